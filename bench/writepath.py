"""The write path of a state change: what the event row, its NOTIFY and its webhook outbox row
cost, written by each statement (before 0010) or by the job_events trigger (0010), and by the
alternative of triggers on jobs writing the event rows too (bench/writepath_jobs_trigger.sql).

Three throwaway databases on one server, one per way; the same hot transitions run on each in
alternating rounds (submit, claim, heartbeat, done, failed with a retry, failed for good; one
job per statement and 100), with and without a webhook URL on the job. Each statement is
timed twice over: as the client sees it (round trip and durable commit), and as the server
spends it (EXPLAIN ANALYZE's execution time, triggers included: how migration 0005 measured
its trigger, with less of the machine's noise in it).

    python -m bench.writepath [--rounds 10] [--jobs 10] [--batch 100] [--batches 3]
                              [--channel user-42]

With --channel, the jobs of the way whose statements know channels (0014) carry that one,
so that its event rows enter the channel index: what a channel adds to a state change.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from bench import report
from bench.common import (
    QUICK,
    command,
    latency_summary,
    machine,
    postgres,
    server_version,
    with_database,
)
from server import sql
from server.queue import db

NAME = "bench.writepath"
HERE = Path(__file__).resolve().parent
HOOK = "https://example.com/hook"
WORKER = "bench-worker"
LEASE_S = 60.0


#: What a time is recorded under: how it was measured, webhook or not, the step, its jobs.
Key = tuple[str, str, str, int]


class Way:
    """One way of writing the side effects: its database, statements and LISTEN counts."""

    def __init__(self, name: str, label: str, upto: str | None, extra: str | None) -> None:
        self.name = name
        self.label = label
        self.upto = upto  # the last migration applied; None: all of them
        self.extra = extra  # SQL applied after the migrations
        self.statements: dict[str, str] = {}
        self.sources = False  # insert_jobs takes assets, source, secrets and channel (0011-0014)
        self.conn: asyncpg.Connection
        self.heard: dict[str, int] = {"pressroom": 0, "pressroom_webhooks": 0}
        self.marker = asyncio.Event()
        self.times: dict[Key, list[float]] = {}
        self.sql: dict[Key, str] = {}  # the named statement each key timed


def ways() -> list[Way]:
    current = sql.queries()
    before = Way("before", "each statement (before 0010)", "0009_tenant_webhook_secrets", None)
    before.statements = sql.parse_blocks((HERE / "writepath_before.sql").read_text())
    after = Way("trigger", "job_events trigger (0010)", None, None)
    after.sources = True
    after.statements = {
        name: current[name]
        for name in ("insert_jobs", "claim_jobs", "finish_done_many", "finish_failed")
    }
    jobs_trigger = Way("jobs_trigger", "jobs triggers write the events too", None, None)
    blocks = sql.parse_blocks((HERE / "writepath_jobs_trigger.sql").read_text())
    jobs_trigger.extra = blocks.pop("setup")
    jobs_trigger.statements = blocks
    for way in (before, after, jobs_trigger):
        way.statements["heartbeat"] = current["heartbeat"]
    return [before, after, jobs_trigger]


@asynccontextmanager
async def databases(server: str, all_ways: list[Way]) -> AsyncIterator[None]:
    """A fresh database per way, migrated as that way needs, with a LISTEN connection."""
    admin = await asyncpg.connect(server)
    names = [f"pressroom_bench_wp_{way.name}_{uuid.uuid4().hex[:6]}" for way in all_ways]
    listeners: list[asyncpg.Connection] = []
    try:
        for way, name in zip(all_ways, names, strict=True):
            await admin.execute(f'CREATE DATABASE "{name}"')
            dsn = with_database(server, name)
            way.conn = await db.connect(dsn)
            for version, text in sql.migrations():
                await way.conn.execute(text)
                if version == way.upto:
                    break
            if way.extra:
                await way.conn.execute(way.extra)
            listener = await asyncpg.connect(dsn)
            for channel in way.heard:
                await listener.add_listener(channel, _counter(way))
            await listener.add_listener("bench_marker", lambda *_a, w=way: w.marker.set())
            listeners.append(listener)
        yield
    finally:
        for listener in listeners:
            await listener.close()
        for way in all_ways:
            if hasattr(way, "conn"):
                await way.conn.close()
        for name in names:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def _counter(way: Way) -> Any:
    def heard(_conn: object, _pid: int, channel: str, _payload: str) -> None:
        way.heard[channel] += 1

    return heard


def job_columns(
    way: Way, count: int, *, webhook: bool, max_attempts: int, channel: str | None
) -> list[Any]:
    """insert_jobs' parameters for `count` queued template jobs: fifteen, and where the way's
    statement is the current one each job's assets, source, sealed secrets and channel."""
    columns = [
        [uuid.uuid4() for _ in range(count)],
        ["default"] * count,
        ["<p>{{ n }}</p>"] * count,
        [{"n": n, "customer": "Ana Lima"} for n in range(count)],
        [{}] * count,
        [{}] * count,
        [HOOK if webhook else None] * count,
        [0] * count,
        [max_attempts] * count,
        [None] * count,
        [None] * count,
        [None] * count,
        [False] * count,
        None,
        0.0,
    ]
    if way.sources:
        columns += [[None] * count, ["template"] * count, [None] * count, [channel] * count]
    return columns


