"""The render cache: a job that asks for it (cache: true) and whose source, data, options and
assets match a done job of its tenant that asked for it too is done at once with that job's
file; retention keeps a file while a job it does not delete points at it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from server.keys import METRICS, POOL, STORAGE
from server.queue import retention
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect
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
