"""The REST surface on a real database, with a fake renderer standing in for Chromium."""

from __future__ import annotations

import asyncio
import io
import time
import uuid
from typing import Any

import pytest
from yarl import URL

from server.access import signing
from server.errors import PermanentError, TransientError
from server.keys import SETTINGS
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sio import SioClient
from tests.sse import collect

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


async def submit(api: RunningApp, body: dict[str, Any] | None = None) -> dict[str, Any]:
    async with api.http.post(api.url("/v1/jobs"), json=body or SEED) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"
        return job


async def wait_status(api: RunningApp, job_id: str, status: str) -> dict[str, Any]:
    messages = await collect(api.http, api.url(f"/v1/jobs/{job_id}/events"), until=f"job.{status}")
    assert messages[-1].event == f"job.{status}", [m.event for m in messages]
    job: dict[str, Any] = messages[-1].json["job"]
    return job


async def test_seed_flow_queued_running_done_and_download(api: RunningApp) -> None:
    job = await submit(api)
    assert job["status"] == "queued"
    assert job["links"] == {
        "self": f"/v1/jobs/{job['id']}",
        "events": f"/v1/jobs/{job['id']}/events",
        "pdf": f"/v1/jobs/{job['id']}/pdf",
    }
    messages = await collect(api.http, api.url(job["links"]["events"]))
    assert [m.event for m in messages] == ["job.queued", "job.running", "job.done"]
    ids = [int(m.id or 0) for m in messages]
    assert ids == [m.json["event_id"] for m in messages]
    assert [m.json["job"]["status"] for m in messages] == ["queued", "running", "done"]

    async with api.http.get(api.url(job["links"]["self"])) as resp:
        done = await resp.json()
    assert done["status"] == "done" and done["attempts"] == 1 and done["pages"] == 1
    assert done["url"].startswith("http://127.0.0.1:")
    async with api.http.get(done["url"]) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/pdf"
        assert (await resp.read()).startswith(b"%PDF-")


async def test_download_link_tampered_or_expired_is_refused(api: RunningApp) -> None:
    job = await submit(api)
    done = await wait_status(api, job["id"], "done")
    url = URL(done["url"])
    tampered = url.update_query(sig=url.query["sig"][:-2] + "xx")
    async with api.http.get(tampered) as resp:
        assert resp.status == 403
        assert resp.content_type == "application/problem+json"
    other_job = url.with_path(f"/v1/jobs/{uuid.uuid4()}/pdf").with_query(url.query)
    async with api.http.get(other_job) as resp:
        assert resp.status == 403
    settings = api.app[SETTINGS]
    expired_at = int(time.time()) - 1
    expired = url.update_query(
        expires=expired_at,
        sig=signing.sign_download(settings.secret, job["id"], expired_at, signing.NO_KEY),
    )
    async with api.http.get(expired) as resp:
        assert resp.status == 403
        assert "expired" in (await resp.json())["detail"]


@pytest.mark.parametrize(
    ("body", "content_type", "status", "field"),
    [
        (b"{not json", "application/json", 400, None),
        (b"\xff\xfe{}", "application/json", 400, None),
        (b"[1, 2]", "application/json", 422, ""),
        (b'{"data": {}}', "application/json", 422, "template"),
        (b'{"template": 5}', "application/json", 422, "template"),
        (b'{"template": "x", "data": []}', "application/json", 422, "data"),
        (b'{"template": "x", "priority": "high"}', "application/json", 422, "priority"),
        (
            b'{"template": "x", "options": {"format": "B9"}}',
            "application/json",
            422,
            "options.format",
        ),
        (b'{"template": "x", "options": {"scale": 7}}', "application/json", 422, "options.scale"),
        (b'{"template": "x", "colour": "red"}', "application/json", 422, "colour"),
        (b'{"template": "{% if %}"}', "application/json", 422, "template"),
        (b'{"template": "x", "run_at": "tomorrow"}', "application/json", 422, "run_at"),
        (
            b'{"template": "x", "webhook_url": "http://127.0.0.1/hook"}',
            "application/json",
            422,
            "webhook_url",
        ),
        (b'{"template": "x"}', "text/plain", 415, None),
        (b"[" * 100000 + b"]" * 100000, "application/json", 400, None),
    ],
)
async def test_bad_submissions_get_problem_json_and_create_nothing(
    api: RunningApp, body: bytes, content_type: str, status: int, field: str | None
) -> None:
    async with api.http.post(
        api.url("/v1/jobs"), data=body, headers={"Content-Type": content_type}
    ) as resp:
        assert resp.status == status, await resp.text()
        assert resp.content_type == "application/problem+json"
        problem = await resp.json()
    assert (
        problem["status"] == status and problem["title"] and problem["type"].startswith("https://")
    )
    if field is not None:
        assert field in [error["field"] for error in problem["errors"]]
    async with api.http.get(api.url("/v1/jobs")) as resp:
        assert (await resp.json())["items"] == []


