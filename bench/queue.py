"""Queue path (P4): drain N queued jobs with a no-op renderer, next to PgQueuer and
Procrastinate on the same PostgreSQL server in the same run; and submit→start latency.

Every system gets a fresh database and the same payload per job (a tiny template and its
data, as JSON). Its workers start first and sit idle; then N jobs are inserted in one
transaction; the clock runs from that commit until the database records all N finished.
Pressroom's jobs go the whole way (claim + job.running event, template, no-op render, PDF
file stored, done + job.done event); the peers' jobs run an empty handler.

Submit→start: one job every 50 ms into an idle Pressroom worker, timed to the moment the
renderer is called: from just before POST /v1/jobs by a client process (bench.submitter) to a
process with web and workers, with the hand-off (the job goes to the idle worker in the
submission's statement, and its render starts while that commits; the 202 answer, after the
commit, is timed too) and without (PRESSROOM_HAND_OFF=false: NOTIFY, claim); the same client
against a bare aiohttp handler (the HTTP floor); and from just before an INSERT over another
connection. The first WARMUP_JOBS of each are not counted.

    python -m bench.queue [--jobs 10000] [--slots 4,16,64] [--latency-jobs 200] [--peers all]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import web

from bench.common import (
    QUICK,
    ROOT,
    checkpoint,
    command,
    database,
    latency_summary,
    machine,
    postgres,
    running_app,
    serving,
)
from bench.noop import PDF, NoopRenderer, StartClock
from server.files.storage import fsync_folder
from server.keys import WORKERS
from server.queue import db, jobs
from server.queue.jobs import NewJob

NAME = "bench.queue"
TEMPLATE = "<p>Job {{ n }}</p>"
SETTLE_S = 1.0  # idle workers get this long to connect and LISTEN before the insert
# Jobs sent before the timed ones: they open the client's connection and prepare statements.
WARMUP_JOBS = 5
POLL_S = 0.005


def payload(n: int) -> dict[str, Any]:
    return {"template": TEMPLATE, "data": {"n": n}}


async def wait_until(check: Callable[[], Awaitable[bool]], *, timeout_s: float) -> None:
    async with asyncio.timeout(timeout_s):
        # The database has no event for "all N finished": poll it (cheaply, only at the end).
        while not await check():  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)


def drain_timeout_s(count: int) -> float:
    return 60 + count / 20  # generous: even 20 jobs/s finishes


# --- Pressroom ------------------------------------------------------------------------------


async def pressroom_drain(count: int, slots: int) -> float:
    """Jobs per second through Pressroom's workers with `slots` render slots."""
    async with database(migrated=True) as dsn:
        overrides: dict[str, Any] = {"render_slots": slots, "renderer_factory": NoopRenderer}
        async with running_app(dsn, run_web=False, **overrides) as (_base, app):
            await asyncio.sleep(SETTLE_S)
            workers = app[WORKERS]
            conn = await db.connect(dsn)
            try:
                new = [
                    NewJob(tenant="default", options={}, metadata={}, max_attempts=3, **payload(n))
                    for n in range(count)
                ]
                await jobs.create(conn, new)
                started = time.perf_counter()
                await wait_until(
                    lambda: _true(workers.rendered >= count), timeout_s=drain_timeout_s(count)
                )
                elapsed = time.perf_counter() - started
                done = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'done'")
            finally:
                await conn.close()
    if done != count:
        raise RuntimeError(f"Pressroom finished {done} of {count} jobs")
    return count / elapsed


async def _true(value: bool) -> bool:
    return value


async def submit_to_start(
    count: int, interval_s: float, slots: int
) -> tuple[list[float], list[float]]:
    """Milliseconds to the renderer's call, one job at a time: from just before the INSERT,
    and from the moment its commit returned (what the worker itself takes)."""
    clock = StartClock()
    committed: dict[float, float] = {}
    async with database(migrated=True) as dsn:
        overrides: dict[str, Any] = {"render_slots": slots, "renderer_factory": lambda _s: clock}
        async with running_app(dsn, run_web=False, **overrides) as (_base, _app):
            await asyncio.sleep(SETTLE_S)
            conn = await db.connect(dsn)
            try:
                next_at = time.perf_counter()
                for _ in range(WARMUP_JOBS + count):
                    next_at += interval_s
                    submitted = time.perf_counter()
                    new = NewJob(
                        tenant="default",
                        template="{{ t }}",
                        data={"t": repr(submitted)},
                        options={},
                        metadata={},
                        max_attempts=3,
                    )
                    await jobs.create(conn, [new])
                    committed[submitted] = time.perf_counter()
                    await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
                total = WARMUP_JOBS + count
                await wait_until(lambda: _true(len(clock.latencies_ms) >= total), timeout_s=30)
            finally:
                await conn.close()
    after_commit = [(clock.started[s] - c) * 1000 for s, c in committed.items()]
    return clock.latencies_ms[WARMUP_JOBS:], after_commit[WARMUP_JOBS:]


