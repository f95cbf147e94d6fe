"""Batches on a real database with the fake renderer: one job per key, replays that create
nothing, refused key reuse, and batch progress on the event streams."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import asyncpg

from server.access import apikeys
from server.keys import POOL
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import Message, messages

ITEMS = [
    {"key": f"invoice-{n}", "template": "<p>Invoice {{n}}</p>", "data": {"n": n}} for n in range(3)
]


async def post_batch(
    api: RunningApp, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    async with api.http.post(api.url("/v1/batches"), json=body, headers=headers or {}) as resp:
        return resp.status, await resp.json()


async def job_count(api: RunningApp) -> int:
    count: int = await api.app[POOL].fetchval("SELECT count(*) FROM jobs")
    return count


@contextlib.asynccontextmanager
async def all_events(api: RunningApp) -> AsyncIterator[AsyncIterator[Message]]:
    """The tenant's event stream, subscribed (response headers in) before the body runs."""
    async with api.http.get(api.url("/v1/events")) as resp:
        assert resp.status == 200
        yield messages(resp)


async def read_until(
    stream: AsyncIterator[Message], stop: Callable[[Message], bool], timeout_s: float = 20
) -> list[Message]:
    got: list[Message] = []
    async with asyncio.timeout(timeout_s):
        async for message in stream:
            got.append(message)
            if stop(message):
                return got
    raise AssertionError(f"stream ended before the condition: {[m.event for m in got]}")


async def test_batch_runs_every_item_and_reports_progress_then_done(api: RunningApp) -> None:
    async with all_events(api) as stream:
        status, batch = await post_batch(api, {"items": ITEMS})
        assert status == 202, batch
        got = await read_until(stream, lambda m: m.event == "batch.done")

    assert [item["key"] for item in batch["items"]] == ["invoice-0", "invoice-1", "invoice-2"]
    job_ids = {item["job_id"] for item in batch["items"]}
    assert len(job_ids) == 3
    assert batch["links"]["self"] == f"/v1/batches/{batch['id']}"

    batch_events = [m for m in got if m.event.startswith("batch.")]
    assert batch_events[0].event == "batch.progress"
    assert batch_events[0].json["batch"]["counts"]["queued"] == 3
    done = batch_events[-1].json
    assert set(done) == {"event_id", "type", "at", "batch"}
    assert done["type"] == "batch.done" and int(batch_events[-1].id or 0) == done["event_id"]
    assert done["batch"]["id"] == batch["id"] and done["batch"]["status"] == "done"
    counts = done["batch"]["counts"]
    assert counts == {"queued": 0, "running": 0, "done": 3, "failed": 0, "cancelled": 0}
    assert done["batch"]["progress"] == 100 and done["batch"]["finished_at"] is not None
    finished = [m.json["job"]["id"] for m in got if m.event == "job.done"]
    assert set(finished) == job_ids

    async with api.http.get(api.url(batch["links"]["self"])) as resp:
        current = await resp.json()
    assert current["status"] == "done" and current["total"] == 3
    for item in current["items"]:
        assert item["status"] == "done" and item["url"].startswith("http://127.0.0.1:")
        async with api.http.get(item["url"]) as resp:
            assert (await resp.read()).startswith(b"%PDF-")


async def test_the_same_items_again_create_nothing(api: RunningApp) -> None:
    status, first = await post_batch(api, {"items": ITEMS})
    assert status == 202
    status, again = await post_batch(api, {"items": ITEMS})
    assert status == 200, again
    assert again["id"] == first["id"]
    assert [i["job_id"] for i in again["items"]] == [i["job_id"] for i in first["items"]]
    assert await job_count(api) == 3

    # A later batch naming accepted keys reuses their jobs and creates only the new one.
    extra = {"key": "invoice-3", "template": "<p>Invoice {{n}}</p>", "data": {"n": 3}}
    status, bigger = await post_batch(api, {"items": [*ITEMS, extra]})
    assert status == 202 and bigger["id"] != first["id"]
    assert [i["job_id"] for i in bigger["items"][:3]] == [i["job_id"] for i in first["items"]]
    assert await job_count(api) == 4

    # A batch of accepted keys only: no job is new, yet the batch has its own first event.
    status, subset = await post_batch(api, {"items": ITEMS[:2]})
    assert status == 202 and subset["total"] == 2
    assert await job_count(api) == 4
    logged = await api.app[POOL].fetchval(
        "SELECT count(*) FROM job_events WHERE payload->>'id' = $1", subset["id"]
    )
    assert logged >= 1


