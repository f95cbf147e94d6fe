"""Concurrent submissions share one transaction and one NOTIFY; a lone one does not wait."""

from __future__ import annotations

import asyncio

import asyncpg

from server.queue.jobs import GroupCommit, NewJob
from server.queue.listener import CHANNEL


def new_job(n: int) -> NewJob:
    return NewJob(
        tenant="default",
        template="<p>{{ n }}</p>",
        data={"n": n},
        options={},
        metadata={},
        max_attempts=3,
    )


async def test_concurrent_submissions_are_grouped(pool: asyncpg.Pool, dsn: str) -> None:
    notifications: list[str] = []
    arrived = asyncio.Event()

    def on_notify(*args: object) -> None:
        notifications.append(str(args[3]))
        arrived.set()

    listener = await asyncpg.connect(dsn)
    await listener.add_listener(CHANNEL, on_notify)
    group = GroupCommit(pool)
    try:
        lone = await group.create(new_job(0))
        assert lone["status"] == "queued" and group.batches == 1
        created = await asyncio.gather(*(group.create(new_job(n)) for n in range(1, 101)))
        assert [job["status"] for job in created] == ["queued"] * 100
        assert len({job["id"] for job in created}) == 100
        assert group.inserted == 101
        assert group.batches <= 3, "100 concurrent submissions go in a few transactions"
        rows = await pool.fetch("SELECT data->>'n' AS n FROM jobs")
        assert sorted(int(r["n"]) for r in rows) == list(range(101))
        events = await pool.fetchval("SELECT count(*) FROM job_events WHERE type = 'job.queued'")
        assert events == 101

        async with asyncio.timeout(5):
            while len(notifications) < group.batches:
                arrived.clear()
                await arrived.wait()
        assert len(notifications) == group.batches, "one NOTIFY per transaction"
    finally:
        await listener.close()


async def test_a_bad_row_does_not_fail_its_neighbours(pool: asyncpg.Pool) -> None:
    group = GroupCommit(pool)
    good = [new_job(n) for n in range(5)]
    bad = NewJob(tenant="default", template="x", data={}, options={}, metadata={}, max_attempts=0)
    results = await asyncio.gather(
        *(group.create(job) for job in [*good[:2], bad, *good[2:]]), return_exceptions=True
    )
    assert isinstance(results[2], asyncpg.CheckViolationError)
    assert all(
        isinstance(r, dict) and r["status"] == "queued" for i, r in enumerate(results) if i != 2
    )
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 5
