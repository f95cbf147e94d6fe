"""Stored templates: immutable versions, jobs naming them by template_id, and the preview."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from server.errors import TransientError
from server.keys import POOL
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect

INVOICE = {
    "name": "invoice",
    "html": "<h1>Invoice for {{customer}}</h1>",
    "options": {"format": "A5", "margin": "10mm"},
    "sample_data": {"customer": "Sample Co"},
    "publish": True,
}


async def post(api: RunningApp, path: str, body: Any) -> tuple[int, Any]:
    async with api.http.post(api.url(path), json=body) as resp:
        return resp.status, await resp.json()


async def get(api: RunningApp, path: str) -> tuple[int, Any]:
    async with api.http.get(api.url(path)) as resp:
        return resp.status, await resp.json()


async def finished(api: RunningApp, job: dict[str, Any]) -> dict[str, Any]:
    messages = await collect(api.http, api.url(job["links"]["events"]))
    final: dict[str, Any] = messages[-1].json["job"]
    return final


async def test_versions_count_up_and_the_latest_is_the_default(api: RunningApp) -> None:
    status, first = await post(api, "/v1/templates", INVOICE)
    assert status == 201, first
    assert first["version"] == 1 and first["template_id"] == "invoice@1"
    assert first["options"] == {
        "format": "A5",
        "margin": {"top": "10mm", "right": "10mm", "bottom": "10mm", "left": "10mm"},
    }
    status, second = await post(
        api, "/v1/templates", {**INVOICE, "html": "<h1>Invoice v2 for {{customer}}</h1>"}
    )
    assert status == 201 and second["version"] == 2
    await post(
        api, "/v1/templates", {"name": "letter", "html": "<p>Dear {{who}}</p>", "publish": True}
    )

    status, latest = await get(api, "/v1/templates/invoice")
    assert status == 200
    assert latest["version"] == 2 and "v2" in latest["html"]
    assert [v["version"] for v in latest["versions"]] == [1, 2]
    status, old = await get(api, "/v1/templates/invoice@1")
    assert status == 200 and old["html"] == INVOICE["html"]
    assert old["sample_data"] == {"customer": "Sample Co"}

    status, listing = await get(api, "/v1/templates")
    assert status == 200
    assert [(t["name"], t["version"], t["versions"]) for t in listing["items"]] == [
        ("invoice", 2, 2),
        ("letter", 1, 1),
    ]
    status, page = await get(api, "/v1/templates?limit=1")
    assert [t["name"] for t in page["items"]] == ["invoice"] and page["next_cursor"] == "invoice"
    status, page = await get(api, f"/v1/templates?limit=1&cursor={page['next_cursor']}")
    assert [t["name"] for t in page["items"]] == ["letter"] and page["next_cursor"] is None

    for missing in ("/v1/templates/nope", "/v1/templates/invoice@3", "/v1/templates/bad@name@1"):
        status, problem = await get(api, missing)
        assert status == 404 and problem["detail"] == "No such template."


async def test_a_stored_version_cannot_be_changed(api: RunningApp) -> None:
    await post(api, "/v1/templates", INVOICE)
    with pytest.raises(asyncpg.CheckViolationError, match="immutable"):
        await api.app[POOL].execute("UPDATE templates SET html = 'changed'")


async def test_bad_templates_are_refused_field_by_field(api: RunningApp) -> None:
    status, problem = await post(
        api,
        "/v1/templates",
        {
            "name": "has space",
            "html": "{% for %}",
            "options": {"scale": 9},
            "sample_data": [1],
            "extra": True,
        },
    )
    assert status == 422
    assert [e["field"] for e in problem["errors"]] == [
        "extra",
        "name",
        "html",
        "options.scale",
        "sample_data",
    ]
    status, problem = await post(api, "/v1/templates", {"name": "x@1", "html": "<p></p>"})
    assert status == 422 and problem["errors"][0]["field"] == "name"


async def test_jobs_name_templates_by_template_id(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    await post(api, "/v1/templates", INVOICE)
    await post(api, "/v1/templates", {**INVOICE, "html": "<h1>v2 {{customer}}</h1>"})

    status, job = await post(
        api,
        "/v1/jobs",
        {"template_id": "invoice", "data": {"customer": "Ana"}, "options": {"landscape": True}},
    )
    assert status == 202, job
    done = await finished(api, job)
    assert done["status"] == "done"
    # The stored options, with the job's own on top.
    assert done["options"]["format"] == "A5" and done["options"]["landscape"] is True
    assert fake_renderer.rendered[-1] == "<h1>v2 Ana</h1>"

    status, job = await post(
        api, "/v1/jobs", {"template_id": "invoice@1", "data": {"customer": "Bo"}}
    )
    assert status == 202
    await finished(api, job)
    assert fake_renderer.rendered[-1] == "<h1>Invoice for Bo</h1>"

    # Storing a new version later does not change what an accepted job renders.
    sql = "SELECT count(*) FROM jobs WHERE template LIKE '%v2%'"
    assert await api.app[POOL].fetchval(sql) == 1


async def test_unknown_or_conflicting_template_ids_are_refused(api: RunningApp) -> None:
    await post(api, "/v1/templates", INVOICE)
    cases = [
        ({"template_id": "missing"}, "no template 'missing'"),
        ({"template_id": "invoice@7"}, "no template 'invoice@7'"),
        ({"template_id": "invoice@x"}, "must be a template name, or name@version"),
        ({"template_id": 5}, "must be a template name, or name@version"),
        (
            {"template_id": "invoice", "template": "<p></p>"},
            "give only one of template, template_id, page_url, markdown, office, docx and pdfs "
            "(template is given too)",
        ),
    ]
    for body, message in cases:
        status, problem = await post(api, "/v1/jobs", body)
        assert status == 422, body
        assert problem["errors"] == [{"field": "template_id", "message": message}], body
    status, problem = await post(
        api, "/v1/jobs", {"template_id": "invoice", "options": {"scale": 5}}
    )
    assert status == 422 and problem["errors"][0]["field"] == "options.scale"
    assert await api.app[POOL].fetchval("SELECT count(*) FROM jobs") == 0


async def test_preview_renders_sample_data_to_pdf_at_once(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    await post(api, "/v1/templates", INVOICE)
    async with api.http.post(api.url("/v1/templates/invoice/preview")) as resp:
        assert resp.status == 200
        assert resp.content_type == "application/pdf"
        assert resp.headers["Pressroom-Pages"] == "1"
        assert 'filename="invoice-v1-preview.pdf"' in resp.headers["Content-Disposition"]
        assert (await resp.read()).startswith(b"%PDF-")
    assert fake_renderer.rendered == ["<h1>Invoice for Sample Co</h1>"]

    async with api.http.post(
        api.url("/v1/templates/invoice/preview"), json={"data": {"customer": "Ana"}}
    ) as resp:
        assert resp.status == 200
    async with api.http.post(
        api.url("/v1/templates/preview"),
        json={"html": "<p>{{ n * 2 }}</p>", "data": {"n": 21}, "options": {"landscape": True}},
    ) as resp:
        assert resp.status == 200 and (await resp.read()).startswith(b"%PDF-")
    assert fake_renderer.rendered[1:] == ["<h1>Invoice for Ana</h1>", "<p>42</p>"]
    # A preview is not a job.
    assert await api.app[POOL].fetchval("SELECT count(*) FROM jobs") == 0


async def test_preview_errors_are_problems(api: RunningApp, fake_renderer: FakeRenderer) -> None:
    status, problem = await post(api, "/v1/templates/nope/preview", {})
    assert status == 404
    status, problem = await post(api, "/v1/templates/preview", {"html": "<p>{{ 1 // 0 }}</p>"})
    assert status == 422 and "ZeroDivisionError" in problem["detail"]
    status, problem = await post(api, "/v1/templates/preview", {"data": {}, "colour": 1})
    assert status == 422
    assert [e["field"] for e in problem["errors"]] == ["colour", "html"]
    fake_renderer.fail_with = TransientError("browser crashed")
    status, problem = await post(api, "/v1/templates/preview", {"html": "<p>hi</p>"})
    assert status == 503 and "browser crashed" in problem["detail"]


async def test_preview_needs_a_process_that_renders(start_app: Callable[..., Any]) -> None:
    app: RunningApp = await start_app(render_slots=0)
    status, problem = await post(app, "/v1/templates/preview", {"html": "<p>hi</p>"})
    assert status == 503 and "PRESSROOM_RENDER_SLOTS=0" in problem["detail"]


ENDLESS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


async def test_a_template_past_its_limits_is_a_422_on_both_previews_as_its_job_fails(
    start_app: Callable[..., Any],
) -> None:
    renderer = FakeRenderer()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1, render_timeout_s=1)
    status, job = await post(app, "/v1/jobs", {"template": ENDLESS})
    assert status == 202, job
    failed = await finished(app, job)
    assert failed["status"] == "failed" and "template limit" in failed["error"], failed

    await post(app, "/v1/templates", {"name": "endless", "html": ENDLESS})
    for path, body in (
        ("/v1/templates/preview", {"html": ENDLESS}),
        ("/v1/templates/endless/preview", {}),
    ):
        status, problem = await post(app, path, body)
        assert status == 422, (path, problem)
        assert problem["type"].endswith("/render-failed")
        assert problem["detail"] == failed["error"], path
    assert renderer.calls == [], "the browser never saw a page of it"

    # The browser taking too long is still a 503 worth retrying.
    renderer.gate = asyncio.Event()
    async with app.http.post(app.url("/v1/templates/preview"), json={"html": "<p>hi</p>"}) as resp:
        assert resp.status == 503 and resp.headers["Retry-After"]
        assert "try again" in (await resp.json())["detail"]