#: The client's view: the statement's round trip, commit included.
CLIENT = "client, durable commit"
#: The server's view: EXPLAIN ANALYZE's execution time (triggers included, no commit).
SERVER = "server, execution"


async def timed(way: Way, key: Key, name: str, *args: Any) -> list[Any]:
    """Run one statement and record its time as its mode sees it."""
    way.sql[key] = name
    if key[0] == SERVER:
        raw = await way.conn.fetchval(
            f"EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) {way.statements[name]}", *args
        )
        plan = json.loads(raw) if isinstance(raw, str) else raw
        way.times.setdefault(key, []).append(float(plan[0]["Execution Time"]))
        if name != "claim_jobs":
            return []
        # EXPLAIN returns no rows: what the claim took is read back, untimed.
        claimed: list[Any] = await way.conn.fetch(
            "SELECT id, attempts FROM jobs WHERE status = 'running' AND worker_id = $1"
            " AND attempts > 0 ORDER BY id",
            WORKER,
        )
        return claimed
    started = time.perf_counter()
    rows: list[Any] = await way.conn.fetch(way.statements[name], *args)
    way.times.setdefault(key, []).append((time.perf_counter() - started) * 1000)
    return rows


async def one_round(way: Way, mode: str, webhook: bool, args: argparse.Namespace) -> None:
    """The hot transitions, each statement on its own (its own implicit transaction)."""
    hook = "webhook" if webhook else "no webhook"

    jobs, batch, batches = args.jobs, args.batch, args.batches

    def key(step: str, jobs: int = 1) -> Key:
        return (mode, hook, step, jobs)

    for _ in range(jobs):  # submit → claim → heartbeat → done
        await timed(
            way,
            key("insert 1 (job.queued)"),
            "insert_jobs",
            *job_columns(way, 1, webhook=webhook, max_attempts=1, channel=args.channel),
        )
        [job] = await timed(way, key("claim 1 (job.running)"), "claim_jobs", 1, WORKER, LEASE_S)
        await timed(way, key("heartbeat (no event)"), "heartbeat", [job["id"]], WORKER, LEASE_S)
        await timed(
            way,
            key("done 1 (job.done)"),
            "finish_done_many",
            [job["id"]],
            WORKER,
            [job["attempts"]],
            [f"k/{job['id']}"],
            [1000],
            [1],
            ["[]"],
        )
    for _ in range(jobs):  # submit → claim → retry → claim → failed
        await timed(
            way,
            key("insert 1 (job.queued)"),
            "insert_jobs",
            *job_columns(way, 1, webhook=webhook, max_attempts=2, channel=args.channel),
        )
        for label, retry in (
            ("failed, retry (job.retrying)", True),
            ("failed, final (job.failed)", False),
        ):
            [job] = await timed(way, key("claim 1 (job.running)"), "claim_jobs", 1, WORKER, LEASE_S)
            await timed(
                way,
                key(label),
                "finish_failed",
                job["id"],
                WORKER,
                job["attempts"],
                "boom",
                0.0,
                retry,
                [],
            )
    # Group commit and the done recorder: many jobs in one statement.
    for _ in range(batches):
        await timed(
            way,
            key(f"insert {batch} (job.queued)", batch),
            "insert_jobs",
            *job_columns(way, batch, webhook=webhook, max_attempts=1, channel=args.channel),
        )
        claimed = await timed(
            way, key(f"claim {batch} (job.running)", batch), "claim_jobs", batch, WORKER, LEASE_S
        )
        ids = [row["id"] for row in claimed]
        await timed(
            way, key(f"heartbeat {batch} (no event)", batch), "heartbeat", ids, WORKER, LEASE_S
        )
        await timed(
            way,
            key(f"done {batch} (job.done)", batch),
            "finish_done_many",
            ids,
            WORKER,
            [row["attempts"] for row in claimed],
            [f"k/{i}" for i in ids],
            [1000] * len(ids),
            [1] * len(ids),
            ["[]"] * len(ids),
        )


