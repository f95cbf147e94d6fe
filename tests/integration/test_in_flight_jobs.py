"""A job in flight is one lease in the worker's consumer (server/queue/lease.py), with its
phase: these follow one through the transitions that cut it short (a cancel while Chromium
renders, a lease lost to another worker) and a final write that the database refuses, and check
what a user sees afterwards: nothing of the cut-off render is recorded or stored, the slot is
free again, and no error is left unread."""

from __future__ import annotations

import asyncio
import gc
import logging
import uuid
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from server.keys import SETTINGS, WORKERS
from server.pipeline.worker import Phase, Workers
from server.queue.jobs import ClaimedJob
from server.queue.lease import Lease, Stage
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect
from tests.timings import quick


async def submit(app: RunningApp, name: str = "Ana") -> str:
    body = {"template": "<p>{{ name }}</p>", "data": {"name": name}}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["id"]
        return job_id


async def in_slot(app: RunningApp, renderer: FakeRenderer) -> tuple[str, Lease[ClaimedJob]]:
    """A job submitted and held in the only render slot; its lease in the worker."""
    job_id = await submit(app)
    await asyncio.wait_for(renderer.started.wait(), 10)
    workers: Workers = app.app[WORKERS]
    [entry] = workers.leases.in_flight.values()
    assert str(entry.item.id) == job_id
    return job_id, entry


async def ended(workers: Workers, entry: Lease[ClaimedJob]) -> None:
    """Wait until the worker has forgotten `entry` (its task and final write are over)."""
    assert entry.task is not None
    await asyncio.wait({entry.task}, timeout=10)
    if entry.write is not None:
        await asyncio.wait({entry.write}, timeout=10)
    await asyncio.sleep(0)  # the done callbacks, which drop the entry, run next
    assert entry.item.id not in workers.leases.in_flight


def stored_files(app: RunningApp) -> list[str]:
    root = app.app[SETTINGS].files_dir
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.pdf")) if root.exists() else []


def test_a_job_moves_only_forward_through_its_phases() -> None:
    order = [Phase.PREPARING, Phase.RENDERING, Phase.FINISHING, Phase.STORING, Phase.RECORDING]
    assert [p for p in order if p.stage.holds_slot] == order[:3]
    assert [p for p in order if p.stage.abortable] == order[:3]
    assert Stage.ABORTED.holds_slot and not Stage.ABORTED.abortable  # until it has unwound
    job = ClaimedJob(uuid.uuid4(), "t", "", {}, {}, attempt=1, max_attempts=1)
    entry = Lease(job)
    for phase in order[1:]:
        entry.enter(phase.stage, phase)
    with pytest.raises(RuntimeError):
        entry.enter(Stage.ABORTED)  # past its render: never cut off
    late = Lease(job)
    late.enter(Stage.ABORTED)
    with pytest.raises(RuntimeError):
        late.enter(Phase.RENDERING.stage, Phase.RENDERING)  # an aborted job records nothing
    settled = Lease(job)
    settled.enter(Phase.STORING.stage, Phase.STORING)
    with pytest.raises(RuntimeError):
        settled.enter(Phase.RENDERING.stage, Phase.RENDERING)  # never back into its slot


async def test_a_job_cancelled_while_rendering_frees_its_slot_and_records_nothing(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    workers: Workers = app.app[WORKERS]
    job_id, entry = await in_slot(app, renderer)
    assert entry.phase == Phase.RENDERING
    async with app.http.post(app.url(f"/v1/jobs/{job_id}/cancel")) as resp:
        assert resp.status == 200
    await ended(workers, entry)
    assert entry.stage is Stage.ABORTED
    assert renderer.rendered == [] and stored_files(app) == []
    status = await pool.fetchval("SELECT status FROM jobs WHERE id = $1", entry.item.id)
    assert status == "cancelled"
    # The slot is free again: the next job is rendered in it.
    renderer.gate.set()
    second = await submit(app, "Bo")
    seen = await collect(app.http, app.url(f"/v1/jobs/{second}/events"), until="job.done")
    assert seen[-1].event == "job.done"
    assert renderer.rendered == ["<p>Bo</p>"]


async def test_a_lost_lease_aborts_the_render_and_leaves_the_row_to_its_new_holder(
    start_app: Callable[..., Any], pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    quick(monkeypatch, LEASE_S=0.6)
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    workers: Workers = app.app[WORKERS]
    job_id, entry = await in_slot(app, renderer)
    # Another worker holds the job now (as after a rescue and its claim), for a long lease.
    await pool.execute(
        "UPDATE jobs SET worker_id = 'another', lease_expires_at = now() + interval '1 hour'"
        " WHERE id = $1",
        entry.item.id,
    )
    await ended(workers, entry)  # the next heartbeat finds the job gone and aborts it
    assert entry.stage is Stage.ABORTED
    renderer.gate.set()
    row = await pool.fetchrow(
        "SELECT status, worker_id, object_key FROM jobs WHERE id = $1", job_id
    )
    assert (row["status"], row["worker_id"], row["object_key"]) == ("running", "another", None)
    assert renderer.rendered == [] and stored_files(app) == []
    types = await pool.fetch("SELECT type FROM job_events WHERE job_id = $1 ORDER BY id", job_id)
    assert [r["type"] for r in types] == ["job.queued", "job.running"]


async def test_a_final_write_the_database_refuses_is_logged_and_leaves_the_job_to_its_lease(
    start_app: Callable[..., Any],
    pool: asyncpg.Pool,
    fake_renderer: FakeRenderer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    await pool.execute(
        """
        CREATE FUNCTION refuse_done() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'done refused'; END $$;
        CREATE TRIGGER refuse_done BEFORE UPDATE ON jobs FOR EACH ROW
        WHEN (NEW.status = 'done') EXECUTE FUNCTION refuse_done();
        """
    )
    unread: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: unread.append(context))
    try:
        app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1)
        workers: Workers = app.app[WORKERS]
        caplog.set_level(logging.INFO, logger="server.queue.lease")
        job_id, entry = await in_slot(app, fake_renderer)
        await ended(workers, entry)
        del entry
        gc.collect()  # a task whose error nobody read says so when it is collected
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert unread == []
    assert any("could not record the result" in r.getMessage() for r in caplog.records)
    row = await pool.fetchrow("SELECT status, worker_id FROM jobs WHERE id = $1", job_id)
    assert (row["status"], row["worker_id"]) == ("running", workers.worker_id)  # the rescuer's
    assert workers.leases.busy == 0  # the slot is free for the next job
