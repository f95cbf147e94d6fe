"""Push benchmark: how fast a committed state change reaches SSE and Socket.IO clients, next to
the raw NOTIFY round trip of the same database, and what fan-out to many idle subscribers
costs: 50,000 SSE and 20,000 Socket.IO websocket subscribers by default.

    python -m bench.push                  # 1,000 events, then the fan-outs (minutes)
    python -m bench.push --quick          # 100 events, 200 subscribers each (a smoke run)
    python -m bench.push --events 0 --subscribers 19000 --sio-subscribers 0 --profile out/spy
    python -m bench.push --events 0 --counts 1000 5000 10000 19000   # the sweep: docs/fanout.png

The server runs as a real `pressroom web` subprocess (no workers: each event is a job.queued
committed by this script); the latency clients run here, the fan-out's subscribers in client
processes of their own (bench/fanout.py, bare sockets). One process holds at most its
open-file limit of connections: the server raises its own to the hard limit (`ulimit -Hn`),
and a fan-out asked for more than fits below it (FD_RESERVE kept for the server's own files)
runs with the most that fits, and says so. DATABASE_URL names a PostgreSQL server (a scratch
database is created and dropped on it); unset, an embedded one is started. Figures go to
stdout and, as JSON, to bench/out/push.json.

Latency is measured from the moment the committing statement is sent to the moment the client
has read the event. The baseline is measured the same way on the same events: a raw asyncpg
LISTEN connection of this script hears each commit's NOTIFY, so the difference is what
Pressroom adds on top of PostgreSQL (the LISTEN of the server, reading the event rows, the
hub, the transports). `SELECT pg_notify` alone, with no commit to wait for, is shown too.
Fan-out is timed from the commit to the moment the last subscriber has the event
(time.monotonic(), one clock for every process of the machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
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

from bench import plots
from server.cli.admin import OPEN_FILES_WITHOUT_LIMIT
from server.queue import db, jobs
from server.queue.jobs import NewJob

OUT = Path(__file__).resolve().parent / "out" / "push.json"
# One event at a time to every subscriber, a pause between them; the median is reported. One
# event alone varied from 0.66 to 1.7 s between runs on the 2-core benchmark machine, where
# the client connections share the cores with the server (which is also why they are bare
# sockets, bench/fanout.py, rather than aiohttp responses).
FAN_OUT_ROUNDS = 5
FAN_OUT_PAUSE_S = 1.0
READY_TIMEOUT_S = 60.0
# Subscribers per client process: within the ports one source address has towards one server
# address (about 28,000 on Linux), and below the client's open-file limit (less its own few).
CLIENTS_PER_PROCESS = 15_000
CLIENT_FD_RESERVE = 100
# Descriptors the server keeps for itself beyond its subscribers: its database pool and LISTEN
# connections, the embedded database's pipes, log and data files, with room to spare; what
# fits is rounded down to a thousand.
FD_RESERVE = 1_000
PLOT = Path(__file__).resolve().parent.parent / "docs" / "fanout.png"


@dataclass
class Latency:
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass
class FanOut:
    transport: str
    subscribers: int
    asked: int  # more than `subscribers` when the open-file limit did not let them all in
    deflate: bool  # the Socket.IO clients offered permessage-deflate, as browsers do
    client_processes: int
    connect_s: float
    rss_before_mb: float
    rss_after_mb: float
    kb_per_connection: float
    reach_all_ms: float  # the median of the rounds
    reach_all_rounds_ms: list[float]
    # The Origin every subscriber sent, allowed by PRESSROOM_CORS_ORIGINS (None: no Origin).
    origin: str | None = None


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


def open_files_limit() -> int:
    """The hard open-file limit, which the server (and each client process) raises its own
    soft limit to; RLIM_INFINITY as the server counts it."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return OPEN_FILES_WITHOUT_LIMIT if hard == resource.RLIM_INFINITY else hard


