"""The routes the dashboard's batches, templates and assets views read: the list of batches, a
template's versions, and what uses an asset; each by cursor, each tenant's own only."""

from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import asyncpg
import pytest

from server.keys import POOL
from tests.assetfiles import png
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.tenants import bearer, made

PROBLEM = "application/problem+json"


class Client:
    """One tenant's requests, with its key."""

    def __init__(self, app: RunningApp, key: str) -> None:
        self.app, self.headers = app, bearer(key)

    async def get(self, path: str) -> tuple[int, Any]:
        async with self.app.http.get(self.app.url(path), headers=self.headers) as resp:
            return resp.status, await resp.json(content_type=None)

    async def post(self, path: str, body: Any) -> dict[str, Any]:
        async with self.app.http.post(self.app.url(path), json=body, headers=self.headers) as resp:
            answer: dict[str, Any] = await resp.json()
            assert resp.status in (200, 201, 202), answer
            return answer

    async def upload(self, data: bytes, kind: str) -> dict[str, Any]:
        headers = {**self.headers, "Content-Type": kind}
        async with self.app.http.post(
            self.app.url("/v1/assets"), data=data, headers=headers
        ) as resp:
            answer: dict[str, Any] = await resp.json()
            assert resp.status in (200, 201), answer
            return answer

    async def refused(self, path: str, status: int) -> dict[str, Any]:
        async with self.app.http.get(self.app.url(path), headers=self.headers) as resp:
            assert resp.status == status, await resp.text()
            assert resp.content_type == PROBLEM
            problem: dict[str, Any] = await resp.json(content_type=None)
            return problem


async def tenants(app: RunningApp) -> tuple[Client, Client]:
    pool: asyncpg.Pool = app.app[POOL]
    acme, _ = await made(pool, "acme")
    other, _ = await made(pool, "other")
    return Client(app, acme), Client(app, other)


def items(prefix: str, n: int = 2) -> list[dict[str, Any]]:
    return [
        {"key": f"{prefix}-{i}", "template": "<p>{{ i }}</p>", "data": {"i": i}} for i in range(n)
    ]


async def test_batches_are_listed_newest_first_by_cursor_and_only_the_tenants_own(
    api: RunningApp,
) -> None:
    acme, other = await tenants(api)
    made_ids = [(await acme.post("/v1/batches", {"items": items(f"a{n}")}))["id"] for n in range(3)]
    combined = await acme.post("/v1/batches", {"items": items("c", 1), "combine": True})
    theirs = await other.post("/v1/batches", {"items": items("o")})

    status, first = await acme.get("/v1/batches?limit=3")
    assert status == 200, first
    assert [b["id"] for b in first["items"]] == [combined["id"], made_ids[2], made_ids[1]]
    assert first["next_cursor"]
    cursor = quote(first["next_cursor"])  # its time's + is no space
    status, second = await acme.get(f"/v1/batches?limit=3&cursor={cursor}")
    assert status == 200, second
    assert [b["id"] for b in second["items"]] == [made_ids[0]]
    assert second["next_cursor"] is None
    listed = first["items"] + second["items"]
    assert theirs["id"] not in {b["id"] for b in listed}
    shown = listed[0]
    assert shown["total"] == 1 and set(shown["counts"]) == {
        "queued", "running", "done", "failed", "cancelled"
    }  # fmt: skip
    assert shown["combined"]["status"] in ("pending", "running", "done")
    assert shown["links"]["self"] == f"/v1/batches/{combined['id']}"
    assert shown["links"]["pdf"] == f"/v1/batches/{combined['id']}/pdf"
    assert "items" not in shown
    assert listed[1]["combined"] is None and "pdf" not in listed[1]["links"]

    status, mine = await other.get("/v1/batches")
    assert [b["id"] for b in mine["items"]] == [theirs["id"]]