async def test_a_key_reused_with_other_content_is_refused(api: RunningApp) -> None:
    status, _ = await post_batch(api, {"items": ITEMS})
    assert status == 202
    revised = {"key": "invoice-1", "template": "<p>Invoice {{n}}</p>", "data": {"n": 99}}
    status, problem = await post_batch(api, {"items": [ITEMS[0], revised]})
    assert status == 422
    [error] = problem["errors"]
    assert error["field"] == "items[1].key"
    assert "'invoice-1'" in error["message"] and "new key" in error["message"]
    assert await job_count(api) == 3

    # The revision under a new versioned key is accepted.
    status, _ = await post_batch(api, {"items": [{**revised, "key": "invoice-1-v2"}]})
    assert status == 202
    assert await job_count(api) == 4


async def test_every_invalid_item_is_reported_with_its_index(api: RunningApp) -> None:
    body = {
        "items": [
            {"key": "a", "template": "<p>ok</p>"},
            {"key": "b", "data": {}},
            {"key": "a", "template": "<p>{{ broken </p>"},
            {"template": "<p>ok</p>", "options": {"format": "B9"}},
            "not an item",
        ],
        "webhook_url": "ftp://example.com/hook",
        "colour": "red",
    }
    status, problem = await post_batch(api, body)
    assert status == 422
    fields = [error["field"] for error in problem["errors"]]
    assert fields == [
        "colour",
        "webhook_url",
        "items[1].template",
        "items[2].key",
        "items[2].template",
        "items[3].key",
        "items[3].options.format",
        "items[4]",
    ]
    assert await job_count(api) == 0
    status, problem = await post_batch(api, {"items": []})
    assert status == 422 and problem["errors"][0]["field"] == "items"
    status, problem = await post_batch(
        api, {"items": [{"key": "a", "template": "<p>ok</p>"}], "webhook_url": "http:///hook"}
    )
    assert status == 422, problem
    assert problem["errors"] == [
        {
            "field": "webhook_url",
            "message": "webhook URL has no host (write it as https://host/path)",
        }
    ]
    assert await job_count(api) == 0


async def test_a_batch_is_one_transaction_with_one_notify(
    start_app: Callable[..., Any], dsn: str
) -> None:
    # No render slots: nothing but the submission itself notifies.
    app: RunningApp = await start_app(render_slots=0)
    listener = await asyncpg.connect(dsn)
    heard: asyncio.Queue[str] = asyncio.Queue()
    await listener.add_listener("pressroom", lambda *args: heard.put_nowait(args[-1]))
    try:
        items = [{"key": f"k{n}", "template": "<p>{{n}}</p>", "data": {"n": n}} for n in range(50)]
        status, batch = await post_batch(app, {"items": items})
        assert status == 202 and batch["counts"]["queued"] == 50
        # Notifications arrive in commit order: once the marker is heard, all before it were.
        await app.app[POOL].execute("SELECT pg_notify('pressroom', 'marker')")
        payloads = []
        async with asyncio.timeout(10):
            while (payload := await heard.get()) != "marker":
                payloads.append(payload)
    finally:
        await listener.close()
    assert len(payloads) == 1 and payloads[0].startswith("q:")
    xids = await app.app[POOL].fetchval("SELECT count(DISTINCT xid) FROM job_events")
    assert xids == 1
    types = await app.app[POOL].fetch("SELECT type FROM job_events ORDER BY xid, id")
    assert [row["type"] for row in types] == ["job.queued"] * 50 + ["batch.progress"]


