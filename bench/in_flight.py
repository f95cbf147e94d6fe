"""The per-tenant in-flight cap at the defaults: submit latency with the background count
(admission.InFlight) and with one indexed count per admission, in the same run, over an empty
queue and over a backlog near the default cap (queued jobs due in an hour, so the worker
stays idle and every job is handed off).

    python -m bench.in_flight [--jobs 300] [--interval-ms 40] [--backlog 9000] [--rounds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
from typing import Any
from unittest import mock

import asyncpg

import server.web.app
from bench.common import (
    QUICK,
    checkpoint,
    command,
    database,
    latency_summary,
    postgres,
    running_app,
)
from bench.noop import StartClock
from bench.queue import WARMUP_JOBS, _submitter, _true, wait_until
from server.queue import admission
from server.queue.admission import InFlight
from server.settings import Settings

NAME = "bench.in_flight"
#: The cap the benchmark runs at: the setting's default.
DEFAULT_CAP: int = Settings.model_fields["tenant_max_inflight"].default
#: How long the background read trusts a count: InFlight's default.
TTL_S: float = inspect.signature(InFlight).parameters["ttl_s"].default
SLOTS = 4


class PerAdmission(InFlight):
    """The cap as one indexed count per admission, read before the insert."""

    async def check(self, pool: asyncpg.Pool, tenant: str, max_in_flight: int) -> None:
        await admission._check_in_flight(pool, tenant, max_in_flight)

    def admitted(self, pool: asyncpg.Pool, tenant: str) -> None:
        return None


async def one(count: int, interval_s: float, backlog: int, *, background: bool) -> dict[str, Any]:
    clock = StartClock()
    async with database(migrated=True) as dsn:
        if backlog:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute(
                    "INSERT INTO jobs (id, tenant, template, max_attempts, run_after)"
                    " SELECT gen_random_uuid(), 'default', 'x', 3, now() + interval '1 hour'"
                    " FROM generate_series(1, $1)",
                    backlog,
                )
                await conn.execute("VACUUM ANALYZE jobs")
            finally:
                await conn.close()
        await checkpoint(dsn)
        overrides: dict[str, Any] = {
            "render_slots": SLOTS,
            "renderer_factory": lambda _s: clock,
            "tenant_max_inflight": DEFAULT_CAP,
        }
        # The app builds its in-flight cap as it starts, from the class server.web.app names.
        cap = InFlight if background else PerAdmission
        with mock.patch.object(server.web.app, "InFlight", cap):
            async with running_app(dsn, **overrides) as (base, _app):
                await asyncio.sleep(1.0)
                answers = await _submitter(base, WARMUP_JOBS + count, interval_s)
                total = WARMUP_JOBS + count
                await wait_until(lambda: _true(len(clock.latencies_ms) >= total), timeout_s=30)
    return {
        "answer": latency_summary(answers[WARMUP_JOBS:]),
        "start": latency_summary(clock.latencies_ms[WARMUP_JOBS:]),
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Both ways of counting, over an empty queue and a backlog, in --rounds rounds."""
    runs: list[dict[str, Any]] = []
    async with postgres():
        for round_ in range(args.rounds):
            for backlog in (0, args.backlog):
                # Each round runs the two the other way round, so drift in the machine's load
                # does not favour one.
                for background in (True, False) if round_ % 2 == 0 else (False, True):
                    r = await one(
                        args.jobs, args.interval_ms / 1000, backlog, background=background
                    )
                    cap = "background" if background else "count"
                    runs.append({"round": round_, "backlog": backlog, "cap": cap, **r})
                    a, s = r["answer"], r["start"]
                    print(
                        f"{f'round {round_} backlog={backlog} {cap}':42} 202 p50 "
                        f"{a['p50_ms']:.2f} p99 {a['p99_ms']:.2f} ms; start p50 "
                        f"{s['p50_ms']:.2f} p99 {s['p99_ms']:.2f} ms",
                        flush=True,
                    )
    return {
        "args": vars(args),
        "command": command(
            NAME,
            f"--jobs {args.jobs}",
            f"--interval-ms {args.interval_ms:g}",
            f"--backlog {args.backlog}",
            f"--rounds {args.rounds}",
        ),
        "cap": DEFAULT_CAP,
        "ttl_s": TTL_S,
        "slots": SLOTS,
        "warmup_jobs": WARMUP_JOBS,
        "runs": runs,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=100 if QUICK else 300)
    parser.add_argument("--interval-ms", type=float, default=40)
    parser.add_argument("--backlog", type=int, default=9000)
    parser.add_argument("--rounds", type=int, default=1)
    return parser


def main() -> None:
    print(json.dumps(asyncio.run(run(parser().parse_args()))))


if __name__ == "__main__":
    main()
