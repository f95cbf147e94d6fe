"""Hand-off: a job submitted to a process whose worker is idle goes straight to that worker,
inserted running in the submission's own statement (no NOTIFY, claim or second commit), with
the same events in the same order as a claimed job. Its render starts while that statement
runs; nothing of it is stored or recorded before the row has committed, and nothing at all
if the insert fails. A busy or stopping worker, or a job due later, leaves the job to the
queue."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import asyncpg
import pytest

from server.keys import SETTINGS, WORKERS
from server.pipeline.worker import Workers
from server.queue import jobs
from server.queue.jobs import ClaimedJob, NewJob
from tests import newjobs
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect


async def idle_workers(app: RunningApp) -> Workers:
    workers: Workers = app.app[WORKERS]
    async with asyncio.timeout(10):
        while not workers.idle:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # the first claim after start has no event to wait on
    return workers


async def submit(app: RunningApp, body: dict[str, Any] | None = None) -> dict[str, Any]:
    body = body or {"template": "<p>{{ name }}</p>", "data": {"name": "Ana"}}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        created: dict[str, Any] = await resp.json()
        return created


async def events(app: RunningApp, job_id: str, until: str = "job.done") -> list[Any]:
    return await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"), until=until)


async def test_an_idle_worker_takes_the_job_with_the_same_events(api: RunningApp) -> None:
    workers = await idle_workers(api)
    created = await submit(api)
    assert created["status"] == "queued"  # 202 shows the job as it was accepted
    assert workers.handed_off == 1
    seen = await events(api, created["id"])
    assert [m.event for m in seen] == ["job.queued", "job.running", "job.done"]
    ids = [int(m.id) for m in seen]
    assert ids == sorted(ids)
    queued, running, done = (m.json["job"] for m in seen)
    assert (queued["status"], queued["attempts"], queued["started_at"]) == ("queued", 0, None)
    assert (running["status"], running["attempts"]) == ("running", 1)
    assert running["started_at"] is not None
    assert done["status"] == "done" and done["attempts"] == 1
    # Apart from what the claim changes, the job.queued event shows the same job.
    changed = {"status", "attempts", "started_at"}
    assert {k: v for k, v in queued.items() if k not in changed} == {
        k: v for k, v in running.items() if k not in changed
    }


async def test_a_busy_worker_leaves_the_job_to_the_queue(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    fake_renderer.gate = asyncio.Event()
    workers = await idle_workers(api)
    first = await submit(api)
    await asyncio.wait_for(fake_renderer.started.wait(), 10)
    second = await submit(api)  # the only slot is held: nothing to hand the job to
    assert workers.handed_off == 1
    async with api.http.get(api.url(f"/v1/jobs/{second['id']}")) as resp:
        assert (await resp.json())["status"] == "queued"
    fake_renderer.gate.set()
    for job in (first, second):
        assert (await events(api, job["id"]))[-1].event == "job.done"
    assert workers.handed_off == 1  # the second was claimed from the queue
    assert fake_renderer.rendered == ["<p>Ana</p>", "<p>Ana</p>"]


async def test_a_job_due_later_is_not_handed_off(api: RunningApp) -> None:
    workers = await idle_workers(api)
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    created = await submit(api, {"template": "<p>later</p>", "run_at": later})
    assert workers.handed_off == 0
    async with api.http.get(api.url(f"/v1/jobs/{created['id']}")) as resp:
        assert (await resp.json())["status"] == "queued"


async def test_a_stopping_worker_takes_nothing(
    start_app: Callable[..., Any], fake_renderer: FakeRenderer
) -> None:
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1)
    workers = await idle_workers(app)
    await workers.stop()
    created = await submit(app)
    assert workers.handed_off == 0
    async with app.http.get(app.url(f"/v1/jobs/{created['id']}")) as resp:
        assert (await resp.json())["status"] == "queued"
    assert fake_renderer.calls == []


async def test_the_hand_off_can_be_turned_off(
    start_app: Callable[..., Any], fake_renderer: FakeRenderer
) -> None:
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1, hand_off=False)
    workers = await idle_workers(app)
    created = await submit(app)
    assert (await events(app, created["id"]))[-1].event == "job.done"  # claimed from the queue
    assert workers.handed_off == 0


async def test_the_hand_off_shows_in_the_metrics(api: RunningApp) -> None:
    await idle_workers(api)
    created = await submit(api)
    await events(api, created["id"])
    async with api.http.get(api.url("/metrics")) as resp:
        text = await resp.text()
    assert 'pressroom_job_starts_total{via="hand_off"} 1.0' in text


class Recorder:
    """A HandOff that grants `free` slots and records the jobs it was handed."""

    def __init__(self, free: int) -> None:
        self.free = free
        self.taken: list[tuple[list[ClaimedJob], asyncio.Future[bool]]] = []

    @property
    def worker_id(self) -> str:
        return "recorder"

    @property
    def lease_s(self) -> float:
        return 60.0

    def take(self, due: Iterable[ClaimedJob], inserted: asyncio.Future[bool]) -> int:
        assert not inserted.done()  # handed before the insert runs
        handed = list(itertools.islice(due, self.free))
        if handed:
            self.taken.append((handed, inserted))
        return len(handed)


def new_job(**fields: Any) -> NewJob:
    return newjobs.new_job(**{"template": "<p>{{ n }}</p>", "data": {"n": 1}, **fields})


async def test_only_reserved_due_jobs_go_best_first(pool: asyncpg.Pool) -> None:
    recorder = Recorder(free=2)
    later = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)
    batch = [
        new_job(priority=0),
        new_job(priority=5, run_at=later),  # best, but not due
        new_job(priority=3),
        new_job(priority=9),
    ]
    await jobs.create(pool, batch, hand_off=recorder)
    [(handed, inserted)] = recorder.taken
    assert inserted.result() is True
    assert [j.id for j in handed] == [batch[3].id, batch[2].id]
    assert all(j.attempt == 1 and j.data == {"n": 1} for j in handed)
    rows = await pool.fetch("SELECT id, status, worker_id FROM jobs")
    status = {r["id"]: (r["status"], r["worker_id"]) for r in rows}
    assert status[batch[3].id] == ("running", "recorder")
    assert status[batch[2].id] == ("running", "recorder")
    assert status[batch[0].id] == ("queued", None)
    assert status[batch[1].id] == ("queued", None)
    # Every job has its job.queued event; only the handed-off ones a job.running.
    types = await pool.fetch("SELECT job_id, type FROM job_events ORDER BY id")
    assert sorted(r["type"] for r in types) == ["job.queued"] * 4 + ["job.running"] * 2
    first_running = next(i for i, r in enumerate(types) if r["type"] == "job.running")
    assert all(r["type"] == "job.running" for r in types[first_running:])


async def test_a_failed_insert_says_so_to_the_worker(pool: asyncpg.Pool) -> None:
    recorder = Recorder(free=1)
    job = new_job()
    await jobs.create(pool, [job])
    with pytest.raises(asyncpg.UniqueViolationError):
        await jobs.create(pool, [new_job(id=job.id)], hand_off=recorder)  # the same id again
    [(handed, inserted)] = recorder.taken
    assert [j.id for j in handed] == [job.id] and inserted.result() is False
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 1


async def test_a_submission_cancelled_before_its_insert_tells_the_worker(
    pool: asyncpg.Pool,
) -> None:
    recorder = Recorder(free=1)
    inserting = asyncio.create_task(jobs.create(pool, [new_job()], hand_off=recorder))
    await asyncio.sleep(0)  # it runs to its first pause: the job is handed over, not inserted
    inserting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await inserting
    [(_handed, inserted)] = recorder.taken
    assert inserted.result() is False  # the worker drops the render instead of waiting forever
    assert await pool.fetchval("SELECT count(*) FROM jobs") == 0


@contextlib.asynccontextmanager
async def inserts_held(dsn: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """Another transaction holds `LOCK TABLE jobs IN SHARE MODE`: every INSERT into jobs waits
    until the function yielded here commits that transaction."""
    blocker = await asyncpg.connect(dsn)
    try:
        tx = blocker.transaction()
        await tx.start()
        await blocker.execute("LOCK TABLE jobs IN SHARE MODE")
        yield tx.commit
    finally:
        await blocker.close()


async def test_a_render_cancelled_while_its_insert_runs_leaves_the_insert_alone(
    api: RunningApp, pool: asyncpg.Pool, dsn: str
) -> None:
    workers = await idle_workers(api)
    async with inserts_held(dsn) as release:
        first, second = new_job(), new_job()  # one slot: the first is handed off, not the second
        inserting = asyncio.create_task(jobs.create(pool, [first, second], hand_off=workers))
        async with asyncio.timeout(10):
            while workers.busy < 1:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the render is over and waits for the insert
        workers.in_flight[first.id].task.cancel()  # e.g. cut off by a shutdown
        await asyncio.sleep(0.05)
        await release()
        await inserting  # the insert itself is not disturbed
    # The job whose render was cut off waits for its lease (the rescuer); the other, claimed
    # from the queue, finishes.
    seen = await events(api, str(second.id))
    assert [m.event for m in seen] == ["job.queued", "job.running", "job.done"]
    status = await pool.fetchval("SELECT status FROM jobs WHERE id = $1", first.id)
    assert status == "running"


async def stored_files(app: RunningApp) -> list[str]:
    root = app.app[SETTINGS].files_dir
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.pdf")) if root.exists() else []


async def test_the_render_starts_while_the_insert_runs_and_waits_for_its_commit(
    api: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool, dsn: str
) -> None:
    workers = await idle_workers(api)
    async with inserts_held(dsn) as release:
        job = new_job(template="<p>{{ n }}</p>")
        inserting = asyncio.create_task(jobs.create(pool, [job], hand_off=workers))
        await asyncio.wait_for(fake_renderer.started.wait(), 10)
        await asyncio.sleep(0.2)  # the render is over; the insert still waits
        assert fake_renderer.rendered == ["<p>1</p>"]
        assert not inserting.done()
        assert await stored_files(api) == []  # nothing stored for a row not yet written
        assert workers.handed_off == 0
        await release()
        await inserting
    seen = await events(api, str(job.id))
    assert [m.event for m in seen] == ["job.queued", "job.running", "job.done"]
    assert workers.handed_off == 1
    assert await stored_files(api) == [f"default/{job.id}/1.pdf"]


async def test_a_render_whose_insert_fails_leaves_nothing(
    api: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool, dsn: str
) -> None:
    workers = await idle_workers(api)
    taken = new_job()  # its id is taken by a row written without a NOTIFY: the worker stays idle
    await pool.execute(
        "INSERT INTO jobs (id, tenant, template, max_attempts, run_after)"
        " VALUES ($1, 'default', 'x', 1, now() + interval '1 hour')",
        taken.id,
    )
    async with inserts_held(dsn) as release:
        inserting = asyncio.create_task(jobs.create(pool, [new_job(id=taken.id)], hand_off=workers))
        await asyncio.wait_for(fake_renderer.started.wait(), 10)
        await release()
        with pytest.raises(asyncpg.UniqueViolationError):
            await inserting
    async with asyncio.timeout(10):
        while workers.busy:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    assert fake_renderer.calls == ["<p>1</p>"]
    assert await stored_files(api) == []
    assert workers.handed_off == 0
    assert await pool.fetchval("SELECT count(*) FROM job_events") == 0
    # The slot is free again: the next job goes to the worker and is done.
    created = await submit(api)
    assert (await events(api, created["id"]))[-1].event == "job.done"
    assert workers.handed_off == 1


async def test_submitted_data_reaches_every_attempt_as_sent(pool: asyncpg.Pool) -> None:
    """The hand-off renders from the submitted values, a claim from the row: the same data."""
    data = {"zebra": 1, "a": {"yy": -0.0, "x": 1e20}, "mid": [3, 2, 1]}
    recorder = Recorder(free=1)
    [created] = await jobs.create(pool, [new_job(data=data)], hand_off=recorder)
    [(handed, _)] = recorder.taken
    stored = await pool.fetchval("SELECT data FROM jobs WHERE id = $1", created["id"])
    for value in (handed[0].data, stored):
        assert value == data
        assert list(value) == ["zebra", "a", "mid"] and list(value["a"]) == ["yy", "x"]
        assert repr(value["a"]["yy"]) == "-0.0" and repr(value["a"]["x"]) == "1e+20"


async def test_a_notification_only_wakes_workers_when_a_job_stayed_queued(
    pool: asyncpg.Pool, dsn: str
) -> None:
    listener = await asyncpg.connect(dsn)
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("pressroom", lambda *args: heard.put_nowait(args[-1]))
    try:
        await jobs.create(pool, [new_job()], hand_off=Recorder(free=1))
        assert (await asyncio.wait_for(heard.get(), 5)).startswith("e:")
        await jobs.create(pool, [new_job(), new_job()], hand_off=Recorder(free=1))
        assert (await asyncio.wait_for(heard.get(), 5)).startswith("q:")
    finally:
        await listener.close()


async def test_a_job_handed_off_as_the_worker_begins_to_stop_goes_back_to_the_queue(
    start_app: Callable[..., Any], fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    fake_renderer.gate = asyncio.Event()  # the render outlasts the grace period
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1, shutdown_grace_s=0.3)
    workers = await idle_workers(app)
    stops: list[asyncio.Task[None]] = []

    class StopsMidInsert:
        """The worker's own hand-off, with a SIGTERM arriving while the insert is in flight."""

        worker_id = workers.worker_id
        lease_s = workers.lease_s

        def take(self, due: Iterable[ClaimedJob], inserted: asyncio.Future[bool]) -> int:
            taken = workers.take(due, inserted)
            stops.append(asyncio.create_task(workers.stop()))  # runs during the insert
            return taken

    [created] = await jobs.create(pool, [new_job()], hand_off=StopsMidInsert())
    await stops[0]
    seen = await events(app, str(created["id"]), until="job.retrying")
    assert [m.event for m in seen] == ["job.queued", "job.running", "job.retrying"]
    row = await pool.fetchrow("SELECT status, attempts FROM jobs WHERE id = $1", created["id"])
    assert (row["status"], row["attempts"]) == ("queued", 0)
    assert fake_renderer.rendered == []
