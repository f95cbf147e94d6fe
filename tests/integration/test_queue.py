"""The queue on a real PostgreSQL: one-statement claims, priorities, schedules, states."""

from __future__ import annotations

import asyncio
import datetime as dt
import uuid

import asyncpg
import pytest

from server import sql
from server.queue import jobs
from server.queue.listener import CHANNEL as LISTEN_CHANNEL
from tests.newjobs import new_job


async def test_concurrent_claims_never_share_a_job(pool: asyncpg.Pool) -> None:
    await jobs.create(pool, [new_job() for _ in range(300)])
    claims = await asyncio.gather(
        *(jobs.claim(pool, limit=7, worker_id=f"w{i}", lease_s=30) for i in range(60))
    )
    claimed = [job.id for batch in claims for job in batch]
    assert len(claimed) == len(set(claimed)) == 300
    assert all(job.attempt == 1 for batch in claims for job in batch)
    running = await pool.fetchval("SELECT count(*) FROM job_events WHERE type = 'job.running'")
    assert running == 300


async def test_claim_takes_higher_priority_first_and_honours_run_at(pool: asyncpg.Pool) -> None:
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    [low, high, scheduled] = await jobs.create(
        pool, [new_job(priority=0), new_job(priority=10), new_job(priority=99, run_at=later)]
    )
    first = await jobs.claim(pool, limit=1, worker_id="w", lease_s=30)
    second = await jobs.claim(pool, limit=5, worker_id="w", lease_s=30)
    assert [str(j.id) for j in first] == [high["id"]]
    assert [str(j.id) for j in second] == [low["id"]]
    assert scheduled["status"] == "queued"
    assert await jobs.next_due_at(pool) == dt.datetime.fromisoformat(scheduled["run_after"])


async def test_a_finish_from_an_attempt_that_lost_the_job_is_refused(pool: asyncpg.Pool) -> None:
    [created] = await jobs.create(pool, [new_job()])
    [claimed] = await jobs.claim(pool, limit=1, worker_id="w1", lease_s=30)
    assert await jobs.cancel(pool, claimed.id, "default") is not None
    done = await jobs.finish_done(
        pool, claimed, worker_id="w1", size_bytes=10, pages=1, warnings=[]
    )
    assert done is False
    status = await pool.fetchval("SELECT status FROM jobs WHERE id = $1", uuid.UUID(created["id"]))
    assert status == "cancelled"


async def test_a_finish_retried_after_its_answer_was_lost_is_still_the_attempts(
    pool: asyncpg.Pool,
) -> None:
    # The first write committed but its answer never came (a failover, a cut cable): the
    # worker writes again, and must not be told the job is not its own, or it would delete
    # the file of a done job. Another attempt's write is refused as before.
    await jobs.create(pool, [new_job(max_attempts=2)])
    [first] = await jobs.claim(pool, limit=1, worker_id="w1", lease_s=30)
    await pool.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second'")
    assert await jobs.rescue_expired(pool) == 1
    [second] = await jobs.claim(pool, limit=1, worker_id="w2", lease_s=30)
    finish = dict(size_bytes=10, pages=1, warnings=[])
    assert await jobs.finish_done(pool, second, worker_id="w2", **finish) is True
    assert await jobs.finish_done(pool, second, worker_id="w2", **finish) is True
    assert await jobs.finish_done(pool, first, worker_id="w1", **finish) is False
    done = await pool.fetchval("SELECT count(*) FROM job_events WHERE type = 'job.done'")
    assert done == 1


