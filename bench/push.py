"""Push benchmark: how fast a committed state change reaches SSE and Socket.IO clients, next to
the raw NOTIFY round trip of the same database, and what fan-out to N SSE subscribers costs.

    python -m bench.push                  # 1,000 events, 10,000 subscribers (slow)
    python -m bench.push --quick          # 100 events, 200 subscribers (a smoke run)
    python -m bench.push --events 500 --subscribers 2000

The server runs as a real `pressroom web` subprocess (no workers: each event is a job.queued
committed by this script); the clients run here. DATABASE_URL names a PostgreSQL server (a
scratch database is created and dropped on it); unset, an embedded one is started. Figures go
to stdout and, as JSON, to bench/out/push.json.

Latency is measured from the moment the committing statement is sent to the moment the client
has read the event. The baseline is measured the same way on the same events: a raw asyncpg
LISTEN connection of this script hears each commit's NOTIFY, so the difference is what
Pressroom adds on top of PostgreSQL (the LISTEN of the server, reading the event rows, the
hub, the transports). `SELECT pg_notify` alone, with no commit to wait for, is shown too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import os
import resource
import signal
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import asyncpg
import socketio

from server import db, jobs
from server.jobs import NewJob

OUT = Path(__file__).resolve().parent / "out" / "push.json"
CONNECT_BATCH = 200
# One event at a time to every subscriber, a pause between them; the median is reported. One
# event alone varied from 0.66 to 1.7 s between runs on the 2-core benchmark machine, where
# the 10,000 client connections of this process share the cores with the server (which is
# also why they are bare sockets, RawStream, rather than aiohttp responses).
FAN_OUT_ROUNDS = 5
FAN_OUT_PAUSE_S = 1.0
READY_TIMEOUT_S = 60.0


@dataclass
class Latency:
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass
class FanOut:
    subscribers: int
    connect_s: float
    rss_before_mb: float
    rss_after_mb: float
    kb_per_connection: float
    reach_all_ms: float  # the median of the rounds
    reach_all_rounds_ms: list[float]


def summarize(samples_s: list[float]) -> Latency:
    ordered = sorted(samples_s)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return Latency(
        count=len(ordered),
        p50_ms=round(statistics.median(ordered) * 1000, 3),
        p99_ms=round(p99 * 1000, 3),
        max_ms=round(ordered[-1] * 1000, 3),
    )


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def raise_fd_limit(wanted: int) -> None:
    """Open files for the subscribers (here and, inherited, in the server)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = min(hard, max(soft, wanted)) if hard != resource.RLIM_INFINITY else max(soft, wanted)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    if target < wanted:
        print(f"warning: open-file limit {target} < {wanted}; fewer subscribers may connect")


def new_job(n: int) -> NewJob:
    return NewJob(
        tenant="default",
        template="<p>bench</p>",
        data={"n": n},
        options={},
        metadata={},
        max_attempts=1,
    )


# --- database and server ----------------------------------------------------------------


@contextlib.asynccontextmanager
async def scratch_database() -> AsyncIterator[str]:
    """A fresh, migrated database on DATABASE_URL's server (or an embedded one)."""
    embedded = None
    server_dsn = os.environ.get("DATABASE_URL")
    if not server_dsn:
        embedded = db.EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="bench-pg-")) / "pg")
        server_dsn = await embedded.start()
    name = f"pressroom_bench_{uuid.uuid4().hex[:10]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    dsn = urlunsplit(urlsplit(server_dsn)._replace(path="/" + name))
    try:
        conn = await db.connect(dsn)
        try:
            await db.migrate(conn)
        finally:
            await conn.close()
        yield dsn
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        if embedded is not None:
            await embedded.stop()


@contextlib.asynccontextmanager
async def pressroom_web(dsn: str, port: int, data_dir: Path) -> AsyncIterator[int]:
    """`pressroom web` in a subprocess; yields its pid once it answers /healthz."""
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "PRESSROOM_PORT": str(port),
        "PRESSROOM_DATA_DIR": str(data_dir),
        "PRESSROOM_LOG_LEVEL": "WARNING",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "server", "web", env=env, stderr=asyncio.subprocess.DEVNULL
    )
    try:
        async with aiohttp.ClientSession() as http, asyncio.timeout(READY_TIMEOUT_S):
            while True:
                if proc.returncode is not None:
                    raise RuntimeError(f"pressroom web exited with {proc.returncode}")
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)  # the port is not open yet
        yield proc.pid
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()


