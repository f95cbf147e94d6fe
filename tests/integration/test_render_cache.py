"""The render cache: a job that uses it (cache: true, or its tenant's default) and whose source,
data, options and assets match a done job of its tenant that used it too is done at once with
that job's file, a batch's items as single jobs; retention keeps a file while a job it does not
delete points at it. The default reaches every server without a restart."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import asyncpg

from server.access import tenants
from server.keys import METRICS, POOL, STORAGE, TENANT_DEFAULTS
from server.queue import retention
from tests.conftest import RunningApp
from tests.integration.test_batches import read_until
from tests.integration.test_combine import labelled, texts
from tests.pdfs import FakeRenderer
from tests.processes import admin_cli
from tests.sse import collect, messages
from tests.tenants import bearer, made

BODY = {"template": "<h1>Hi {{ name }}</h1>", "data": {"name": "Ana"}, "cache": True}


async def submit(api: RunningApp, body: dict[str, Any], key: str | None = None) -> dict[str, Any]:
    """Submit a job and wait for its stream to end (with its final event)."""
    headers = bearer(key) if key else {}
    async with api.http.post(api.url("/v1/jobs"), json=body, headers=headers) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
    events = await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"), headers=headers)
    assert events[-1].event == "job.done", [m.event for m in events]
    return job


async def shown(api: RunningApp, job_id: str, key: str | None = None) -> dict[str, Any]:
    headers = bearer(key) if key else {}
    async with api.http.get(api.url(f"/v1/jobs/{job_id}"), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


async def download(api: RunningApp, job_id: str, key: str | None = None) -> bytes:
    headers = bearer(key) if key else {}
    async with api.http.get(api.url(f"/v1/jobs/{job_id}/pdf"), headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return await resp.read()


def counted(api: RunningApp, result: str) -> float:
    value = api.app[METRICS].registry.get_sample_value(
        "pressroom_render_cache_total", {"result": result}
    )
    return value or 0.0


async def test_an_identical_job_is_done_at_once_with_the_same_file(
    start_app: Callable[..., Any],
) -> None:
    renderer = FakeRenderer(text_of=lambda html: html)
    api: RunningApp = await start_app(renderer=renderer, render_slots=1)
    first = await submit(api, BODY)
    assert len(renderer.calls) == 1
    hook = "https://hooks.example.com/pdf"

    async with api.http.post(api.url("/v1/jobs"), json={**BODY, "webhook_url": hook}) as resp:
        assert resp.status == 202, await resp.text()
        second = await resp.json()
    # Done in the answer itself, with the first job's file and no render.
    assert second["status"] == "done"
    assert second["cached_from"] == first["id"]
    assert second["url"]
    events = await collect(api.http, api.url(f"/v1/jobs/{second['id']}/events"))
    assert [m.event for m in events][-1] == "job.done"
    assert len(renderer.calls) == 1
    done_first = await shown(api, first["id"])
    done_second = await shown(api, second["id"])
    assert done_first["cached_from"] is None
    assert done_second["cached_from"] == first["id"]
    assert done_second["bytes"] == done_first["bytes"]
    assert done_second["pages"] == done_first["pages"]
    assert done_second["provenance"] == done_first["provenance"]
    assert await download(api, second["id"]) == await download(api, first["id"])
    # Its webhook fires as any done job's.
    hooks = await api.app[POOL].fetch(
        "SELECT type, url FROM webhook_deliveries WHERE job_id = $1", second["id"]
    )
    assert [(row["type"], row["url"]) for row in hooks] == [("job.done", hook)]

    # A third, served from the second, still names the job that rendered the file.
    third = await submit(api, BODY)
    assert (await shown(api, third["id"]))["cached_from"] == first["id"]
    assert len(renderer.calls) == 1
    assert counted(api, "hit") == 2
    assert counted(api, "miss") == 1


async def test_what_differs_renders(start_app: Callable[..., Any]) -> None:
    renderer = FakeRenderer(text_of=lambda html: html)
    api: RunningApp = await start_app(renderer=renderer, render_slots=1)
    await submit(api, BODY)
    other_data = await submit(api, {**BODY, "data": {"name": "Bea"}})
    other_options = await submit(api, {**BODY, "options": {"format": "Letter"}})
    uncached = await submit(api, {key: value for key, value in BODY.items() if key != "cache"})
    assert len(renderer.calls) == 4
    for job in (other_data, other_options, uncached):
        assert (await shown(api, job["id"]))["cached_from"] is None
    # A job that did not ask for the cache feeds none: the next one asking renders.
    body = {"template": "<p>{{ n }}</p>", "data": {"n": 7}}
    await submit(api, body)
    await submit(api, {**body, "cache": True})
    assert len(renderer.calls) == 6
    assert counted(api, "miss") == 4
    assert counted(api, "hit") == 0


async def test_another_tenant_is_not_served_from_the_cache(
    start_app: Callable[..., Any],
) -> None:
    renderer = FakeRenderer()
    api: RunningApp = await start_app(renderer=renderer, render_slots=1)
    await submit(api, BODY)
    key, _secret = await made(api.app[POOL], "acme")
    theirs = await submit(api, BODY, key)
    assert len(renderer.calls) == 2
    assert (await shown(api, theirs["id"], key))["cached_from"] is None
    again = await submit(api, BODY, key)
    assert (await shown(api, again["id"], key))["cached_from"] == theirs["id"]
    assert len(renderer.calls) == 2


async def test_a_page_url_or_a_thumbnail_is_not_cached(start_app: Callable[..., Any]) -> None:
    api: RunningApp = await start_app(renderer=FakeRenderer())
    for body, says in (
        ({"page_url": "https://example.com/", "cache": True}, "page may change"),
        ({**BODY, "options": {"thumbnail": {"width": 32}}}, "thumbnail"),
    ):
        async with api.http.post(api.url("/v1/jobs"), json=body) as resp:
            problem = await resp.json()
            assert resp.status == 422, problem
        [error] = problem["errors"]
        assert error["field"] == "cache" and says in error["message"], problem


async def test_retention_keeps_a_file_a_kept_job_points_at(
    start_app: Callable[..., Any],
) -> None:
    renderer = FakeRenderer()
    api: RunningApp = await start_app(renderer=renderer, render_slots=1)
    first = await submit(api, BODY)
    second = await submit(api, BODY)
    assert (await shown(api, second["id"]))["cached_from"] == first["id"]
    pool, storage = api.app[POOL], api.app[STORAGE]
    file = f"default/{first['id']}/1.pdf"
    old = "UPDATE jobs SET finished_at = now() - interval '31 days' WHERE id = $1"
    await pool.execute(old, first["id"])

    assert await retention.sweep(pool, storage, older_than_days=30) == 1
    async with api.http.get(api.url(f"/v1/jobs/{first['id']}")) as resp:
        assert resp.status == 404
    kept = await download(api, second["id"])
    assert kept == await storage.get(file)
    # A later job is served from the one kept, naming the job that rendered the file.
    third = await submit(api, BODY)
    assert (await shown(api, third["id"]))["cached_from"] == first["id"]
    assert len(renderer.calls) == 1

    # Once no job points at it, the file goes with the last of them.
    await pool.execute(
        "UPDATE jobs SET finished_at = now() - interval '31 days' WHERE id = ANY($1::uuid[])",
        [second["id"], third["id"]],
    )
    assert await retention.sweep(pool, storage, older_than_days=30) == 2
    try:
        await storage.get(file)
    except FileNotFoundError:
        pass
    else:
        raise AssertionError(f"{file} outlived every job pointing at it")


async def test_an_image_is_cached_and_a_replay_stays_itself(start_app: Callable[..., Any]) -> None:
    renderer = FakeRenderer()
    api: RunningApp = await start_app(renderer=renderer, render_slots=1)
    body = {**BODY, "options": {"output": "webp"}}
    first = await submit(api, body)
    headers = {"Idempotency-Key": "statement-2026-11"}
    async with api.http.post(api.url("/v1/jobs"), json=body, headers=headers) as resp:
        assert resp.status == 202, await resp.text()
        second = await resp.json()
    assert second["status"] == "done" and second["cached_from"] == first["id"]
    async with api.http.post(api.url("/v1/jobs"), json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Idempotent-Replayed"] == "true"
        assert (await resp.json())["id"] == second["id"]
    async with api.http.get(api.url(f"/v1/jobs/{second['id']}/pdf")) as resp:
        assert resp.status == 200 and resp.content_type == "image/webp"
        assert await resp.read() == await download(api, first["id"])
    assert len(renderer.calls) == 1
    assert counted(api, "hit") == 1  # the replay is no new lookup


# --- a tenant's default -----------------------------------------------------------------------

#: A change's commit to every server following it: a notification and one read.
WITHIN_S = 1.0


async def followed(apps: list[RunningApp], tenant: str, on: bool) -> None:
    """Every app's submissions take the tenant's default as `on` within WITHIN_S."""
    deadline = time.monotonic() + WITHIN_S
    while any(app.app[TENANT_DEFAULTS].render_cache(tenant) != on for app in apps):
        assert time.monotonic() < deadline, (
            f"a server still has the default of {tenant} as {not on}"
        )
        await asyncio.sleep(0.02)


async def refused(api: RunningApp, body: dict[str, Any], key: str) -> dict[str, Any]:
    async with api.http.post(api.url("/v1/jobs"), json=body, headers=bearer(key)) as resp:
        problem: dict[str, Any] = await resp.json()
        assert resp.status == 422, problem
        return problem


async def test_a_tenant_default_serves_the_jobs_that_leave_cache_out(
    start_app: Callable[..., Any],
) -> None:
    renderer = FakeRenderer(text_of=lambda html: html)
    api: RunningApp = await start_app(renderer=renderer, render_slots=1)
    pool = api.app[POOL]
    acme, _ = await made(pool, "acme")
    bob, _ = await made(pool, "bob")
    assert await tenants.set_render_cache(pool, "acme", on=True) is True
    await followed([api], "acme", True)
    body = {key: value for key, value in BODY.items() if key != "cache"}

    first = await submit(api, body, acme)
    second = await submit(api, {**body, "cache": None}, acme)
    assert (await shown(api, second["id"], acme))["cached_from"] == first["id"]
    assert len(renderer.calls) == 1
    # cache: false opts out: it renders, and its file serves no later job.
    mine = await submit(api, {**BODY, "cache": False}, acme)
    assert (await shown(api, mine["id"], acme))["cached_from"] is None
    assert len(renderer.calls) == 2

    # What the cache cannot serve renders, each time, with no 422 ...
    page = {"page_url": "https://example.com/statement"}
    thumbnailed = {**body, "data": {"name": "Bea"}, "options": {"thumbnail": {"width": 32}}}
    for uncacheable in (page, page, thumbnailed, thumbnailed):
        job = await submit(api, uncacheable, acme)
        assert (await shown(api, job["id"], acme))["cached_from"] is None
    assert len(renderer.calls) == 6
    # ... but a job that asks for the cache itself is still told why it cannot have it.
    [error] = (await refused(api, {**page, "cache": True}, acme))["errors"]
    assert error["field"] == "cache" and "page may change" in error["message"]

    # Another tenant's identical job is not served, not even when it asks; once its own
    # default is on, its jobs are served from its own.
    theirs = await submit(api, BODY, bob)
    assert (await shown(api, theirs["id"], bob))["cached_from"] is None
    assert len(renderer.calls) == 7
    assert await tenants.set_render_cache(pool, "bob", on=True) is True
    await followed([api], "bob", True)
    again = await submit(api, body, bob)
    assert (await shown(api, again["id"], bob))["cached_from"] == theirs["id"]
    assert len(renderer.calls) == 7

    # Off again: a job without cache renders; one with cache: true is still served.
    assert await tenants.set_render_cache(pool, "acme", on=False) is True
    assert await tenants.set_render_cache(pool, "acme", on=False) is False
    await followed([api], "acme", False)
    off = await submit(api, body, acme)
    assert (await shown(api, off["id"], acme))["cached_from"] is None
    assert len(renderer.calls) == 8
    asked = await submit(api, BODY, acme)
    assert (await shown(api, asked["id"], acme))["cached_from"] == first["id"]
    assert len(renderer.calls) == 8
    assert counted(api, "hit") == 3
    assert counted(api, "miss") == 2


async def tenants_cache(dsn: str, tmp_path: Path, *args: str) -> tuple[int, str, str]:
    return await admin_cli(dsn, tmp_path / "cli", "tenants", "cache", *args)


async def test_the_cli_turns_the_default_on_and_off_and_every_server_follows(
    start_app: Callable[..., Any], dsn: str, tmp_path: Path, pool: asyncpg.Pool
) -> None:
    code, out, err = await tenants_cache(dsn, tmp_path, "nobody", "--on")
    assert (code, out) == (1, ""), err
    assert (
        "tenant 'nobody' has no API key" in err and "pressroom keys create --tenant nobody" in err
    )
    assert '"cache": true' in err  # what the dev-mode tenant's jobs do instead
    code, out, err = await tenants_cache(dsn, tmp_path, "nobody", "--show")
    assert (code, out) == (1, "") and "has no API key" in err
    assert await pool.fetchval("SELECT count(*) FROM tenants WHERE name = 'nobody'") == 0
    code, out, err = await tenants_cache(dsn, tmp_path, "acme")
    assert code == 2 and "--on" in err

    acme, _ = await made(pool, "acme")
    renderer = FakeRenderer()
    one: RunningApp = await start_app(renderer=renderer, render_slots=1)
    other: RunningApp = await start_app(renderer=renderer, render_slots=1)
    code, out, err = await tenants_cache(dsn, tmp_path, "acme", "--show")
    assert (code, out) == (0, "off\n"), err

    code, out, err = await tenants_cache(dsn, tmp_path, "acme", "--on")
    assert (code, out) == (0, ""), err
    assert "tenant 'acme' now serves its jobs from the render cache" in err
    await followed([one, other], "acme", True)
    code, out, err = await tenants_cache(dsn, tmp_path, "acme", "--on")
    assert code == 0 and "already serves" in err
    code, out, err = await tenants_cache(dsn, tmp_path, "acme", "--show")
    assert (code, out) == (0, "on\n"), err
    # Rendered through one server, served by the other, from what it keeps in memory.
    body = {key: value for key, value in BODY.items() if key != "cache"}
    first = await submit(one, body, acme)
    async with other.http.post(other.url("/v1/jobs"), json=body, headers=bearer(acme)) as resp:
        assert resp.status == 202, await resp.text()
        served = await resp.json()
    assert served["status"] == "done" and served["cached_from"] == first["id"]
    assert len(renderer.calls) == 1

    code, out, err = await tenants_cache(dsn, tmp_path, "acme", "--off")
    assert (code, out) == (0, "") and "no longer serves" in err, err
    await followed([one, other], "acme", False)
    rendered = await submit(other, body, acme)
    assert (await shown(other, rendered["id"], acme))["cached_from"] is None
    assert len(renderer.calls) == 2


# --- batch items -----------------------------------------------------------------------------

STATEMENTS = [
    {"template": "<p>Statement {{ who }}</p>", "data": {"who": who}} for who in ("ana", "bo", "cy")
]


def keyed(month: str, items: list[dict[str, Any]], **fields: Any) -> list[dict[str, Any]]:
    """The items under keys of this month (a new batch of the same documents), with fields."""
    return [{"key": f"{month}-{n}", **item, **fields} for n, item in enumerate(items)]


async def batch_to_done(
    api: RunningApp, body: dict[str, Any], key: str | None = None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Post a batch and read the tenant's stream to its batch.done: the answer, and the batch
    as batch.done shows it."""
    headers = bearer(key) if key else {}
    async with api.http.get(api.url("/v1/events"), headers=headers) as stream:
        assert stream.status == 200
        async with api.http.post(api.url("/v1/batches"), json=body, headers=headers) as resp:
            batch: dict[str, Any] = await resp.json()
            assert resp.status == 202, batch
        got = await read_until(
            messages(stream),
            lambda m: m.event == "batch.done" and m.json["batch"]["id"] == batch["id"],
        )
    done: dict[str, Any] = got[-1].json["batch"]
    return batch, done


