"""Accept path (P1): POST /v1/jobs against raw asyncpg inserts of the same rows (the floor).

Pressroom runs web only (render_slots=0). The floor runs Pressroom's own insert statement (one
job row + one job.queued event + NOTIFY, one transaction per job) over 16 connections. Each
figure gets a fresh database on the same server, and the load comes from a child process.

    python -m bench.accept [--duration S] [--clients 32] [--rate 500] [--connections 16]

With --cors it measures what CORS costs instead: two Pressrooms, each on its own fresh
database, CORS off (no PRESSROOM_CORS_ORIGINS, requests without Origin) and on (an allowed
Origin on every request, so every answer carries the CORS headers); --rounds rounds of one
closed-loop run of --duration seconds against each, the order swapped every round, so that
both sides see the same machine. It prints each round's throughput and server CPU per job
(this process's CPU time, where both apps run; PostgreSQL's is not in it) of each side, then
the medians and the median, lowest and highest of the rounds' on/off ratios.

    python -m bench.accept --cors [--rounds 10] [--duration S] [--clients 32]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
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
#: The page origin of the CORS rounds: allowed by PRESSROOM_CORS_ORIGINS, sent as Origin.
CORS_ORIGIN = "https://app.example.com"


async def pressroom(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    async with database() as dsn, running_app(dsn, render_slots=0) as (base, _app):
        return await load(base, mode, args)


async def load(
    base: str,
    mode: str,
    args: argparse.Namespace,
    origin: str | None = None,
    *,
    warmup_s: float | None = None,
) -> dict[str, Any]:
    """POST /v1/jobs to the Pressroom at `base` from a child process, with `origin` as Origin."""
    load = ["http", "--url", base, "--mode", mode, "--duration", str(args.duration)]
    load += ["--concurrency", str(args.clients), "--rate", str(args.rate)]
    if origin is not None:
        load += ["--origin", origin]
    if warmup_s is not None:
        load += ["--warmup", str(warmup_s)]
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
    if args.cors:
        return await run_cors(args)
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


async def run_cors(args: argparse.Namespace) -> dict[str, Any]:
    """Closed-loop throughput, and the server's CPU per job, with CORS off and on, in turn."""
    figures: dict[str, dict[str, list[float]]] = {
        side: {"rate": [], "cpu_ms": []} for side in ("off", "on")
    }
    async with postgres(), contextlib.AsyncExitStack() as stack:
        bases: dict[str, str] = {}
        for side, origins in (("off", ()), ("on", (CORS_ORIGIN,))):
            dsn = await stack.enter_async_context(database())
            app = running_app(dsn, render_slots=0, cors_origins=origins)
            bases[side], _ = await stack.enter_async_context(app)
            await load(bases[side], "closed", args, warmup_s=0)  # warm: pools, caches
        for n in range(args.rounds):
            for side in ("off", "on") if n % 2 == 0 else ("on", "off"):
                # Both apps run in this process: its CPU time is theirs (the idle one's is
                # next to none), and it moves less than throughput with other work on the
                # machine.
                cpu_s = time.process_time()
                got = await load(
                    bases[side], "closed", args, CORS_ORIGIN if side == "on" else None, warmup_s=0
                )
                cpu_s = time.process_time() - cpu_s
                if got["errors"]:
                    raise RuntimeError(f"{got['errors']} requests failed with CORS {side}")
                figures[side]["rate"].append(got["rate"])
                figures[side]["cpu_ms"].append(cpu_s * 1000 / got["requests"])
    result = {
        "args": vars(args),
        "command": command(NAME, "--cors", f"--rounds {args.rounds}", *_argv(args)[:2]),
        "cors": {"origin": CORS_ORIGIN, **figures},
    }
    print_cors(result)
    return result


def _on_off(figures: dict[str, dict[str, list[float]]], key: str, shown: str) -> str:
    """Medians of one figure, off and on, and their ratio round by round: median (range)."""
    off, on = figures["off"][key], figures["on"][key]
    ratios = [b / a for a, b in zip(off, on, strict=True)]
    return (
        f"off {statistics.median(off):{shown}}, on {statistics.median(on):{shown}}; on/off "
        f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"
    )


def print_cors(result: dict[str, Any]) -> None:
    args, cors = result["args"], result["cors"]
    for n in range(len(cors["off"]["rate"])):
        print(
            f"accept  CORS round {n + 1}: "
            + ", ".join(
                f"{side} {cors[side]['rate'][n]:6.0f} jobs/s {cors[side]['cpu_ms'][n]:.3f} ms CPU"
                for side in ("off", "on")
            )
        )
    print(
        f"accept  CORS, {args['clients']} clients, {args['rounds']} rounds of "
        f"{args['duration']:g} s (medians; on/off by round: median (lowest-highest)):\n"
        f"  jobs/s:            {_on_off(cors, 'rate', '.0f')}\n"
        f"  server CPU ms/job: {_on_off(cors, 'cpu_ms', '.3f')}",
        flush=True,
    )


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
    parser.add_argument("--cors", action="store_true", help="CORS off against on (see above)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of --cors")
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
