"""Push and fan-out: how fast a committed state change reaches an SSE and a Socket.IO
subscriber, against a raw LISTEN on the same commits; then what idle subscribers cost a server
process (memory per subscriber) and how long one event takes to reach them all.

The server is a real `pressroom web` subprocess (no workers: each event is a `job.queued`
committed here), so that its memory is its own: one for the latency and then the SSE fan-out,
another for the Socket.IO fan-out, which would otherwise reuse what the SSE streams freed.

Latency runs from the moment the committing statement is sent to the moment the client has
read the event; the baseline, an asyncpg LISTEN connection here hearing each commit's NOTIFY,
is timed the same way on the same events, so the difference is what Pressroom adds to
PostgreSQL. The fan-out's subscribers are bare sockets in client processes of their own
(bench/clients.py, at most --per-process each, each from an address of its own); five events,
one at a time, each from its commit to the moment the last subscriber has it
(time.monotonic(), one clock for every process of the machine), the median printed. A server
process holds at most its open-file limit of connections (it raises its own to `ulimit -Hn`):
a fan-out asked for more than fits runs with the most that does, and says so.

    python -m bench.push [--events 1000] [--subscribers 50000] [--sio-subscribers 20000]
                         [--per-process 15000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
from asyncio.subprocess import Process
from collections.abc import AsyncIterator

import aiohttp
import asyncpg
import psutil
import socketio

from bench import common
from bench.common import QUICK, ROOT, database, free_port, new_job, postgres, start_python, summary
from server.cli.admin import OPEN_FILES_WITHOUT_LIMIT
from server.queue import db, jobs
from server.queue.jobs import NewJob

FAN_OUT_ROUNDS = 5
# A pause before each event, so that the last one's writes and the connections settle.
FAN_OUT_PAUSE_S = 0.2 if QUICK else 1.0
READY_TIMEOUT_S = 60.0
WARMUP_EVENTS = 10  # the first events warm up connections and caches; not counted
# Descriptors a process keeps beyond its subscribers: the server's pool and LISTEN connections,
# the client's own few; what fits in a server is rounded down to a thousand.
FD_RESERVE = 1_000
CLIENT_FD_RESERVE = 100
TRANSPORTS = {"sse": "SSE", "socketio": "Socket.IO (websocket)"}


def open_files_limit() -> int:
    """The hard open-file limit, which the server and each client process raise theirs to."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    return OPEN_FILES_WITHOUT_LIMIT if hard == resource.RLIM_INFINITY else hard


def queued(n: int) -> NewJob:
    """Job `n`, which no worker runs here: its `job.queued` is the event."""
    return new_job("<p>bench</p>", {"n": n}, attempts=1)


async def stopped(proc: Process) -> None:
    """Wait for `proc` to end; killed if it has not in 30 seconds."""
    try:
        await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()


@contextlib.asynccontextmanager
async def pressroom_web(dsn: str) -> AsyncIterator[tuple[str, int]]:
    """`pressroom web` in a subprocess with a data folder of its own; yields its URL and pid
    once it answers /healthz."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="prb-data-") as data_dir:
        env = {**os.environ, "DATABASE_URL": dsn, "PRESSROOM_PORT": str(port)}
        env |= {"PRESSROOM_DATA_DIR": data_dir, "PRESSROOM_LOG_LEVEL": "WARNING"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "server", "web", cwd=ROOT, env=env
        )
        base = f"http://127.0.0.1:{port}"
        try:
            async with aiohttp.ClientSession() as http, asyncio.timeout(READY_TIMEOUT_S):
                while True:
                    if proc.returncode is not None:
                        raise RuntimeError(f"pressroom web exited with {proc.returncode}")
                    with contextlib.suppress(aiohttp.ClientConnectionError):
                        async with http.get(f"{base}/healthz") as resp:
                            if resp.status == 200:
                                break
                    await asyncio.sleep(0.1)  # the port is not open yet
            yield base, proc.pid
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
                await stopped(proc)


async def sse_reader(resp: aiohttp.ClientResponse, arrived: asyncio.Queue[float]) -> None:
    """The moment each SSE event's last line is read (a keep-alive comment has no `id:`)."""
    event = False
    async for raw in resp.content:
        if raw.startswith(b"id:"):
            event = True
        elif raw.strip() == b"" and event:
            arrived.put_nowait(time.perf_counter())
            event = False


async def latency(pool: asyncpg.Pool, dsn: str, base: str, events: int) -> None:
    """One SSE and one Socket.IO subscriber on the all-jobs stream, and a raw LISTEN on
    Pressroom's channel (the baseline); one `job.queued` at a time."""
    arrived = {path: asyncio.Queue[float]() for path in ("NOTIFY", "SSE", "Socket.IO")}
    listener = await asyncpg.connect(dsn)
    await listener.add_listener(
        "pressroom", lambda *_: arrived["NOTIFY"].put_nowait(time.perf_counter())
    )
    sio = socketio.AsyncClient(reconnection=False)
    sio.on("job", lambda _event: arrived["Socket.IO"].put_nowait(time.perf_counter()))
    samples: dict[str, list[float]] = {path: [] for path in arrived}
    async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/events") as resp:
        reader = asyncio.create_task(sse_reader(resp, arrived["SSE"]))
        await sio.connect(base, transports=["websocket"], wait_timeout=10)
        assert await sio.call("subscribe", {"all": True}, timeout=10) == {"ok": True}
        try:
            for n in range(WARMUP_EVENTS + events):
                sent = time.perf_counter()
                await jobs.create(pool, [queued(n)])
                async with asyncio.timeout(10):
                    times = [await queue.get() for queue in arrived.values()]
                if n >= WARMUP_EVENTS:
                    for path, at in zip(arrived, times, strict=True):
                        samples[path].append((at - sent) * 1000)
        finally:
            reader.cancel()
            await sio.disconnect()
            await listener.close()
    result = {path: summary(ms) for path, ms in samples.items()}
    notify = result["NOTIFY"]
    for path in ("SSE", "Socket.IO"):
        print(
            f"push    {events} events to one {path} subscriber: p50 {result[path]['p50']:.2f} ms, "
            f"p99 {result[path]['p99']:.2f} ms; raw NOTIFY of the same commits p50 "
            f"{notify['p50']:.2f} ms, p99 {notify['p99']:.2f} ms; added at p99 "
            f"{result[path]['p99'] - notify['p99']:+.2f} ms",
        )


