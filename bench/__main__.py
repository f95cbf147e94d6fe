"""Every benchmark in one run, then the report: `python -m bench` (what `make bench` runs).

Full sizes write docs/performance.md and its plots, and keep the figures in
bench/results.json (`python -m bench.report` renders the report from them again). With
BENCH_QUICK=1 the sizes are reduced and everything goes to --out (a new temporary folder by
default), so a quick run never overwrites the committed report. --tiny shrinks the quick sizes
further (the suite's test).
bench/push.py, when present, runs as `python -m bench.push` (--quick in quick mode).
bench/dbcost.py starts a PostgreSQL cluster of its own from Debian's server package (the
wheel's server has no pg_stat_statements).

    python -m bench [--out DIR] [--only accept,queue,...,profile] [--tiny]
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import (
    accept,
    budget,
    dbcost,
    drain,
    egress,
    in_flight,
    latency,
    mechanisms,
    plans,
    profile,
    queue,
    render,
    report,
    soak,
    writepath,
)
from bench.common import QUICK, ROOT, machine, postgres, server_version
from server.render.chromium import find_system_chromium

ALL = [
    "accept",
    "queue",
    "in_flight",
    "render",
    "budget",
    "plans",
    "egress",
    "latency",
    "mechanisms",
    "soak",
    "push",
    "writepath",
    "dbcost",
    "drain",
    "profile",
]

#: Arguments per benchmark in --tiny mode (on top of the quick defaults).
TINY = {
    "accept": ["--duration", "1"],
    "queue": ["--jobs", "300", "--slots", "4,16", "--latency-jobs", "20"],
    "in_flight": ["--jobs", "20", "--backlog", "500"],
    "render": "--docs 4 --slots 1 --pages 1,20 --rounds 1 --finish-docs 1".split(),
    "latency": ["--docs", "5", "--rounds", "1"],
    "mechanisms": "--docs 4 --latency-docs 2 --rounds 1 --configs defaults".split(),
    "egress": ["--docs", "4", "--slots", "1", "--rounds", "1"],
    "budget": ["--docs", "6", "--slots", "1", "--rounds", "1"],
    "plans": ["--jobs", "40"],
    "soak": ["--jobs", "100", "--every", "50", "--from-job", "50"],
    "writepath": ["--rounds", "1", "--jobs", "2", "--batch", "10", "--batches", "1"],
    "dbcost": ["--jobs", "50", "--ceiling-s", "0.3"],
    "drain": ["--jobs", "300", "--processes", "2"],
    "profile": ["--duration", "1"],
}
PUSH_TIMEOUT_S = 900


def chromium_version() -> str:
    executable = os.environ.get("PRESSROOM_CHROMIUM") or find_system_chromium()
    if executable is None:
        return "Playwright's own build"
    try:
        out = subprocess.run(
            [executable, "--version"], capture_output=True, text=True, timeout=30, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return executable
    return f"{out.stdout.strip()} ({executable})"


def push(tiny: bool) -> dict[str, Any]:
    """bench/push.py (push latency and fan-out) runs as its own command; its JSON comes back."""
    args = (
        ["--events", "50", "--subscribers", "100", "--sio-subscribers", "100"]
        if tiny
        else ["--quick"]
        if QUICK
        else []
    )
    out = Path(tempfile.mkdtemp(prefix="pressroom-push-")) / "push.json"
    done = subprocess.run(
        [sys.executable, "-m", "bench.push", *args, "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=PUSH_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"python -m bench.push exited {done.returncode}: {done.stderr[-2000:]}")
    print(done.stdout, flush=True)
    prefix = "BENCH_QUICK=1 " if QUICK else ""
    return {
        "command": f"{prefix}python -m bench.push {' '.join(args)}".rstrip(),
        "output": done.stdout,
        "result": json.loads(out.read_text()),
    }


async def run(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    started = time.perf_counter()
    results: dict[str, Any] = {}
    errors: dict[str, str] = {}
    wanted = args.only.split(",") if args.only else ALL

    def arguments(name: str, module: Any) -> argparse.Namespace:
        extra = TINY.get(name, []) if args.tiny else []
        namespace: argparse.Namespace = module.parser().parse_args(extra)
        return namespace

    async def step(name: str, bench: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        if name not in wanted:
            return
        print(f"== {name}", flush=True)
        began = time.perf_counter()
        try:
            results[name] = await bench()
        except Exception:
            errors[name] = traceback.format_exc()
            print(errors[name], file=sys.stderr, flush=True)
        print(f"== {name}: {time.perf_counter() - began:.1f} s", flush=True)

    async with postgres() as server:
        meta = {
            "quick": QUICK,
            "tiny": args.tiny,
            "machine": machine(),
            "postgres": await server_version(server),
            "postgres_where": "DATABASE_URL" if args.external_db else "embedded, from the wheel",
            "chromium": chromium_version(),
            "started_at": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
            "command": ("BENCH_QUICK=1 " if QUICK else "")
            + "python -m bench"
            + (" --tiny" if args.tiny else ""),
        }
        await step("accept", lambda: accept.run(arguments("accept", accept)))
        await step("queue", lambda: queue.run(arguments("queue", queue)))
        await step("in_flight", lambda: in_flight.run(arguments("in_flight", in_flight)))
        await step("render", lambda: render.run(arguments("render", render)))
        await step("budget", lambda: budget.run(arguments("budget", budget)))
        await step("plans", lambda: plans.run(arguments("plans", plans)))
        await step("egress", lambda: egress.run(arguments("egress", egress)))
        await step("latency", lambda: latency.run(arguments("latency", latency)))
        await step("mechanisms", lambda: mechanisms.run(arguments("mechanisms", mechanisms)))
        await step("soak", lambda: soak.run(arguments("soak", soak)))
        if (ROOT / "bench" / "push.py").exists():
            await step("push", lambda: asyncio.to_thread(push, args.tiny))
        await step("writepath", lambda: writepath.run(arguments("writepath", writepath)))
        await step("dbcost", lambda: dbcost.run(arguments("dbcost", dbcost)))
        await step("drain", lambda: drain.run(arguments("drain", drain)))
        profile_args = arguments("profile", profile)
        profile_args.out = str(out)
        await step("profile", lambda: profile.run(profile_args))
    meta["elapsed_s"] = time.perf_counter() - started
    results["meta"] = meta
    if errors:
        results["errors"] = errors
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default=None, help="report folder (full default: docs/)")
    parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(ALL)}")
    parser.add_argument("--tiny", action="store_true", help="smallest sizes (the suite's test)")
    args = parser.parse_args()
    unknown = set(args.only.split(",")) - set(ALL) if args.only else set()
    if unknown:
        parser.error(f"--only: no benchmark named {', '.join(sorted(unknown))}")
    if args.out is None:
        args.out = str(ROOT / "docs") if not QUICK else tempfile.mkdtemp(prefix="pressroom-bench-")
    args.external_db = "DATABASE_URL" in os.environ
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {machine()}", flush=True)
    results = asyncio.run(run(args, out))
    # The raw results (with every latency) stay out of the repository: they are large and
    # redone each run. A full run keeps its figures in bench/results.json, which is enough to
    # render the report again after a change to its template.
    raw = out / "results.json" if QUICK else Path(tempfile.mkdtemp()) / "results.json"
    raw.write_text(json.dumps(results))
    if not QUICK:
        report.RESULTS.write_text(json.dumps(report.figures(results), indent=1) + "\n")
    path = report.write(results, out)
    print(f"report: {path}\nresults: {raw} (python -m bench.report {raw} --out {out})")
    if "errors" in results:
        print(f"failed: {', '.join(results['errors'])}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
