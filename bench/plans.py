"""What the claim's and the done write's plans buy (migration 0019): the claim and the done
write of one job as they were before (bench/plans_before.sql: a claim joined to its picked
rows, a done write PostgreSQL planned afresh on every call) and as today's (the claim updates
its picked rows by key, the done write is a function that keeps one plan), on one connection
of one database, alternating job by job.

The database holds --jobs queued invoices (the benchmark's styled one-page invoice with its
20 lines: rows the size of real ones), its statistics up to date. Each job is claimed and
then made done, by the old statements for every other job and by today's for the rest. Each
call is timed as the client sees it (round trip and durable commit) and as the server spends
it: the CPU time of the connection's backend process, read from /proc/PID/schedstat (in
nanoseconds) before and after.

    python -m bench.plans [--jobs 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

from bench.common import (
    INVOICE,
    QUICK,
    command,
    database,
    invoice_data,
    machine,
    postgres,
    server_version,
)
from server import sql
from server.queue import db, jobs
from server.queue.jobs import NewJob

NAME = "bench.plans"
HERE = Path(__file__).resolve().parent
WORKER = "bench-worker"
LEASE_S = 600.0
INSERT_BATCH = 100
#: The ways, the old one first: the ratio is today's / before.
BEFORE, TODAY = "before 0019", "today (0019)"


def cpu_ns(pid: int) -> int:
    """Nanoseconds process `pid` has run on a CPU (the first field of its schedstat)."""
    return int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])


async def fill(dsn: str, count: int) -> None:
    pool = await db.create_pool(dsn, min_size=1, max_size=2)
    try:
        for start in range(0, count, INSERT_BATCH):
            new = [
                NewJob(
                    tenant="default",
                    template=INVOICE,
                    data=invoice_data(n),
                    options={},
                    metadata={},
                    max_attempts=3,
                )
                for n in range(start, min(start + INSERT_BATCH, count))
            ]
            await jobs.create(pool, new)
        await pool.execute("ANALYZE")
    finally:
        await pool.close()


async def measure(dsn: str, count: int) -> dict[str, dict[str, dict[str, float]]]:
    old = sql.parse_blocks((HERE / "plans_before.sql").read_text())
    statements = {
        BEFORE: {name: old[name] for name in ("claim_jobs", "finish_done_many")},
        TODAY: {name: sql.query(name) for name in ("claim_jobs", "finish_done_many")},
    }
    times: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}
    conn = await db.connect(dsn)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()")

        async def timed(way: str, name: str, *args: Any) -> list[Any]:
            cpu_before, started = cpu_ns(backend), time.perf_counter()
            rows: list[Any] = await conn.fetch(statements[way][name], *args)
            times.setdefault((way, name), []).append((time.perf_counter() - started) * 1000)
            cpu.setdefault((way, name), []).append((cpu_ns(backend) - cpu_before) / 1e6)
            return rows

        for n in range(count):
            way = BEFORE if n % 2 else TODAY
            [job] = await timed(way, "claim_jobs", 1, WORKER, LEASE_S)
            done = await timed(
                way,
                "finish_done_many",
                [job["id"]],
                WORKER,
                [job["attempts"]],
                [f"k/{job['id']}"],
                [1000],
                [1],
                ["[]"],
            )
            assert len(done) == 1, "the done write did not finish its job"
        assert await conn.fetchval("SELECT count(*) FROM jobs WHERE status = 'done'") == count
    finally:
        await conn.close()
    result: dict[str, dict[str, dict[str, float]]] = {}
    for (way, name), values in times.items():
        result.setdefault(name, {})[way] = {
            "p50_ms": statistics.median(values),
            "cpu_ms": statistics.fmean(cpu[(way, name)]),
        }
    return result


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with postgres() as server, database(migrated=True) as dsn:
        version = await server_version(server)
        await fill(dsn, args.jobs)
        statements = await measure(dsn, args.jobs)
    result: dict[str, Any] = {
        "args": vars(args),
        "command": command(NAME, f"--jobs {args.jobs}"),
        "server": version,
        "statements": statements,
    }
    for name, ways in statements.items():
        old, new = ways[BEFORE], ways[TODAY]
        ways["ratio"] = {
            "p50_ms": new["p50_ms"] / old["p50_ms"],
            "cpu_ms": new["cpu_ms"] / old["cpu_ms"],
        }
        print(
            f"plans  {name}: round trip p50 {old['p50_ms']:.3f} → {new['p50_ms']:.3f} ms "
            f"(ratio {ways['ratio']['p50_ms']:.2f}), server CPU {old['cpu_ms']:.3f} → "
            f"{new['cpu_ms']:.3f} ms per call (ratio {ways['ratio']['cpu_ms']:.2f})",
            flush=True,
        )
    return result


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--jobs", type=int, default=400 if QUICK else 2000)
    return parser


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
