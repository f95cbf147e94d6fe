"""Stopping a worker while its claim is in flight: the claim has committed in the database
whether or not its answer was read, so stop() waits for that answer and hands the jobs back at
once, instead of leaving them `running` until their lease runs out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from server.keys import POOL, WORKERS
from server.queue import jobs
from server.queue.jobs import NewJob
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer


class Heard(logging.Handler):
    """Sets `event` once a record whose message holds `text` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text
        self.event = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


async def test_jobs_of_a_claim_in_flight_at_stop_go_back_to_the_queue(
    start_app: Callable[..., Any],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()  # a render that has begun does not end before the grace
    app: RunningApp = await start_app(renderer=renderer, render_slots=2, shutdown_grace_s=0.5)
    claimed_in_db = asyncio.Event()
    answer = asyncio.Event()
    real_claim = jobs.claim

    async def slow_answer(*args: Any, **kwargs: Any) -> list[jobs.ClaimedJob]:
        taken = await real_claim(*args, **kwargs)
        if taken:
            claimed_in_db.set()
            await answer.wait()  # committed; its answer is still on the way
        return taken

    monkeypatch.setattr(jobs, "claim", slow_answer)
    # Listening and idle, so the insert's notification wakes it (else the poll, much later).
    await asyncio.wait_for(app.app[WORKERS].leases.waiting.wait(), 10)
    pool: asyncpg.Pool = app.app[POOL]
    new = NewJob(
        tenant="default", template="<p>x</p>", data={}, options={}, metadata={}, max_attempts=3
    )
    await jobs.create(pool, [new])
    await asyncio.wait_for(claimed_in_db.wait(), 10)
    caplog.set_level(logging.INFO, logger="server.queue.lease")
    heard = Heard("for a claim in flight")
    logging.getLogger("server.queue.lease").addHandler(heard)
    try:
        stopping = asyncio.create_task(app.app[WORKERS].leases.stop())
        await asyncio.wait_for(heard.event.wait(), 10)  # stop() says it waits for the answer
        assert not stopping.done(), "stop waits for the claim's answer"
        answer.set()
        await asyncio.wait_for(stopping, 10)
    finally:
        logging.getLogger("server.queue.lease").removeHandler(heard)
    row = await pool.fetchrow("SELECT status, attempts FROM jobs WHERE id = $1", new.id)
    # Whether its render had begun or not, the job is back in the queue, the attempt uncharged.
    assert (row["status"], row["attempts"]) == ("queued", 0)
