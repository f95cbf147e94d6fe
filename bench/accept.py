"""Accept path (P1): POST /v1/jobs against raw asyncpg inserts of the same rows (the floor).

Pressroom runs web only (render_slots=0). The floor runs Pressroom's own insert statement (one
job row + one job.queued event + NOTIFY, one transaction per job) over 16 connections. Each
figure gets a fresh database on the same server, and the load comes from a child process.

    python -m bench.accept [--duration S] [--clients 32] [--rate 500] [--connections 16]
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

from bench.common import (
    QUICK,
    command,
    database,
    latency_summary,
    machine,
    postgres,
    run_module,
    running_app,
)

NAME = "bench.accept"


async def pressroom(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    async with database() as dsn, running_app(dsn, render_slots=0) as (base, _app):
        load = ["http", "--url", base, "--mode", mode, "--duration", str(args.duration)]
        load += ["--concurrency", str(args.clients), "--rate", str(args.rate)]
        result: dict[str, Any] = await run_module("bench.load", *load)
    return result


async def floor(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    async with database(migrated=True) as dsn:
        load = ["raw", "--dsn", dsn, "--mode", mode, "--duration", str(args.duration)]
        load += ["--concurrency", str(args.clients), "--rate", str(args.rate)]
        load += ["--connections", str(args.connections)]
        result: dict[str, Any] = await run_module("bench.load", *load)
    return result


def _row(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "requests": result["requests"],
        "errors": result["errors"],
        "rate": result["rate"],
        **latency_summary(result["latencies_ms"]),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Throughput (closed loop) and latency at a fixed rate (open loop), ours and the floor's."""
    async with postgres():
        ours_closed = await pressroom("closed", args)
        raw_closed = await floor("closed", args)
        ours_open = await pressroom("open", args)
        raw_open = await floor("open", args)
    result = {
        "args": vars(args),
        "command": command(NAME, *_argv(args)),
        "throughput": {"pressroom": _row(ours_closed), "raw": _row(raw_closed)},
        "fixed_rate": {"pressroom": _row(ours_open), "raw": _row(raw_open)},
        "ratio": ours_closed["rate"] / raw_closed["rate"],
        "latencies_ms": {
            "pressroom": ours_open["latencies_ms"],
            "raw": raw_open["latencies_ms"],
        },
    }
    print_result(result)
    return result


def print_result(result: dict[str, Any]) -> None:
    args = result["args"]
    ours, raw = result["throughput"]["pressroom"], result["throughput"]["raw"]
    print(
        f"accept  {args['clients']} clients: Pressroom {ours['rate']:7.0f} jobs/s "
        f"(p50 {ours['p50_ms']:.1f} ms), raw asyncpg x{args['connections']} "
        f"{raw['rate']:7.0f} inserts/s (p50 {raw['p50_ms']:.1f} ms), ratio {result['ratio']:.2f}",
        flush=True,
    )
    ours, raw = result["fixed_rate"]["pressroom"], result["fixed_rate"]["raw"]
    print(
        f"accept  at {args['rate']:g}/s: Pressroom p50 {ours['p50_ms']:.2f} ms "
        f"p99 {ours['p99_ms']:.2f} ms, raw p50 {raw['p50_ms']:.2f} ms p99 {raw['p99_ms']:.2f} ms",
        flush=True,
    )


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3 if QUICK else 15)
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rate", type=float, default=500)
    parser.add_argument("--connections", type=int, default=16)
    return parser


def _argv(args: argparse.Namespace) -> list[str]:
    return [
        f"--duration {args.duration:g}",
        f"--clients {args.clients}",
        f"--rate {args.rate:g}",
        f"--connections {args.connections}",
    ]


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
