"""One write path for a state change: whatever statement writes an event row, the job_events
trigger (0010) writes its NOTIFY, its webhook outbox row and its batch event, in the same
transaction; no statement writes them itself."""

from __future__ import annotations

import asyncio
import contextlib
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from server.queue import jobs
from server.queue.jobs import NewJob
from server.sql import queries

HOOK = "https://example.com/hook"
WORKER = "test-worker"


def new_job(*, webhook_url: str | None = HOOK, max_attempts: int = 2) -> NewJob:
    return NewJob(
        tenant="default",
        template="<p>x</p>",
        data={},
        options={},
        metadata={},
        max_attempts=max_attempts,
        webhook_url=webhook_url,
    )


class Heard:
    """Every notification on Pressroom's two channels, in the order they arrive."""

    def __init__(self) -> None:
        self.items: asyncio.Queue[tuple[str, str]] = asyncio.Queue()

    def __call__(self, _conn: object, _pid: int, channel: str, payload: str) -> None:
        self.items.put_nowait((channel, payload))

    async def until_marker(self, pool: asyncpg.Pool) -> list[tuple[str, str]]:
        """What was heard up to now: notifications arrive in commit order, so once a marker
        sent after everything else is heard, all before it were."""
        await pool.execute("SELECT pg_notify('pressroom', 'marker')")
        heard = []
        async with asyncio.timeout(10):
            while (item := await self.items.get()) != ("pressroom", "marker"):
                heard.append(item)
        return heard


@contextlib.asynccontextmanager
async def listening(dsn: str) -> AsyncIterator[Heard]:
    heard = Heard()
    conn = await asyncpg.connect(dsn)
    await conn.add_listener("pressroom", heard)
    await conn.add_listener("pressroom_webhooks", heard)
    try:
        yield heard
    finally:
        await conn.close()


async def outbox(pool: asyncpg.Pool) -> list[dict[str, Any]]:
    rows = await pool.fetch(
        "SELECT job_id, tenant, url, type, payload, status FROM webhook_deliveries"
        " ORDER BY created_at, id"
    )
    return [dict(row) for row in rows]


