"""The event log in partitions (0017_event_log_partitions.sql): the migration moves a log holding
every type of event without losing one or a client's cursor; the log's pass makes partitions
ahead of its writers, closes one that filled for longer than a stretch, and drops expired ones
whole; a cursor into a dropped partition gets a reset."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from server import events, sql
from server.events import JobEvent, Position, streams
from server.queue import db, jobs, retention
from server.queue.jobs import NewJob

BEFORE = "0016_batch_combine"
HOOK = "http://127.0.0.1:9/hook"
HOUR_S = 3600
#: How each event's state change was written before 0017, in SQL that 0016's jobs table takes
#: and always will: today's statements name columns that later migrations add.
RELEASED = "lease_expires_at = NULL, worker_id = NULL"
ERROR = (
    "error = 'boom', errors = errors || jsonb_build_array("
    "jsonb_build_object('attempt', attempts, 'error', 'boom', 'at', now()))"
)
CHANGES = {
    "job.running": "status = 'running', attempts = attempts + 1, worker_id = 'w',"
    " lease_expires_at = now() + interval '1 minute', started_at = now(), progress = NULL",
    "job.progress": "progress = 50",
    "job.done": "status = 'done', progress = 100, object_key = 'k', bytes = 10, pages = 1,"
    f" {RELEASED}, finished_at = now()",
    "job.retrying": f"status = 'queued', {ERROR}, {RELEASED}, progress = NULL",
    "job.failed": f"status = 'failed', {ERROR}, {RELEASED}, progress = NULL, finished_at = now()",
    "job.cancelled": f"status = 'cancelled', {RELEASED}, finished_at = now()",
}


def new_job(*, channel: str | None = None, webhook_url: str | None = None) -> NewJob:
    return NewJob(
        tenant="default",
        template="<p>x</p>",
        data={},
        options={},
        metadata={},
        max_attempts=2,
        channel=channel,
        webhook_url=webhook_url,
    )


@contextlib.asynccontextmanager
async def migrated_to(server_dsn: str, version: str) -> AsyncIterator[tuple[str, asyncpg.Pool]]:
    """A new database that the migration runner took up to `version` only, and a pool on it."""
    name = f"pressroom_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_dsn)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    dsn = urlunsplit(urlsplit(server_dsn)._replace(path="/" + name))
    every = sql.migrations()
    upto = [m for m in every if m[0] <= version]
    conn = await db.connect(dsn)
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(sql, "migrations", lambda: upto)
            assert (await db.migrate(conn))[-1] == version
    finally:
        await conn.close()
    pool = await db.create_pool(dsn, min_size=1, max_size=4)
    try:
        yield dsn, pool
    finally:
        await pool.close()
        admin = await asyncpg.connect(server_dsn)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def whole_log(
    pool: asyncpg.Pool, after: Position = events.START, *, channel: str | None = None
) -> list[int]:
    """The ids of every final event after `after` in log order (of one channel of the default
    tenant), page by page as a stream reads them."""
    ids: list[int] = []
    tenant = "default" if channel is not None else None
    while True:
        page, _ = await events.after(pool, after, limit=7, tenant=tenant, channel=channel)
        ids += [e.id for e in page]
        if len(page) < 7:
            return ids
        after = page[-1].position


async def queue(pool: asyncpg.Pool, *jobs: tuple[str | None, str | None]) -> list[uuid.UUID]:
    """New jobs, each a (channel, webhook_url), with their job.queued events in one statement,
    as 0016's queue wrote them."""
    ids = [uuid.uuid4() for _ in jobs]
    await pool.execute(
        "WITH new AS ("
        " INSERT INTO jobs (id, tenant, template, max_attempts, channel, webhook_url)"
        " SELECT id, 'default', '<p>x</p>', 2, channel, hook"
        " FROM unnest($1::uuid[], $2::text[], $3::text[]) AS t(id, channel, hook)"
        " RETURNING *)"
        " INSERT INTO job_events (job_id, tenant, type, payload)"
        " SELECT id, tenant, 'job.queued', job_public(new::jobs) FROM new ORDER BY id",
        ids,
        [channel for channel, _ in jobs],
        [hook for _, hook in jobs],
    )
    return ids