async def submit_to_start_http(
    count: int, interval_s: float, slots: int, *, hand_off: bool
) -> tuple[list[float], list[float]]:
    """Milliseconds from just before POST /v1/jobs to the renderer's call, one job at a time,
    into a `pressroom serve` process (web and workers) whose worker is idle: with `hand_off`
    the job goes to it in the submission's own statement, without it through the queue
    (NOTIFY, claim). The client is another process (bench.submitter); both read the
    machine's one monotonic clock. Also the milliseconds to each 202 answer, which comes once
    the job's row has committed."""
    clock = StartClock()
    async with database(migrated=True) as dsn:
        overrides: dict[str, Any] = {
            "render_slots": slots,
            "renderer_factory": lambda _s: clock,
            "hand_off": hand_off,
        }
        async with running_app(dsn, **overrides) as (base, app):
            await asyncio.sleep(SETTLE_S)
            answers = await _submitter(base, WARMUP_JOBS + count, interval_s)
            total = WARMUP_JOBS + count
            await wait_until(lambda: _true(len(clock.latencies_ms) >= total), timeout_s=30)
            handed_off = app[WORKERS].handed_off
    if hand_off and handed_off != total:
        print(f"queue   note: {total - handed_off} of {total} jobs went through the queue")
    return clock.latencies_ms[WARMUP_JOBS:], answers[WARMUP_JOBS:]


async def _submitter(base: str, count: int, interval_s: float) -> list[float]:
    """Run bench.submitter against `base`; the milliseconds to each of its answers."""
    with tempfile.TemporaryDirectory(prefix="prb-answers-") as folder:
        answers = Path(folder) / "answers.json"
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "bench.submitter",
            base,
            f"--count={count}",
            f"--interval-ms={interval_s * 1000:g}",
            f"--answers={answers}",
            cwd=ROOT,
        )
        if await client.wait() != 0:
            raise RuntimeError(f"bench.submitter exited {client.returncode}")
        result: list[float] = json.loads(answers.read_text())
        return result


async def http_floor(count: int, interval_s: float) -> list[float]:
    """The HTTP part alone: the same client and schedule against a bare aiohttp handler that
    reads the body; milliseconds from just before the POST to the handler holding the JSON."""
    arrived: list[float] = []

    async def handler(request: web.Request) -> web.Response:
        body = await request.json()
        arrived.append((time.perf_counter() - float(body["data"]["t"])) * 1000)
        return web.json_response({}, status=202)

    app = web.Application()
    app.router.add_post("/v1/jobs", handler)
    async with serving(app) as base:
        await _submitter(base, WARMUP_JOBS + count, interval_s)
    return arrived[WARMUP_JOBS:]


async def commit_floor(count: int, interval_s: float) -> list[float]:
    """Milliseconds of one durable commit (a one-row INSERT over raw asyncpg) at the same pace:
    the submission and the claim are each one, so submit→start cannot beat two of these."""
    async with database() as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("CREATE TABLE floor (id bigserial PRIMARY KEY, body jsonb)")
            latencies: list[float] = []
            next_at = time.perf_counter()
            for n in range(count):
                next_at += interval_s
                started = time.perf_counter()
                await conn.execute("INSERT INTO floor (body) VALUES ($1::jsonb)", f'{{"n": {n}}}')
                latencies.append((time.perf_counter() - started) * 1000)
                await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
        finally:
            await conn.close()
    return latencies


def durable_files(count: int, threads: int) -> float:
    """Files per second of the bare durable write every finished job needs (a folder of its
    own, synced in its parent; write, fsync, rename, fsync of the folder) from `threads`
    threads, in a temporary folder on the same filesystem as the benchmark's data: the
    storage floor."""
    root = Path(tempfile.mkdtemp(prefix="prb-files-"))
    pdf = PDF

    def one(n: int) -> None:
        folder = root / str(n)
        folder.mkdir()
        fsync_folder(root)
        tmp, final = folder / ".1.pdf.tmp", folder / "1.pdf"
        with open(tmp, "wb") as handle:
            handle.write(pdf)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, final)
        fsync_folder(folder)

    try:
        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            started = time.perf_counter()
            list(pool.map(one, range(count)))
            elapsed = time.perf_counter() - started
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return count / elapsed


# --- PgQueuer -------------------------------------------------------------------------------