async def test_the_batch_list_shows_progress_as_items_finish(
    start_app: Any, pool: asyncpg.Pool
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    acme, _ = await tenants(app)
    batch = await acme.post("/v1/batches", {"items": items("p", 2)})
    await asyncio.wait_for(renderer.started.wait(), 10)
    _, listed = await acme.get("/v1/batches")
    [shown] = listed["items"]
    assert shown["status"] == "running" and shown["progress"] == 0
    assert shown["counts"]["running"] + shown["counts"]["queued"] == 2
    renderer.gate.set()
    async with asyncio.timeout(20):
        while shown["status"] != "done":
            await asyncio.sleep(0.05)
            _, listed = await acme.get("/v1/batches")
            [shown] = listed["items"]
    assert shown["id"] == batch["id"] and shown["progress"] == 100
    assert shown["counts"]["done"] == 2 and shown["finished_at"] is not None


@pytest.mark.parametrize(
    ("query", "field"),
    [("cursor=yesterday", "cursor"), ("limit=0", "limit"), ("limit=1000", "limit")],
)
async def test_a_bad_batch_page_is_a_problem_naming_the_parameter(
    api: RunningApp, query: str, field: str
) -> None:
    acme, _ = await tenants(api)
    problem = await acme.refused(f"/v1/batches?{query}", 422)
    assert [e["field"] for e in problem["errors"]] == [field], problem


async def test_a_templates_versions_newest_first_by_cursor_and_only_the_tenants_own(
    api: RunningApp,
) -> None:
    acme, other = await tenants(api)
    for n in range(3):
        await acme.post("/v1/templates", {"name": "invoice", "html": f"<h1>v{n + 1}</h1>"})
    await other.post("/v1/templates", {"name": "invoice", "html": "<h1>theirs</h1>"})

    status, first = await acme.get("/v1/templates/invoice/versions?limit=2")
    assert status == 200, first
    assert first["name"] == "invoice"
    assert [v["version"] for v in first["items"]] == [3, 2]
    newest = first["items"][0]
    assert {name: newest[name] for name in ("version", "template_id", "kind", "links")} == {
        "version": 3,
        "template_id": "invoice@3",
        "kind": "html",
        "links": {"self": "/v1/templates/invoice@3"},
    }
    assert newest["created_at"] >= first["items"][1]["created_at"]
    assert first["next_cursor"] == "2"
    _, second = await acme.get("/v1/templates/invoice/versions?limit=2&cursor=2")
    assert [v["version"] for v in second["items"]] == [1] and second["next_cursor"] is None
    _, past = await acme.get("/v1/templates/invoice/versions?cursor=1")
    assert past["items"] == [] and past["next_cursor"] is None

    _, theirs = await other.get("/v1/templates/invoice/versions")
    assert [v["version"] for v in theirs["items"]] == [1]
    _, html = await other.get(theirs["items"][0]["links"]["self"])
    assert html["html"] == "<h1>theirs</h1>"

    await acme.post("/v1/templates", {"name": "letter", "html": "<p>mine</p>"})
    await other.refused("/v1/templates/letter/versions", 404)
    await acme.refused("/v1/templates/nothing/versions", 404)
    await acme.refused("/v1/templates/invoice@2/versions", 404)
    problem = await acme.refused("/v1/templates/invoice/versions?cursor=two", 422)
    assert [e["field"] for e in problem["errors"]] == ["cursor"]


async def test_an_asset_says_which_template_versions_and_jobs_in_flight_use_it(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    acme, other = await tenants(api)
    logo, unused = png((200, 30, 30)), png((30, 30, 200))
    asset = await acme.upload(logo, "image/png")
    spare = await acme.upload(unused, "image/png")
    page = '<img src="img/logo.png"><p>{{ n }}</p>'
    for n in range(2):
        await acme.post(
            "/v1/templates",
            {"name": "invoice", "html": f"{page}{n}", "assets": {"img/logo.png": asset["id"]}},
        )
    await acme.post("/v1/templates", {"name": "invoice", "html": "<p>no logo</p>"})
    await acme.post(
        "/v1/templates", {"name": "letter", "html": page, "assets": {"brand/l.png": asset["id"]}}
    )
    fake_renderer.gate = asyncio.Event()  # the first job runs and holds, the second waits
    jobs = [
        await acme.post(
            "/v1/jobs",
            {"template": page, "data": {"n": 1}, "assets": {"img/logo.png": asset["id"]}},
        )
        for _ in range(2)
    ]
    # The same bytes are another asset of another tenant's, with its own users.
    theirs = await other.upload(logo, "image/png")
    assert theirs["id"] == asset["id"]
    await other.post(
        "/v1/templates", {"name": "mine", "html": page, "assets": {"logo.png": theirs["id"]}}
    )

    status, shown = await acme.get(f"/v1/assets/{asset['id']}")
    assert status == 200, shown
    used = shown["used_by"]
    assert [(t["name"], t["version"], t["path"]) for t in used["templates"]] == [
        ("invoice", 2, "img/logo.png"),
        ("invoice", 1, "img/logo.png"),
        ("letter", 1, "brand/l.png"),
    ]
    assert used["templates"][0]["link"] == "/v1/templates/invoice@2"
    assert used["template_versions"] == 3
    assert [j["id"] for j in used["jobs"]] == [job["id"] for job in jobs]
    assert used["jobs"][0]["link"] == f"/v1/jobs/{jobs[0]['id']}"
    assert used["jobs_in_flight"] == 2

    _, listed = await acme.get("/v1/assets")
    by_id = {a["id"]: a for a in listed["items"]}
    assert by_id[asset["id"]]["used_by"] == used
    assert by_id[spare["id"]]["used_by"] == {
        "templates": [], "template_versions": 0, "jobs": [], "jobs_in_flight": 0
    }  # fmt: skip

    _, mine = await other.get(f"/v1/assets/{asset['id']}")
    assert [(t["name"], t["path"]) for t in mine["used_by"]["templates"]] == [("mine", "logo.png")]
    assert mine["used_by"]["jobs"] == [] and mine["used_by"]["jobs_in_flight"] == 0
    await other.refused(f"/v1/assets/{spare['id']}", 404)

    # What the list shows is what keeps DELETE from removing it.
    async with api.http.delete(api.url(f"/v1/assets/{asset['id']}"), headers=acme.headers) as resp:
        assert resp.status == 409
        assert (await resp.json())["jobs"] == [job["id"] for job in jobs]
    fake_renderer.gate.set()
    async with asyncio.timeout(20):
        while used["jobs_in_flight"]:
            await asyncio.sleep(0.05)
            used = (await acme.get(f"/v1/assets/{asset['id']}"))[1]["used_by"]
    assert used["jobs"] == [] and used["template_versions"] == 3


async def test_an_inline_preview_maps_the_assets_it_names_and_only_the_tenants_own(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    acme, other = await tenants(api)
    logo = png((10, 120, 10))
    asset = await acme.upload(logo, "image/png")
    body = {"html": '<img src="img/logo.png">', "assets": {"img/logo.png": asset["id"]}}
    async with api.http.post(
        api.url("/v1/templates/preview"), json=body, headers=acme.headers
    ) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.read()).startswith(b"%PDF-")
    files = fake_renderer.assets[-1]
    assert files is not None and files["img/logo.png"] == ("image/png", logo)

    # Another tenant's id is unknown there, as an id never uploaded.
    async with api.http.post(
        api.url("/v1/templates/preview"), json=body, headers=other.headers
    ) as resp:
        assert resp.status == 422 and resp.content_type == PROBLEM
        problem = await resp.json(content_type=None)
    assert [e["field"] for e in problem["errors"]] == ["assets.img/logo.png"]