async def move(pool: asyncpg.Pool, event: str, *ids: uuid.UUID) -> None:
    """Jobs' state change and its events in one statement: 0016's job_events trigger writes
    the rest (NOTIFY, webhook outbox rows, batch events) as it did then."""
    await pool.execute(
        f"WITH moved AS (UPDATE jobs SET {CHANGES[event]}, updated_at = now()"
        " WHERE id = ANY($1::uuid[]) RETURNING *)"
        " INSERT INTO job_events (job_id, tenant, type, payload)"
        " SELECT id, tenant, $2, job_public(moved::jobs) FROM moved ORDER BY id",
        ids,
        event,
    )


async def log_every_type(pool: asyncpg.Pool) -> None:
    """Events of every type, written on the 0016 schema: jobs with channels and webhooks, two of
    them in a batch on a channel, each job taken to another end (one left running)."""
    done, failed = await queue(pool, ("user-1", HOOK), (None, HOOK))
    batch = uuid.uuid4()
    await pool.execute(
        "INSERT INTO batches (id, tenant, request_hash, channel) VALUES ($1, 'default', 'h', 'b')",
        batch,
    )
    await pool.execute(
        "INSERT INTO batch_items (batch_id, position, key, job_id)"
        " VALUES ($1, 0, 'a', $2), ($1, 1, 'b', $3)",
        batch,
        done,
        failed,
    )
    await pool.execute("SELECT batch_log_events(ARRAY[$1::uuid])", batch)
    cancelled, running = await queue(pool, ("user-2", HOOK), (None, None))
    await move(pool, "job.running", done, failed, cancelled, running)
    await move(pool, "job.progress", done)
    await move(pool, "job.done", done)
    await move(pool, "job.retrying", failed)
    await move(pool, "job.running", failed)
    await move(pool, "job.failed", failed)
    await move(pool, "job.cancelled", cancelled)


async def test_the_migration_moves_every_event_and_every_cursor_resumes(server_dsn: str) -> None:
    async with migrated_to(server_dsn, BEFORE) as (dsn, pool):
        await log_every_type(pool)
        # The log in log order, as 0016 has it (nothing is running: all of it is final).
        in_order = "SELECT id FROM job_events WHERE $1::text IS NULL OR payload->>'channel' = $1"
        in_order += " ORDER BY xid, id"
        before = [row["id"] for row in await pool.fetch(in_order, None)]
        types = {row["type"] for row in await pool.fetch("SELECT type FROM job_events")}
        assert types == events.TYPES - {"template.published"}  # 0035 added it
        channel = [row["id"] for row in await pool.fetch(in_order, "user-1")]
        batch_channel = [row["id"] for row in await pool.fetch(in_order, "b")]
        assert channel and batch_channel
        rows = "SELECT id, xid::text, job_id, type, payload, created_at FROM job_events ORDER BY id"
        stored = await pool.fetch(rows)
        outbox = await pool.fetch("SELECT * FROM webhook_deliveries ORDER BY id")
        assert len(outbox) == 3  # done, failed, cancelled: each had a webhook_url
        # A client holds each event id as its cursor (Last-Event-ID, since) across the migration.
        cursors = [row["id"] for row in stored]

        async with pool.acquire() as conn:
            applied = await db.migrate(conn)
        assert applied == [v for v, _ in sql.migrations() if v > BEFORE]
        assert applied[0] == "0017_event_log_partitions"

        assert (
            await pool.fetchval("SELECT relkind::text FROM pg_class WHERE relname = 'job_events'")
            == "p"
        )
        assert await pool.fetch(rows) == stored  # the same rows: ids, xids, payloads, times
        assert await pool.fetch("SELECT * FROM webhook_deliveries ORDER BY id") == outbox
        assert await whole_log(pool) == before
        for n, cursor in enumerate(cursors):
            located = await events.locate(pool, cursor)
            assert located is not None
            assert await whole_log(pool, located.position) == before[before.index(cursor) + 1 :]
            assert (await streams.start(pool, tenant="default", job_id=None, cursor=cursor)) == (
                streams.Start(located.position, reset=None, history=True)
            ), n
        assert await whole_log(pool, channel="user-1") == channel
        assert await whole_log(pool, channel="b") == batch_channel

        # New events after it: in order after the last cursor, with their NOTIFY and outbox row.
        last = await events.locate(pool, before[-1])
        assert last is not None
        woken: asyncio.Queue[str] = asyncio.Queue()
        listener = await db.connect(dsn)
        await listener.add_listener("pressroom", lambda *args: woken.put_nowait(args[3]))
        try:
            job = new_job(webhook_url=HOOK)
            await jobs.create(pool, [job])
            hint = await asyncio.wait_for(woken.get(), 10)
        finally:
            await listener.close()
        [claimed] = await jobs.claim(pool, limit=1, worker_id="w", lease_s=60)
        await jobs.cancel(pool, job.id, "default")
        new: list[JobEvent] = (await events.after(pool, last.position))[0]
        assert [e.type for e in new] == ["job.queued", "job.running", "job.cancelled"]
        assert hint == f"q:{new[0].id}"
        assert all(e.job_id == claimed.id for e in new)
        assert await pool.fetchval("SELECT count(*) FROM webhook_deliveries") == 4