# --- latency ------------------------------------------------------------------------------


async def notify_round_trip(pool: asyncpg.Pool, dsn: str, count: int) -> Latency:
    """PostgreSQL alone: send `SELECT pg_notify` on one connection, receive on a LISTENer."""
    listener = await asyncpg.connect(dsn)
    arrived: asyncio.Queue[float] = asyncio.Queue()
    await listener.add_listener("bench", lambda *_: arrived.put_nowait(time.perf_counter()))
    samples = []
    try:
        for n in range(count):
            sent = time.perf_counter()
            await pool.execute("SELECT pg_notify('bench', $1)", str(n))
            samples.append(await asyncio.wait_for(arrived.get(), 10) - sent)
    finally:
        await listener.close()
    return summarize(samples)


async def sse_reader(
    resp: aiohttp.ClientResponse, arrived: asyncio.Queue[tuple[int, float]]
) -> None:
    """Timestamp each SSE message as soon as its last line is read."""
    ident = None
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("id:"):
            ident = int(line[3:].strip())
        elif line == "" and ident is not None:
            arrived.put_nowait((ident, time.perf_counter()))
            ident = None


async def push_latency(
    pool: asyncpg.Pool, dsn: str, base: str, count: int
) -> tuple[Latency, Latency, Latency]:
    """One SSE and one Socket.IO client on the all-jobs stream, and a raw LISTEN connection
    on Pressroom's channel (the baseline); one job.queued at a time."""
    sse_arrived: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
    sio_arrived: asyncio.Queue[tuple[int, float]] = asyncio.Queue()
    heard: asyncio.Queue[float] = asyncio.Queue()
    listener = await asyncpg.connect(dsn)
    await listener.add_listener("pressroom", lambda *_: heard.put_nowait(time.perf_counter()))
    sio = socketio.AsyncClient(reconnection=False)
    sio.on("job", lambda event: sio_arrived.put_nowait((event["event_id"], time.perf_counter())))
    async with aiohttp.ClientSession() as http:
        resp = await http.get(base + "/v1/events")
        reader = asyncio.create_task(sse_reader(resp, sse_arrived))
        await sio.connect(base, transports=["websocket"], wait_timeout=10)
        ack = await sio.call("subscribe", {"all": True}, timeout=10)
        assert ack == {"ok": True}, ack
        notify_samples, sse_samples, sio_samples = [], [], []
        try:
            for n in range(count + 10):
                sent = time.perf_counter()
                await jobs.create(pool, [new_job(n)])
                notify_at, (_sse_id, sse_at), (_sio_id, sio_at) = await asyncio.wait_for(
                    asyncio.gather(heard.get(), sse_arrived.get(), sio_arrived.get()), 10
                )
                if n >= 10:  # the first few warm up connections and caches
                    notify_samples.append(notify_at - sent)
                    sse_samples.append(sse_at - sent)
                    sio_samples.append(sio_at - sent)
        finally:
            reader.cancel()
            resp.close()
            await sio.disconnect()
            await listener.close()
    return summarize(notify_samples), summarize(sse_samples), summarize(sio_samples)


# --- fan-out ------------------------------------------------------------------------------


class RawStream(asyncio.Protocol):
    """One SSE subscriber on a bare socket: the fan-out's client side, kept as light as a
    client can be, since 10,000 of them share this machine's two cores with the server. It
    notes when the response headers came and when an event (an `id:` line) arrives."""

    def __init__(self, request: bytes) -> None:
        self._request = request
        self._tail = b""  # the end of the last read: `id:` may be split across two
        self.headers: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self.event: asyncio.Future[float] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if not self.headers.done():
            self.headers.set_result(data)
        seen = self._tail + data
        self._tail = data[-2:]
        if self.event is not None and not self.event.done() and b"\nid:" in seen:
            self.event.set_result(time.perf_counter())

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.headers, self.event):
            if future is not None and not future.done():
                future.set_exception(ConnectionError("the stream ended"))


def _same(stream: RawStream) -> RawStream:
    return stream