async def combined_texts(
    api: RunningApp, batch: dict[str, Any], key: str | None = None
) -> list[str]:
    headers = bearer(key) if key else {}
    async with api.http.get(batch["combined"]["url"], headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        return texts(await resp.read())


async def test_a_batch_of_cached_items_is_done_at_once_and_joined(
    start_app: Callable[..., Any],
) -> None:
    renderer = labelled()
    api: RunningApp = await start_app(renderer=renderer, render_slots=2)
    march, done = await batch_to_done(
        api, {"items": keyed("march", STATEMENTS, cache=True), "combine": True}
    )
    assert len(renderer.calls) == 3
    assert await combined_texts(api, done) == ["Statement ana", "Statement bo", "Statement cy"]
    rendered = [item["job_id"] for item in march["items"]]

    # The same documents under new keys: every item done in the answer, from the cache, and
    # the batch joined from the first batch's files.
    april, done = await batch_to_done(
        api, {"items": keyed("april", STATEMENTS, cache=True), "combine": True}
    )
    assert [item["status"] for item in april["items"]] == ["done"] * 3
    assert [item["cached_from"] for item in april["items"]] == rendered
    assert [item["cached_from"] for item in march["items"]] == [None] * 3
    assert len(renderer.calls) == 3
    assert done["status"] == "done" and done["counts"]["done"] == 3 and done["progress"] == 100
    assert done["combined"]["status"] == "done" and done["combined"]["pages"] == 3
    assert await combined_texts(api, done) == ["Statement ana", "Statement bo", "Statement cy"]
    for item in april["items"]:
        job = await shown(api, item["job_id"])
        assert job["status"] == "done" and job["cached_from"] in rendered
        assert await download(api, item["job_id"]) == await download(api, job["cached_from"])

    # Without combine, a batch whose items are all served is done by its insert alone.
    may, done = await batch_to_done(api, {"items": keyed("may", STATEMENTS[::-1], cache=True)})
    assert may["status"] == "done" and done["status"] == "done"
    assert [item["cached_from"] for item in may["items"]] == rendered[::-1]
    assert len(renderer.calls) == 3
    assert counted(api, "miss") == 3
    assert counted(api, "hit") == 6


async def test_batch_items_follow_the_tenant_default_and_their_own_cache(
    start_app: Callable[..., Any],
) -> None:
    renderer = labelled()
    api: RunningApp = await start_app(renderer=renderer, render_slots=2)
    pool = api.app[POOL]
    acme, _ = await made(pool, "acme")
    assert await tenants.set_render_cache(pool, "acme", on=True) is True
    await followed([api], "acme", True)
    first, _ = await batch_to_done(api, {"items": keyed("march", STATEMENTS[:2])}, acme)
    assert len(renderer.calls) == 2

    # One item served, one that opts out and one new rendered; the join takes all three.
    ana, bo = keyed("april", STATEMENTS[:2])
    new = {"key": "april-2", "template": "<p>Statement {{ who }}</p>", "data": {"who": "di"}}
    items = [ana, {**bo, "cache": False}, new]
    mixed, done = await batch_to_done(api, {"items": items, "combine": True}, acme)
    assert mixed["items"][0]["status"] == "done"
    assert [item["cached_from"] for item in mixed["items"]] == [
        first["items"][0]["job_id"],
        None,
        None,
    ]
    assert len(renderer.calls) == 4
    assert done["status"] == "done" and done["counts"]["done"] == 3
    expected = ["Statement ana", "Statement bo", "Statement di"]
    assert await combined_texts(api, done, acme) == expected
    assert counted(api, "hit") == 1
    assert counted(api, "miss") == 3  # march's two and di: bo asked for no lookup