async def partition_of(pool: asyncpg.Pool, event_id: int) -> str:
    name: str = await pool.fetchval(
        "SELECT tableoid::regclass::text FROM job_events WHERE id = $1", event_id
    )
    return name


async def queue_one(pool: asyncpg.Pool | asyncpg.Connection) -> int:
    """A new job's job.queued event id."""
    await jobs.create(pool, [new_job()])
    last: int = await pool.fetchval("SELECT max(id) FROM job_events")
    return last


async def test_an_expired_partition_is_dropped_and_its_cursors_reset(pool: asyncpg.Pool) -> None:
    old = [await queue_one(pool) for _ in range(3)]
    # Their partition filled for longer than a stretch: the pass closes it.
    await pool.execute("UPDATE job_events SET created_at = now() - interval '2 hours'")
    await retention.extend_log(pool, stretch_s=HOUR_S)
    recent = [await queue_one(pool) for _ in range(3)]
    expired = await partition_of(pool, old[0])
    assert {await partition_of(pool, i) for i in old} == {expired}
    assert expired not in {await partition_of(pool, i) for i in recent}
    cursor = await events.locate(pool, recent[0])
    assert cursor is not None

    assert await retention.prune_log(pool, keep_s=3 * HOUR_S) == []
    await pool.execute(
        "UPDATE job_events SET created_at = now() - interval '4 hours' WHERE id = ANY($1)", old
    )
    assert await retention.prune_log(pool, keep_s=3 * HOUR_S) == [expired]

    assert await pool.fetchval("SELECT array_agg(id ORDER BY id) FROM job_events") == recent
    assert await pool.fetchval("SELECT to_regclass($1)", expired) is None
    start = await streams.start(pool, tenant="default", job_id=None, cursor=old[-1])
    assert start.reset == streams.PRUNED and start.position is None
    # A cursor into what is kept resumes as before.
    assert await whole_log(pool, cursor.position) == recent[1:]
    assert await retention.prune_log(pool, keep_s=3 * HOUR_S) == []


