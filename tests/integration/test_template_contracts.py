"""A template version's data contract (data_schema, samples) and its drafts and publishing:
the data of the jobs that name it is checked at submission, each problem by its path."""

from __future__ import annotations

from typing import Any

from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer

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
    status, stored = await post(api, "/v1/templates", INVOICE)
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
    await post(api, "/v1/templates", INVOICE)
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
    plain = {"name": "letter", "html": "<p>Dear {{who}}</p>"}
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
