"""A job's story (GET /v1/jobs/{id}/story) and redelivering its webhooks, on the real app: a job
retried once then done, its webhook refused once then delivered; secrets; tenants; bad ids."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

import asyncpg
import pytest

from server.errors import TransientError
from server.keys import DSN, POOL, WORKERS
from server.render.chromium import RenderResult
from server.schemas.story import Story
from server.web.story_api import phase_totals, timeline_of
from tests.conftest import RunningApp
from tests.integration.test_webhooks import (  # noqa: F401 (fixtures)
    SECRET,
    Hooked,
    Receiver,
    StartHooked,
    receiver,
    start_hooked,
    verify,
)
from tests.pdfs import FakeRenderer
from tests.sse import collect
from tests.tenants import bearer, made

PROBLEM = "application/problem+json"


class FailsOnce(FakeRenderer):
    """The first render fails as a crashed browser would (transient); the next ones print."""

    async def render(self, html: Any, options: Any, **kwargs: Any) -> RenderResult:
        failing = not self.calls
        result = await super().render(html, options, **kwargs)
        if failing:
            raise TransientError("browser crashed (test)")
        return result


async def story_of(app: RunningApp, job_id: str, **headers: str) -> dict[str, Any]:
    async with app.http.get(app.url(f"/v1/jobs/{job_id}/story"), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
    Story.model_validate(body)  # as the OpenAPI document describes it
    return body


async def delivered(hooked: Hooked) -> None:
    attempts = await hooked.until_final()
    assert attempts[-1].outcome == "delivered", attempts


async def test_a_job_retried_once_then_done_tells_each_attempt_its_events_and_its_webhook(
    start_hooked: StartHooked,  # noqa: F811
    receiver: Receiver,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    receiver.script = [500]
    hooked = await start_hooked(FailsOnce(), RETRY_BASE_S=0.05)
    job = await hooked.submit(receiver.url, data={"name": "Ana", "z": 1, "a": 2})
    await hooked.wait_final(job["id"])
    await delivered(hooked)

    story = await story_of(hooked.app, job["id"])

    assert story["job"]["status"] == "done" and story["live"] is False
    assert story["job"]["url"], "the signed download URL is given, as GET /v1/jobs/{id} does"
    assert list(story["data"]) == ["name", "z", "a"], "data as stored, in the job's own order"
    worker = hooked.app.app[WORKERS].worker_id
    first, second = story["attempts"]
    assert (first["attempt"], first["outcome"], first["worker_id"]) == (1, "retrying", worker)
    assert first["error"] == "browser crashed (test)"
    assert (second["attempt"], second["outcome"], second["error"]) == (2, "done", None)
    assert first["ended_at"] <= second["started_at"] <= second["ended_at"]
    assert all(a["seconds"] >= 0 for a in story["attempts"])

    timeline = story["timeline"]
    assert [e["type"] for e in timeline] == [
        "job.queued", "job.running", "job.retrying", "job.running", "job.done",
    ]  # fmt: skip
    assert [e["phase"] for e in timeline] == ["queued", "running", "queued", "running", None]
    assert timeline[2]["error"] == "browser crashed (test)" and timeline[2]["attempt"] == 1
    assert timeline[-1]["seconds"] is None
    totals = {p["phase"]: p["seconds"] for p in story["phases"]}
    # The retry's backoff is time spent queued: half its base at the least (it is jittered).
    assert totals["queued"] >= 0.05 / 2, "the retry's backoff is time spent queued"
    assert totals["running"] >= 0

    [delivery] = story["deliveries"]
    assert delivery["status"] == "delivered" and delivery["url"] == receiver.url
    assert [(t["attempt"], t["status_code"]) for t in delivery["tries"]] == [(1, 500), (2, 200)]
    assert delivery["tries"][0]["error"] == "HTTP 500: answer 500"
    assert delivery["redeliver"] == (f"/v1/jobs/{job['id']}/webhooks/{delivery['id']}/redeliver")
    assert story["batches"] == []


async def test_redeliver_sends_the_same_message_again_signed_and_records_its_try(
    start_hooked: StartHooked,  # noqa: F811
    receiver: Receiver,  # noqa: F811
) -> None:
    hooked = await start_hooked(FakeRenderer())
    job = await hooked.submit(receiver.url)
    await hooked.wait_final(job["id"])
    await delivered(hooked)
    first = await receiver.next()
    [delivery] = (await story_of(hooked.app, job["id"]))["deliveries"]
    heard: asyncio.Queue[str] = asyncio.Queue()
    listening = await asyncpg.connect(hooked.app.app[DSN])
    await listening.add_listener("pressroom_webhooks", lambda *args: heard.put_nowait(args[-1]))

    async with hooked.app.http.post(hooked.app.url(delivery["redeliver"])) as resp:
        assert resp.status == 202, await resp.text()
        queued = await resp.json()
    assert queued["status"] == "pending" and queued["delivered_at"] is None
    # Every process's sender is woken, not only this one's at its next poll.
    assert await asyncio.wait_for(heard.get(), 5) == "w"
    await listening.close()

    again = await receiver.next()
    await delivered(hooked)
    assert again.headers["webhook-id"] == first.headers["webhook-id"] == delivery["id"]
    sent, resent = (verify(SECRET, r.headers, r.body) for r in (first, again))
    # The same event; only its download URL is signed afresh, at send time.
    assert resent["type"] == sent["type"] == "job.done"
    assert {**resent["data"]["job"], "url": None} == {**sent["data"]["job"], "url": None}
    [shown] = (await story_of(hooked.app, job["id"]))["deliveries"]
    assert shown["status"] == "delivered" and shown["attempts"] == 2
    assert [t["status_code"] for t in shown["tries"]] == [200, 200]


async def test_redeliver_refuses_a_pending_delivery_and_unknown_ids(
    start_hooked: StartHooked,  # noqa: F811
    receiver: Receiver,  # noqa: F811
) -> None:
    hooked = await start_hooked(FakeRenderer(), sends=False)  # nothing sends: it stays pending
    job = await hooked.submit(receiver.url)
    await hooked.wait_final(job["id"])
    [delivery] = (await story_of(hooked.app, job["id"]))["deliveries"]
    assert delivery["status"] == "pending" and delivery["tries"] == []

    async with hooked.app.http.post(hooked.app.url(delivery["redeliver"])) as resp:
        assert resp.status == 409 and resp.content_type == PROBLEM
        assert "already due or in flight" in (await resp.json())["detail"]
    for path in (
        f"/v1/jobs/{job['id']}/webhooks/00000000-0000-0000-0000-000000000000/redeliver",
        f"/v1/jobs/{job['id']}/webhooks/not-a-uuid/redeliver",
        f"/v1/jobs/00000000-0000-0000-0000-000000000000/webhooks/{delivery['id']}/redeliver",
    ):
        async with hooked.app.http.post(hooked.app.url(path)) as resp:
            assert resp.status == 404 and resp.content_type == PROBLEM, path
            assert (await resp.json())["detail"] == "No such webhook delivery."
    assert len(receiver.received) == 0


async def test_a_running_job_shows_its_attempt_in_flight_and_the_time_so_far(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    fake_renderer.gate = asyncio.Event()
    async with api.http.post(api.url("/v1/jobs"), json={"template": "<p>x</p>"}) as resp:
        job_id = (await resp.json())["id"]
    await asyncio.wait_for(fake_renderer.started.wait(), 10)

    story = await story_of(api, job_id)

    assert story["live"] is True and story["job"]["status"] == "running"
    [attempt] = story["attempts"]
    assert attempt["outcome"] == "running" and attempt["ended_at"] is None
    assert attempt["worker_id"] == api.app[WORKERS].worker_id
    assert [e["type"] for e in story["timeline"]] == ["job.queued", "job.running"]
    assert story["timeline"][-1]["phase"] == "running"
    assert story["timeline"][-1]["seconds"] is not None, "a running phase counts until now"
    fake_renderer.gate.set()
    await collect(api.http, api.url(f"/v1/jobs/{job_id}/events"))
    [attempt] = (await story_of(api, job_id))["attempts"]
    assert attempt["outcome"] == "done" and attempt["ended_at"] is not None


async def test_secrets_are_shown_as_stars_and_never_sent(api: RunningApp) -> None:
    body = {
        "page_url": "https://example.com/invoice",
        "options": {
            "headers": {"Authorization": "Bearer page-secret-1"},
            "cookies": [{"name": "session", "value": "page-secret-2"}],
        },
    }
    async with api.http.post(api.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job_id = (await resp.json())["id"]

    async with api.http.get(api.url(f"/v1/jobs/{job_id}/story")) as resp:
        raw = await resp.text()
    story = json.loads(raw)
    assert "page-secret" not in raw
    assert story["job"]["options"]["headers"] == {"Authorization": "***"}
    assert story["job"]["options"]["cookies"][0]["value"] == "***"
    assert story["source"] == "page_url"
    sealed = await api.app[POOL].fetchval("SELECT secrets FROM jobs WHERE id = $1", job_id)
    assert sealed is None or b"page-secret" not in sealed


async def test_another_tenants_job_is_unknown_and_bad_ids_are_problems(
    start_hooked: StartHooked,  # noqa: F811
    receiver: Receiver,  # noqa: F811
) -> None:
    hooked = await start_hooked(FakeRenderer())
    app, pool = hooked.app, hooked.app.app[POOL]
    key_a, _ = await made(pool, "acme")
    key_b, _ = await made(pool, "globex")
    async with app.http.post(
        app.url("/v1/jobs"),
        json={"template": "<p>a</p>", "webhook_url": receiver.url},
        headers=bearer(key_a),
    ) as resp:
        assert resp.status == 202, await resp.text()
        job_id = (await resp.json())["id"]
    await delivered(hooked)
    [delivery] = (await story_of(app, job_id, **bearer(key_a)))["deliveries"]

    unknown = "00000000-0000-0000-0000-000000000000"
    for path in (f"/v1/jobs/{job_id}/story", f"/v1/jobs/{unknown}/story", "/v1/jobs/nope/story"):
        async with app.http.get(app.url(path), headers=bearer(key_b)) as resp:
            assert resp.status == 404 and resp.content_type == PROBLEM, path
            assert (await resp.json())["detail"] == "No such job."
    async with app.http.post(app.url(delivery["redeliver"]), headers=bearer(key_b)) as resp:
        assert resp.status == 404 and resp.content_type == PROBLEM
    async with app.http.get(app.url(f"/v1/jobs/{job_id}/story")) as resp:
        assert resp.status == 401, "keys exist: the story needs one"
    async with app.http.post(app.url(delivery["redeliver"]), headers=bearer(key_a)) as resp:
        assert resp.status == 202


async def test_the_job_page_is_served_for_any_id(api: RunningApp) -> None:
    for job_id in ("00000000-0000-0000-0000-000000000000", "anything"):
        async with api.http.get(api.url(f"/jobs/{job_id}")) as resp:
            assert resp.status == 200 and resp.content_type == "text/html"
            assert '<script type="module" src="/static/job.js">' in await resp.text()


def test_timeline_phases_are_the_gaps_between_events() -> None:
    events = [
        {"type": "job.queued", "at": "2026-01-01T00:00:00+00:00", "status": "queued"},
        {"type": "job.running", "at": "2026-01-01T00:00:02+00:00", "status": "running"},
        {"type": "job.retrying", "at": "2026-01-01T00:00:05+00:00", "status": "queued"},
        {"type": "job.running", "at": "2026-01-01T00:00:06+00:00", "status": "running"},
    ]
    now = dt.datetime.fromisoformat("2026-01-01T00:00:10+00:00")
    timeline = timeline_of(events, now=now, final=False)
    assert [e["seconds"] for e in timeline] == [2.0, 3.0, 1.0, 4.0]
    assert phase_totals(timeline) == [
        {"phase": "queued", "seconds": 3.0},
        {"phase": "running", "seconds": 7.0},
    ]
    done = [*events, {"type": "job.done", "at": "2026-01-01T00:00:09+00:00", "status": "done"}]
    timeline = timeline_of(done, now=now, final=True)
    assert [e["seconds"] for e in timeline] == [2.0, 3.0, 1.0, 3.0, None]
    assert timeline[-1]["phase"] is None


class SlowFailsOnce(FailsOnce):
    """FailsOnce whose every render takes RENDER_S, as a real print would."""

    RENDER_S = 0.2

    async def render(self, html: Any, options: Any, **kwargs: Any) -> RenderResult:
        await asyncio.sleep(self.RENDER_S)
        return await super().render(html, options, **kwargs)


async def test_each_attempt_tells_the_time_of_each_phase_it_reached(
    start_hooked: StartHooked,  # noqa: F811
    receiver: Receiver,  # noqa: F811
) -> None:
    hooked = await start_hooked(SlowFailsOnce(), RETRY_BASE_S=0.05, sends=False)
    job = await hooked.submit(receiver.url, data={"name": "Ana"})
    await hooked.wait_final(job["id"])

    first, second = (await story_of(hooked.app, job["id"]))["attempts"]

    # The first failed in its render: it reached its template and its render, not its store.
    assert first["outcome"] == "retrying"
    assert set(first["phases"]) == {"template", "render", "finishing", "store"}
    assert first["phases"]["template"] >= 0
    assert first["phases"]["render"] >= SlowFailsOnce.RENDER_S
    assert first["phases"]["finishing"] is None and first["phases"]["store"] is None
    # The second went through all but finishing (its options ask for none).
    phases = second["phases"]
    assert second["outcome"] == "done"
    assert phases["render"] >= SlowFailsOnce.RENDER_S and phases["store"] >= 0
    assert phases["template"] >= 0 and phases["finishing"] is None
    # They are the attempt's time, measured by its worker, less its claim and its done write.
    spent = sum(s for s in phases.values() if s is not None)
    assert SlowFailsOnce.RENDER_S <= spent <= second["seconds"] + 0.01, (spent, second)


async def test_an_attempt_cut_off_keeps_no_phases_and_a_template_job_names_its_template(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    template = {"name": "invoice", "html": "<p>{{ n }}</p>", "publish": True}
    async with api.http.post(api.url("/v1/templates"), json=template) as resp:
        assert resp.status == 201, await resp.text()
    fake_renderer.gate = asyncio.Event()
    async with api.http.post(
        api.url("/v1/jobs"), json={"template_id": "invoice", "data": {"n": 1}}
    ) as resp:
        job_id = (await resp.json())["id"]
    await asyncio.wait_for(fake_renderer.started.wait(), 10)
    story = await story_of(api, job_id)
    assert story["template"] == "invoice@1" and story["source"] == "template"
    assert story["attempts"][0]["phases"] is None, "an attempt in flight has no phases yet"

    async with api.http.post(api.url(f"/v1/jobs/{job_id}/cancel")) as resp:
        assert resp.status == 200, await resp.text()
    fake_renderer.gate.set()
    await collect(api.http, api.url(f"/v1/jobs/{job_id}/events"))
    [attempt] = (await story_of(api, job_id))["attempts"]
    assert attempt["outcome"] == "cancelled" and attempt["phases"] is None


async def test_a_pdfs_job_names_its_files_by_path_and_by_asset_id(api: RunningApp) -> None:
    from tests.integration.test_pdf_operations import run_job, upload
    from tests.pdfmaking import text_pdf

    terms, annex = await upload(api, text_pdf(["terms"])), await upload(api, text_pdf(["annex"]))
    job, data = await run_job(api, {"pdfs": ["terms.pdf", annex], "assets": {"terms.pdf": terms}})
    assert data is not None, job["error"]
    story = await story_of(api, job["id"])
    assert story["source"] == "pdfs"
    assert story["files"] == [
        {"name": "terms.pdf", "asset_id": terms},
        {"name": annex, "asset_id": annex},
    ]
    async with api.http.post(api.url("/v1/jobs"), json={"template": "<p>x</p>"}) as resp:
        printed = (await resp.json())["id"]
    assert (await story_of(api, printed))["files"] == []
