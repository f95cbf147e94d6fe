"""The event log's prune at scale: retention of the oldest half of a log of N events, the way
before 0017 (jobs deleted, their events with them by ON DELETE CASCADE, then the VACUUM that
the dead rows need) and the way since (jobs deleted, the log's expired partitions dropped).

Each way gets a throwaway database holding the same log: N events, `--per-job` per job, spread
evenly over twice the keep time (a week), filled with generate_series (the events' trigger
off: its side effects cost nothing here). The old one has the schema as the migrations up to
0016 left it; the new one is filled stretch by stretch, the log's pass closing each, as it would
have filled over those days. Then the jobs finished more than a week ago are deleted as the
retention sweep deletes them (its statements, in its batches), and the log is pruned. Printed
per way: the time, the WAL written (pg_current_wal_lsn before and after) and the size of the
log and of the jobs table after, and what the partitions cost a reader (the hub's read at the
head, a cursor's lookup); then the ratios, and how long migration 0017 took on the old way's
log (what is left of it).

    python -m bench.prune [--events 10000000] [--per-job 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import asyncpg

from bench.common import checkpoint, command, database, machine, server_version
from server import events, sql
from server.queue import db, retention
from server.sql import query

KEEP_DAYS = 7
#: The hub's read as it was before 0017 (queries.sql, events_after_all), for the old log.
HUB_READ_BEFORE = """
SELECT e.id, e.xid, e.job_id, e.tenant, e.type, e.payload, e.created_at, held.held
FROM (SELECT (SELECT h.xid FROM job_events h ORDER BY h.xid DESC LIMIT 1)
             >= pg_snapshot_xmin(pg_current_snapshot()) AS held) held
