"""The event log is read in commit-safe order: no gap and no duplicate on resume, even when two
transactions commit in the opposite order of their event ids."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg

from server import events
from server.queue import jobs
from server.queue.jobs import NewJob
from tests.conftest import RunningApp
from tests.sse import Message, collect, messages


def new_job() -> NewJob:
    return NewJob(
        tenant="default", template="<p>x</p>", data={}, options={}, metadata={}, max_attempts=3
    )


async def test_reader_waits_for_an_open_transaction_with_a_smaller_event_id(
    pool: asyncpg.Pool,
) -> None:
    start = await events.head(pool)
    slow = await pool.acquire()
    try:
        tx = slow.transaction()
        await tx.start()
        # The slow transaction takes the smaller event id and stays open...
        [slow_job] = await jobs.create(slow, [new_job()])
        # ...while a later one takes a bigger id and commits first.
        [fast_job] = await jobs.create(pool, [new_job()])
        seen, held = await events.after(pool, start)
        assert seen == [] and held, "a committed event behind an open transaction must wait"
        await tx.commit()
    finally:
        await pool.release(slow)
    seen, held = await events.after(pool, start)
    assert [e.job_id for e in seen] == [uuid.UUID(slow_job["id"]), uuid.UUID(fast_job["id"])]
    assert not held
    # Resuming from either event gives exactly what follows it, once.
    rest, _ = await events.after(pool, seen[0].position)
    assert [e.id for e in rest] == [seen[1].id]
    rest, _ = await events.after(pool, seen[1].position)
    assert rest == []


async def test_log_order_differs_from_id_order_and_resume_has_no_gap(pool: asyncpg.Pool) -> None:
    start = await events.head(pool)
    early = await pool.acquire()
    try:
        tx = early.transaction()
        await tx.start()
        await early.fetchval("SELECT pg_current_xact_id()")  # this transaction is older...
        [other] = await jobs.create(pool, [new_job()])  # ...than this one, which takes id N
        [late] = await jobs.create(early, [new_job()])  # and then takes id N+1
        await tx.commit()
    finally:
        await pool.release(early)
    seen, _ = await events.after(pool, start)
    assert [str(e.job_id) for e in seen] == [late["id"], other["id"]]
    assert seen[0].id > seen[1].id, "log order is transaction order, not id order"
    rest, _ = await events.after(pool, seen[0].position)
    assert [e.id for e in rest] == [seen[1].id]


async def test_sse_resume_with_last_event_id_across_out_of_order_commits(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    app: RunningApp = await start_app(render_slots=0)  # no worker: only the events we write
    [first] = await jobs.create(pool, [new_job()])
    first_event = await pool.fetchval("SELECT max(id) FROM job_events")
    received: list[Message] = []
    both_seen = asyncio.Event()

    async def follow() -> None:
        headers = {"Last-Event-ID": str(first_event)}
        async with app.http.get(app.url("/v1/events"), headers=headers) as resp:
            async for message in messages(resp):
                received.append(message)
                if len(received) == 2:
                    both_seen.set()

    reader = asyncio.create_task(follow())
    slow = await pool.acquire()
    try:
        tx = slow.transaction()
        await tx.start()
        [held_job] = await jobs.create(slow, [new_job()])
        [quick_job] = await jobs.create(pool, [new_job()])
        await tx.commit()
    finally:
        await pool.release(slow)
    await asyncio.wait_for(both_seen.wait(), 10)
    reader.cancel()
    assert [m.json["job"]["id"] for m in received] == [held_job["id"], quick_job["id"]]
    assert int(received[0].id or 0) < int(received[1].id or 0)
    assert first["id"] not in {m.json["job"]["id"] for m in received}, "acknowledged, not resent"

    # Resuming from each event gives exactly what follows it in the log.
    resumed = await collect(
        app.http, app.url("/v1/events"), headers={"Last-Event-ID": received[0].id or ""}, count=1
    )
    assert [m.json["job"]["id"] for m in resumed] == [quick_job["id"]]


async def test_pruned_cursor_gets_a_reset_event(api: RunningApp, pool: asyncpg.Pool) -> None:
    [job] = await jobs.create(pool, [new_job()])
    await pool.execute("DELETE FROM job_events")
    got = await collect(
        api.http, api.url(f"/v1/jobs/{job['id']}/events"), headers={"Last-Event-ID": "1"}, count=1
    )
    assert got[0].event == "reset"
    assert got[0].json["job"]["id"] == job["id"]
