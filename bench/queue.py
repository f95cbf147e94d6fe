"""Queue path: drain N queued jobs through Pressroom's workers with a no-op renderer, next to
PgQueuer and Procrastinate on the same PostgreSQL server in the same run.

Each system gets a fresh database and the same payload per job (a one-line template and its
data). Its workers start first and sit idle; then the N jobs are inserted in one transaction,
and the clock runs from that commit until every job is finished. Pressroom's jobs go the
whole way (claim with its `job.running` event, template, a tiny PDF stored durably in the
local folder, done with its `job.done` event); the others' run an empty handler. PgQueuer
runs with durability `balanced` (its queue table logged, as Pressroom's is), with each
--pgqueuer configuration (queue managers x batch size); Procrastinate with one worker at each
--procrastinate concurrency. The best of each system is compared.

    python -m bench.queue [--jobs 10000] [--slots 4,16,64] [--pgqueuer 1x10,5x10,2x100,5x100]
                          [--procrastinate 10,50]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import asyncpg

from bench import common
from bench.common import QUICK, database, new_job, postgres, running_app
from server.keys import WORKERS
from server.options import RenderOptions
from server.queue import db, jobs
from server.render.chromium import Assets, RenderResult
from server.render.sources import Document
from server.settings import Settings

TEMPLATE = "<p>Job {{ n }}</p>"
SETTLE_S = 0.2 if QUICK else 1.0  # idle workers get this long to connect and LISTEN
POLL_S = 0.005


def tiny_pdf() -> bytes:
    """A valid one-page blank PDF, built by hand."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\n" % (len(objects) + 1)
    out += b"startxref\n%d\n%%%%EOF\n" % xref
    return bytes(out)


class NoopRenderer:
    """The same tiny PDF for every job, at once: the queue is measured, not Chromium."""

    PDF = tiny_pdf()

    def __init__(self, settings: Settings) -> None:
        pass

    async def render(
        self,
        html: Document,
        options: RenderOptions,
        *,
        timeout_s: float,
        on_print: Callable[[], None] | None = None,
        assets: Assets | None = None,
    ) -> RenderResult:
        return RenderResult(data=self.PDF, pages=1, warnings=[])

    async def check(self) -> None:
        return None


def payload(n: int) -> dict[str, Any]:
    return {"template": TEMPLATE, "data": {"n": n}}


async def drained(finished: Callable[[], Awaitable[bool]], count: int) -> float:
    """Seconds until `finished()`, from now (just after the insert's commit)."""
    started = time.perf_counter()
    async with asyncio.timeout(60 + count / 20):  # generous: even 20 jobs/s finishes
        # The database has no event for "all N finished": poll it (cheaply, only at the end).
        while not await finished():  # noqa: ASYNC110
            await asyncio.sleep(POLL_S)
    return time.perf_counter() - started


async def pressroom(count: int, slots: int) -> float:
    """Jobs per second through Pressroom's workers with `slots` render slots."""
    overrides: dict[str, Any] = {"render_slots": slots, "renderer_factory": NoopRenderer}
    async with database() as dsn, running_app(dsn, run_web=False, **overrides) as (_base, app):
        await asyncio.sleep(SETTLE_S)
        workers = app[WORKERS]
        conn = await db.connect(dsn)
        try:
            await jobs.create(conn, [new_job(**payload(n)) for n in range(count)])

            async def finished() -> bool:
                return workers.rendered >= count

            elapsed = await drained(finished, count)
            done = await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'done'")
        finally:
            await conn.close()
    if done != count:
        raise RuntimeError(f"Pressroom finished {done} of {count} jobs")
    return count / elapsed