LEFT JOIN LATERAL (
    SELECT e.id, e.xid::text::bigint AS xid, e.job_id, e.tenant, e.type, e.payload,
           e.created_at
    FROM job_events e
    WHERE (e.xid, e.id) > ($1::text::xid8, $2::bigint)
      AND e.xid < pg_snapshot_xmin(pg_current_snapshot())
    ORDER BY e.xid, e.id
    LIMIT $3
) e ON true
ORDER BY e.xid, e.id"""
#: What the old way is: the schema before the log was partitioned.
BEFORE = "0017"
#: Rows per fill statement, so no statement holds millions of rows at once.
CHUNK = 500_000
READS = 2000
# An event's payload is the job's public JSON (job_public), about this big.
PAYLOAD = """jsonb_build_object(
    'id', j.id, 'status', 'done', 'attempts', 1, 'max_attempts', 3, 'priority', 0,
    'progress', 100, 'error', NULL, 'errors', '[]'::jsonb, 'warnings', '[]'::jsonb,
    'options', '{"format": "A4"}'::jsonb, 'metadata', '{"order": 42}'::jsonb,
    'webhook_url', NULL, 'pages', 1, 'bytes', 18000, 'channel', NULL,
    'run_after', j.created_at, 'created_at', j.created_at, 'updated_at', j.finished_at,
    'started_at', j.created_at, 'finished_at', j.finished_at)"""


async def fill(
    conn: asyncpg.Connection, first: int, count: int, jobs_total: int, per_job: int
) -> None:
    """Jobs number `first`..`first + count - 1` of `jobs_total`, the oldest first, evenly over
    twice the keep time up to an hour ago: finished, each with its `per_job` events (queued,
    running, progress…, done) a second apart."""
    numbered = """generate_series($1::bigint, $1::bigint + $2 - 1) AS n,
        LATERAL (SELECT md5(n::text)::uuid AS id,
                        now() - interval '1 hour'
                            - make_interval(secs => $4 * (1 - n::float8 / $3)) AS created_at)
            AS t,
        LATERAL (SELECT t.id, 'default' AS tenant, t.created_at,
                        t.created_at + interval '1 minute' AS finished_at) AS j"""
    span_s = 2 * KEEP_DAYS * 86400
    await conn.execute(
        f"""INSERT INTO jobs (id, tenant, template, max_attempts, status, attempts, object_key,
                              bytes, created_at, updated_at, finished_at)
            SELECT j.id, j.tenant, '<p>x</p>', 3, 'done', 1, 'key', 18000,
                   j.created_at, j.finished_at, j.finished_at
            FROM {numbered}""",
        first,
        count,
        jobs_total,
        span_s,
    )
    await conn.execute(
        f"""INSERT INTO job_events (job_id, tenant, type, payload, created_at)
            SELECT j.id, j.tenant,
                   CASE WHEN k = $5 THEN 'job.done' WHEN k = 1 THEN 'job.queued'
                        WHEN k = 2 THEN 'job.running' ELSE 'job.progress' END,
                   {PAYLOAD}, j.created_at + make_interval(secs => k)
            FROM {numbered}, generate_series(1, $5) AS k""",
        first,
        count,
        jobs_total,
        span_s,
        per_job,
    )


async def schema_before(dsn: str) -> None:
    """The schema as the migrations before BEFORE left it."""
    conn = await db.connect(dsn)
    try:
        for version, text in sql.migrations():
            if version < BEFORE:
                await conn.execute(text)
    finally:
        await conn.close()


async def fill_old(dsn: str, jobs_total: int, per_job: int) -> None:
    await schema_before(dsn)
    conn = await db.connect(dsn)
    try:
        await conn.execute("ALTER TABLE job_events DISABLE TRIGGER job_events_side_effects")
        step = CHUNK // per_job
        for first in range(0, jobs_total, step):
            await fill(conn, first, min(step, jobs_total - first), jobs_total, per_job)
        await conn.execute("ALTER TABLE job_events ENABLE TRIGGER job_events_side_effects")
        await conn.execute("VACUUM ANALYZE jobs, job_events")
    finally:
        await conn.close()


async def fill_new(dsn: str, jobs_total: int, per_job: int) -> None:
    """As fill_old, on the partitioned log: each stretch's jobs, then the log's pass (which
    closes the stretch's partition, every event of it being older than a stretch by now)."""
    keep_s = KEEP_DAYS * 86400
    stretch_s = retention.stretch_s(keep_s)
    stretches = 2 * keep_s // stretch_s
    conn = await db.connect(dsn)
    try:
        await db.migrate(conn)
        await conn.execute("ALTER TABLE job_events DISABLE TRIGGER job_events_side_effects")
        per_stretch = -(-jobs_total // stretches)
        step = CHUNK // per_job
        for begin in range(0, jobs_total, per_stretch):
            end = min(begin + per_stretch, jobs_total)
            # Ahead: one partition the size of a stretch's events, as the pass sizes them.
            await conn.fetchval(query("extend_event_log"), stretch_s, (end - begin) * per_job)
            for first in range(begin, end, step):
                await fill(conn, first, min(step, end - first), jobs_total, per_job)
        await conn.fetchval(query("extend_event_log"), stretch_s, retention.MIN_PARTITION_IDS)
        await conn.execute("ALTER TABLE job_events ENABLE TRIGGER job_events_side_effects")
        await conn.execute("VACUUM ANALYZE jobs, job_events")
    finally:
        await conn.close()


async def delete_expired_jobs(conn: asyncpg.Connection) -> int:
    """The retention sweep's rows, without its files: batch by batch, oldest first."""
    deleted = 0
    while True:
        async with conn.transaction():
            rows = await conn.fetch(query("expired_jobs"), KEEP_DAYS, retention.BATCH)
            if rows:
                await conn.execute(query("delete_jobs"), [row["id"] for row in rows])
        deleted += len(rows)
        if len(rows) < retention.BATCH:
            return deleted


async def sizes(conn: asyncpg.Connection) -> dict[str, int]:
    """Bytes on disk (with indexes and TOAST) of the log, all its partitions, and of jobs."""
    log: int = await conn.fetchval(
        """SELECT coalesce((SELECT sum(pg_total_relation_size(relid))::bigint
                            FROM pg_partition_tree('job_events')),
                           pg_total_relation_size('job_events'))"""
    )
    jobs: int = await conn.fetchval("SELECT pg_total_relation_size('jobs')")
    return {"log_bytes": log, "jobs_bytes": jobs}


async def reads(dsn: str, way: str) -> dict[str, float]:
    """What the partitions cost every reader: the hub's read at the head of the log, as the hub
    runs it (a prepared statement: before 0017 the statement of then, since then the one of
    queries.sql with the floor events.after gives it) and a cursor's lookup (event_position),
    READS times each; the median, in microseconds."""
    conn = await db.connect(dsn)
    try:
        head = await conn.fetchrow(query("events_head"))
        at_head: tuple[object, ...] = (str(head["xid"]), head["id"], events.REPLAY_PAGE)
        if way == "old":
            hub = await conn.prepare(HUB_READ_BEFORE)
        else:
            hub = await conn.prepare(query("events_after_all"))
            at_head += (await events.floor(conn, head["xid"]),)
        lookup = await conn.prepare(query("event_position"))
        timed: dict[str, list[float]] = {"hub_read_us": [], "cursor_lookup_us": []}
        for _ in range(READS):
            began = time.perf_counter()
            await hub.fetch(*at_head)
            middle = time.perf_counter()
            await lookup.fetchrow(head["id"])
            timed["hub_read_us"].append((middle - began) * 1e6)
            timed["cursor_lookup_us"].append((time.perf_counter() - middle) * 1e6)
        tables: int = await conn.fetchval(
            "SELECT greatest(count(*), 1) FROM pg_partition_tree('job_events') WHERE isleaf"
        )
        return {"tables": tables, **{k: statistics.median(v) for k, v in timed.items()}}
    finally:
        await conn.close()


async def measure(dsn: str, way: str) -> dict[str, Any]:
    await checkpoint(dsn)
    conn = await db.connect(dsn)
    try:
        events_before: int = await conn.fetchval("SELECT count(*) FROM job_events")
        size_before = await sizes(conn)
        wal_before = await conn.fetchval("SELECT pg_current_wal_lsn()")
        began = time.perf_counter()
        jobs_deleted = await delete_expired_jobs(conn)
        deleted_s = time.perf_counter() - began
        if way == "old":
            await conn.execute("VACUUM job_events, jobs")
        else:
            await conn.fetch(query("prune_event_log"), KEEP_DAYS * 86400)
            await conn.execute("VACUUM jobs")
        elapsed_s = time.perf_counter() - began
        wal_bytes: int = await conn.fetchval("SELECT pg_current_wal_lsn() - $1::pg_lsn", wal_before)
        events_after: int = await conn.fetchval("SELECT count(*) FROM job_events")
        return {
            "jobs_deleted": jobs_deleted,
            "events_pruned": events_before - events_after,
            "delete_jobs_s": deleted_s,
            "total_s": elapsed_s,
            "wal_bytes": int(wal_bytes),
            "before": size_before,
            "after": await sizes(conn),
        }
    finally:
        await conn.close()


async def migration(dsn: str) -> dict[str, Any]:
    """How long migration 0017 holds the log locked: on the old way's log, once pruned."""
    conn = await db.connect(dsn)
    try:
        events: int = await conn.fetchval("SELECT count(*) FROM job_events")
        await conn.execute(
            "CREATE TABLE schema_migrations (version text PRIMARY KEY,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        await conn.executemany(
            "INSERT INTO schema_migrations (version) VALUES ($1)",
            [(version,) for version, _ in sql.migrations() if version < BEFORE],
        )
        began = time.perf_counter()
        await db.migrate(conn)
        return {"events": events, "s": time.perf_counter() - began}
    finally:
        await conn.close()


def mib(n: int) -> str:
    return f"{n / 2**20:,.0f} MiB"


async def run(args: argparse.Namespace) -> dict[str, Any]:
    jobs_total = args.events // args.per_job
    results: dict[str, Any] = {"events": jobs_total * args.per_job, "per_job": args.per_job}
    for way, filler in (("old", fill_old), ("new", fill_new)):
        async with database() as dsn:
            if way == "old":
                results["postgres"] = await server_version(dsn)
            began = time.perf_counter()
            await filler(dsn, jobs_total, args.per_job)
            fill_s = time.perf_counter() - began
            results[way] = {"fill_s": fill_s, **await reads(dsn, way), **await measure(dsn, way)}
            if way == "old":
                results["migration"] = await migration(dsn)
        r = results[way]
        print(
            f"{way}: filled in {fill_s:.0f} s; pruned {r['events_pruned']:,} events of "
            f"{r['jobs_deleted']:,} jobs in {r['total_s']:.1f} s (the jobs' DELETE "
            f"{r['delete_jobs_s']:.1f} s), WAL {mib(r['wal_bytes'])}; after: log "
            f"{mib(r['after']['log_bytes'])} (before {mib(r['before']['log_bytes'])}), jobs "
            f"{mib(r['after']['jobs_bytes'])}; {r['tables']} tables, the hub's read "
            f"{r['hub_read_us']:.0f} us, a cursor's lookup {r['cursor_lookup_us']:.0f} us",
            flush=True,
        )
    moved = results["migration"]
    print(f"0017 on the old way's log, {moved['events']:,} events: {moved['s']:.2f} s")
    old, new = results["old"], results["new"]
    results["ratio"] = {
        "time": old["total_s"] / new["total_s"],
        "wal": old["wal_bytes"] / new["wal_bytes"],
        "log_size_after": old["after"]["log_bytes"] / new["after"]["log_bytes"],
    }
    ratio = results["ratio"]
    print(
        f"old / new: time {ratio['time']:.1f}x, WAL {ratio['wal']:.1f}x, "
        f"log size after {ratio['log_size_after']:.1f}x"
    )
    return results


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--events", type=int, default=10_000_000)
    parser.add_argument("--per-job", type=int, default=5, help="events per job")
    return parser


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    print(f"command: {command('bench.prune', '--events', args.events, '--per-job', args.per_job)}")
    results = asyncio.run(run(args))
    print(json.dumps(results))


if __name__ == "__main__":
    main()