async def fan_out(pool: asyncpg.Pool, base: str, server_pid: int, subscribers: int) -> FanOut:
    """N idle SSE subscribers on one process: memory each, and the time one event takes to
    reach them all (FAN_OUT_ROUNDS events, one at a time)."""
    loop = asyncio.get_running_loop()
    host, port = urlsplit(base).hostname or "127.0.0.1", urlsplit(base).port or 80
    request = (
        f"GET /v1/events HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    rss_before = rss_mb(server_pid)
    streams: list[RawStream] = []
    transports: list[asyncio.BaseTransport] = []
    started = time.perf_counter()
    try:
        for first in range(0, subscribers, CONNECT_BATCH):
            batch = [
                RawStream(request) for _ in range(first, min(subscribers, first + CONNECT_BATCH))
            ]
            opened = await asyncio.gather(
                *(loop.create_connection(functools.partial(_same, s), host, port) for s in batch)
            )
            transports += [transport for transport, _ in opened]
            heads = await asyncio.wait_for(asyncio.gather(*(s.headers for s in batch)), 60)
            assert all(h.startswith(b"HTTP/1.1 200") for h in heads), heads[0][:100]
            streams += batch
        connect_s = time.perf_counter() - started
        rss_after = rss_mb(server_pid)
        rounds: list[float] = []
        for n in range(FAN_OUT_ROUNDS):
            for stream in streams:
                stream.event = loop.create_future()
            sent = time.perf_counter()
            await jobs.create(pool, [new_job(-1 - n)])
            arrivals = await asyncio.wait_for(
                asyncio.gather(*(s.event for s in streams if s.event is not None)), 120
            )
            rounds.append(round((max(arrivals) - sent) * 1000, 1))
            await asyncio.sleep(FAN_OUT_PAUSE_S)
    finally:
        for transport in transports:
            transport.close()
    return FanOut(
        subscribers=subscribers,
        connect_s=round(connect_s, 2),
        rss_before_mb=round(rss_before, 1),
        rss_after_mb=round(rss_after, 1),
        kb_per_connection=round((rss_after - rss_before) * 1024 / subscribers, 2),
        reach_all_ms=round(statistics.median(rounds), 1),
        reach_all_rounds_ms=rounds,
    )


# --- main ---------------------------------------------------------------------------------


async def run(events: int, subscribers: int) -> dict[str, Any]:
    raise_fd_limit(subscribers + 1024)
    async with scratch_database() as dsn:
        pool = await db.create_pool(dsn, min_size=2, max_size=4)
        try:
            port = free_port()
            with tempfile.TemporaryDirectory(prefix="bench-data-") as data_dir:
                async with pressroom_web(dsn, port, Path(data_dir)) as pid:
                    base = f"http://127.0.0.1:{port}"
                    notify = await notify_round_trip(pool, dsn, events)
                    committed, sse, sio = await push_latency(pool, dsn, base, events)
                    fan = await fan_out(pool, base, pid, subscribers)
        finally:
            await pool.close()
    result = {
        "notify_round_trip": asdict(notify),
        "notify_commit": asdict(committed),
        "sse": asdict(sse),
        "socketio": asdict(sio),
        "fan_out": asdict(fan),
        "targets": {
            "p99_within_ms_of_notify": 5,
            "kb_per_idle_connection": 20,
            "reach_all_ms": 1000,
        },
    }
    return result


def report(result: dict[str, Any]) -> str:
    rows = [
        "| path | events | p50 ms | p99 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for name, key in (
        ("raw NOTIFY alone (SELECT pg_notify, no commit)", "notify_round_trip"),
        ("raw NOTIFY of the same commits (asyncpg LISTEN)", "notify_commit"),
        ("SSE", "sse"),
        ("Socket.IO", "socketio"),
    ):
        r = result[key]
        rows.append(f"| {name} | {r['count']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} |")
    fan = result["fan_out"]
    rows += [
        "",
        f"fan-out: {fan['subscribers']} SSE subscribers connected in {fan['connect_s']} s; "
        f"server RSS {fan['rss_before_mb']} → {fan['rss_after_mb']} MB "
        f"({fan['kb_per_connection']} KB per idle connection); "
        f"one event reached all in {fan['reach_all_ms']} ms (median of "
        f"{len(fan['reach_all_rounds_ms'])} events: "
        f"{', '.join(f'{ms:g}' for ms in fan['reach_all_rounds_ms'])} ms)",
    ]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000, help="latency samples (1000)")
    parser.add_argument("--subscribers", type=int, default=10_000, help="fan-out clients (10000)")
    parser.add_argument("--quick", action="store_true", help="100 events, 200 subscribers")
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON results ({OUT})")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.subscribers = 100, 200
    result = asyncio.run(run(args.events, args.subscribers))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(report(result))
    print(f"\n(results in {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