def fitting(asked: int, limit: int) -> int:
    """The most subscribers up to `asked` that one server process holds under `limit`."""
    return min(asked, max(0, limit - FD_RESERVE) // 1000 * 1000)


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
async def pressroom_web(dsn: str, origin: str | None = None) -> AsyncIterator[tuple[str, int]]:
    """`pressroom web` in a subprocess, with a data folder of its own (and `origin` allowed
    for CORS); yields its URL and pid once it answers /healthz."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="bench-data-") as data_dir:
        async with _pressroom_web(dsn, port, Path(data_dir), origin) as pid:
            yield f"http://127.0.0.1:{port}", pid


@contextlib.asynccontextmanager
async def _pressroom_web(
    dsn: str, port: int, data_dir: Path, origin: str | None
) -> AsyncIterator[int]:
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "PRESSROOM_PORT": str(port),
        "PRESSROOM_DATA_DIR": str(data_dir),
        "PRESSROOM_LOG_LEVEL": "WARNING",
        "PRESSROOM_CORS_ORIGINS": origin or "",
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


async def _line(proc: asyncio.subprocess.Process, expected: str) -> list[str]:
    """The next line a client process prints, which must start with `expected`."""
    assert proc.stdout is not None
    raw = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S * 4)
    words = raw.decode().split()
    if not words or words[0] != expected:
        raise RuntimeError(f"a fan-out client said {raw!r}, expected {expected!r}")
    return words[1:]


async def _tell(procs: list[asyncio.subprocess.Process], command: str) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{command}\n".encode())
        await proc.stdin.drain()


async def fan_out(
    pool: asyncpg.Pool,
    base: str,
    server_pid: int,
    subscribers: int,
    *,
    transport: str = "sse",
    per_process: int = CLIENTS_PER_PROCESS,
    profile: Path | None = None,
    deflate: bool = False,
    origin: str | None = None,
) -> FanOut:
    """N idle subscribers of one transport on one process: memory each, and the time one
    event takes to reach them all (FAN_OUT_ROUNDS events, one at a time). The subscribers
    are bare sockets in processes of their own (bench/fanout.py), each connecting from an
    address of its own so that none runs out of ports, and each holding no more than its
    open-file limit allows."""
    per_process = max(1, min(per_process, open_files_limit() - CLIENT_FD_RESERVE))
    shares = [min(per_process, subscribers - first) for first in range(0, subscribers, per_process)]
    rss_before = rss_mb(server_pid)
    started = time.monotonic()
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.fanout",
            "--url",
            base,
            "--transport",
            transport,
            "--count",
            str(share),
            "--local",
            f"127.0.0.{2 + n}",
            *(["--deflate"] if deflate else []),
            *(["--origin", origin] if origin else []),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for n, share in enumerate(shares)
    ]
    spy: asyncio.subprocess.Process | None = None
    try:
        for proc in procs:
            await _line(proc, "ready")
        connect_s = time.monotonic() - started
        await asyncio.sleep(FAN_OUT_PAUSE_S)  # the last connections' buffers settle
        rss_after = rss_mb(server_pid)
        if profile is not None:
            spy = await start_py_spy(server_pid, profile)
        rounds: list[float] = []
        for n in range(FAN_OUT_ROUNDS):
            await _tell(procs, "arm")
            for proc in procs:
                await _line(proc, "armed")
            sent = time.monotonic()
            await jobs.create(pool, [new_job(-1 - n)])
            arrived = [await _line(proc, "arrived") for proc in procs]
            assert sum(int(count) for _at, count in arrived) == subscribers
            rounds.append(round((max(float(at) for at, _count in arrived) - sent) * 1000, 1))
            await asyncio.sleep(FAN_OUT_PAUSE_S)
    finally:
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its profile when interrupted
            await spy.wait()
        with contextlib.suppress(ConnectionError):
            await _tell(procs, "quit")
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
    return FanOut(
        transport=transport,
        subscribers=subscribers,
        asked=subscribers,
        deflate=deflate,
        origin=origin,
        client_processes=len(procs),
        connect_s=round(connect_s, 2),
        rss_before_mb=round(rss_before, 1),
        rss_after_mb=round(rss_after, 1),
        kb_per_connection=round((rss_after - rss_before) * 1024 / subscribers, 2),
        reach_all_ms=round(statistics.median(rounds), 1),
        reach_all_rounds_ms=rounds,
    )


async def start_py_spy(pid: int, out: Path) -> asyncio.subprocess.Process:
    """py-spy sampling the server until interrupted, its samples written to `out` as
    collapsed stacks (one line per stack and its count: grep it, or feed it to a flame graph)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    out.parent.mkdir(parents=True, exist_ok=True)
    return await asyncio.create_subprocess_exec(
        spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw",
        "--output", str(out), "--nonblocking",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip


# --- main ---------------------------------------------------------------------------------


async def run(
    events: int,
    subscribers: int,
    sio_subscribers: int,
    *,
    per_process: int = CLIENTS_PER_PROCESS,
    profile: Path | None = None,
    deflate: bool = False,
    counts: list[int] | None = None,
    origin: str | None = None,
) -> dict[str, Any]:
    """Latency over `events`, then the fan-outs, each transport in a server of its own; with
    `counts`, the fan-out of both transports at each count (the sweep the plot shows)."""
    raise_fd_limit(1024)  # the server raises its own; each client process its own too
    limit = open_files_limit()
    result: dict[str, Any] = {"open_files_limit": limit, "notes": []}
    async with scratch_database() as dsn:
        pool = await db.create_pool(dsn, min_size=2, max_size=4)

        async def one(transport: str, asked: int, spy: Path | None = None) -> FanOut | None:
            count = fitting(asked, limit)
            if count < asked:
                name = "SSE" if transport == "sse" else "Socket.IO"
                note = (
                    f"{asked:,} {name} subscribers do not fit in one server process under the "
                    f"open-file limit of {limit:,} (`ulimit -Hn`, less {FD_RESERVE:,} for the "
                    f"server's own files): running {count:,}. Raise the hard limit to run "
                    "them all (README, Many streams)."
                )
                result["notes"].append(note)
                print(note, flush=True)
            if not count:
                return None
            # A server of its own for each: memory another run's streams freed would
            # otherwise be counted as this one's.
            async with pressroom_web(dsn, origin) as (base, pid):
                fan = await fan_out(
                    pool, base, pid, count, transport=transport, per_process=per_process,
                    profile=spy, deflate=deflate and transport == "socketio", origin=origin,
                )  # fmt: skip
            fan.asked = asked
            return fan

        try:
            if events:
                async with pressroom_web(dsn) as (base, _pid):
                    notify = await notify_round_trip(pool, dsn, events)
                    committed, sse, sio = await push_latency(pool, dsn, base, events)
                result |= {
                    "notify_round_trip": asdict(notify),
                    "notify_commit": asdict(committed),
                    "sse": asdict(sse),
                    "socketio": asdict(sio),
                }
            for key, transport, asked in (
                ("fan_out", "sse", subscribers),
                ("fan_out_socketio", "socketio", sio_subscribers),
            ):
                spy = profile and profile.with_name(f"{profile.stem}-{transport}.txt")
                if asked and (fan := await one(transport, asked, spy)) is not None:
                    result[key] = asdict(fan)
            if counts:
                sweep = []
                for asked in counts:
                    for transport in ("sse", "socketio"):
                        if (fan := await one(transport, asked)) is not None:
                            sweep.append(asdict(fan))
                result["sweep"] = sweep
        finally:
            await pool.close()
    result["targets"] = {
        "p99_within_ms_of_notify": 5,
        "kb_per_idle_connection": 12,
        "reach_all_ms": 1500,
    }
    return result


def _fan_out_line(fan: dict[str, Any]) -> str:
    name = "SSE" if fan["transport"] == "sse" else "Socket.IO (websocket)"
    if fan.get("deflate"):
        name += " offering permessage-deflate"
    if fan.get("origin"):
        name += f" from the allowed origin {fan['origin']}"
    return (
        f"fan-out: {fan['subscribers']} {name} subscribers ({fan['client_processes']} client "
        f"processes) connected in {fan['connect_s']} s; "
        f"server RSS {fan['rss_before_mb']} → {fan['rss_after_mb']} MB "
        f"({fan['kb_per_connection']} KB per idle connection); "
        f"one event reached all in {fan['reach_all_ms']} ms (median of "
        f"{len(fan['reach_all_rounds_ms'])} events: "
        f"{', '.join(f'{ms:g}' for ms in fan['reach_all_rounds_ms'])} ms)"
    )


def report(result: dict[str, Any]) -> str:
    rows = []
    if "sse" in result:
        rows += [
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
            rows.append(
                f"| {name} | {r['count']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_ms']} |"
            )
        rows.append("")
    rows += [_fan_out_line(result[key]) for key in ("fan_out", "fan_out_socketio") if key in result]
    if result.get("sweep"):
        rows += [
            "",
            "| transport | subscribers | KB per idle connection | one event to all, ms (median) "
            "| rounds, ms |",
            "|---|---|---|---|---|",
        ]
        for fan in result["sweep"]:
            name = "SSE" if fan["transport"] == "sse" else "Socket.IO"
            rounds = ", ".join(f"{ms:g}" for ms in fan["reach_all_rounds_ms"])
            rows.append(
                f"| {name} | {fan['subscribers']:,} | {fan['kb_per_connection']} "
                f"| {fan['reach_all_ms']:g} | {rounds} |"
            )
    rows += [f"note: {note}" for note in result.get("notes", [])]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=1000, help="latency samples (1000; 0: none)")
    parser.add_argument(
        "--subscribers", type=int, default=50_000, help="SSE fan-out clients (50000; 0: none)"
    )
    parser.add_argument(
        "--sio-subscribers",
        type=int,
        default=20_000,
        help="Socket.IO websocket fan-out clients (20000; 0: none)",
    )
    parser.add_argument(
        "--per-process",
        type=int,
        default=CLIENTS_PER_PROCESS,
        help=f"subscribers per client process ({CLIENTS_PER_PROCESS})",
    )
    parser.add_argument(
        "--profile", type=Path, help="py-spy the server during the fan-out rounds, to this path"
    )
    parser.add_argument(
        "--sio-deflate",
        action="store_true",
        help="the Socket.IO subscribers offer permessage-deflate, as browsers do",
    )
    parser.add_argument(
        "--counts",
        type=int,
        nargs="+",
        help="also the fan-out of both transports at each of these counts, plotted",
    )
    parser.add_argument("--plot", type=Path, default=PLOT, help=f"the sweep's plot ({PLOT})")
    parser.add_argument(
        "--origin",
        help="every subscriber sends this Origin, which the server allows (CORS headers on)",
    )
    parser.add_argument("--quick", action="store_true", help="100 events, 200 subscribers each")
    parser.add_argument("--out", type=Path, default=OUT, help=f"JSON results ({OUT})")
    args = parser.parse_args(argv)
    if args.quick:
        args.events, args.subscribers, args.sio_subscribers = 100, 200, 200
    result = asyncio.run(
        run(
            args.events,
            args.subscribers,
            args.sio_subscribers,
            per_process=args.per_process,
            profile=args.profile,
            deflate=args.sio_deflate,
            counts=args.counts,
            origin=args.origin,
        )
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    if result.get("sweep"):
        plots.fan_out(args.plot, result["sweep"], result["targets"])
        print(f"(plot in {args.plot})")
    print(report(result))
    print(f"\n(results in {args.out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
