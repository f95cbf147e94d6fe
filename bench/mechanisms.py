"""The worker's ways of starting a job sooner, each on and off in the same run.

Hand-off at submission (PRESSROOM_HAND_OFF) and claim-while-printing
(PRESSROOM_CLAIM_WHILE_PRINTING_S) against the defaults and against neither: one database per
configuration; in --rounds rounds, every configuration in turn starts its app (the only one
alive), warms it, prints a burst of --docs invoices at --slots slots (PDFs/s, HTTP submit →
done on SSE, as bench.render) and --latency-docs invoices one at a time (submit → job.done, as
bench.latency), beside the raw loop printing the same documents from pages with Pressroom's
print viewport. --pages 20 prints documents of about that many pages. Rows report medians
of the rounds, with the lowest and highest round in brackets.

    python -m bench.mechanisms [--docs 150] [--latency-docs 60] [--slots 2] [--rounds 3]
                               [--pages 1] [--configs defaults,no-hand-off,...]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
from typing import Any

from bench.common import (
    INVOICE,
    QUICK,
    command,
    database,
    invoice_data,
    machine,
    postgres,
    run_module,
    running_app,
)
from bench.latency import raw_latencies, summary
from bench.render import RawLoop, pressroom
from server.render import templates

NAME = "bench.mechanisms"

#: Each configuration: its name, what the report calls it, its settings ("defaults" is what a
#: user gets).
CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "defaults": ("defaults (hand-off, claim-while-printing)", {}),
    "no-hand-off": ("without hand-off", {"hand_off": False}),
    "no-claim-while-printing": ("without claim-while-printing", {"claim_while_printing_s": 0}),
    "none": ("neither", {"hand_off": False, "claim_while_printing_s": 0}),
}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    lines = 20 if args.pages <= 1 else args.pages * 32  # about 32 table lines fill an A4 page
    html = [templates.render(INVOICE, invoice_data(n, lines)) for n in range(args.docs)]
    configs = args.configs.split(",")
    rounds: dict[str, list[dict[str, float]]] = {name: [] for name in [*configs, "raw"]}
    async with postgres(), contextlib.AsyncExitStack() as stack:
        raw = await stack.enter_async_context(RawLoop(args.slots))
        raw_one = await stack.enter_async_context(RawLoop(1))
        await raw.warm(html)
        await raw_one.warm(html)
        dsns = {name: await stack.enter_async_context(database()) for name in configs}
        for _ in range(args.rounds):
            floor, _ = await raw.run(html)
            one = summary(await raw_latencies(raw_one, html[: args.latency_docs]))
            rounds["raw"].append({"pdfs_per_s": floor, **one})
            for name in configs:
                # One app alive at a time: an idle app's Chromium and pollers weigh on the others.
                app = running_app(dsns[name], render_slots=args.slots, **CONFIGS[name][1])
                async with app as (base, _):
                    await pressroom(base, args.slots * 4, 20)  # warm: Chromium, fonts, pools
                    ours, _ = await pressroom(base, args.docs, 20)
                    waits = await run_module(
                        "bench.latency", "--client", base, "--docs", str(args.latency_docs)
                    )
                rounds[name].append({"pdfs_per_s": ours, **summary(waits)})
    rows = []
    raw_row = {key: statistics.median(r[key] for r in rounds["raw"]) for key in rounds["raw"][0]}
    for name in configs:
        label, overrides = CONFIGS[name]
        row: dict[str, Any] = {"config": label, "settings": overrides}
        for key in ("pdfs_per_s", "p50", "p99"):
            row[key] = statistics.median(r[key] for r in rounds[name])
            row[f"{key}_range"] = (
                min(r[key] for r in rounds[name]),
                max(r[key] for r in rounds[name]),
            )
        row["ratio"] = row["pdfs_per_s"] / raw_row["pdfs_per_s"]
        row["added_p50"] = row["p50"] - raw_row["p50"]
        row["added_p99"] = row["p99"] - raw_row["p99"]
        rows.append(row)
        print(
            f"mechanisms pages={args.pages} {label:45} {row['pdfs_per_s']:6.1f} PDF/s "
            f"[{_range(row['pdfs_per_s_range'])}] (ratio {row['ratio']:.2f}); one at a time p50 "
            f"{row['p50']:5.1f} ms [{_range(row['p50_range'])}] ({row['added_p50']:+.1f}), p99 "
            f"{row['p99']:5.1f} ms [{_range(row['p99_range'])}] ({row['added_p99']:+.1f})",
            flush=True,
        )
    print(
        f"mechanisms raw loop (print viewport) {raw_row['pdfs_per_s']:6.1f} PDF/s; one at a "
        f"time p50 {raw_row['p50']:.1f} ms, p99 {raw_row['p99']:.1f} ms",
        flush=True,
    )
    return {
        "args": vars(args),
        "command": command(
            NAME,
            f"--docs {args.docs}",
            f"--latency-docs {args.latency_docs}",
            f"--slots {args.slots}",
            f"--rounds {args.rounds}",
            f"--pages {args.pages}",
            f"--configs {args.configs}",
        ),
        "raw": raw_row,
        "rows": rows,
        "rounds": rounds,
    }


def _range(pair: tuple[float, float]) -> str:
    return f"{pair[0]:.1f} to {pair[1]:.1f}"


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=20 if QUICK else 150)
    parser.add_argument("--latency-docs", type=int, default=10 if QUICK else 60)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 3)
    parser.add_argument("--pages", type=int, default=1, help="pages per document, about")
    parser.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"a subset of {','.join(CONFIGS)}"
    )
    return parser


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
