"""Long-poll fallback: GET /v1/jobs/{id}?wait=S with ETag / If-None-Match or ?since=."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest

from server.keys import HUB, POOL
from server.queue import jobs
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


async def submit(api: RunningApp) -> dict[str, Any]:
    async with api.http.post(api.url("/v1/jobs"), json=SEED) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


async def get(
    api: RunningApp, path: str, etag: str | None = None
) -> tuple[int, str, dict[str, Any] | None, float]:
    """(status, ETag, body or None, seconds taken)."""
    headers = {"If-None-Match": etag} if etag else {}
    started = time.monotonic()
    async with api.http.get(api.url(path), headers=headers) as resp:
        body = await resp.json() if resp.status != 304 else None
        return resp.status, resp.headers.get("ETag", ""), body, time.monotonic() - started


def parked(api: RunningApp) -> asyncio.Event:
    """Set once a request subscribes to the hub (a long-poll parks there)."""
    hub = api.app[HUB]
    subscribed = asyncio.Event()
    real = hub.subscribe

    def subscribe(**target: Any) -> Any:
        subscribed.set()
        return real(**target)

    hub.subscribe = subscribe  # type: ignore[method-assign]
    return subscribed


async def running(api: RunningApp, fake_renderer: FakeRenderer) -> dict[str, Any]:
    """A job held in `running` until fake_renderer.gate is set."""
    fake_renderer.gate = asyncio.Event()
    job = await submit(api)
    await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"), until="job.running")
    return job


async def test_every_get_has_an_etag_and_if_none_match_answers_304(api: RunningApp) -> None:
    job = await submit(api)
    await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"), until="job.done")
    status, etag, body, _ = await get(api, f"/v1/jobs/{job['id']}")
    assert status == 200 and body is not None and body["status"] == "done"
    assert etag.startswith('W/"')
    status, again, body, _ = await get(api, f"/v1/jobs/{job['id']}", etag)
    assert (status, again, body) == (304, etag, None)
    status, _, body, _ = await get(api, f"/v1/jobs/{job['id']}", 'W/"stale", W/"other"')
    assert status == 200 and body is not None and "url" in body


async def test_a_webhook_delivery_changes_the_etag(api: RunningApp) -> None:
    # GET shows the job's webhook deliveries too: a new attempt recorded by the sender (here
    # written as the sender writes it) is a change the client's copy does not have.
    job = await submit(api)
    await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"), until="job.done")
    _, etag, body, _ = await get(api, f"/v1/jobs/{job['id']}")
    assert body is not None and body["webhooks"] == []
    await api.app[POOL].execute(
        "INSERT INTO webhook_deliveries (job_id, tenant, url, type, payload, attempts,"
        " last_status_code) VALUES ($1, 'default', 'https://example.com/hook', 'job.done',"
        " '{}', 1, 503)",
        uuid.UUID(job["id"]),
    )
    status, changed, body, _ = await get(api, f"/v1/jobs/{job['id']}", etag)
    assert status == 200 and changed != etag
    assert body is not None and body["webhooks"][0]["last_status_code"] == 503
    status, _, _, taken = await get(api, f"/v1/jobs/{job['id']}?wait=5", etag)
    assert status == 200 and taken < 2, "a long-poll on the old ETag answers at once"
    assert (await get(api, f"/v1/jobs/{job['id']}", changed))[0] == 304


async def test_wait_answers_when_the_job_changes(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    job = await running(api, fake_renderer)
    _, etag, _, _ = await get(api, f"/v1/jobs/{job['id']}")
    subscribed = parked(api)
    poll = asyncio.create_task(get(api, f"/v1/jobs/{job['id']}?wait=30", etag))
    async with asyncio.timeout(5):
        await subscribed.wait()
    fake_renderer.gate.set()
    status, new_etag, body, took = await poll
    assert status == 200 and body is not None and body["status"] == "done"
    assert new_etag != etag and took < 10


async def test_wait_answers_at_once_when_the_etag_is_already_stale(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    job = await running(api, fake_renderer)
    status, _, body, took = await get(api, f"/v1/jobs/{job['id']}?wait=30", 'W/"old"')
    assert status == 200 and body is not None and body["status"] == "running" and took < 5
    fake_renderer.gate.set()


async def test_wait_times_out_with_304_or_the_current_job(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    job = await running(api, fake_renderer)
    _, etag, _, _ = await get(api, f"/v1/jobs/{job['id']}")
    status, same, body, took = await get(api, f"/v1/jobs/{job['id']}?wait=1", etag)
    assert (status, same, body) == (304, etag, None) and 1 <= took < 5
    status, _, body, took = await get(api, f"/v1/jobs/{job['id']}?wait=1")
    assert status == 200 and body is not None and body["status"] == "running"
    assert 1 <= took < 5
    fake_renderer.gate.set()


async def test_since_an_event_id(api: RunningApp, fake_renderer: FakeRenderer) -> None:
    job = await running(api, fake_renderer)
    history = await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"), count=2)
    queued_id, running_id = (m.id for m in history)
    # Something happened after the queued event: at once.
    status, _, body, took = await get(api, f"/v1/jobs/{job['id']}?wait=30&since={queued_id}")
    assert status == 200 and body is not None and body["status"] == "running" and took < 5
    # Nothing after the running event yet: held until the job is done.
    subscribed = parked(api)
    poll = asyncio.create_task(get(api, f"/v1/jobs/{job['id']}?wait=30&since={running_id}"))
    async with asyncio.timeout(5):
        await subscribed.wait()
    fake_renderer.gate.set()
    status, _, body, took = await poll
    assert status == 200 and body is not None and body["status"] == "done" and took < 10


async def test_a_finished_job_without_a_baseline_answers_at_once(api: RunningApp) -> None:
    job = await submit(api)
    await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"), until="job.done")
    status, _, body, took = await get(api, f"/v1/jobs/{job['id']}?wait=60")
    assert status == 200 and body is not None and body["status"] == "done" and took < 5


@pytest.mark.parametrize(
    ("query", "field"),
    [("wait=61", "wait"), ("wait=-1", "wait"), ("wait=soon", "wait"), ("wait=nan", "wait"),
     ("since=x", "since"), ("since=-3", "since")],
)  # fmt: skip
async def test_bad_wait_or_since_is_422(api: RunningApp, query: str, field: str) -> None:
    job = await submit(api)
    async with api.http.get(api.url(f"/v1/jobs/{job['id']}?{query}")) as resp:
        assert resp.status == 422
        assert resp.content_type == "application/problem+json"
        problem = await resp.json()
    assert [e["field"] for e in problem["errors"]] == [field]


async def test_waiting_polls_do_not_query_the_database(
    api: RunningApp, fake_renderer: FakeRenderer, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = await running(api, fake_renderer)
    # The stream above may have replayed the job's events before the hub read them: on a busy
    # machine they would then reach the polls below live, each a read of its own.
    hub = api.app[HUB]
    both = asyncio.Event()  # job.queued and job.running: all of this app
    hub.add_listener(lambda _event: both.set() if hub.published >= 2 else None)
    if hub.published < 2:
        async with asyncio.timeout(10):
            await both.wait()
    _, etag, _, _ = await get(api, f"/v1/jobs/{job['id']}")
    reads = 0
    real_get = jobs.get

    async def counting_get(*args: Any, **kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await real_get(*args, **kwargs)

    monkeypatch.setattr(jobs, "get", counting_get)
    polls = [get(api, f"/v1/jobs/{job['id']}?wait=1.5", etag) for _ in range(20)]
    answers = await asyncio.gather(*polls)
    assert all(status == 304 for status, *_ in answers)
    assert reads == 20, "one read per request; the wait itself is driven by the hub"
    fake_renderer.gate.set()


async def test_unknown_job_is_404_even_with_wait(api: RunningApp) -> None:
    status, _, body, took = await get(api, "/v1/jobs/0b5c7e3a-0000-4000-8000-000000000000?wait=30")
    assert status == 404 and body is not None and body["title"] == "Not found" and took < 5
