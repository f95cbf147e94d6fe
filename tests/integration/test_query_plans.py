"""The statements that run all the time stay index scans however long the tables grow.

The hub reads the event log after every NOTIFY, so a read that walks the whole table costs
more with every event kept: with 20,000 events, spread over partitions of the log as its pass
makes them (0017), none of the log's reads may scan a partition holding events from end to end.
(The `held` check once did: its horizon came from a CTE, which cannot bound an index scan.)
Likewise the claim, /metrics' count of jobs by state on every scrape, and a listing of the jobs
in one state.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from server import events
from server.queue import db, jobs, listing, retention
from server.sql import query
from tests.newjobs import new_job

ROWS = 20_000
#: The log's events fill this many partitions, each closed by the log's pass.
PARTS = 4


def scans(plan: dict[str, Any]) -> list[tuple[str, str]]:
    """(node type, relation) of every scan in an EXPLAIN (FORMAT JSON) plan tree."""
    found = []
    if "Relation Name" in plan:
        found.append((plan["Node Type"], plan["Relation Name"]))
    for child in plan.get("Plans", []):
        found += scans(child)
    return found


async def explain(conn: asyncpg.Connection, sql: str, *args: Any) -> list[tuple[str, str]]:
    raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) {sql}", *args)
    document = json.loads(raw) if isinstance(raw, str) else raw
    return scans(document[0]["Plan"])


async def generic_plan(
    conn: asyncpg.Connection, sql: str, *args: int | str, types: str = ""
) -> list[tuple[str, str]]:
    """The scans of the plan PostgreSQL keeps for `sql` as a prepared statement (the generic
    one, costed for parameters of unknown value; of `types` when given), executed with
    `args`."""
    literals = ", ".join(str(a) if isinstance(a, int) else f"'{a}'" for a in args)
    await conn.execute("SET plan_cache_mode = force_generic_plan")
    await conn.execute(f"PREPARE kept{f' ({types})' if types else ''} AS {sql}")
    try:
        raw = await conn.fetchval(f"EXPLAIN (FORMAT JSON) EXECUTE kept({literals})")
    finally:
        await conn.execute("DEALLOCATE kept")
        await conn.execute("RESET plan_cache_mode")
    document = json.loads(raw) if isinstance(raw, str) else raw
    return scans(document[0]["Plan"])


async def hub_plan(conn: asyncpg.Connection, *args: Any) -> list[tuple[str, str]]:
    """The plan of the hub's read (events_after_all) for these arguments, as it runs: its
    function's query, with the plan the function keeps (generic, partitions pruned at start)."""
    body: str = await conn.fetchval(
        "SELECT prosrc FROM pg_proc WHERE proname = 'job_events_after_all'"
    )
    statement = body.split("RETURN QUERY", 1)[1].rsplit(";", 1)[0]
    xid, after_id, page, floor_id = args
    types = "xid8, bigint, integer, bigint"
    return await generic_plan(conn, statement, str(int(xid)), after_id, page, floor_id, types=types)


async def blocks_read(conn: asyncpg.Connection, sql: str, *args: Any) -> int:
    """Buffers a read-only statement touches when it runs (EXPLAIN ANALYZE, BUFFERS): a
    bound on the work it does whatever plan it takes."""
    raw = await conn.fetchval(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *args)
    document = json.loads(raw) if isinstance(raw, str) else raw
    plan = document[0]["Plan"]
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


async def fill_log(conn: asyncpg.Connection) -> None:
    """ROWS queued jobs, each with its event, in PARTS partitions: each but the last filled
    for longer than a stretch, so that the log's pass closed it."""
    await conn.execute(
        """INSERT INTO jobs (id, tenant, template, data, max_attempts)
           SELECT gen_random_uuid(), 'default', '<p>x</p>', '{}', 1
           FROM generate_series(1, $1)""",
        ROWS,
    )
    for part in range(PARTS):
        # One event in a hundred is of a job in one of ten channels (as job_public shows it).
        await conn.execute(
            """INSERT INTO job_events (job_id, tenant, type, payload, created_at)
               SELECT id, tenant, 'job.queued',
                      CASE WHEN n % 100 = 0
                           THEN jsonb_build_object('channel', 'user-' || n % 1000)
                           ELSE '{}' END,
                      CASE WHEN $1 THEN now() ELSE now() - interval '2 hours' END
               FROM (SELECT id, tenant, row_number() OVER (ORDER BY id) AS n FROM jobs) j
               WHERE n % $2 = $3""",
            part == PARTS - 1,
            PARTS,
            part,
        )
        await conn.fetchval(query("extend_event_log"), 3600, retention.MIN_PARTITION_IDS)


