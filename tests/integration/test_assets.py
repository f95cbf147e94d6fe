"""Assets over the API (the fake renderer stands in for Chromium): uploads, limits, what a job
maps in and what it is refused, deletes while jobs need them, templates, multipart jobs."""

from __future__ import annotations

import asyncio
import io
import json
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest
from aiohttp import FormData

from server.access import apikeys
from server.keys import ASSET_CACHE, SETTINGS, STORAGE
from tests.assetfiles import asset_id, font, png
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer, minimal_pdf
from tests.sse import collect

LOGO = png((200, 30, 30), 40, 20)
PAGE = '<img src="img/logo.png"><p>{{ name | default("Invoice") }}</p>'


async def upload(
    app: RunningApp, data: bytes, kind: str = "image/png", headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    sent = {"Content-Type": kind, **(headers or {})}
    async with app.http.post(app.url("/v1/assets"), data=data, headers=sent) as resp:
        return resp.status, await resp.json()


async def submit(
    app: RunningApp, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with app.http.post(app.url("/v1/jobs"), json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def finished(app: RunningApp, job_id: str, headers: dict[str, str] | None = None) -> Any:
    got = await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"), headers=headers)
    return got[-1].json["job"]


def fields(problem: dict[str, Any]) -> dict[str, str]:
    return {error["field"]: error["message"] for error in problem.get("errors", [])}


async def count(pool: asyncpg.Pool, table: str) -> int:
    value: int = await pool.fetchval(f"SELECT count(*) FROM {table}")
    return value


async def test_an_upload_is_stored_once_by_its_hash_and_shown(api: RunningApp) -> None:
    status, first = await upload(api, LOGO)
    assert status == 201, first
    assert first["id"] == asset_id(LOGO)
    assert first["size"] == len(LOGO) and first["content_type"] == "image/png"
    status, again = await upload(api, LOGO, "image/png; charset=binary")
    assert status == 200 and again == first

    async with api.http.get(api.url(f"/v1/assets/{first['id']}")) as resp:
        assert resp.status == 200
        assert await resp.json() == first
    async with api.http.get(api.url(first["links"]["content"])) as resp:
        assert resp.status == 200 and resp.content_type == "image/png"
        assert resp.headers["Content-Disposition"].startswith("attachment")
        assert await resp.read() == LOGO
    status, problem = await upload(api, b"body { color: red }", "text/css")
    assert status == 201 and problem["content_type"] == "text/css"
    status, legacy = await upload(api, b"let x = 1", "application/javascript")
    assert status == 201 and legacy["content_type"] == "text/javascript"
    async with api.http.get(api.url(f"/v1/assets/sha256:{'0' * 64}")) as resp:
        assert resp.status == 404
    async with api.http.get(api.url("/v1/assets/logo.png")) as resp:
        assert resp.status == 404


async def test_a_tenant_lists_its_own_assets_page_by_page_with_its_total(
    api: RunningApp, pool: asyncpg.Pool
) -> None:
    _, acme_key = await apikeys.create_key(pool, "acme")
    _, other_key = await apikeys.create_key(pool, "globex")
    acme = {"Authorization": f"Bearer {acme_key}"}
    other = {"Authorization": f"Bearer {other_key}"}
    files = [png((n * 40, 10, 10), 8 + n, 8) for n in range(5)]
    for data in files:
        assert (await upload(api, data, headers=acme))[0] == 201
    assert (await upload(api, LOGO, headers=other))[0] == 201

    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"limit": "2", **({"cursor": cursor} if cursor else {})}
        async with api.http.get(api.url("/v1/assets"), params=params, headers=acme) as resp:
            assert resp.status == 200
            page = await resp.json()
        assert len(page["items"]) <= 2
        assert page["total_bytes"] == sum(map(len, files))
        assert page["quota_bytes"] == api.app[SETTINGS].tenant_max_asset_bytes
        seen += page["items"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [item["id"] for item in seen] == sorted(asset_id(data) for data in files)
    assert seen[0]["links"]["content"] == f"/v1/assets/{seen[0]['id']}/content"

    async with api.http.get(api.url("/v1/assets"), headers=other) as resp:
        page = await resp.json()
    assert [item["id"] for item in page["items"]] == [asset_id(LOGO)]
    assert page["next_cursor"] is None and page["total_bytes"] == len(LOGO)
    for bad in ({"cursor": "logo.png"}, {"limit": "0"}, {"limit": "x"}):
        async with api.http.get(api.url("/v1/assets"), params=bad, headers=acme) as resp:
            assert resp.status == 422, bad
            assert resp.content_type == "application/problem+json"


async def test_uploads_past_their_limits_or_of_other_types_are_refused(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    app: RunningApp = await start_app(
        renderer=FakeRenderer(),
        render_slots=1,
        env={"PRESSROOM_MAX_ASSET_BYTES": "1000", "PRESSROOM_TENANT_MAX_ASSET_BYTES": "2700"},
    )
    status, problem = await upload(app, b"x" * 1001)
    assert status == 413 and problem["type"].endswith("/asset-too-large"), problem
    assert "PRESSROOM_MAX_ASSET_BYTES" in problem["detail"]
    status, problem = await upload(app, b"<html></html>", "text/html")
    assert status == 415 and problem["type"].endswith("/unsupported-asset-type")
    assert "image/png" in problem["detail"] and "font/woff2" in problem["detail"]
    status, problem = await upload(app, b"\x00\x01", "application/octet-stream")
    assert status == 415
    status, problem = await upload(app, b"%PDF-1.4 cut short", "application/pdf")
    assert status == 422 and "not a complete PDF" in json.dumps(problem)
    status, problem = await upload(app, b"a" * 100, "image/png")
    assert status == 422 and "not a complete PNG" in json.dumps(problem), "not what it says"
    assert await count(pool, "assets") == 0

    assert (await upload(app, b"a" * 1000, "text/css"))[0] == 201
    assert (await upload(app, b"b" * 1000, "text/css"))[0] == 201
    status, problem = await upload(app, b"c" * 1000, "text/css")
    assert status == 413 and problem["type"].endswith("/asset-quota"), problem
    assert "2000" in problem["detail"] and "2700" in problem["detail"]
    again = await upload(app, b"a" * 1000, "text/css")
    assert again[0] == 200, "stored bytes cost nothing again"
    assert (await upload(app, minimal_pdf(), "application/pdf"))[0] == 201
    assert await count(pool, "assets") == 3


async def test_a_job_maps_paths_to_assets_and_the_renderer_gets_their_bytes(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    _, logo = await upload(api, LOGO)
    _, brand = await upload(api, font(), "font/ttf")
    body = {
        "template": PAGE,
        "data": {"name": "Ana"},
        "assets": {"img/logo.png": logo["id"], "fonts/brand.ttf": brand["id"]},
    }
    status, job = await submit(api, body)
    assert status == 202, job
    assert (await finished(api, job["id"]))["status"] == "done"
    assert fake_renderer.assets[-1] == {
        "img/logo.png": ("image/png", LOGO),
        "fonts/brand.ttf": ("font/ttf", font()),
    }
    status, plain = await submit(api, {"template": "<p>no files</p>"})
    assert (await finished(api, plain["id"]))["status"] == "done"
    assert fake_renderer.assets[-1] is None, "a job without assets gives the renderer none"


async def test_asset_maps_with_bad_paths_or_unknown_ids_are_refused_naming_the_path(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    _, acme_key = await apikeys.create_key(pool, "acme")
    _, other_key = await apikeys.create_key(pool, "globex")
    acme = {"Authorization": f"Bearer {acme_key}"}
    other = {"Authorization": f"Bearer {other_key}"}
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    _, theirs = await upload(app, png((1, 2, 3)), headers=other)
    _, mine = await upload(app, LOGO, headers=acme)
    unknown = "sha256:" + "ab" * 32
    body = {
        "template": PAGE,
        "assets": {
            "../secret.png": mine["id"],
            "/etc/logo.png": mine["id"],
            "https://cdn.example/logo.png": mine["id"],
            "img//logo.png": mine["id"],
            "img/logo.png": theirs["id"],
            "img/unknown.png": unknown,
            "img/short.png": "sha256:abc",
        },
    }
    status, problem = await submit(app, body, acme)
    assert status == 422, problem
    errors = fields(problem)
    assert "'..'" in errors["assets.../secret.png"]
    assert "leading /" in errors["assets./etc/logo.png"]
    assert "not a URL" in errors["assets.https://cdn.example/logo.png"]
    assert "empty" in errors["assets.img//logo.png"]
    # Another tenant's asset is as unknown as one never uploaded: the same message.
    assert (
        errors["assets.img/logo.png"] == f"no asset {theirs['id']}: upload it with POST /v1/assets"
    )
    assert errors["assets.img/unknown.png"] == f"no asset {unknown}: upload it with POST /v1/assets"
    assert "64 hexadecimal digits" in errors["assets.img/short.png"]
    async with app.http.get(app.url(f"/v1/assets/{theirs['id']}"), headers=acme) as resp:
        assert resp.status == 404
    assert await count(pool, "jobs") == 0
    status, job = await submit(
        app, {"template": PAGE, "assets": {"img/logo.png": mine["id"]}}, acme
    )
    assert status == 202, job


async def test_an_asset_is_kept_while_a_queued_or_running_job_needs_it(
    api: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    _, logo = await upload(api, LOGO)
    path = api.url(f"/v1/assets/{logo['id']}")
    later = {
        "template": PAGE,
        "assets": {"img/logo.png": logo["id"]},
        "run_at": "2099-01-01T00:00:00Z",
    }
    _, waiting = await submit(api, later)
    async with api.http.delete(path) as resp:
        assert resp.status == 409
        problem = await resp.json()
    assert problem["type"].endswith("/asset-in-use") and problem["jobs"] == [waiting["id"]]
    async with api.http.post(api.url(f"/v1/jobs/{waiting['id']}/cancel")) as resp:
        assert resp.status == 200

    fake_renderer.gate = asyncio.Event()
    _, running = await submit(api, {"template": PAGE, "assets": {"img/logo.png": logo["id"]}})
    await fake_renderer.started.wait()
    async with api.http.delete(path) as resp:
        assert resp.status == 409
        assert (await resp.json())["jobs"] == [running["id"]]
    fake_renderer.gate.set()
    assert (await finished(api, running["id"]))["status"] == "done"

    async with api.http.delete(path) as resp:
        assert resp.status == 204
    async with api.http.get(path) as resp:
        assert resp.status == 404
    async with api.http.delete(path) as resp:
        assert resp.status == 404
    assert await count(pool, "assets") == 0
    status, problem = await submit(api, {"template": PAGE, "assets": {"img/logo.png": logo["id"]}})
    assert status == 422 and "no asset" in fields(problem)["assets.img/logo.png"]
    assert (await upload(api, LOGO))[0] == 201, "deleted bytes can be uploaded again"


async def test_a_job_whose_asset_is_gone_from_storage_fails_naming_it(
    api: RunningApp, pool: asyncpg.Pool
) -> None:
    _, logo = await upload(api, LOGO)
    await api.app[STORAGE].delete(f"default/assets/{logo['id'].removeprefix('sha256:')}")
    _, job = await submit(api, {"template": PAGE, "assets": {"img/logo.png": logo["id"]}})
    failed = await finished(api, job["id"])
    assert failed["status"] == "failed" and failed["attempts"] == 1
    assert failed["error"] == f"the asset img/logo.png ({logo['id']}) is no longer stored"


async def test_many_jobs_read_an_asset_from_storage_once(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    _, logo = await upload(api, LOGO)
    cache = api.app[ASSET_CACHE]
    reads = cache.reads
    jobs = [
        (await submit(api, {"template": PAGE, "assets": {f"logo{i}.png": logo["id"]}}))[1]
        for i in range(3)
    ]
    for job in jobs:
        assert (await finished(api, job["id"]))["status"] == "done"
    assert cache.reads == reads + 1
    assert [files and list(files.values()) for files in fake_renderer.assets] == [
        [("image/png", LOGO)]
    ] * 3


async def test_a_template_version_keeps_its_assets_and_a_job_map_lies_over_it(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    _, logo = await upload(api, LOGO)
    _, other = await upload(api, png((0, 0, 255)))
    _, css = await upload(api, b"p { color: red }", "text/css")
    stored = {
        "name": "invoice",
        "html": PAGE,
        "assets": {"img/logo.png": logo["id"], "style.css": css["id"]},
    }
    async with api.http.post(api.url("/v1/templates"), json=stored) as resp:
        assert resp.status == 201, await resp.text()
        assert (await resp.json())["assets"] == stored["assets"]
    async with api.http.get(api.url("/v1/templates/invoice@1")) as resp:
        assert (await resp.json())["assets"] == stored["assets"]
    body = {"template_id": "invoice@1", "assets": {"img/logo.png": other["id"]}}
    _, job = await submit(api, body)
    assert (await finished(api, job["id"]))["status"] == "done"
    assert fake_renderer.assets[-1] == {
        "img/logo.png": ("image/png", png((0, 0, 255))),
        "style.css": ("text/css", b"p { color: red }"),
    }
    async with api.http.post(
        api.url("/v1/templates"),
        json={"name": "bad", "html": "<p></p>", "assets": {"../x": css["id"]}},
    ) as resp:
        assert resp.status == 422
        assert "assets.../x" in fields(await resp.json())


def multipart(*parts: tuple[str, bytes | str | io.BytesIO, str | None, str | None]) -> FormData:
    """(name, content, file name, content type) parts, in order."""
    form = FormData()
    for name, content, filename, kind in parts:
        form.add_field(name, content, filename=filename, content_type=kind)
    return form


async def test_a_multipart_job_stores_its_files_as_assets_mapped_by_name(
    api: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    job_part = json.dumps(
        {"data": {"name": "Ana"}, "options": {"format": "A5"}, "metadata": {"n": 1}}
    )
    form = multipart(
        ("files", PAGE.encode(), "index.html", "text/html"),
        ("files", LOGO, "logo.png", "image/png"),
        ("files", font(), "brand.woff2", "application/octet-stream"),
        ("job", job_part, None, "application/json"),
    )
    async with api.http.post(api.url("/v1/jobs"), data=form) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    done = await finished(api, job["id"])
    assert done["status"] == "done" and done["options"] == {"format": "A5"}
    assert done["metadata"] == {"n": 1}
    assert fake_renderer.rendered[-1] == '<img src="img/logo.png"><p>Ana</p>'
    assert fake_renderer.assets[-1] == {
        "logo.png": ("image/png", LOGO),
        "brand.woff2": ("font/woff2", font()),
    }
    async with api.http.get(api.url(f"/v1/assets/{asset_id(LOGO)}")) as resp:
        assert resp.status == 200
    assert await count(pool, "assets") == 2


@pytest.mark.parametrize(
    ("parts", "field", "status"),
    [
        ([("files", LOGO, "logo.png", "image/png")], "index.html", 422),
        (
            [
                ("files", b"<p>1</p>", "index.html", "text/html"),
                ("files", b"<p>2</p>", "index.html", "text/html"),
                ("files", LOGO, "logo.png", "image/png"),
            ],
            "index.html",
            422,
        ),
        (
            [
                ("files", b"<p>1</p>", "index.html", "text/html"),
                ("files", LOGO, "logo.png", "image/png"),
                ("job", "{not json", None, "application/json"),
            ],
            "job",
            422,
        ),
        (
            [
                ("files", b"<p>1</p>", "index.html", "text/html"),
                ("files", LOGO, "logo.png", "image/png"),
                ("job", '{"template": "<p>2</p>"}', None, "application/json"),
            ],
            "job.template",
            422,
        ),
        (
            [
                ("files", b"<p>{{ broken</p>", "index.html", "text/html"),
                ("files", LOGO, "logo.png", "image/png"),
            ],
            "template",
            422,
        ),
        (
            [
                ("files", b"<p>1</p>", "index.html", "text/html"),
                ("files", LOGO, "../logo.png", None),
            ],
            "../logo.png",
            422,
        ),
        (
            [
                ("files", b"<p>1</p>", "index.html", "text/html"),
                ("files", LOGO, "logo.png", "image/png"),
                ("files", b"x" * 3000, "big.png", "image/png"),
            ],
            None,
            413,
        ),
        (
            [("files", b"<p>1</p>", "index.html", "text/html"), ("files", b"MZ", "tool.exe", None)],
            None,
            415,
        ),
    ],
    ids=["no-index", "two-index", "bad-job-json", "job-template", "bad-template", "dot-dot",
         "oversized", "unknown-type"],
)  # fmt: skip
async def test_a_bad_multipart_job_is_a_clear_problem_and_stores_nothing(
    start_app: Callable[..., Any],
    pool: asyncpg.Pool,
    parts: list[tuple[str, bytes | str, str | None, str | None]],
    field: str | None,
    status: int,
) -> None:
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, env={"PRESSROOM_MAX_ASSET_BYTES": "2000"}
    )
    async with app.http.post(app.url("/v1/jobs"), data=multipart(*parts)) as resp:
        assert resp.status == status, await resp.text()
        assert resp.content_type == "application/problem+json"
        problem = await resp.json()
    if field is not None:
        assert field in fields(problem), problem
    assert await count(pool, "assets") == 0
    assert await count(pool, "jobs") == 0
    assert not list((app.app[SETTINGS].files_dir / "default" / "assets").glob("*"))


async def test_a_multipart_job_with_index_md_is_a_markdown_job(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    form = multipart(
        ("files", b"# Invoice\n\n![logo](logo.png)\n", "index.md", "text/markdown"),
        ("files", LOGO, "logo.png", "image/png"),
    )
    async with api.http.post(api.url("/v1/jobs"), data=form) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    assert (await finished(api, job["id"]))["status"] == "done"
    assert "<h1>Invoice</h1>" in fake_renderer.rendered[-1]
    assert fake_renderer.assets[-1] == {"logo.png": ("image/png", LOGO)}


async def test_batch_items_and_template_previews_take_their_assets(
    api: RunningApp, fake_renderer: FakeRenderer, pool: asyncpg.Pool
) -> None:
    _, logo = await upload(api, LOGO)
    items = [
        {"key": "with-logo", "template": PAGE, "assets": {"img/logo.png": logo["id"]}},
        {"key": "plain", "template": "<p>plain</p>"},
        {"key": "bad", "template": PAGE, "assets": {"img/logo.png": "sha256:" + "1" * 64}},
    ]
    async with api.http.post(api.url("/v1/batches"), json={"items": items}) as resp:
        assert resp.status == 422
        assert "items[2].assets.img/logo.png" in fields(await resp.json())
    async with api.http.post(api.url("/v1/batches"), json={"items": items[:2]}) as resp:
        assert resp.status == 202, await resp.text()
        batch = await resp.json()
    for item in batch["items"]:
        assert (await finished(api, item["job_id"]))["status"] == "done"
    assert sorted(map(str, fake_renderer.assets)) == sorted(
        ["None", str({"img/logo.png": ("image/png", LOGO)})]
    )

    template = {"name": "branded", "html": PAGE, "assets": {"img/logo.png": logo["id"]}}
    async with api.http.post(api.url("/v1/templates"), json=template) as resp:
        assert resp.status == 201
    async with api.http.post(api.url("/v1/templates/branded/preview")) as resp:
        assert resp.status == 200, await resp.text()
    assert fake_renderer.assets[-1] == {"img/logo.png": ("image/png", LOGO)}


async def test_assets_may_be_larger_than_a_json_body(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    big = b"\x00" * (3 * 1024 * 1024)  # over PRESSROOM_MAX_BODY_BYTES (2 MiB), under 10 MiB
    headers = {"Content-Type": "font/woff2"}
    async with api.http.post(api.url("/v1/assets"), data=io.BytesIO(big), headers=headers) as r:
        assert r.status == 201, await r.text()
    form = multipart(
        ("files", b"<p>big</p>", "index.html", "text/html"),
        ("files", io.BytesIO(big + b"\x01"), "fonts/big.woff2", None),
    )
    async with api.http.post(api.url("/v1/jobs"), data=form) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    assert (await finished(api, job["id"]))["status"] == "done"
    assert fake_renderer.assets[-1] == {"fonts/big.woff2": ("font/woff2", big + b"\x01")}


async def test_a_multipart_part_whose_headers_are_not_http_headers_is_a_400(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    """Found by schemathesis: a part name of raw non-ASCII bytes made aiohttp's part reader
    raise InvalidHeader, which was a 500."""
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    boundary = "b0undary"
    body = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="'.encode()
        + "=àú".encode()
        + b"\xc2\x9d\x18"
        + f'"\r\n\r\n{{}}\r\n--{boundary}--\r\n'.encode()
    )
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    async with app.http.post(app.url("/v1/jobs"), data=body, headers=headers) as resp:
        assert resp.status == 400, await resp.text()
        assert resp.content_type == "application/problem+json"
    assert await count(pool, "jobs") == 0


async def test_a_page_url_job_takes_no_assets(api: RunningApp, pool: asyncpg.Pool) -> None:
    status, logo = await upload(api, LOGO)
    assert status in (200, 201)
    body = {"page_url": "https://pages.invalid/invoice", "assets": {"logo.png": logo["id"]}}
    async with api.http.post(api.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 422
        problem = await resp.json()
    assert [e["field"] for e in problem["errors"]] == ["assets"], problem
    assert "its own site" in problem["errors"][0]["message"]
    assert await count(pool, "jobs") == 0
