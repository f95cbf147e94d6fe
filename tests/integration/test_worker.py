"""The render worker with the fake renderer: a job submitted to an idle worker starts at once
(the insert's NOTIFY wakes it, no poll needed), with its events in order; the next job waits
for a free slot; a stopped worker claims nothing; a job cut off before it reaches Chromium is
never rendered."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from server.keys import WORKERS
from server.pipeline.worker import Phase, Workers
from server.queue.lease import Stage
from server.render.chromium import RenderResult
from tests.conftest import RunningApp
from tests.integration.test_metrics import scrape
from tests.pdfs import FakeRenderer
from tests.sse import Message, collect
from tests.timings import quick

# A template that takes seconds to render (in a thread): its job stays in preparing meanwhile.
SLOW_TEMPLATE = "{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}done"
CLAIMS = ("pressroom_claim_duration_seconds_count", ())


async def submit(app: RunningApp, body: dict[str, Any] | None = None) -> dict[str, Any]:
    body = body or {"template": "<p>{{ name }}</p>", "data": {"name": "Ana"}}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        created: dict[str, Any] = await resp.json()
        return created


async def events(app: RunningApp, job_id: str, until: str = "job.done") -> list[Message]:
    return await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"), until=until)


async def status(app: RunningApp, job_id: str) -> str:
    async with app.http.get(app.url(f"/v1/jobs/{job_id}")) as resp:
        value: str = (await resp.json())["status"]
        return value


async def test_a_job_submitted_to_an_idle_worker_starts_at_once_with_its_events_in_order(
    start_app: Callable[..., Any], fake_renderer: FakeRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # No poll while the test runs (60 s, jittered to 30 s at the least): only the insert's
    # notification can wake the worker before the stream below gives up (15 s).
    quick(monkeypatch, POLL_INTERVAL_S=60)
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1)
    workers: Workers = app.app[WORKERS]
    await asyncio.wait_for(workers.leases.waiting.wait(), 10)  # it found the queue empty and waits
    created = await submit(app)
    assert created["status"] == "queued"
    seen = await events(app, created["id"])
    assert [m.event for m in seen] == ["job.queued", "job.running", "job.done"]
    ids = [int(m.id or 0) for m in seen]
    assert ids == sorted(ids)
    queued, running, done = (m.json["job"] for m in seen)
    assert (queued["status"], queued["attempts"], queued["started_at"]) == ("queued", 0, None)
    assert (running["status"], running["attempts"]) == ("running", 1)
    assert running["started_at"] is not None
    assert done["status"] == "done" and done["attempts"] == 1
    # Apart from what the claim changes, the job.queued event shows the same job.
    changed = {"status", "attempts", "started_at", "updated_at"}
    assert {k: v for k, v in queued.items() if k not in changed} == {
        k: v for k, v in running.items() if k not in changed
    }


class Counting(FakeRenderer):
    """Counts the renders under way at once."""

    def __init__(self) -> None:
        super().__init__()
        self.now = self.most = 0

    async def render(self, html: Any, options: Any, **kwargs: Any) -> RenderResult:
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await super().render(html, options, **kwargs)
        finally:
            self.now -= 1


async def test_the_next_job_waits_for_the_slot(start_app: Callable[..., Any]) -> None:
    renderer = Counting()
    renderer.gate = asyncio.Event()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    first = await submit(app)
    await asyncio.wait_for(renderer.started.wait(), 10)
    second = await submit(app, {"template": "<p>Bo</p>"})  # the only slot is held
    renderer.gate.set()
    for job in (first, second):
        assert (await events(app, job["id"]))[-1].event == "job.done"
    assert renderer.rendered == ["<p>Ana</p>", "<p>Bo</p>"]
    assert renderer.most == 1, "one render at a time in one slot"


async def test_a_stopped_worker_claims_nothing(
    start_app: Callable[..., Any], fake_renderer: FakeRenderer
) -> None:
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1)
    workers: Workers = app.app[WORKERS]
    await asyncio.wait_for(workers.leases.waiting.wait(), 10)
    await workers.leases.stop()
    claims = (await scrape(app))[CLAIMS]
    created = await submit(app)
    # The job's event reached this process, whose listener woke the worker with it.
    await events(app, created["id"], until="job.queued")
    assert (await scrape(app))[CLAIMS] == claims
    assert await status(app, created["id"]) == "queued"
    assert fake_renderer.calls == []


async def test_a_job_cancelled_before_it_reaches_chromium_is_never_rendered(
    start_app: Callable[..., Any], fake_renderer: FakeRenderer
) -> None:
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1)
    workers: Workers = app.app[WORKERS]
    created = await submit(app, {"template": SLOW_TEMPLATE})
    await events(app, created["id"], until="job.running")
    # The claim's event can reach this stream before the claim's answer reaches the worker,
    # and no event tells when the worker has taken its lease: look again shortly.
    key = uuid.UUID(created["id"])
    async with asyncio.timeout(5):
        while key not in workers.leases.in_flight:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    entry = workers.leases.in_flight[key]
    assert entry.phase == Phase.PREPARING
    async with app.http.post(app.url(f"/v1/jobs/{created['id']}/cancel")) as resp:
        assert resp.status == 200
    # The cancel reaches the worker as an event through the log; its render is cut off then.
    assert entry.task is not None
    await asyncio.wait({entry.task}, timeout=10)
    assert entry.stage is Stage.ABORTED
    assert await status(app, created["id"]) == "cancelled"
    assert fake_renderer.calls == []


async def test_stopping_returns_a_job_still_rendering_its_template_at_once(
    start_app: Callable[..., Any], fake_renderer: FakeRenderer
) -> None:
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1, shutdown_grace_s=30)
    created = await submit(app, {"template": SLOW_TEMPLATE})
    await events(app, created["id"], until="job.running")  # its template takes seconds
    started = asyncio.get_running_loop().time()
    await app.app[WORKERS].leases.stop()
    assert asyncio.get_running_loop().time() - started < 5, "not held for the grace period"
    assert await status(app, created["id"]) == "queued"
    assert fake_renderer.calls == []