async def pgqueuer_drain(count: int, dequeuers: int, batch: int) -> float:
    """Jobs per second through PgQueuer: `dequeuers` queue managers, each on its connection."""
    # "balanced": the queue table is logged (durable, as Pressroom's), the log tables are not.
    os.environ["PGQUEUER_DURABILITY"] = "balanced"
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.domain.settings import db_settings
    from pgqueuer.models import Job

    db_settings.cache_clear()
    async with database() as dsn:
        admin = await asyncpg.connect(dsn)
        await Queries(AsyncpgDriver(admin)).install()
        processed = 0
        managers: list[QueueManager] = []
        connections: list[asyncpg.Connection] = []
        for _ in range(dequeuers):
            conn = await asyncpg.connect(dsn)
            connections.append(conn)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint("render")
            async def render(job: Job) -> None:
                nonlocal processed
                processed += 1

            managers.append(qm)
        tasks = [
            asyncio.create_task(qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=5)))
            for qm in managers
        ]
        try:
            await asyncio.sleep(SETTLE_S)
            payloads = [json.dumps(payload(n)).encode() for n in range(count)]
            await Queries(AsyncpgDriver(admin)).enqueue(
                ["render"] * count, list[bytes | None](payloads), [0] * count
            )
            started = time.perf_counter()

            async def finished() -> bool:
                if processed < count:
                    return False
                left: int = await admin.fetchval("SELECT count(*) FROM pgqueuer")
                return left == 0

            await wait_until(finished, timeout_s=drain_timeout_s(count))
            elapsed = time.perf_counter() - started
        finally:
            for qm in managers:
                qm.shutdown.set()
            await _settle(tasks)
            for conn in [*connections, admin]:
                await conn.close()
    return count / elapsed


# --- Procrastinate --------------------------------------------------------------------------


async def procrastinate_drain(count: int, concurrency: int) -> float:
    """Jobs per second through one Procrastinate worker with `concurrency` sub-workers."""
    import procrastinate

    # It warns that the app is made in __main__ (true when run as `python -m bench.queue`).
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    async with database() as dsn:
        connector = procrastinate.PsycopgConnector(
            conninfo=dsn, min_size=2, max_size=max(10, concurrency + 2)
        )
        app = procrastinate.App(connector=connector)
        processed = 0

        @app.task(name="render", queue="render")
        async def render(**_kwargs: Any) -> None:
            nonlocal processed
            processed += 1

        async with app.open_async():
            await app.schema_manager.apply_schema_async()
            worker = asyncio.create_task(
                app.run_worker_async(
                    queues=["render"],
                    concurrency=concurrency,
                    wait=True,
                    install_signal_handlers=False,
                    listen_notify=True,
                )
            )
            admin = await asyncpg.connect(dsn)
            try:
                await asyncio.sleep(SETTLE_S)
                await render.batch_defer_async(*(payload(n) for n in range(count)))
                started = time.perf_counter()

                async def finished() -> bool:
                    if processed < count:
                        return False
                    done: int = await admin.fetchval(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                    )
                    return done == count

                await wait_until(finished, timeout_s=drain_timeout_s(count))
                elapsed = time.perf_counter() - started
            finally:
                worker.cancel()
                await _settle([worker])
                await admin.close()
    return count / elapsed


async def _settle(tasks: list[asyncio.Task[None]]) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(15):
            await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        task.cancel()


# --- The run --------------------------------------------------------------------------------

PGQUEUER_CONFIGS = [(1, 10), (5, 10), (2, 100), (5, 100)]  # (dequeuers, batch size)
PROCRASTINATE_CONFIGS = [10, 50]  # worker concurrency
FILE_THREADS = 32  # as many as LocalStorage writes with