async def whole_scans(conn: asyncpg.Connection, plan: list[tuple[str, str]]) -> set[str]:
    """The partitions holding events (or the log itself) that `plan` reads from end to end."""
    holding = {
        row[0]
        for row in await conn.fetch("SELECT DISTINCT tableoid::regclass::text FROM job_events")
    }
    assert len(holding) == PARTS
    return {rel for node, rel in plan if node == "Seq Scan"} & (holding | {"job_events"})


@pytest.fixture
async def long_log(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A database whose log holds ROWS events, one per queued job, its statistics up to date."""
    conn = await db.connect(dsn)
    await fill_log(conn)
    await conn.execute("ANALYZE jobs, job_events")
    try:
        yield conn
    finally:
        await conn.close()


async def test_the_hub_reads_an_unanalyzed_log_through_its_index(dsn: str) -> None:
    """Before autovacuum has analyzed a log that grew, PostgreSQL plans from a guess; the
    hub's read must not turn into a scan of the whole log then (its `held` check once did)."""
    conn = await db.connect(dsn)
    try:
        await fill_log(conn)
        head = await conn.fetchrow(query("events_head"))
        below = await events.floor(conn, head["xid"])
        plan = await hub_plan(conn, head["xid"], head["id"], 100, below)
        assert plan and not await whole_scans(conn, plan), plan
    finally:
        await conn.close()


async def test_reading_the_log_never_scans_all_of_it(long_log: asyncpg.Connection) -> None:
    conn = long_log
    head = await conn.fetchrow(query("events_head"))
    assert head is not None
    job_id = await conn.fetchval("SELECT job_id FROM job_events ORDER BY id DESC LIMIT 1")
    position = (str(head["xid"]), head["id"], 100)
    below, start = await events.floor(conn, head["xid"]), events.MIN_ID
    hub = await hub_plan(conn, head["xid"], head["id"], 100, below)
    assert hub and not await whole_scans(conn, hub), hub
    reads = {
        "a tenant's stream": ("events_after", (*position, "default", None, None, None, below)),
        "a job's stream, from the start": (
            "events_after",
            ("0", 0, 100, None, job_id, None, None, start),
        ),
        "filtered by type": ("events_after", (*position, None, None, ["job.done"], None, below)),
    }
    for what, (name, args) in reads.items():
        plan = await explain(conn, query(name), *args)
        assert not await whole_scans(conn, plan), f"{what}: {plan}"
    # At the head, the partitions the pass sealed before the newest are not even planned.
    sealed = {
        row[0]
        for row in await conn.fetch(
            """SELECT r.partition::text FROM job_events_ranges() r
               JOIN job_events_sealed s ON s.hi = r.hi WHERE s.newest_xid IS NOT NULL"""
        )
    }
    assert len(sealed) == PARTS - 1
    name, args = reads["a tenant's stream"]
    for plan in (hub, await explain(conn, query(name), *args)):
        planned = {rel for _, rel in plan}
        assert planned and not planned & sealed, planned
    # A channel's stream from the start reads that channel's events, not the whole log.
    channel = ("0", 0, 100, "default", None, None, "user-100", start)
    touched = await blocks_read(conn, query("events_after"), *channel)
    assert touched < 100, f"{touched} buffers for a channel's 20 events"
    rows = await conn.fetch(query("events_after"), *channel)
    assert len(rows) == ROWS // 1000 and {row["payload"]["channel"] for row in rows} == {"user-100"}
    for name in ("events_head", "events_oldest_id"):
        plan = await explain(conn, query(name))
        assert not await whole_scans(conn, plan), f"{name}: {plan}"
    # A cursor (Last-Event-ID) is found in its own partition alone, through its primary key.
    [where] = await conn.fetch(
        "SELECT tableoid::regclass::text FROM job_events WHERE id = $1", head["id"]
    )
    plan = await explain(conn, query("event_position"), head["id"])
    assert plan == [("Index Scan", where[0])], plan
    # And the claim finds the due jobs through their index, not by reading every job.
    claim = await explain(conn, query("claim_jobs"), 4, "worker", 60.0)
    assert ("Seq Scan", "jobs") not in claim, claim


@pytest.fixture
async def many_jobs(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """ROWS finished jobs the size of an invoice, one in a hundred failed, newest first by
    number; and 7 queued."""
    conn = await db.connect(dsn)
    data = json.dumps({"lines": [{"item": f"Service {i}", "price": 9.5 + i} for i in range(20)]})
    await conn.execute(
        """INSERT INTO jobs (id, tenant, template, data, max_attempts, status, attempts,
                             object_key, bytes, finished_at, created_at)
           SELECT gen_random_uuid(), 'default', repeat('<p>{{ lines }}</p>', 40), $1::json,
                  3, CASE WHEN n % 100 = 0 THEN 'failed' ELSE 'done' END, 1,
                  CASE WHEN n % 100 = 0 THEN NULL ELSE 'key' END,
                  CASE WHEN n % 100 = 0 THEN NULL ELSE 1 END, now(),
                  now() - make_interval(secs => n)
           FROM generate_series(1, $2) AS n""",
        data,
        ROWS,
    )
    await conn.execute(
        """INSERT INTO jobs (id, tenant, template, data, max_attempts)
           SELECT gen_random_uuid(), 'default', '<p>x</p>', '{}', 1
           FROM generate_series(1, 7)"""
    )
    await conn.execute("VACUUM ANALYZE jobs")
    try:
        yield conn
    finally:
        await conn.close()


async def test_counting_jobs_by_state_reads_indexes_only(
    many_jobs: asyncpg.Connection,
) -> None:
    """/metrics counts jobs by state on every scrape without reading the rows (0007)."""
    plan = await explain(many_jobs, query("metrics_jobs"))
    assert ("Seq Scan", "jobs") not in plan, plan
    counts = {row["status"]: row["n"] for row in await many_jobs.fetch(query("metrics_jobs"))}
    assert counts == {"queued": 7, "done": ROWS - ROWS // 100, "failed": ROWS // 100}


async def test_listing_a_rare_state_reads_only_that_page(many_jobs: asyncpg.Connection) -> None:
    """GET /v1/jobs?status=failed among many done jobs goes through an index (0008)."""
    args = listing.list_args("default", listing.JobFilter(status=jobs.JobState.FAILED), None, 51)
    touched = await blocks_read(many_jobs, query("list_jobs"), *args)
    assert touched < 300, f"{touched} buffers for a page of 51 jobs"
    rows = await many_jobs.fetch(query("list_jobs"), *args)
    assert len(rows) == 51
    assert all(row["job"]["status"] == "failed" for row in rows)
    assert [row["created_at"] for row in rows] == sorted(
        (row["created_at"] for row in rows), reverse=True
    )


async def test_a_page_of_batches_reads_only_that_page(dsn: str) -> None:
    """GET /v1/batches (the dashboard's batches view) among many batches, newest first, reads
    one page of the tenant's index in order, not every batch sorted (0036). Each row's JSON
    (batch_public) reads its items' counts: about 17 buffers a batch, whatever their number."""
    conn = await db.connect(dsn)
    try:
        await conn.execute(
            """INSERT INTO batches (id, tenant, request_hash, created_at)
               SELECT gen_random_uuid(), CASE WHEN n % 10 = 0 THEN 'other' ELSE 'default' END,
                      md5(n::text), now() - make_interval(secs => n)
               FROM generate_series(1, $1) AS n""",
            ROWS,
        )
        await conn.execute("VACUUM ANALYZE batches")
        plan = await explain(conn, query("batch_list"), "default", None, None, 51)
        assert ("Index Scan", "batches") in plan and ("Seq Scan", "batches") not in plan, plan
        rows = await conn.fetch(query("batch_list"), "default", None, None, 51)
        assert len(rows) == 51
        assert [row["created_at"] for row in rows] == sorted(
            (row["created_at"] for row in rows), reverse=True
        )
    finally:
        await conn.close()


async def test_listing_a_channel_reads_only_its_jobs(many_jobs: asyncpg.Connection) -> None:
    """GET /v1/jobs?channel= (the dashboard's filter) among many jobs goes through an index."""
    await many_jobs.execute(
        """UPDATE jobs SET channel = 'user-7' WHERE id IN (
               SELECT id FROM jobs WHERE status = 'done' ORDER BY created_at LIMIT 30)"""
    )
    await many_jobs.execute("ANALYZE jobs")
    args = listing.list_args("default", listing.JobFilter(channel="user-7"), None, 51)
    touched = await blocks_read(many_jobs, query("list_jobs"), *args)
    assert touched < 200, f"{touched} buffers for a channel's 30 jobs"
    rows = await many_jobs.fetch(query("list_jobs"), *args)
    assert len(rows) == 30 and {row["job"]["channel"] for row in rows} == {"user-7"}


async def test_the_template_filter_reads_only_that_templates_jobs(
    many_jobs: asyncpg.Connection,
) -> None:
    """GET /v1/jobs?template= and its counts among many jobs go through jobs_tenant_template
    (0032): one version's jobs are told from the others' in the index, not by their rows."""
    await many_jobs.execute(
        """UPDATE jobs SET template_name = 'invoice',
                           template_version = CASE WHEN n % 10 = 0 THEN 2 ELSE 1 END
           FROM (SELECT id, row_number() OVER (ORDER BY created_at) AS n FROM jobs
                 WHERE status = 'done' ORDER BY created_at LIMIT 300) AS picked
           WHERE jobs.id = picked.id"""
    )
    await many_jobs.execute("VACUUM ANALYZE jobs")
    args = listing.list_args("default", listing.JobFilter(template=("invoice", 2)), None, 51)
    assert ("Seq Scan", "jobs") not in await explain(many_jobs, query("list_jobs"), *args)
    touched = await blocks_read(many_jobs, query("list_jobs"), *args)
    assert touched < 200, f"{touched} buffers for a version's 30 jobs"
    rows = await many_jobs.fetch(query("list_jobs"), *args)
    assert len(rows) == 30 and {(r["template_name"], r["template_version"]) for r in rows} == {
        ("invoice", 2)
    }
    counting = listing.count_args("default", listing.JobFilter(template=("invoice", None)))
    plan = await explain(many_jobs, query("count_jobs"), *counting)
    assert ("Seq Scan", "jobs") not in plan, plan
    counted = await many_jobs.fetch(query("count_jobs"), *counting)
    assert {row["status"]: row["n"] for row in counted}["done"] == 300


async def test_searching_reads_the_index_of_each_kind_of_match(
    many_jobs: asyncpg.Connection,
) -> None:
    """GET /v1/jobs?q= (the dashboard's search) finds a job by id prefix, idempotency key or
    metadata value through the primary key, jobs_idempotency and jobs_metadata_values (0029),
    never by reading every job."""
    picked = await many_jobs.fetchrow("SELECT id FROM jobs ORDER BY id OFFSET 5000 LIMIT 1")
    await many_jobs.execute(
        "UPDATE jobs SET idempotency_key = 'inv-9', metadata = '{\"order\": \"A-17\"}' "
        "WHERE id = $1",
        picked["id"],
    )
    await many_jobs.execute("ANALYZE jobs")
    for q in (str(picked["id"])[:8], "inv-9", "A-17"):
        args = listing.list_args("default", listing.JobFilter(q=q), None, 51)
        plan = await explain(many_jobs, query("list_jobs"), *args)
        assert ("Seq Scan", "jobs") not in plan, (q, plan)
        touched = await blocks_read(many_jobs, query("list_jobs"), *args)
        assert touched < 100, f"{touched} buffers to find {q!r}"
        rows = await many_jobs.fetch(query("list_jobs"), *args)
        assert [row["id"] for row in rows] == [picked["id"]], q


async def test_counting_the_lists_jobs_reads_an_index_only(many_jobs: asyncpg.Connection) -> None:
    """GET /v1/jobs/counts counts a tenant's jobs by state from jobs_tenant_tally (0029)."""
    args = listing.count_args("default", listing.JobFilter())
    plan = await explain(many_jobs, query("count_jobs"), *args)
    assert plan == [("Index Only Scan", "jobs")], plan
    counted = {row["status"]: row["n"] for row in await many_jobs.fetch(query("count_jobs"), *args)}
    assert counted == {
        "queued": 7,
        "running": 0,
        "done": ROWS - ROWS // 100,
        "failed": ROWS // 100,
        "cancelled": 0,
    }


async def test_the_hub_still_reads_what_follows_its_position(long_log: asyncpg.Connection) -> None:
    conn = long_log
    head = await conn.fetchrow(query("events_head"))
    job_id = uuid.uuid4()
    await conn.execute(
        """WITH j AS (INSERT INTO jobs (id, tenant, template, data, max_attempts)
                      VALUES ($1, 'default', '<p>x</p>', '{}', 1) RETURNING id, tenant)
           INSERT INTO job_events (job_id, tenant, type, payload)
           SELECT id, tenant, 'job.queued', '{}' FROM j""",
        job_id,
    )
    below = await events.floor(conn, head["xid"])
    rows = await conn.fetch(query("events_after_all"), str(head["xid"]), head["id"], 100, below)
    assert [row["job_id"] for row in rows] == [job_id]
    assert rows[0]["held"] is False


async def seq_scans(conn: asyncpg.Connection, table: str) -> int:
    """Sequential scans of `table` counted in this transaction's view of the statistics (it
    also holds what earlier transactions did and has not been sent yet: compare two reads)."""
    count = await conn.fetchval(
        "SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relname = $1", table
    )
    return int(count)


async def rows_read(conn: asyncpg.Connection, table: str) -> int:
    """Rows of `table` read by any scan, as seq_scans counts (compare two reads)."""
    count = await conn.fetchval(
        """SELECT seq_tup_read + coalesce(idx_tup_fetch, 0) FROM pg_stat_xact_user_tables
           WHERE relname = $1""",
        table,
    )
    return int(count)


async def finish_claimed(conn: asyncpg.Connection, claimed: list[asyncpg.Record]) -> list[Any]:
    """The done write for every attempt of `claimed` (rows of claim_jobs by worker "w")."""
    count = len(claimed)
    rows: list[Any] = await conn.fetch(
        query("finish_done_many"),
        [row["id"] for row in claimed],
        "w",
        [row["attempts"] for row in claimed],
        [f"k/{row['id']}" for row in claimed],
        [1] * count,
        [1] * count,
        ["[]"] * count,
        [json.dumps({"attempt": row["attempts"], "render": 0.1}) for row in claimed],
        [None] * count,  # what finishing did
        [json.dumps({"Version": "test"})] * count,  # the provenance
        [None] * count,  # what preflight found
    )
    return rows


async def test_a_done_write_with_a_webhook_does_not_read_the_whole_outbox(dsn: str) -> None:
    """The event trigger skips deliveries to a URL disabled by a 410 (0016); with ROWS
    deliveries kept in the outbox, that check must not scan them all (0018)."""
    conn = await db.connect(dsn)
    try:
        await conn.execute(
            """WITH j AS (
                   INSERT INTO jobs (id, tenant, template, data, max_attempts, status,
                                     attempts, object_key, bytes, finished_at)
                   SELECT gen_random_uuid(), 'default', '<p>x</p>', '{}', 1, 'done', 1, 'k',
                          1, now()
                   FROM generate_series(1, $1) RETURNING id, tenant)
               INSERT INTO webhook_deliveries
                   (job_id, tenant, url, type, payload, status, delivered_at)
               SELECT id, tenant, 'https://example.com/hook', 'job.done', '{}', 'delivered',
                      now()
               FROM j""",
            ROWS,
        )
        hook = "https://example.com/hook"
        new = [new_job(max_attempts=1, webhook_url=hook) for _ in range(3)]
        await jobs.create(conn, new)
        claimed = await conn.fetch(query("claim_jobs"), 3, "w", 60.0)
        async with conn.transaction():
            before = await seq_scans(conn, "webhook_deliveries")
            done = await finish_claimed(conn, claimed)
            scans = await seq_scans(conn, "webhook_deliveries") - before
        assert len(done) == 3
        assert scans == 0, f"{scans} sequential scans of the outbox for three done writes"
        pending = await conn.fetchval(
            "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending'"
        )
        assert pending == 3  # each job's delivery was queued
    finally:
        await conn.close()


async def test_the_kept_plans_of_the_claims_find_each_row_by_its_key(dsn: str) -> None:
    """A claim picks due rows with SKIP LOCKED, then updates them. PostgreSQL keeps the generic
    plan of a statement after five calls; costed for a LIMIT of unknown size, a join to the
    picked rows was planned as a hash join over every row of the table (at a few thousand
    rows), so each claim read the whole queue. Joined as an array of ids instead, the kept
    plan takes the primary key."""
    conn = await db.connect(dsn)
    try:
        await conn.execute(
            """WITH j AS (
                   INSERT INTO jobs (id, tenant, template, data, max_attempts)
                   SELECT gen_random_uuid(), 'default', '<p>x</p>', '{}', 1
                   FROM generate_series(1, 2000) RETURNING id, tenant)
               INSERT INTO webhook_deliveries (job_id, tenant, url, type, payload, status)
               SELECT id, tenant, 'https://example.com/hook', 'job.done', '{}', 'pending'
               FROM j"""
        )
        await conn.execute("ANALYZE jobs, webhook_deliveries")
        for name, table, args in [
            ("claim_jobs", "jobs", (4, "worker", 60)),
            ("claim_webhooks", "webhook_deliveries", (4, "sender", 60)),
        ]:
            async with conn.transaction():
                plan = await generic_plan(conn, query(name), *args)
            assert ("Seq Scan", table) not in plan, f"{name}: {plan}"
    finally:
        await conn.close()


async def test_the_done_write_keeps_a_plan_by_key_from_a_young_table(dsn: str) -> None:
    """The done write keeps one plan for the session (0019). Planned while the table held a
    few jobs, then run after it grew to ROWS, it still finds each job by its key: with the
    table unanalyzed, only the kept plan stands between it and a scan of every job, by the
    table or by an index on the state (0041)."""
    conn = await db.connect(dsn)

    async def claim_and_finish(count: int) -> tuple[int, int]:
        await jobs.create(conn, [new_job(max_attempts=1) for _ in range(count)])
        claimed = await conn.fetch(query("claim_jobs"), count, "w", 60.0)
        async with conn.transaction():
            scans, read = await seq_scans(conn, "jobs"), await rows_read(conn, "jobs")
            done = await finish_claimed(conn, claimed)
            scans = await seq_scans(conn, "jobs") - scans
            read = await rows_read(conn, "jobs") - read
        assert sorted(row["id"] for row in done) == sorted(row["id"] for row in claimed)
        return scans, read

    try:
        for _ in range(6):  # past the five calls after which a statement's plan is kept
            await claim_and_finish(2)
        await conn.execute(
            """INSERT INTO jobs (id, tenant, template, data, max_attempts, status, attempts,
                                 object_key, bytes, finished_at)
               SELECT gen_random_uuid(), 'default', '<p>x</p>', '{}', 1, 'done', 1, 'k', 1,
                      now()
               FROM generate_series(1, $1)""",
            ROWS,
        )
        scans, read = await claim_and_finish(3)
        assert scans == 0, f"{scans} sequential scans of jobs for a done write of three jobs"
        # By key, each job is read a few times (the update, the check for one done already, the
        # attempt's foreign key); an index on the state would read every done job.
        assert read <= 3 * 4, f"{read} rows of jobs read for a done write of three jobs"
        statuses = await conn.fetch("SELECT DISTINCT status FROM jobs")
        assert {row["status"] for row in statuses} == {"done"}
    finally:
        await conn.close()
