"""Every benchmark in turn, each printing its figures and their ratio to its baseline:
`python -m bench` (what `make bench` runs). Figures worth keeping go into docs/performance.md
by hand, with their command, date and machine.

BENCH_QUICK=1 runs reduced sizes; --tiny the smallest that still run every path (the suite's
smoke test, tests/integration/test_bench_quick.py). A benchmark that fails is reported and the
others still run; the exit status says whether any failed.

    python -m bench [--only accept,queue,render,soak,push,office,pdfops,dashboard,cost] [--tiny]
"""

from __future__ import annotations

import asyncio
import importlib
import sys
import time
import traceback

import asyncpg

from bench.common import arguments, machine, postgres

#: Each benchmark (the module bench.<name>) in the order they run, with its --tiny arguments.
TINY = {
    "accept": "--duration 0.3 --clients 4 --rate 40 --connections 2",
    "queue": "--jobs 20 --slots 2 --pgqueuer 1x10 --procrastinate 2",
    "render": "--docs 2 --slots 1 --pages 1 --rounds 1 --engines default",
    "soak": "--jobs 10 --every 5 --from-job 5 --slots 1",
    "push": "--events 3 --subscribers 10 --sio-subscribers 10",
    "office": "--docs 1 --peers soffice",
    "pdfops": "--pages 2 --rounds 1",
    "dashboard": "--jobs 500 --requests 3",
    "cost": "--docs 4 --slots 1 --rounds 1 --latency-docs 2",
}


async def run(names: list[str], tiny: bool) -> list[str]:
    """Run the benchmarks named, in turn; the names of those that failed."""
    failed = []
    async with postgres() as server:
        conn = await asyncpg.connect(server)
        version = await conn.fetchval("SHOW server_version")
        await conn.close()
        print(f"machine: {machine()}; PostgreSQL {version}")
        for name in names:
            # Only the benchmarks asked for are imported: Playwright, Socket.IO and the peers'
            # libraries load where they are needed.
            module = importlib.import_module(f"bench.{name}")
            args = module.parser().parse_args(TINY[name].split() if tiny else [])
            print(f"== {name}")
            started = time.perf_counter()
            try:
                await module.run(args)
            except Exception:
                traceback.print_exc()
                failed.append(name)
            print(f"== {name}: {time.perf_counter() - started:.1f} s")
    return failed


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--only", default=",".join(TINY), help="a comma-separated subset")
    parser.add_argument("--tiny", action="store_true", help="the smallest sizes (the suite's)")
    args = parser.parse_args()
    # Each line out as soon as it is printed, to a pipe or a file too.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    names = args.only.split(",")
    if unknown := set(names) - set(TINY):
        parser.error(f"--only: no benchmark named {', '.join(sorted(unknown))}")
    if failed := asyncio.run(run(names, args.tiny)):
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
