"""Submit→PDF latency on an idle server, one job at a time, against the raw print of the same
page, one at a time.

Pressroom: a client in a process of its own follows the all-jobs stream live (`job.done`,
`job.failed` only), then for each document takes the time, POSTs it and waits for its
`job.done`: the latency a user waiting on SSE sees, the PDF stored and the event committed.
The floor: bench.render's raw loop with one page of the same engine, timed per document. Both
are started once and warmed, then alternate in --rounds rounds of --docs documents; the
medians of the rounds' p50 and p99 are printed, with what Pressroom adds to the raw print.

    python -m bench.latency [--docs 100] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

from bench.clients import INVOICE, burst, invoice_data
from bench.common import (
    QUICK,
    checkpoint,
    database,
    machine,
    postgres,
    run_module,
    running_app,
    summary,
)
from bench.render import RawLoop
from server.render import templates


async def raw_latencies(raw: RawLoop, html: list[str]) -> list[float]:
    """Milliseconds per document on the raw loop's pages, one document at a time."""
    times = []
    for doc in html:
        started = time.perf_counter()
        await raw.run([doc])
        times.append((time.perf_counter() - started) * 1000)
    return times


async def run(args: argparse.Namespace) -> dict[str, Any]:
    html = [templates.render(INVOICE, invoice_data(n)) for n in range(args.docs)]
    rounds: list[dict[str, float]] = []
    async with (
        postgres(),
        RawLoop(1) as raw,
        database() as dsn,
        running_app(dsn) as (base, _app),
    ):
        await raw.warm(html)
        await burst(base, 4)
        await checkpoint(dsn)
        for _ in range(args.rounds):
            floor = summary(await raw_latencies(raw, html))
            timed = await run_module("bench.clients", "one-at-a-time", base, f"--docs={args.docs}")
            ours = summary(timed)
            rounds.append(
                {
                    "raw_p50": floor["p50"],
                    "raw_p99": floor["p99"],
                    "p50": ours["p50"],
                    "p99": ours["p99"],
                }
            )
    row = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    print(
        f"latency {args.docs} docs, one at a time, median of {args.rounds} rounds: raw print p50 "
        f"{row['raw_p50']:.1f} ms, p99 {row['raw_p99']:.1f} ms; Pressroom submit→job.done p50 "
        f"{row['p50']:.1f} ms ({row['p50'] - row['raw_p50']:+.1f}), p99 {row['p99']:.1f} ms "
        f"({row['p99'] - row['raw_p99']:+.1f})",
        flush=True,
    )
    return row


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=20 if QUICK else 100, help="per round")
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 3)
    return parser


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
