"""A template version's data contract (data_schema, samples) and its drafts and publishing:
the data of the jobs that name it is checked at submission, each problem by its path."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg

from server.access import apikeys
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import messages

SCHEMA = {
    "type": "object",
    "required": ["customer", "items"],
    "properties": {
        "customer": {"type": "string"},
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["name", "price"],
                "properties": {"name": {"type": "string"}, "price": {"type": "number"}},
            },
        },
    },
}
GOOD = {"customer": "Acme", "items": [{"name": "Ink", "price": 4.5}]}
INVOICE = {
    "name": "invoice",
    "html": "<h1>{{customer}}</h1>{% for i in items %}<p>{{i.name}} {{i.price}}</p>{% endfor %}",
    "data_schema": SCHEMA,
    "samples": {"short": GOOD, "empty": {"customer": "Nobody", "items": []}},
}


async def post(
    api: RunningApp, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with api.http.post(api.url(path), json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def get(api: RunningApp, path: str) -> tuple[int, Any]:
    async with api.http.get(api.url(path)) as resp:
        return resp.status, await resp.json()


def fields(problem: dict[str, Any]) -> dict[str, str]:
    return {e["field"]: e["message"] for e in problem["errors"]}


async def test_a_job_breaking_the_contract_is_refused_naming_each_path(api: RunningApp) -> None:
    status, stored = await post(api, "/v1/templates", {**INVOICE, "publish": True})
    assert status == 201, stored
    assert stored["data_schema"] == SCHEMA and set(stored["samples"]) == {"short", "empty"}
    items = [{"name": f"line {n}", "price": n} for n in range(3)]
    items.append({"name": "line 3", "price": "twelve"})
    items.append({"price": 1})
    status, problem = await post(
        api, "/v1/jobs", {"template_id": "invoice", "data": {"customer": 7, "items": items}}
    )
    assert status == 422, problem
    assert fields(problem) == {
        "data.customer": "is not a string",
        "data.items[3].price": "is not a number",
        "data.items[4].name": "is required",
    }
    status, job = await post(api, "/v1/jobs", {"template_id": "invoice@1", "data": GOOD})
    assert status == 202, job


async def test_in_a_batch_the_path_names_the_item(api: RunningApp) -> None:
    await post(api, "/v1/templates", {**INVOICE, "publish": True})
    body = {
        "items": [
            {"key": "a", "template_id": "invoice", "data": GOOD},
            {"key": "b", "template_id": "invoice", "data": {"customer": "B"}},
        ]
    }
    status, problem = await post(api, "/v1/batches", body)
    assert status == 422, problem
    assert fields(problem) == {"items[1].data.items": "is required"}


async def test_without_a_schema_any_data_goes_as_before(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    plain = {"name": "letter", "html": "<p>Dear {{who}}</p>", "publish": True}
    status, stored = await post(api, "/v1/templates", plain)
    assert status == 201 and stored["data_schema"] is None and stored["samples"] == {}
    status, job = await post(api, "/v1/jobs", {"template_id": "letter", "data": {"who": [1, 2]}})
    assert status == 202, job


async def test_a_version_whose_samples_break_its_own_contract_is_refused(
    api: RunningApp,
) -> None:
    bad = {**INVOICE, "samples": {"short": {"customer": "A", "items": [{"name": "x"}]}}}
    status, problem = await post(api, "/v1/templates", bad)
    assert status == 422
    assert fields(problem) == {"samples.short.items[0].price": "is required"}
    status, problem = await post(
        api, "/v1/templates", {**INVOICE, "data_schema": {"type": "nothing"}}
    )
    assert status == 422
    assert "not a valid JSON Schema (draft 2020-12)" in fields(problem)["data_schema"]
    many = {f"s{n}": GOOD for n in range(11)}
    status, problem = await post(api, "/v1/templates", {**INVOICE, "samples": many})
    assert status == 422 and "samples" in fields(problem)


async def test_the_preview_renders_a_sample_by_name(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    await post(api, "/v1/templates", INVOICE)
    async with api.http.post(
        api.url("/v1/templates/invoice@1/preview"), json={"sample": "short"}
    ) as resp:
        assert resp.status == 200, await resp.text()
    assert fake_renderer.rendered[-1] == "<h1>Acme</h1><p>Ink 4.5</p>"
    status, problem = await post(api, "/v1/templates/invoice@1/preview", {"sample": "long"})
    assert status == 422
    assert fields(problem) == {"sample": "invoice@1 has no sample 'long'; it has: empty, short"}


async def test_a_new_version_is_a_draft_that_jobs_get_only_by_name_at_version(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    letter = {"name": "letter", "html": "<p>Dear {{who}}</p>"}
    status, first = await post(api, "/v1/templates", letter)
    assert status == 201 and first["status"] == "draft" and first["published_at"] is None
    status, problem = await post(api, "/v1/jobs", {"template_id": "letter", "data": {}})
    assert status == 422 and "template_id" in fields(problem)
    status, job = await post(api, "/v1/jobs", {"template_id": "letter@1", "data": {"who": "A"}})
    assert status == 202, job
    status, published = await post(api, "/v1/templates/letter@1/publish", None)
    assert status == 200, published
    assert published["status"] == "published" and published["diff"]["against"] is None

    await post(api, "/v1/templates", {**letter, "html": "<p>Hello {{who}}</p>"})
    status, shown = await get(api, "/v1/templates/letter")
    assert shown["version"] == 1 and [v["status"] for v in shown["versions"]] == [
        "published",
        "draft",
    ]
    status, listed = await get(api, "/v1/templates")
    assert [(i["version"], i["published"]) for i in listed["items"]] == [(2, 1)]
    status, versions = await get(api, "/v1/templates/letter/versions")
    assert [v["status"] for v in versions["items"]] == ["draft", "published"]
    status, job = await post(api, "/v1/jobs", {"template_id": "letter", "data": {"who": "B"}})
    assert status == 202
    status, job = await post(api, "/v1/jobs", {"template_id": "letter@2", "data": {"who": "C"}})
    assert status == 202
    async with api.http.get(api.url("/v1/jobs?limit=10")) as resp:
        jobs = (await resp.json())["items"]
    assert sorted(j["source"] for j in jobs) == ["letter@1", "letter@1", "letter@2"]


async def test_publishing_renders_every_sample_and_the_first_needs_only_render(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    await post(api, "/v1/templates", INVOICE)
    status, published = await post(api, "/v1/templates/invoice@1/publish", {})
    assert status == 200, published
    assert sorted(s["sample"] for s in published["diff"]["samples"]) == ["empty", "short"]
    assert sorted(fake_renderer.rendered) == ["<h1>Acme</h1><p>Ink 4.5</p>", "<h1>Nobody</h1>"]
    assert published["diff"]["refused"] == []
    # Publishing it again answers as it is, rendering nothing.
    status, again = await post(api, "/v1/templates/invoice@1/publish", {})
    assert status == 200 and again["status"] == "published" and len(fake_renderer.rendered) == 2
    status, diff = await get(api, "/v1/templates/invoice@1/diff")
    assert status == 200 and diff["published"] and diff["against"] is None


async def test_a_sample_that_fails_refuses_publishing_unless_forced(api: RunningApp) -> None:
    await post(api, "/v1/templates", {**INVOICE, "publish": True})
    broken = {**INVOICE, "html": "<h1>{{ customer.nothing.more }}</h1>"}
    status, _ = await post(api, "/v1/templates", broken)
    assert status == 201
    status, problem = await post(api, "/v1/templates/invoice@2/publish", {})
    assert status == 409, problem
    assert problem["refused"] and all("does not render" in r for r in problem["refused"])
    assert "invoice@2 stays a draft" in problem["detail"]
    status, shown = await get(api, "/v1/templates/invoice")
    assert shown["version"] == 1
    status, diff = await get(api, "/v1/templates/invoice@2/diff")
    assert status == 200 and not diff["published"] and diff["refused"] == problem["refused"]
    status, forced = await post(api, "/v1/templates/invoice@2/publish", {"force": True})
    assert status == 200 and forced["status"] == "published" and forced["diff"]["forced"]
    status, shown = await get(api, "/v1/templates/invoice")
    assert shown["version"] == 2


async def test_publish_takes_a_version_and_its_body_is_checked(api: RunningApp) -> None:
    await post(api, "/v1/templates", INVOICE)
    status, problem = await post(api, "/v1/templates/invoice/publish", {})
    assert status == 404 and "invoice@VERSION" in problem["detail"]
    status, problem = await post(api, "/v1/templates/invoice@1/publish", {"threshold": 2})
    assert status == 422 and "threshold" in fields(problem)
    status, problem = await get(api, "/v1/templates/invoice@1/diff")
    assert status == 404


async def test_drafts_and_diffs_belong_to_their_tenant(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    _, acme = await apikeys.create_key(pool, "acme")
    _, other = await apikeys.create_key(pool, "other")
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    mine, theirs = {"Authorization": f"Bearer {acme}"}, {"Authorization": f"Bearer {other}"}
    status, _ = await post(app, "/v1/templates", INVOICE, mine)
    assert status == 201
    status, _ = await post(app, "/v1/templates/invoice@1/publish", {}, theirs)
    assert status == 404
    status, _ = await post(app, "/v1/templates/invoice@1/publish", {}, mine)
    assert status == 200
    async with app.http.get(app.url("/v1/templates/invoice@1/diff"), headers=theirs) as resp:
        assert resp.status == 404
    status, problem = await post(
        app, "/v1/jobs", {"template_id": "invoice@1", "data": GOOD}, theirs
    )
    assert status == 422 and "template_id" in fields(problem)


async def test_the_tenants_stream_announces_template_published(api: RunningApp) -> None:
    await post(api, "/v1/templates", {**INVOICE, "publish": True})
    await post(api, "/v1/templates", INVOICE)
    async with api.http.get(api.url("/v1/events")) as resp:
        assert resp.status == 200
        stream = messages(resp)
        status, _ = await post(api, "/v1/templates/invoice@2/publish", {})
        assert status == 200
        async with asyncio.timeout(20):
            # The live stream may still show version 1's, published just before it opened.
            async for message in stream:
                if message.json.get("template", {}).get("version") == 2:
                    break
    assert message.event == "template.published"
    assert message.json["type"] == "template.published" and "job" not in message.json
    assert message.json["template"] == {
        "name": "invoice",
        "version": 2,
        "template_id": "invoice@2",
        "kind": "html",
        "published_at": message.json["template"]["published_at"],
        "replaces": 1,
        "links": {"self": "/v1/templates/invoice@2", "diff": "/v1/templates/invoice@2/diff"},
    }
    # The type filters the tenant's stream as any other.
    async with api.http.get(api.url("/v1/events?type=template.published")) as resp:
        assert resp.status == 200
