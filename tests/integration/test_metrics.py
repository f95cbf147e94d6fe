"""/metrics parses with prometheus-client's own parser, and each metric moves with its event."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from server.errors import TransientError
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect


async def scrape(app: RunningApp) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with app.http.get(app.url("/metrics")) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


async def test_metrics_move_when_their_events_happen(start_app: Callable[..., Any]) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    before = await scrape(app)
    assert before[("pressroom_jobs", (("state", "queued"),))] == 0
    assert before[("pressroom_events_published_total", ())] == 0

    async with app.http.post(app.url("/v1/jobs"), json={"template": "<p>a</p>"}) as resp:
        first = await resp.json()
    async with app.http.post(app.url("/v1/jobs"), json={"template": "<p>b</p>"}) as resp:
        second = await resp.json()
    await asyncio.wait_for(renderer.started.wait(), 10)
    stream = asyncio.create_task(
        collect(app.http, app.url(second["links"]["events"]), timeout_s=20)
    )
    during = await scrape(app)
    assert during[("pressroom_jobs", (("state", "running"),))] == 1
    assert during[("pressroom_jobs", (("state", "queued"),))] == 1
    assert during[("pressroom_queue_depth", ())] == 1
    assert during[("pressroom_queue_oldest_due_age_seconds", ())] >= 0
    assert during[("pressroom_claim_duration_seconds_count", ())] >= 1

    renderer.gate.set()
    await stream
    await collect(app.http, app.url(first["links"]["events"]))
    renderer.fail_with = TransientError("flaky")
    async with app.http.post(
        app.url("/v1/jobs"), json={"template": "<p>c</p>", "max_attempts": 1}
    ) as resp:
        third = await resp.json()
    await collect(app.http, app.url(third["links"]["events"]), until="job.failed")
    after = await scrape(app)
    assert after[("pressroom_jobs", (("state", "done"),))] == 2
    assert after[("pressroom_jobs", (("state", "failed"),))] == 1
    assert after[("pressroom_job_attempts_total", (("outcome", "done"),))] == 2
    assert after[("pressroom_job_attempts_total", (("outcome", "failed"),))] == 1
    assert after[("pressroom_render_duration_seconds_count", ())] == 3, "every attempt is timed"
    phase = "pressroom_job_phase_duration_seconds_count"
    assert after[(phase, (("phase", "preparing"),))] == 3, "every attempt left preparing"
    assert after[(phase, (("phase", "rendering"),))] == 3, "and rendering"
    assert after[(phase, (("phase", "storing"),))] == 2, "the two done ones stored"
    started = after[("pressroom_job_starts_total", ())]
    assert started == 3, "every attempt is counted once, as it is claimed"
    assert after[("pressroom_events_published_total", ())] >= 8
    assert after[("pressroom_db_pool_size", ())] >= 1


async def test_subscribers_are_counted_by_transport(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    fake_renderer.gate = asyncio.Event()
    async with api.http.post(api.url("/v1/jobs"), json={"template": "<p>x</p>"}) as resp:
        job = await resp.json()
    connected = asyncio.Event()

    async def listen() -> None:
        async with api.http.get(api.url("/v1/events")) as resp:
            connected.set()
            async for _ in resp.content:
                pass

    listener = asyncio.create_task(listen())
    await asyncio.wait_for(connected.wait(), 5)
    samples = await scrape(api)
    assert samples[("pressroom_subscribers", (("transport", "sse"),))] == 1
    listener.cancel()
    fake_renderer.gate.set()
    await collect(api.http, api.url(job["links"]["events"]))