async def test_oversize_body_is_413(api: RunningApp) -> None:
    body = io.BytesIO(b'{"template": "' + b"x" * (3 * 1024 * 1024) + b'"}')
    async with api.http.post(
        api.url("/v1/jobs"), data=body, headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 413
        assert resp.content_type == "application/problem+json"


@pytest.mark.parametrize(
    "path",
    [f"/v1/jobs/{uuid.uuid4()}", "/v1/jobs/not-a-uuid", f"/v1/jobs/{uuid.uuid4()}/events"],
    ids=["unknown-id", "not-a-uuid", "unknown-id-events"],  # the same ids in every xdist worker
)
async def test_unknown_jobs_are_404(api: RunningApp, path: str) -> None:
    async with api.http.get(api.url(path)) as resp:
        assert resp.status == 404
        assert resp.content_type == "application/problem+json"


async def test_template_error_fails_at_once_without_retry(api: RunningApp) -> None:
    job = await submit(api, {"template": "<p>{{ customer.name }}</p>", "data": {}})
    failed = await wait_status(api, job["id"], "failed")
    assert failed["attempts"] == 1
    assert "customer" in failed["error"] and "undefined" in failed["error"]


async def test_transient_failure_is_retried_with_backoff(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    fake_renderer.fail_with = TransientError("browser crashed")
    job = await submit(api, {**SEED, "max_attempts": 2})
    messages = await collect(
        api.http, api.url(f"/v1/jobs/{job['id']}/events"), until="job.retrying"
    )
    retrying = messages[-1].json["job"]
    assert retrying["status"] == "queued" and retrying["attempts"] == 1
    assert retrying["errors"][0]["error"] == "browser crashed"
    assert retrying["run_after"] > retrying["updated_at"]


async def test_permanent_failure_then_manual_retry(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    fake_renderer.fail_with = PermanentError("the page cannot be printed")
    job = await submit(api)
    await wait_status(api, job["id"], "failed")
    fake_renderer.fail_with = None
    async with api.http.post(api.url(f"/v1/jobs/{job['id']}/retry")) as resp:
        assert resp.status == 202
        assert (await resp.json())["status"] == "queued"
    async with api.http.get(api.url(f"/v1/jobs/{job['id']}/events"), headers={}) as resp:
        assert resp.status == 200
    done = await wait_status(api, job["id"], "done")
    assert done["errors"][0]["error"] == "the page cannot be printed"
    async with api.http.post(api.url(f"/v1/jobs/{job['id']}/retry")) as resp:
        assert resp.status == 409


async def test_cancel_queued_job_and_refuse_cancelling_finished(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    fake_renderer.gate = asyncio.Event()
    first = await submit(api)  # holds the only slot
    await asyncio.wait_for(fake_renderer.started.wait(), 10)
    second = await submit(api)
    async with api.http.post(api.url(f"/v1/jobs/{second['id']}/cancel")) as resp:
        assert resp.status == 200
        assert (await resp.json())["status"] == "cancelled"
    fake_renderer.gate.set()
    await wait_status(api, first["id"], "done")
    for job_id in (first["id"], second["id"]):
        async with api.http.post(api.url(f"/v1/jobs/{job_id}/cancel")) as resp:
            assert resp.status == 409
            assert resp.content_type == "application/problem+json"
    assert len(fake_renderer.rendered) == 1


async def test_list_is_newest_first_with_cursor_and_filters(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    fake_renderer.gate = asyncio.Event()  # keep them queued
    created = [(await submit(api))["id"] for _ in range(5)]
    async with api.http.get(api.url("/v1/jobs?limit=2")) as resp:
        page1 = await resp.json()
    async with api.http.get(
        api.url("/v1/jobs"), params={"limit": 2, "cursor": page1["next_cursor"]}
    ) as resp:
        page2 = await resp.json()
    async with api.http.get(
        api.url("/v1/jobs"), params={"limit": 2, "cursor": page2["next_cursor"]}
    ) as resp:
        page3 = await resp.json()
    listed = [j["id"] for j in page1["items"] + page2["items"] + page3["items"]]
    assert listed == list(reversed(created))
    assert page3["next_cursor"] is None
    async with api.http.get(api.url("/v1/jobs?status=running")) as resp:
        running = (await resp.json())["items"]
    assert [j["id"] for j in running] == [created[0]]
    async with api.http.get(api.url("/v1/jobs?status=nope&limit=0")) as resp:
        assert resp.status == 422
        fields = {e["field"] for e in (await resp.json())["errors"]}
    assert fields == {"status", "limit"}
    fake_renderer.gate.set()


async def test_readyz_and_healthz(api: RunningApp) -> None:
    async with api.http.get(api.url("/healthz")) as resp:
        assert resp.status == 200
    async with api.http.get(api.url("/readyz")) as resp:
        body = await resp.json()
        assert resp.status == 200, body
    assert body["checks"] == {"database": "ok", "listener": "ok", "storage": "ok", "browser": "ok"}


async def test_absolute_links_come_from_the_public_url_never_from_the_host_header(
    start_app: Any,
) -> None:
    public = "https://pdf.example.com"
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, env={"PRESSROOM_PUBLIC_URL": public + "/"}
    )
    evil = {"Host": "evil.example", "X-Forwarded-Host": "evil.example"}
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=evil) as resp:
        assert resp.status == 202
        job = await resp.json()
        assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"
    async with app.http.post(
        app.url("/v1/batches"), json={"items": [{"key": "k", **SEED}]}, headers=evil
    ) as resp:
        assert resp.status == 202, await resp.text()
        batch = await resp.json()
    streamed = await collect(
        app.http, app.url(f"/v1/jobs/{job['id']}/events"), until="job.done", headers=evil
    )
    await collect(app.http, app.url(f"/v1/jobs/{batch['items'][0]['job_id']}/events"))
    sio = SioClient()
    await sio.client.connect(app.url("/"), headers=evil, transports=["polling"], wait_timeout=10)
    try:
        await sio.subscribe(job_id=job["id"])
        pushed = await sio.take(3)
    finally:
        await sio.close()

    answers = [streamed[-1].json["job"], pushed[-1][1]["job"]]
    for path in (f"/v1/jobs/{job['id']}", "/v1/jobs", f"/v1/batches/{batch['id']}"):
        async with app.http.get(app.url(path), headers=evil) as resp:
            text = await resp.text()
            assert "evil.example" not in text, path
            body = await resp.json()
            answers.extend(body.get("items", [body]))
    urls = [answer["url"] for answer in answers]
    assert len(urls) == 6 and all(url.startswith(f"{public}/v1/jobs/") for url in urls), urls
    # The link works once its origin is where clients reach this server (here, the test's).
    async with app.http.get(app.url(URL(urls[0]).raw_path_qs)) as resp:
        assert resp.status == 200 and (await resp.read()).startswith(b"%PDF-")