async def lines(procs: list[Process], expected: str) -> list[list[str]]:
    """The next line each client process prints, which must start with `expected`."""
    said = []
    for proc in procs:
        assert proc.stdout is not None
        raw = await asyncio.wait_for(proc.stdout.readline(), READY_TIMEOUT_S * 4)
        words = raw.decode().split()
        if not words or words[0] != expected:
            raise RuntimeError(f"a fan-out client said {raw!r}, expected {expected!r}")
        said.append(words[1:])
    return said


async def tell(procs: list[Process], command: str) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{command}\n".encode())
        await proc.stdin.drain()


async def fan_out(
    pool: asyncpg.Pool, base: str, pid: int, transport: str, count: int, per_process: int
) -> None:
    """`count` idle subscribers of `transport` on the server `pid`: memory each, and the time
    one event takes to reach them all."""
    per_process = max(1, min(per_process, open_files_limit() - CLIENT_FD_RESERVE))
    shares = [min(per_process, count - first) for first in range(0, count, per_process)]
    server = psutil.Process(pid)
    rss_before, started = server.memory_info().rss, time.monotonic()
    client = ["-m", "bench.clients", "subscribers", base, "--transport", transport]
    procs = [
        await start_python(*client, "--count", str(share), "--local", f"127.0.0.{2 + n}")
        for n, share in enumerate(shares)
    ]
    try:
        await lines(procs, "ready")
        connect_s = time.monotonic() - started
        await asyncio.sleep(FAN_OUT_PAUSE_S)
        kb_each = (server.memory_info().rss - rss_before) / 1024 / count
        rounds = []
        for n in range(FAN_OUT_ROUNDS):
            await tell(procs, "arm")
            await lines(procs, "armed")
            sent = time.monotonic()
            await jobs.create(pool, [queued(-1 - n)])
            arrived = await lines(procs, "arrived")
            assert sum(int(got) for _at, got in arrived) == count
            rounds.append((max(float(at) for at, _got in arrived) - sent) * 1000)
            await asyncio.sleep(FAN_OUT_PAUSE_S)
    finally:
        with contextlib.suppress(ConnectionError):
            await tell(procs, "quit")
        for proc in procs:
            await stopped(proc)
    reach_ms = statistics.median(rounds)
    print(
        f"push    fan-out to {count} idle {TRANSPORTS[transport]} subscribers ({len(procs)} client "
        f"processes, connected in {connect_s:.1f} s): {kb_each:.2f} KB per subscriber; one event "
        f"reached all in {reach_ms:.0f} ms (median of {FAN_OUT_ROUNDS}: "
        f"{', '.join(f'{ms:.0f}' for ms in rounds)})",
    )


def fitting(asked: int, transport: str) -> int:
    """The most subscribers up to `asked` that one server process holds; says when fewer."""
    limit = open_files_limit()
    count = min(asked, max(0, limit - FD_RESERVE) // 1000 * 1000)
    if count < asked:
        print(
            f"push    {asked:,} {TRANSPORTS[transport]} subscribers do not fit in one server "
            f"process under the open-file limit of {limit:,} (`ulimit -Hn`, less "
            f"{FD_RESERVE:,} for the server's own files): running {count:,}. Raise the hard "
            "limit to run them all.",
        )
    return count


async def run(args: argparse.Namespace) -> None:
    """Latency, then the SSE fan-out, on one server; the Socket.IO fan-out on another."""
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the server inherits it
    async with postgres(), database() as dsn:
        pool = await db.create_pool(dsn, min_size=2, max_size=4)
        try:
            async with pressroom_web(dsn) as (base, pid):
                if args.events:
                    await latency(pool, dsn, base, args.events)
                if count := fitting(args.subscribers, "sse"):
                    await fan_out(pool, base, pid, "sse", count, args.per_process)
            if count := fitting(args.sio_subscribers, "socketio"):
                async with pressroom_web(dsn) as (base, pid):
                    await fan_out(pool, base, pid, "socketio", count, args.per_process)
        finally:
            await pool.close()


def parser() -> argparse.ArgumentParser:
    parser = common.arguments(__doc__)
    parser.add_argument("--events", type=int, default=100 if QUICK else 1000, help="0: none")
    parser.add_argument("--subscribers", type=int, default=200 if QUICK else 50_000)
    parser.add_argument("--sio-subscribers", type=int, default=200 if QUICK else 20_000)
    parser.add_argument("--per-process", type=int, default=15_000, help="subscribers per client")
    return parser


if __name__ == "__main__":
    common.main(parser, run)