async def test_partitions_are_made_ahead_so_no_insert_fails_at_a_boundary(
    pool: asyncpg.Pool,
) -> None:
    ranges = "SELECT partition::text, lo, hi FROM job_events_ranges()"
    next_id = "SELECT job_events_next_id()"
    [*_, (current, _, hi)] = await pool.fetch(ranges)
    assert await pool.fetchval(next_id) < hi
    # Writers reach the end of the current partition: the one ahead takes the next events,
    # within one statement too.
    await pool.execute("SELECT setval('job_events_id_seq', $1 - 2)", hi)
    assert await retention.extend_log(pool, stretch_s=HOUR_S) == 1
    [*_, (_, ahead, top)] = await pool.fetch(ranges)
    assert ahead == hi and top - await pool.fetchval(next_id) >= retention.MIN_PARTITION_IDS
    await jobs.create(pool, [new_job() for _ in range(4)])
    placed = await pool.fetch(
        "SELECT id, tableoid::regclass::text AS part FROM job_events ORDER BY id"
    )
    assert [(row["id"] - hi, row["part"]) for row in placed] == [
        (-1, current),
        (0, f"job_events_from_{hi}"),
        (1, f"job_events_from_{hi}"),
        (2, f"job_events_from_{hi}"),
    ]

    # A burst past every range before the pass ran again: its events go to the overflow,
    # and the next pass starts the next range after them.
    await pool.execute("SELECT setval('job_events_id_seq', $1 + 5)", top)
    burst = [await queue_one(pool) for _ in range(2)]
    assert {await partition_of(pool, i) for i in burst} == {"job_events_overflow"}
    assert await retention.extend_log(pool, stretch_s=HOUR_S) >= 1
    after = await queue_one(pool)
    assert await partition_of(pool, after) == f"job_events_from_{top + 8}"
    first = await events.locate(pool, burst[0])
    assert first is not None
    assert await whole_log(pool, first.position) == [burst[1], after]
    # Once all of the overflow's events are past the keep time, it is emptied too.
    await pool.execute(
        "UPDATE job_events SET created_at = now() - interval '4 hours' WHERE id = ANY($1)", burst
    )
    assert "job_events_overflow" in (await retention.prune_log(pool, keep_s=3 * HOUR_S) or [])
    assert await pool.fetchval("SELECT count(*) FROM job_events_overflow") == 0
    kept = await whole_log(pool)
    assert after in kept and not set(burst) & set(kept)


async def test_one_pass_at_a_time(pool: asyncpg.Pool) -> None:
    async with pool.acquire() as other:
        await other.execute("SELECT pg_advisory_lock($1)", retention.EVENT_LOG_LOCK)
        try:
            assert await retention.extend_log(pool, stretch_s=HOUR_S) is None
            assert await retention.prune_log(pool, keep_s=HOUR_S) is None
        finally:
            await other.execute("SELECT pg_advisory_unlock($1)", retention.EVENT_LOG_LOCK)
    assert await retention.prune_log(pool, keep_s=HOUR_S) == []


async def test_a_partition_is_sealed_only_once_its_writers_are_done(pool: asyncpg.Pool) -> None:
    """A writer still open with an event in a partition holds back its seal (and the move to
    the next partition): the newest xid written down is final, so a read may skip it."""
    old = await queue_one(pool)
    await pool.execute("UPDATE job_events SET created_at = now() - interval '2 hours'")
    async with pool.acquire() as writer:
        tx = writer.transaction()
        await tx.start()
        late = await queue_one(writer)
        with pytest.raises(asyncpg.LockNotAvailableError):
            await retention.extend_log(pool, stretch_s=HOUR_S)
        await tx.commit()
    assert await retention.extend_log(pool, stretch_s=HOUR_S) == 1
    newest = await pool.fetchval(
        "SELECT newest_xid::text::bigint FROM job_events_sealed s"
        " JOIN job_events_ranges() r ON r.hi = s.hi WHERE r.partition = $1::regclass",
        await partition_of(pool, old),
    )
    assert newest == await pool.fetchval(
        "SELECT xid::text::bigint FROM job_events WHERE id = $1", late
    )
    # Reads after the late event skip that partition now; reads after the first do not.
    assert await events.floor(pool, newest + 1) > late
    located = await events.locate(pool, old)
    assert located is not None and await whole_log(pool, located.position) == [late]