async def test_expired_leases_are_rescued_or_failed_when_out_of_attempts(
    pool: asyncpg.Pool,
) -> None:
    [retry_me, last_try] = await jobs.create(
        pool, [new_job(max_attempts=2), new_job(max_attempts=1)]
    )
    await jobs.claim(pool, limit=2, worker_id="dead", lease_s=30)
    await pool.execute("UPDATE jobs SET lease_expires_at = now() - interval '1 second'")
    assert await jobs.rescue_expired(pool) == 2
    rows = {
        str(r["id"]): r for r in await pool.fetch("SELECT id, status, error, attempts FROM jobs")
    }
    assert rows[retry_me["id"]]["status"] == "queued"
    assert rows[last_try["id"]]["status"] == "failed"
    assert "lease expired" in rows[last_try["id"]]["error"]
    types = await pool.fetch(
        "SELECT type FROM job_events WHERE type IN ('job.retrying', 'job.failed')"
    )
    assert sorted(t["type"] for t in types) == ["job.failed", "job.retrying"]


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE jobs SET status = 'done'",  # queued → done skips running (and has no file)
        "UPDATE jobs SET status = 'bogus'",
        "UPDATE jobs SET attempts = 99",
        "UPDATE jobs SET status = 'running'",  # running needs a lease
    ],
)
async def test_the_database_refuses_invalid_states(pool: asyncpg.Pool, statement: str) -> None:
    await jobs.create(pool, [new_job()])
    with pytest.raises((asyncpg.CheckViolationError, asyncpg.RaiseError)):
        await pool.execute(statement)


async def test_migrations_and_queries_agree(pool: asyncpg.Pool) -> None:
    applied = [
        r["version"] for r in await pool.fetch("SELECT version FROM schema_migrations ORDER BY 1")
    ]
    assert applied == [version for version, _ in sql.migrations()]
    # Every named query is valid SQL against the migrated schema.
    async with pool.acquire() as conn:
        for name, text in sql.queries().items():
            try:
                await conn.prepare(text)
            except asyncpg.PostgresError as exc:
                pytest.fail(f"query {name} does not match the schema: {exc}")


async def test_renders_finishing_together_are_recorded_in_one_statement(pool: asyncpg.Pool) -> None:
    await jobs.create(pool, [new_job() for _ in range(20)])
    claimed = await jobs.claim(pool, limit=20, worker_id="w1", lease_s=30)
    for lost in claimed[:2]:
        await jobs.cancel(pool, lost.id, "default")
    recorder = jobs.DoneRecorder(pool, worker_id="w1")
    results = await asyncio.gather(
        *(recorder.submit(jobs.Done(job, 100, 1, [f"note {n}"])) for n, job in enumerate(claimed))
    )
    assert results == [False, False] + [True] * 18, "a lost attempt is refused, the rest done"
    assert recorder.batches <= 3
    rows = await pool.fetch("SELECT status, warnings, object_key FROM jobs WHERE status = 'done'")
    assert len(rows) == 18 and all(r["warnings"][0].startswith("note") for r in rows)
    assert all(r["object_key"].endswith("/1.pdf") for r in rows)
    done_events = await pool.fetchval("SELECT count(*) FROM job_events WHERE type = 'job.done'")
    assert done_events == 18


async def test_a_claimed_job_gets_its_data_exactly_as_sent(pool: asyncpg.Pool) -> None:
    data = {"zebra": 1, "a": {"yy": -0.0, "x": 1e20}, "mid": [3, 2, 1]}
    [created] = await jobs.create(pool, [new_job(data=data)])
    [claimed] = await jobs.claim(pool, limit=1, worker_id="w", lease_s=30)
    stored = await pool.fetchval("SELECT data FROM jobs WHERE id = $1", uuid.UUID(created["id"]))
    for value in (claimed.data, stored):
        assert value == data
        assert list(value) == ["zebra", "a", "mid"] and list(value["a"]) == ["yy", "x"]
        assert repr(value["a"]["yy"]) == "-0.0" and repr(value["a"]["x"]) == "1e+20"


async def test_a_new_job_notifies_the_workers(pool: asyncpg.Pool, dsn: str) -> None:
    listener = await asyncpg.connect(dsn)
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener(LISTEN_CHANNEL, lambda *args: heard.put_nowait(args[-1]))
    try:
        await jobs.create(pool, [new_job()])
        assert (await asyncio.wait_for(heard.get(), 5)).startswith("q:")  # work: wake up
    finally:
        await listener.close()