async def written(way: Way) -> dict[str, int]:
    """What the runs left behind, which must be the same whichever way wrote it."""
    await way.conn.execute("SELECT pg_notify('bench_marker', '')")
    await asyncio.wait_for(way.marker.wait(), 30)
    row = await way.conn.fetchrow(
        """SELECT (SELECT count(*) FROM job_events) AS events,
                  (SELECT count(*) FROM webhook_deliveries) AS outbox"""
    )
    assert row is not None
    return {
        "events": row["events"],
        "outbox rows": row["outbox"],
        "NOTIFY pressroom": way.heard["pressroom"],
        "NOTIFY pressroom_webhooks": way.heard["pressroom_webhooks"],
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    all_ways = ways()
    result: dict[str, Any] = {
        "args": vars(args),
        "command": command(NAME, *_argv(args)),
        "machine": machine(),
    }
    started = time.perf_counter()
    async with postgres() as server, databases(server, all_ways):
        result["server"] = await server_version(server)
        for round_no in range(args.rounds):
            for mode in (CLIENT, SERVER):
                # The server's view skips the WAL flush: it is not measured there anyway.
                setting = "on" if mode == CLIENT else "off"
                for way in all_ways:
                    await way.conn.execute(f"SET synchronous_commit = {setting}")
                for webhook in (False, True):
                    # Each way goes first in turn, so none is always measured on a warm server.
                    shift = round_no % len(all_ways)
                    for way in all_ways[shift:] + all_ways[:shift]:
                        await one_round(way, mode, webhook, args)
        result["written"] = {way.name: await written(way) for way in all_ways}
    result["same_written"] = (
        len({json.dumps(w, sort_keys=True) for w in result["written"].values()}) == 1
    )
    result["seconds"] = time.perf_counter() - started
    before, *others = all_ways
    rows = []
    for key, base in before.times.items():
        row: dict[str, Any] = {
            "mode": key[0],
            "webhook": key[1],
            "statement": key[2],
            "jobs": key[3],
            "sql": before.sql[key],
        }
        row[before.name] = latency_summary(base)
        for way in others:
            row[way.name] = latency_summary(way.times[key])
            row[f"{way.name}_ratio_p50"] = row[way.name]["p50_ms"] / row[before.name]["p50_ms"]
            row[f"{way.name}_ratio_p99"] = row[way.name]["p99_ms"] / row[before.name]["p99_ms"]
        rows.append(row)
    result["rows"] = rows
    result["labels"] = {way.name: way.label for way in all_ways}
    result["modes"] = {"client": CLIENT, "server": SERVER}
    return result


def print_result(result: dict[str, Any]) -> None:
    print(f"machine: {result['machine']}; {result['server']}; {result['seconds']:.0f} s")
    print(f"command: {result['command']}")
    print("p50 / p99 ms per statement; ratio = the way / before 0010")
    print()
    print(report.table(report.WRITEPATH_HEADER, report.writepath_rows(result)))
    print()
    print("written (must match): " + json.dumps(result["written"]))


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=2 if QUICK else 10)
    parser.add_argument("--jobs", type=int, default=10, help="jobs per path per round")
    parser.add_argument("--batch", type=int, default=100, help="jobs in the many-job statements")
    parser.add_argument("--batches", type=int, default=3, help="many-job cycles per round")
    parser.add_argument("--channel", help="the channel of the jobs of the ways that know them")
    return parser


def _argv(args: argparse.Namespace) -> list[str]:
    return [
        f"--rounds {args.rounds}",
        f"--jobs {args.jobs}",
        f"--batch {args.batch}",
        f"--batches {args.batches}",
        *([f"--channel {args.channel}"] if args.channel else []),
    ]


def main() -> None:
    args = parser().parse_args()
    result = asyncio.run(run(args))
    print_result(result)
    if not result["same_written"]:
        raise SystemExit("the ways wrote different rows or notifications: see 'written'")


if __name__ == "__main__":
    main()