async def pgqueuer(count: int, managers: int, batch: int) -> float:
    """Jobs per second through PgQueuer: `managers` queue managers, each on its connection."""
    # "balanced": the queue table is logged (durable, as Pressroom's), the log tables are not.
    os.environ["PGQUEUER_DURABILITY"] = "balanced"
    from pgqueuer import AsyncpgDriver, Queries, QueueManager
    from pgqueuer.domain.settings import db_settings
    from pgqueuer.models import Job

    db_settings.cache_clear()
    processed = 0
    async with database(migrated=False) as dsn, contextlib.AsyncExitStack() as stack:
        admin = await asyncpg.connect(dsn)
        stack.push_async_callback(admin.close)
        await Queries(AsyncpgDriver(admin)).install()
        queue_managers = []
        for _ in range(managers):
            conn = await asyncpg.connect(dsn)
            stack.push_async_callback(conn.close)
            qm = QueueManager(Queries(AsyncpgDriver(conn)))

            @qm.entrypoint("render")
            async def render(job: Job) -> None:
                nonlocal processed
                processed += 1

            queue_managers.append(qm)
        tasks = [
            asyncio.create_task(qm.run(batch_size=batch, dequeue_timeout=timedelta(seconds=5)))
            for qm in queue_managers
        ]
        try:
            await asyncio.sleep(SETTLE_S)
            payloads: list[bytes | None] = [json.dumps(payload(n)).encode() for n in range(count)]
            await Queries(AsyncpgDriver(admin)).enqueue(["render"] * count, payloads, [0] * count)

            async def finished() -> bool:
                return processed >= count and not await admin.fetchval(
                    "SELECT EXISTS (SELECT 1 FROM pgqueuer)"
                )

            elapsed = await drained(finished, count)
        finally:
            for qm in queue_managers:
                qm.shutdown.set()
            await settle(tasks)
    return count / elapsed


async def procrastinate(count: int, concurrency: int) -> float:
    """Jobs per second through one Procrastinate worker with `concurrency` sub-workers."""
    import procrastinate

    # It warns that the app is made in __main__ (true when run as `python -m bench.queue`).
    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    processed = 0
    async with database(migrated=False) as dsn:
        connector = procrastinate.PsycopgConnector(
            conninfo=dsn, min_size=2, max_size=max(10, concurrency + 2)
        )
        app = procrastinate.App(connector=connector)

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

                async def finished() -> bool:
                    return processed >= count and count == await admin.fetchval(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                    )

                elapsed = await drained(finished, count)
            finally:
                worker.cancel()
                await settle([worker])
                await admin.close()
    return count / elapsed


async def settle(tasks: list[asyncio.Task[None]]) -> None:
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(15):
            await asyncio.gather(*tasks, return_exceptions=True)
    for task in tasks:
        task.cancel()


async def run(args: argparse.Namespace) -> None:
    best: dict[str, tuple[float, str]] = {}

    def note(system: str, config: str, rate: float) -> None:
        print(f"queue   {system}, {config}: {rate:7.0f} jobs/s")
        if rate > best.get(system, (0.0, ""))[0]:
            best[system] = (rate, config)

    async with postgres():
        for slots in (int(s) for s in args.slots.split(",")):
            note("Pressroom", f"{slots} slots", await pressroom(args.jobs, slots))
        for config in args.pgqueuer.split(","):
            managers, batch = (int(n) for n in config.split("x"))
            rate = await pgqueuer(args.jobs, managers, batch)
            note("PgQueuer", f"{managers} managers, batch {batch}", rate)
        for concurrency in (int(c) for c in args.procrastinate.split(",")):
            rate = await procrastinate(args.jobs, concurrency)
            note("Procrastinate", f"concurrency {concurrency}", rate)
    ours, config = best["Pressroom"]
    ratios = {system: ours / rate for system, (rate, _) in best.items() if system != "Pressroom"}
    print(
        f"queue   {args.jobs} jobs, the best of each: Pressroom {ours:.0f} jobs/s ({config}); "
        + "; ".join(
            f"{system} {best[system][0]:.0f} ({best[system][1]}), ratio {ratio:.2f}"
            for system, ratio in ratios.items()
        ),
    )


def parser() -> argparse.ArgumentParser:
    parser = common.arguments(__doc__)
    parser.add_argument("--jobs", type=int, default=1000 if QUICK else 10_000)
    parser.add_argument("--slots", default="4,16,64", help="Pressroom's render slots, each run")
    parser.add_argument("--pgqueuer", default="1x10,5x10,2x100,5x100", help="managers x batch")
    parser.add_argument("--procrastinate", default="10,50", help="worker concurrency, each run")
    return parser


if __name__ == "__main__":
    common.main(parser, run)
