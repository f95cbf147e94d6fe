"""Submit→PDF latency on an idle server, one job at a time, against a raw loop printing the
same page one at a time.

Pressroom: a client in a process of its own follows the all-jobs stream live (`job.done`,
`job.failed` only), then for each document takes the time, POSTs it and waits for its
`job.done`: that span is the latency a user waiting on SSE sees, the file stored and the
event committed. The floor: one reused page of the same engine, `set_content` then `pdf`
with Pressroom's PDF arguments, timed per document. Then Pressroom's own renderer alone
(the app's render call, nothing around it), the same way. Between them, the bare service
(bench/bare.py: the least a service of this design can do, printing on the same page) is
timed by the same client: the latency no service of this design reaches below. All three are
started once and warmed, then alternate in --rounds rounds of --docs documents; the report
gives the medians of the rounds' p50 and p99, and the difference each service adds.

    python -m bench.latency [--docs 100] [--rounds 3]
    python -m bench.latency --client URL --docs N   (the client; prints one JSON line)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import ClientSession

from bench.bare import BareService
from bench.common import (
    FINAL_TYPES,
    INVOICE,
    QUICK,
    RENDER_TIMEOUT_S,
    checkpoint,
    command,
    database,
    invoice_data,
    machine,
    percentile,
    postgres,
    run_module,
    running_app,
    until_done,
)
from bench.render import RawLoop
from server.keys import CHROMIUM, METRICS
from server.options import RenderOptions
from server.pipeline.worker import Phase
from server.queue.metrics import Metrics
from server.render import templates

NAME = "bench.latency"
#: Issue 19's targets: what Pressroom may add to the raw print, at p50 and at p99.
TARGET_ADDED_MS = {"p50": 3.0, "p99": 6.0}


async def client(url: str, docs: int) -> list[float]:
    """Milliseconds from each POST to its job.done on the stream, one job at a time."""
    latencies: list[float] = []
    async with ClientSession() as session:
        async with session.get(f"{url}/v1/events?type={FINAL_TYPES}") as stream:
            for n in range(docs):
                body = {"template": INVOICE, "data": invoice_data(n)}
                started = time.perf_counter()
                async with session.post(f"{url}/v1/jobs", json=body) as resp:
                    assert resp.status == 202, await resp.text()
                    job_id = str((await resp.json())["id"])
                await until_done(stream, {job_id})
                latencies.append((time.perf_counter() - started) * 1000)
    return latencies


async def latencies(print_one: Callable[[str], Awaitable[object]], html: list[str]) -> list[float]:
    """Milliseconds per document for `print_one`, one document at a time."""
    times: list[float] = []
    for doc in html:
        started = time.perf_counter()
        await print_one(doc)
        times.append((time.perf_counter() - started) * 1000)
    return times


async def raw_latencies(raw: RawLoop, html: list[str]) -> list[float]:
    """Milliseconds per document for the raw loop's single page."""
    return await latencies(lambda doc: raw.run([doc]), html)


#: The phases a job passes in the worker, in order (bench.latency reports their means).
PHASES = [Phase.PREPARING, Phase.RENDERING, Phase.PRINTING, Phase.STORING, Phase.RECORDING]
PHASE_METRIC = "pressroom_job_phase_duration_seconds"


def phase_totals(metrics: Metrics) -> dict[str, float]:
    """Seconds spent so far in each phase, summed over every attempt (from /metrics)."""
    totals = {}
    for phase in PHASES:
        value = metrics.registry.get_sample_value(f"{PHASE_METRIC}_sum", {"phase": phase.value})
        totals[phase.value] = value or 0.0
    return totals


