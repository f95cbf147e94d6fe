"""Accept path: POST /v1/jobs through Pressroom against a bare aiohttp handler that runs the
same insert, in the same run.

Pressroom runs web only (no render slots, dev mode). The baseline is the least an HTTP service
of this design does for a job: aiohttp reads the JSON body, inserts the job with Pressroom's
own statement (the job row, its `job.queued` event and NOTIFY, one transaction per request)
over --connections pooled connections, and answers 202. Each gets a fresh database on the
same server. The load comes from a client in a process of its own: --clients clients in a
closed loop for --duration seconds (throughput), then requests on a fixed schedule of --rate
per second for as long (latency, counted from each request's scheduled moment, so that a
stall is not hidden by a client waiting for it).

With --tracing, the same load against Pressroom with tracing off and on (server/tracing.py:
every request a span, exported over OTLP/HTTP to a receiver on loopback, bench/otlp.py), in
--rounds rounds of both in alternating order; the ratios on/off of each round, and their median.

    python -m bench.accept [--duration 15] [--clients 32] [--rate 500] [--connections 16]
                           [--tracing [--rounds 3]]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
from aiohttp import web

from bench import common, otlp
from bench.common import QUICK, database, new_job, postgres, run_client, running_app, summary
from server.queue import db, jobs


@contextlib.asynccontextmanager
async def bare_service(dsn: str, connections: int) -> AsyncIterator[str]:
    """The baseline: POST /v1/jobs reads the body and inserts the job, nothing else."""
    pool = await db.create_pool(dsn, min_size=connections, max_size=connections)

    async def submit(request: web.Request) -> web.Response:
        body = await request.json()
        new = new_job(body["template"], body["data"])
        await jobs.create(pool, [new])
        return web.json_response({"id": str(new.id), "status": "queued"}, status=202)

    app = web.Application()
    app.router.add_post("/v1/jobs", submit)
    try:
        async with common.serving(app) as base:
            yield base
    finally:
        await pool.close()


async def run(args: argparse.Namespace) -> None:
    load = ["--clients", str(args.clients), "--duration", str(args.duration)]
    load += ["--rate", str(args.rate)]
    if args.tracing:
        await traced(args, load)
        return
    async with (
        postgres(),
        database() as dsn,
        running_app(dsn, render_slots=0) as (base, _app),
        database() as bare_dsn,
        bare_service(bare_dsn, args.connections) as bare_base,
    ):
        ours, bare = await run_client("load", base, bare_base, *load)
    for side in (ours, bare):
        side |= summary(side.pop("ms"))
    ratio = ours["jobs_per_s"] / bare["jobs_per_s"]
    print(
        f"accept  {args.clients} clients: Pressroom {ours['jobs_per_s']:7.0f} jobs/s, bare "
        f"aiohttp + insert ({args.connections} connections) {bare['jobs_per_s']:7.0f} jobs/s, "
        f"ratio {ratio:.2f}\n"
        f"accept  at {args.rate:g}/s: Pressroom p50 {ours['p50']:.2f} ms p99 {ours['p99']:.2f} "
        f"ms, bare p50 {bare['p50']:.2f} ms p99 {bare['p99']:.2f} ms, ratio p99 "
        f"{ours['p99'] / bare['p99']:.2f}",
    )


async def traced(args: argparse.Namespace, load: list[str]) -> None:
    """The same load with tracing off and on, in alternating order, --rounds times."""
    async with (
        postgres(),
        database() as dsn,
        running_app(dsn, render_slots=0) as (base, _app),
        otlp.receiving() as switch,
    ):

        async def measure() -> dict[str, Any]:
            result: dict[str, Any]
            [result] = await run_client("load", base, *load)
            return result | summary(result.pop("ms"))

        rounds = [await switch.off_and_on(n, measure) for n in range(args.rounds)]
        conn = await asyncpg.connect(dsn)
        traced_jobs = await conn.fetchval("SELECT count(*) FROM jobs WHERE traceparent IS NOT NULL")
        await conn.close()
    rate = [r["on"]["jobs_per_s"] / r["off"]["jobs_per_s"] for r in rounds]
    p99 = [r["on"]["p99"] / r["off"]["p99"] for r in rounds]
    median = {
        side: {k: statistics.median(r[side][k] for r in rounds) for k in ("jobs_per_s", "p99")}
        for side in ("off", "on")
    }
    print(
        f"accept  tracing, {args.clients} clients: off {median['off']['jobs_per_s']:7.0f} jobs/s, "
        f"on {median['on']['jobs_per_s']:7.0f} jobs/s, ratio on/off {otlp.spread(rate)}\n"
        f"accept  tracing at {args.rate:g}/s: p99 off {median['off']['p99']:.2f} ms, on "
        f"{median['on']['p99']:.2f} ms, ratio on/off {otlp.spread(p99)}; "
        f"{switch.spans} spans in {switch.traces} traces received for {traced_jobs} jobs traced",
    )


def parser() -> argparse.ArgumentParser:
    parser = common.arguments(__doc__)
    parser.add_argument("--duration", type=float, default=3 if QUICK else 15, help="seconds")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rate", type=float, default=500, help="requests per second")
    parser.add_argument("--connections", type=int, default=16, help="the baseline's pool")
    parser.add_argument(
        "--tracing", action="store_true", help="tracing off against on instead of the baseline"
    )
    parser.add_argument("--rounds", type=int, default=3, help="with --tracing")
    return parser


if __name__ == "__main__":
    common.main(parser, run)