async def test_an_event_row_from_a_statement_without_side_effect_sql_gets_them_all(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """A new transition written as bare SQL (the change and its event row, nothing more)
    still sends its NOTIFY, writes its outbox row and logs its batch's event."""
    [job] = await jobs.create(pool, [new_job()])
    batch_id = uuid.uuid4()
    await pool.execute(
        "INSERT INTO batches (id, tenant, request_hash) VALUES ($1, 'default', 'h')", batch_id
    )
    await pool.execute(
        "INSERT INTO batch_items (batch_id, position, key, job_id) VALUES ($1, 0, 'k', $2)",
        batch_id,
        uuid.UUID(job["id"]),
    )
    async with listening(dsn) as heard:
        event = await pool.fetchrow(
            """WITH c AS (
                   UPDATE jobs SET status = 'cancelled', finished_at = now(), updated_at = now()
                   WHERE id = $1 RETURNING *)
               INSERT INTO job_events (job_id, tenant, type, payload)
               SELECT id, tenant, 'job.cancelled', job_public(c::jobs) FROM c
               RETURNING id, xid, payload""",
            uuid.UUID(job["id"]),
        )
        assert event is not None
        notified = await heard.until_marker(pool)
    assert notified == [("pressroom_webhooks", "w"), ("pressroom", f"e:{event['id']}")]
    assert await outbox(pool) == [
        {
            "job_id": uuid.UUID(job["id"]),
            "tenant": "default",
            "url": HOOK,
            "type": "job.cancelled",
            "payload": event["payload"],
            "status": "pending",
        }
    ]
    logged = await pool.fetch(
        "SELECT type, xid, payload->>'status' AS status FROM job_events"
        " WHERE job_id IS NULL ORDER BY xid, id"
    )
    assert [(row["type"], row["xid"], row["status"]) for row in logged] == [
        ("batch.done", event["xid"], "done")
    ]


async def test_every_transition_gets_its_notify_and_outbox_row(
    pool: asyncpg.Pool, dsn: str
) -> None:
    """Each state change Pressroom makes, through the functions that run it: one NOTIFY per
    statement naming its last event ('q' when work became due), and an outbox row for each
    final event of a job with a webhook URL, carrying that event's payload."""
    async with listening(dsn) as heard:
        [first] = await jobs.create(pool, [new_job()])  # q: job.queued
        [claimed] = await jobs.claim(pool, limit=1, worker_id=WORKER, lease_s=60)  # e
        failed = {"worker_id": WORKER, "error": "boom", "retry_in_s": 0.0, "warnings": []}
        await jobs.finish_failed(pool, claimed, retryable=True, **failed)  # q: job.retrying
        [claimed] = await jobs.claim(pool, limit=1, worker_id=WORKER, lease_s=60)  # e
        await jobs.finish_failed(pool, claimed, retryable=False, **failed)  # e: job.failed
        await jobs.retry(pool, claimed.id, "default")  # q: job.queued
        [claimed] = await jobs.claim(pool, limit=1, worker_id=WORKER, lease_s=60)  # e
        await jobs.finish_done(
            pool, claimed, worker_id=WORKER, size_bytes=1, pages=1, warnings=[]
        )  # e: job.done
        [quiet] = await jobs.create(pool, [new_job(webhook_url=None)])  # q
        await jobs.cancel(pool, uuid.UUID(quiet["id"]), "default")  # e: no outbox row
        await jobs.create(pool, [new_job(max_attempts=1)])  # q
        [lost] = await jobs.claim(pool, limit=1, worker_id=WORKER, lease_s=60)  # e
        await pool.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second'")
        assert await jobs.rescue_expired(pool) == 1  # e: job.failed, out of attempts
        await jobs.create(pool, [new_job()])  # q
        [held] = await jobs.claim(pool, limit=1, worker_id=WORKER, lease_s=60)  # e
        assert await jobs.release(pool, [held.id], worker_id=WORKER) == 1  # q: job.retrying
        notified = await heard.until_marker(pool)

    statements = await pool.fetch(
        "SELECT max(id) AS last, array_agg(type ORDER BY id) AS types FROM job_events"
        " GROUP BY xid ORDER BY xid"
    )
    kinds = "q e q e e q e e q e q e e q e q".split()
    assert [payload for channel, payload in notified if channel == "pressroom"] == [
        f"{kind}:{row['last']}" for kind, row in zip(kinds, statements, strict=True)
    ]
    final = await pool.fetch(
        "SELECT e.job_id, e.type, e.payload FROM job_events e JOIN jobs j ON j.id = e.job_id"
        " WHERE e.type IN ('job.done', 'job.failed', 'job.cancelled')"
        " AND j.webhook_url IS NOT NULL ORDER BY e.id"
    )
    assert [(row["type"], row["job_id"]) for row in final] == [
        ("job.failed", claimed.id),
        ("job.done", claimed.id),
        ("job.failed", lost.id),
    ]
    assert [(row["job_id"], row["type"], row["payload"]) for row in await outbox(pool)] == [
        (row["job_id"], row["type"], row["payload"]) for row in final
    ]
    assert uuid.UUID(first["id"]) == claimed.id
    webhook_notifies = [payload for channel, payload in notified if channel != "pressroom"]
    assert webhook_notifies == ["w", "w", "w"]


def test_no_statement_writes_a_side_effect_itself() -> None:
    """The NOTIFY and the outbox row are written by the trigger alone (0010)."""
    repeated = {
        name
        for name, text in queries().items()
        if re.search(r"pg_notify|INSERT\s+INTO\s+webhook_deliveries", text, re.IGNORECASE)
    }
    assert repeated == set()
