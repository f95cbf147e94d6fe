"""How far the queue goes with several worker processes: N jobs queued, then K processes, each
a real Pressroom worker (claim with its `job.running` event, template, no-op render, file
stored, done with its `job.done` event) whose storage keeps files in memory, so that the
queue on PostgreSQL is measured, not this disk; next to K PgQueuer processes with an empty
handler on the same server, in the same run.

Each figure gets a fresh database on the benchmarks' server (bench.common.postgres:
DATABASE_URL, else the embedded one). The K processes start, connect and sit idle; then N
jobs are inserted in one transaction, and the clock runs from that commit until none is left
to do (checked every 20 ms with an EXISTS over the open jobs).

    python -m bench.drain [--jobs 20000] [--processes 1,2,4] [--slots 32] [--pgqueuer-batch 100]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import QUICK, ROOT, command, database, machine, postgres, serving
from bench.noop import NoopRenderer
from server.files.storage import LocalStorage, check_complete
from server.options import outputs
from server.queue import db, jobs
from server.queue.jobs import NewJob
from server.settings import Settings
from server.web.app import create_app

NAME = "bench.drain"
TEMPLATE = "<p>Job {{ n }}</p>"
SETTLE_S = 1.0  # idle workers get this long to connect and LISTEN before the insert
READY_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
POLL_S = 0.02
READY = "ready"


class MemoryStorage(LocalStorage):
    """Files kept in a dict (benchmarks only, never a setting of the server): `put` checks the
    file is whole as the real storage does, then keeps it, with no disk and no fsync."""

    def __init__(self, root: Path, secret: str) -> None:
        super().__init__(root, secret)
        self.files: dict[str, bytes] = {}

    async def put(
        self, key: str, data: bytes, *, filename: str, content_type: str = outputs.PDF.content_type
    ) -> None:
        check_complete(data, content_type)
        self._path(key)  # the same check of the key
        self.files[key] = data

    async def get(self, key: str) -> bytes:
        try:
            return self.files[key]
        except KeyError:
            raise FileNotFoundError(key) from None

    async def delete(self, key: str) -> None:
        self.files.pop(key, None)

    async def check(self) -> None:
        return None


def memory_storage(settings: Settings) -> MemoryStorage:
    return MemoryStorage(settings.files_dir, settings.secret)


# --- Worker processes -----------------------------------------------------------------------


async def pressroom_worker(dsn: str, slots: int) -> None:
    """One `pressroom worker` process (web off) with the no-op renderer and files in memory,
    until its standard input closes."""
    env = {name: value for name, value in os.environ.items() if name.startswith("PRESSROOM_")}
    with tempfile.TemporaryDirectory(prefix="prb-drain-") as data_dir:
        env |= {"DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": data_dir}
        settings = Settings.from_env(env, render_slots=slots, run_web=False)
        app = create_app(settings, renderer_factory=NoopRenderer, storage_factory=memory_storage)
        async with serving(app):
            print(READY, flush=True)
            await asyncio.to_thread(sys.stdin.read)


async def pgqueuer_worker(dsn: str, batch: int) -> None:
    """One process with one PgQueuer queue manager and an empty handler, until its standard
    input closes."""
    os.environ["PGQUEUER_DURABILITY"] = "balanced"  # as bench.queue: its queue table is logged
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.models import Job

    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("render")
    async def render(job: Job) -> None:
        return None

    task = asyncio.create_task(qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=5)))
    try:
        print(READY, flush=True)
        await asyncio.to_thread(sys.stdin.read)
    finally:
        qm.shutdown.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(task, STOP_TIMEOUT_S)
        await conn.close()


# --- The drain ------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def workers(system: str, dsn: str, count: int, size: int) -> AsyncIterator[None]:
    """`count` worker processes of `system`, each ready (connected, idle) when this yields;
    stopped on exit by closing their standard input."""
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            NAME,
            "--worker",
            system,
            "--dsn",
            dsn,
            "--size",
            str(size),
            cwd=ROOT,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        for _ in range(count)
    ]
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            for proc in procs:
                assert proc.stdout is not None
                line = (await proc.stdout.readline()).decode().strip()
                if line != READY:
                    raise RuntimeError(f"a {system} worker process did not start: {line!r}")
        yield
    finally:
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
            except TimeoutError:
                proc.kill()
                await proc.wait()


async def wait_drained(conn: asyncpg.Connection, left: str, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        # The database has no event for "all N finished": poll it, with a cheap EXISTS.
        while await conn.fetchval(left):  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)


def drain_timeout_s(count: int) -> float:
    return 60 + count / 20  # generous: even 20 jobs/s finishes


async def pressroom_drain(count: int, processes: int, slots: int) -> float:
    """Jobs per second through `processes` Pressroom worker processes of `slots` slots each."""
    async with database(migrated=True) as dsn, workers("pressroom", dsn, processes, slots):
        await asyncio.sleep(SETTLE_S)
        conn = await db.connect(dsn)
        try:
            new = [
                NewJob(
                    tenant="default",
                    template=TEMPLATE,
                    data={"n": n},
                    options={},
                    metadata={},
                    max_attempts=3,
                )
                for n in range(count)
            ]
            await jobs.create(conn, new)
            started = time.perf_counter()
            await wait_drained(
                conn,
                "SELECT EXISTS (SELECT 1 FROM jobs WHERE status IN ('queued', 'running'))",
                drain_timeout_s(count),
            )
            elapsed = time.perf_counter() - started
            done = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'done'")
        finally:
            await conn.close()
    if done != count:
        raise RuntimeError(f"Pressroom finished {done} of {count} jobs")
    return count / elapsed


async def pgqueuer_drain(count: int, processes: int, batch: int) -> float:
    """Jobs per second through `processes` processes of one PgQueuer queue manager each."""
    os.environ["PGQUEUER_DURABILITY"] = "balanced"
    from pgqueuer import AsyncpgDriver, Queries
    from pgqueuer.domain.settings import db_settings

    db_settings.cache_clear()
    async with database() as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            queries = Queries(AsyncpgDriver(conn))
            await queries.install()
            async with workers("pgqueuer", dsn, processes, batch):
                await asyncio.sleep(SETTLE_S)
                payloads = [
                    json.dumps({"template": TEMPLATE, "data": {"n": n}}).encode()
                    for n in range(count)
                ]
                await queries.enqueue(["render"] * count, list[bytes | None](payloads), [0] * count)
                started = time.perf_counter()
                await wait_drained(
                    conn, "SELECT EXISTS (SELECT 1 FROM pgqueuer)", drain_timeout_s(count)
                )
                elapsed = time.perf_counter() - started
        finally:
            await conn.close()
    return count / elapsed


async def run(args: argparse.Namespace) -> dict[str, Any]:
    counts = [int(k) for k in args.processes.split(",")]
    result: dict[str, Any] = {"args": vars(args), "command": command(NAME, *_argv(args))}
    rows = []
    async with postgres() as server:
        conn = await asyncpg.connect(server)
        try:
            result["postgres"] = "PostgreSQL " + await conn.fetchval("SHOW server_version")
            result["server"] = await conn.fetchval(
                "SELECT coalesce(host(inet_server_addr()) || ':' || current_setting('port'), "
                "'a Unix socket, port ' || current_setting('port'))"
            )
        finally:
            await conn.close()
        for processes in counts:
            ours = await pressroom_drain(args.jobs, processes, args.slots)
            print(f"drain   Pressroom, {_processes(processes)}: {ours:7.0f} jobs/s", flush=True)
            theirs = await pgqueuer_drain(args.jobs, processes, args.pgqueuer_batch)
            print(f"drain   PgQueuer, {_processes(processes)}: {theirs:7.0f} jobs/s", flush=True)
            rows.append({"processes": processes, "pressroom": ours, "pgqueuer": theirs})
    result["rows"] = rows
    print_result(result)
    return result


def print_result(result: dict[str, Any]) -> None:
    args = result["args"]
    print(
        f"drain   {args['jobs']} jobs, Pressroom {args['slots']} slots per process, PgQueuer "
        f"batch {args['pgqueuer_batch']}, {result['postgres']} ({result['server']}):"
    )
    for row in result["rows"]:
        ratio = row["pressroom"] / row["pgqueuer"]
        print(
            f"drain   {_processes(row['processes'])}: Pressroom {row['pressroom']:7.0f} jobs/s, "
            f"PgQueuer {row['pgqueuer']:7.0f} jobs/s, ratio {ratio:.2f}",
            flush=True,
        )


def _processes(count: int) -> str:
    return f"{count} process{'es' if count != 1 else ''}"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=2000 if QUICK else 20_000)
    parser.add_argument("--processes", default="1,2" if QUICK else "1,2,4")
    parser.add_argument("--slots", type=int, default=32, help="render slots per process")
    parser.add_argument("--pgqueuer-batch", type=int, default=100)
    # One worker process, started by the drain itself.
    parser.add_argument("--worker", choices=["pressroom", "pgqueuer"], help=argparse.SUPPRESS)
    parser.add_argument("--dsn", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    return parser


def _argv(args: argparse.Namespace) -> list[str]:
    return [
        f"--jobs {args.jobs}",
        f"--processes {args.processes}",
        f"--slots {args.slots}",
        f"--pgqueuer-batch {args.pgqueuer_batch}",
    ]


def main() -> None:
    args = parser().parse_args()
    if args.worker == "pressroom":
        asyncio.run(pressroom_worker(args.dsn, args.size))
        return
    if args.worker == "pgqueuer":
        asyncio.run(pgqueuer_worker(args.dsn, args.size))
        return
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