async def test_jobs_finishing_at_once_still_end_the_batch_with_batch_done(
    start_app: Callable[..., Any],
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()  # hold every render, then let four finish together
    app: RunningApp = await start_app(renderer=renderer, render_slots=4)
    items = [{"key": f"k{n}", "template": "<p>{{n}}</p>", "data": {"n": n}} for n in range(12)]
    async with all_events(app) as stream:
        status, _ = await post_batch(app, {"items": items})
        assert status == 202
        renderer.gate.set()
        await read_until(stream, lambda m: m.event == "batch.done")
    rows = await app.app[POOL].fetch(
        "SELECT type, payload FROM job_events WHERE type LIKE 'batch.%' ORDER BY xid, id"
    )
    finals = [row["payload"]["counts"]["done"] + row["payload"]["counts"]["failed"] for row in rows]
    # Counted in turn under the batch's lock: never backwards, and the last one sees all.
    assert finals == sorted(finals)
    assert rows[-1]["type"] == "batch.done" and finals[-1] == 12
    assert [row["type"] for row in rows].count("batch.done") == 1


async def test_failed_items_show_their_errors(api: RunningApp) -> None:
    items = [
        {"key": "good", "template": "<p>fine</p>"},
        {"key": "bad", "template": "<p>{{ 1 // 0 }}</p>"},
    ]
    async with all_events(api) as stream:
        status, batch = await post_batch(api, {"items": items})
        assert status == 202
        got = await read_until(stream, lambda m: m.event == "batch.done")
    assert got[-1].json["batch"]["counts"]["failed"] == 1
    async with api.http.get(api.url(batch["links"]["self"])) as resp:
        current = await resp.json()
    good, bad = current["items"]
    assert good["status"] == "done" and "url" in good
    assert bad["status"] == "failed" and "ZeroDivisionError" in bad["error"]
    assert "url" not in bad


async def test_items_can_name_stored_templates(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    async with api.http.post(
        api.url("/v1/templates"),
        json={
            "name": "letter",
            "html": "<p>Dear {{who}}</p>",
            "options": {"landscape": True},
            "publish": True,
        },
    ) as resp:
        assert resp.status == 201
    items = [
        {"key": "to-ana", "template_id": "letter", "data": {"who": "Ana"}},
        {"key": "to-bo", "template_id": "letter@1", "data": {"who": "Bo"}},
        {"key": "to-cy", "template_id": "nothing-here", "data": {}},
    ]
    status, problem = await post_batch(api, {"items": items})
    assert status == 422
    assert problem["errors"] == [
        {"field": "items[2].template_id", "message": "no template 'nothing-here'"}
    ]
    async with all_events(api) as stream:
        status, _ = await post_batch(api, {"items": items[:2]})
        assert status == 202
        got = await read_until(stream, lambda m: m.event == "batch.done")
    assert sorted(fake_renderer.rendered) == ["<p>Dear Ana</p>", "<p>Dear Bo</p>"]
    assert all(m.json["job"]["options"]["landscape"] for m in got if m.event == "job.done")


async def test_keys_and_batches_belong_to_their_tenant(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    _, acme = await apikeys.create_key(pool, "acme")
    _, other = await apikeys.create_key(pool, "other")
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    status, batch = await post_batch(app, {"items": ITEMS}, {"Authorization": f"Bearer {acme}"})
    assert status == 202
    async with app.http.get(
        app.url(batch["links"]["self"]), headers={"Authorization": f"Bearer {other}"}
    ) as resp:
        assert resp.status == 404
    # The same keys are another tenant's own: its jobs are new, not acme's.
    status, theirs = await post_batch(app, {"items": ITEMS}, {"Authorization": f"Bearer {other}"})
    assert status == 202 and theirs["id"] != batch["id"]
    assert {i["job_id"] for i in theirs["items"]}.isdisjoint(i["job_id"] for i in batch["items"])
    assert await job_count(app) == 6