async def run(args: argparse.Namespace) -> dict[str, Any]:
    slot_counts = [int(s) for s in args.slots.split(",")]
    peers = {"pgqueuer", "procrastinate"} if args.peers == "all" else set(args.peers.split(","))
    peers.discard("")
    result: dict[str, Any] = {"args": vars(args), "command": command(NAME, *_argv(args))}
    async with postgres() as server:
        ours: dict[str, float] = {}
        for slots in slot_counts:
            ours[str(slots)] = await pressroom_drain(args.jobs, slots)
            print(f"queue   Pressroom slots={slots}: {ours[str(slots)]:7.0f} jobs/s", flush=True)
        result["pressroom"] = ours
        result["pressroom_best"] = max(ours.values())
        result["pressroom_best_slots"] = int(max(ours, key=lambda k: ours[k]))
        if "pgqueuer" in peers:
            pgq: dict[str, float] = {}
            for dequeuers, batch in PGQUEUER_CONFIGS:
                rate = await pgqueuer_drain(args.jobs, dequeuers, batch)
                pgq[f"{dequeuers} managers, batch {batch}"] = rate
                print(
                    f"queue   PgQueuer {dequeuers} managers batch={batch}: {rate:7.0f} jobs/s",
                    flush=True,
                )
            result["pgqueuer"] = pgq
            result["pgqueuer_best"] = max(pgq.values())
            result["pgqueuer_best_config"] = max(pgq, key=lambda k: pgq[k])
            result["ratio_pgqueuer"] = result["pressroom_best"] / result["pgqueuer_best"]
        if "procrastinate" in peers:
            pro: dict[str, float] = {}
            for concurrency in PROCRASTINATE_CONFIGS:
                rate = await procrastinate_drain(args.jobs, concurrency)
                pro[f"concurrency {concurrency}"] = rate
                print(
                    f"queue   Procrastinate concurrency={concurrency}: {rate:7.0f} jobs/s",
                    flush=True,
                )
            result["procrastinate"] = pro
            result["procrastinate_best"] = max(pro.values())
            result["procrastinate_best_config"] = max(pro, key=lambda k: pro[k])
            result["ratio_procrastinate"] = result["pressroom_best"] / result["procrastinate_best"]
        result["file_floor"] = await asyncio.to_thread(durable_files, args.jobs, FILE_THREADS)
        result["file_threads"] = FILE_THREADS
        result["ratio_file_floor"] = result["pressroom_best"] / result["file_floor"]
        print(
            f"queue   durable file floor ({FILE_THREADS} threads): "
            f"{result['file_floor']:7.0f} files/s",
            flush=True,
        )
        # The latencies time single durable commits: the drains' and the file floor's writes
        # still on their way to the disk are written out first, before each figure.
        interval_s = args.interval_ms / 1000
        await checkpoint(server)
        over_http, answers = await submit_to_start_http(
            args.latency_jobs, interval_s, 4, hand_off=True
        )
        await checkpoint(server)
        queued, _ = await submit_to_start_http(args.latency_jobs, interval_s, 4, hand_off=False)
        bare_http = await http_floor(args.latency_jobs, interval_s)
        await checkpoint(server)
        latencies, after_commit = await submit_to_start(args.latency_jobs, interval_s, 4)
        await checkpoint(server)
        floor = await commit_floor(args.latency_jobs, interval_s)
    result["latency_http"] = latency_summary(over_http)
    result["latencies_http_ms"] = over_http
    result["latency_http_answer"] = latency_summary(answers)
    result["http_floor"] = latency_summary(bare_http)
    result["latency_http_queued"] = latency_summary(queued)
    result["latencies_http_queued_ms"] = queued
    result["latency"] = latency_summary(latencies)
    result["latencies_ms"] = latencies
    result["latency_after_commit"] = latency_summary(after_commit)
    result["commit_floor"] = latency_summary(floor)
    print_result(result)
    return result


def print_result(result: dict[str, Any]) -> None:
    line = f"queue   {result['args']['jobs']} jobs: Pressroom best {result['pressroom_best']:.0f}"
    line += f" jobs/s ({result['pressroom_best_slots']} slots)"
    if "pgqueuer_best" in result:
        line += f", PgQueuer best {result['pgqueuer_best']:.0f} ({result['pgqueuer_best_config']})"
        line += f", ratio {result['ratio_pgqueuer']:.2f}"
    if "procrastinate_best" in result:
        line += f", Procrastinate best {result['procrastinate_best']:.0f}"
        line += f" ({result['procrastinate_best_config']}), ratio "
        line += f"{result['ratio_procrastinate']:.2f}"
    print(line, flush=True)
    for key, what in (
        ("latency_http", "POST /v1/jobs→start, hand-off"),
        ("latency_http_answer", "POST /v1/jobs→202 (row committed), hand-off"),
        ("http_floor", "POST→handler, bare aiohttp"),
        ("latency_http_queued", "POST /v1/jobs→start, through the queue"),
        ("latency", "insert→start"),
        ("latency_after_commit", "commit→start"),
        ("commit_floor", "one raw commit"),
    ):
        lat = result[key]
        print(
            f"queue   {what}, one every {result['args']['interval_ms']:g} ms: "
            f"p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms",
            flush=True,
        )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=1000 if QUICK else 10_000)
    parser.add_argument("--slots", default="4,16,64")
    parser.add_argument("--latency-jobs", type=int, default=60 if QUICK else 200)
    parser.add_argument("--interval-ms", type=float, default=50)
    parser.add_argument("--peers", default="all", help="all, none, or pgqueuer,procrastinate")
    return parser


def _argv(args: argparse.Namespace) -> list[str]:
    return [
        f"--jobs {args.jobs}",
        f"--slots {args.slots}",
        f"--latency-jobs {args.latency_jobs}",
        f"--interval-ms {args.interval_ms:g}",
        f"--peers {args.peers}",
    ]


def main() -> None:
    args = parser().parse_args()
    if args.peers == "none":
        args.peers = ""
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