def summary(latencies: list[float]) -> dict[str, float]:
    return {"p50": percentile(latencies, 50), "p99": percentile(latencies, 99)}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    html = [templates.render(INVOICE, invoice_data(n)) for n in range(args.docs)]
    rounds: list[dict[str, float]] = []
    async with (
        postgres(),
        RawLoop(1) as raw,
        database() as dsn,
        running_app(dsn) as (base, app),
        database() as bare_dsn,
        BareService(bare_dsn, raw) as bare,
    ):
        await raw.warm(html)
        await run_module(NAME, "--client", base, "--docs", "4")
        await run_module(NAME, "--client", bare.base, "--docs", "4")
        await checkpoint(dsn)
        options = RenderOptions()

        async def renderer_alone(doc: str) -> object:
            """Pressroom's own renderer: the app's render call, nothing around it."""
            return await app[CHROMIUM].render(doc, options, timeout_s=RENDER_TIMEOUT_S)

        for _ in range(args.rounds):
            floor = summary(await raw_latencies(raw, html))
            alone = summary(await latencies(renderer_alone, html))
            least = summary(await run_module(NAME, "--client", bare.base, "--docs", str(args.docs)))
            before = phase_totals(app[METRICS])
            timed = await run_module(NAME, "--client", base, "--docs", str(args.docs))
            after = phase_totals(app[METRICS])
            ours = summary(timed)
            spent = {p: (after[p] - before[p]) * 1000 / args.docs for p in after}
            rounds.append(
                {
                    "mean": statistics.fmean(timed),
                    **{f"phase_{p}": ms for p, ms in spent.items()},
                    "outside_worker": statistics.fmean(timed) - sum(spent.values()),
                    "raw_p50": floor["p50"],
                    "raw_p99": floor["p99"],
                    "p50": ours["p50"],
                    "p99": ours["p99"],
                    "added_p50": ours["p50"] - floor["p50"],
                    "added_p99": ours["p99"] - floor["p99"],
                    "renderer_added_p50": alone["p50"] - floor["p50"],
                    "renderer_added_p99": alone["p99"] - floor["p99"],
                    "bare_p50": least["p50"],
                    "bare_p99": least["p99"],
                    "bare_added_p50": least["p50"] - floor["p50"],
                    "bare_added_p99": least["p99"] - floor["p99"],
                }
            )
    row = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(
        f"latency docs={args.docs}: raw print p50 {row['raw_p50']:.1f} ms p99 "
        f"{row['raw_p99']:.1f} ms; Pressroom submit→job.done p50 {row['p50']:.1f} ms p99 "
        f"{row['p99']:.1f} ms; added p50 {row['added_p50']:+.1f} ms p99 {row['added_p99']:+.1f} ms "
        f"(median of {args.rounds} rounds)",
        flush=True,
    )
    print(
        f"latency Pressroom's renderer alone adds p50 {row['renderer_added_p50']:+.1f} ms p99 "
        f"{row['renderer_added_p99']:+.1f} ms to the raw print",
        flush=True,
    )
    print(
        f"latency the bare service (bench/bare.py) submit→job.done p50 {row['bare_p50']:.1f} ms "
        f"p99 {row['bare_p99']:.1f} ms; added p50 {row['bare_added_p50']:+.1f} ms p99 "
        f"{row['bare_added_p99']:+.1f} ms",
        flush=True,
    )
    phases = ", ".join(f"{p.value} {row[f'phase_{p.value}']:.1f}" for p in PHASES)
    print(
        f"latency Pressroom's mean {row['mean']:.1f} ms: in the worker {phases}; outside it "
        f"(HTTP, the insert's commit before the job starts, the event to the client) "
        f"{row['outside_worker']:.1f} ms",
        flush=True,
    )
    return {
        "args": vars(args),
        "command": command(NAME, f"--docs {args.docs}", f"--rounds {args.rounds}"),
        "row": row,
        "rounds": rounds,
        "targets_added_ms": TARGET_ADDED_MS,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=20 if QUICK else 100, help="per round")
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 3)
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.client:
        print(json.dumps(asyncio.run(client(args.client, args.docs))))
        return
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
