"""Claiming ahead: by default, a slot's next job is claimed when a page that loaded quickly
begins to print (PRESSROOM_CLAIM_WHILE_PRINTING_S). The job claimed is prepared while Chromium
prints, starts the moment the slot frees, and is never rendered once cancelled or once the
process begins to stop. Stopping returns every job not yet in Chromium at once, claimed ahead
or not."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from server.keys import WORKERS
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect


async def submit(app: RunningApp, name: str) -> str:
    body = {"template": "<p>{{ name }}</p>", "data": {"name": name}}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["id"]
        return job_id


async def status(app: RunningApp, job_id: str) -> str:
    async with app.http.get(app.url(f"/v1/jobs/{job_id}")) as resp:
        value: str = (await resp.json())["status"]
        return value


async def wait_event(app: RunningApp, job_id: str, event: str) -> None:
    messages = await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"), until=event)
    assert messages[-1].event == event, [m.event for m in messages]


async def printing_app(
    start_app: Callable[..., Any], *, load_s: float = 0.0, **overrides: Any
) -> tuple[RunningApp, FakeRenderer]:
    """One slot; the renderer "loads" for load_s, says it prints, then holds."""
    renderer = FakeRenderer(prints=True, load_s=load_s)
    renderer.gate = asyncio.Event()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1, **overrides)
    return app, renderer


async def submit_in_slot(app: RunningApp, renderer: FakeRenderer) -> str:
    """The first job, held in the only render slot. Only then are others submitted: a job
    whose template renders in a thread (a busy machine) could otherwise reach the slot after
    one claimed later."""
    job_id = await submit(app, "a")
    await asyncio.wait_for(renderer.started.wait(), 10)
    return job_id


async def test_a_job_cancelled_while_it_waits_for_the_slot_is_never_rendered(
    start_app: Callable[..., Any],
) -> None:
    app, renderer = await printing_app(start_app, claim_while_printing_s=5)
    first, second = await submit_in_slot(app, renderer), await submit(app, "b")
    await wait_event(app, second, "job.running")
    async with app.http.post(app.url(f"/v1/jobs/{second}/cancel")) as resp:
        assert resp.status == 200
    workers = app.app[WORKERS]
    async with asyncio.timeout(10):
        # The abort travels as an event through the log; then the worker holds one job.
        while workers.busy > 1:  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # the worker count has no event to wait on: poll it
    renderer.gate.set()
    await wait_event(app, first, "job.done")
    assert renderer.calls == ["<p>a</p>"]
    assert await status(app, second) == "cancelled"


async def test_stopping_returns_a_job_claimed_ahead_to_the_queue_at_once(
    start_app: Callable[..., Any],
) -> None:
    app, renderer = await printing_app(start_app, claim_while_printing_s=5, shutdown_grace_s=30)
    first, second = await submit_in_slot(app, renderer), await submit(app, "b")
    await wait_event(app, second, "job.running")
    stopping = asyncio.create_task(app.app[WORKERS].stop())
    # Back in the queue while the render in the slot still has its grace period.
    await wait_event(app, second, "job.retrying")
    assert not stopping.done()
    renderer.gate.set()
    await stopping
    assert await status(app, first) == "done"
    assert await status(app, second) == "queued"
    assert renderer.calls == ["<p>a</p>"]


async def test_stopping_returns_a_job_still_rendering_its_template_at_once(
    start_app: Callable[..., Any],
) -> None:
    renderer = FakeRenderer()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1, shutdown_grace_s=30)
    slow = "{% for i in range(2000) %}{% for j in range(2000) %}{% endfor %}{% endfor %}done"
    async with app.http.post(app.url("/v1/jobs"), json={"template": slow}) as resp:
        job_id = (await resp.json())["id"]
    await wait_event(app, job_id, "job.running")  # its template takes seconds in a thread
    started = asyncio.get_running_loop().time()
    await app.app[WORKERS].stop()
    assert asyncio.get_running_loop().time() - started < 5, "not held for the grace period"
    assert await status(app, job_id) == "queued"
    assert renderer.calls == []


async def test_the_next_job_is_claimed_while_the_only_slot_prints(
    start_app: Callable[..., Any],
) -> None:
    app, renderer = await printing_app(start_app, claim_while_printing_s=5)
    first = await submit_in_slot(app, renderer)
    second, third = await submit(app, "b"), await submit(app, "c")
    await wait_event(app, second, "job.running")  # claimed while the first prints
    await asyncio.sleep(0.3)
    assert await status(app, third) == "queued"  # one per printing slot, no more
    assert renderer.calls == ["<p>a</p>"]
    renderer.gate.set()
    for job_id in (first, second, third):
        await wait_event(app, job_id, "job.done")
    assert renderer.rendered == ["<p>a</p>", "<p>b</p>", "<p>c</p>"]


async def test_no_job_is_claimed_ahead_of_a_page_that_loaded_slowly(
    start_app: Callable[..., Any],
) -> None:
    # A slow load foretells a long print: a job claimed then could wait long for this process
    # while another has a slot free.
    app, renderer = await printing_app(start_app, load_s=0.4, claim_while_printing_s=0.1)
    first = await submit_in_slot(app, renderer)
    second = await submit(app, "b")
    await asyncio.sleep(0.8)  # the load is over and the print has begun
    assert await status(app, second) == "queued"
    renderer.gate.set()
    await wait_event(app, second, "job.done")
    assert await status(app, first) == "done"


async def test_claiming_while_printing_can_be_turned_off(start_app: Callable[..., Any]) -> None:
    app, renderer = await printing_app(start_app, claim_while_printing_s=0)
    await submit_in_slot(app, renderer)
    second = await submit(app, "b")
    await asyncio.sleep(0.5)
    assert await status(app, second) == "queued"
    renderer.gate.set()
    await wait_event(app, second, "job.done")


async def test_a_print_with_the_queue_empty_sends_no_claim(start_app: Callable[..., Any]) -> None:
    from tests.integration.test_metrics import scrape

    claims = ("pressroom_claim_duration_seconds_count", ())
    # No polling during the test: every claim counted is one something asked for.
    app, renderer = await printing_app(start_app, claim_while_printing_s=5, poll_interval_s=60)
    await asyncio.sleep(0.3)  # the worker's first look at the empty queue
    before = (await scrape(app))[claims]
    first = await submit_in_slot(app, renderer)  # handed to the idle worker: no claim either
    await asyncio.sleep(0.3)
    assert (await scrape(app))[claims] == before  # its print woke nothing: the queue was empty
    second = await submit(app, "b")  # its NOTIFY wakes the loop, which claims it for the slot
    await wait_event(app, second, "job.running")
    assert await status(app, first) == "running"
    renderer.gate.set()
    await wait_event(app, second, "job.done")
