"""Idempotency-Key on POST /v1/jobs: retries are safe, reuse with another body is refused,
a key in use answers 409, keys are per tenant and forgotten after their retention."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from server.access import apikeys
from server.queue import admission, db
from server.sql import query
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


async def post(
    app: RunningApp, key: str, idempotency_key: str | None, body: Any = None, *, raw: str = ""
) -> tuple[int, Any, dict[str, str]]:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    if idempotency_key is not None:
        headers["Idempotency-Key"] = idempotency_key
    data = raw or json.dumps(body if body is not None else SEED)
    async with app.http.post(app.url("/v1/jobs"), data=data, headers=headers) as resp:
        return resp.status, await resp.json(), dict(resp.headers)


async def job_count(pool: asyncpg.Pool) -> int:
    count: int = await pool.fetchval("SELECT count(*) FROM jobs")
    return count


async def test_retry_with_same_key_and_body_returns_the_original_job(
    api: RunningApp, pool: asyncpg.Pool, fake_renderer: FakeRenderer
) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    status, first, headers = await post(api, key, "order-1001")
    assert status == 202 and "Idempotent-Replayed" not in headers
    await collect(
        api.http,
        api.url(f"/v1/jobs/{first['id']}/events"),
        until="job.done",
        headers={"Authorization": f"Bearer {key}"},
    )
    # The same JSON written differently is the same request.
    same = '{ "data": {"name": "Ana"},\n  "template": "<h1>Hi {{name}}</h1>" }'
    status, again, headers = await post(api, key, '"order-1001"', raw=same)
    assert status == 200
    assert headers["Idempotent-Replayed"] == "true"
    assert headers["Location"] == f"/v1/jobs/{first['id']}"
    assert again["id"] == first["id"] and again["status"] == "done"
    assert await job_count(pool) == 1
    assert len(fake_renderer.rendered) == 1, "no second render"


async def test_same_key_with_another_body_is_422(api: RunningApp, pool: asyncpg.Pool) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    assert (await post(api, key, "k1"))[0] == 202
    status, problem, _headers = await post(api, key, "k1", {**SEED, "data": {"name": "Bo"}})
    assert status == 422
    assert problem["type"].endswith("/idempotency-key-reused")
    assert "different request body" in problem["detail"]
    assert await job_count(pool) == 1


async def test_keys_are_scoped_per_tenant(api: RunningApp, pool: asyncpg.Pool) -> None:
    _row, alice = await apikeys.create_key(pool, "alice")
    _row, bob = await apikeys.create_key(pool, "bob")
    status_a, job_a, _ = await post(api, alice, "shared-key")
    status_b, job_b, _ = await post(api, bob, "shared-key", {**SEED, "data": {"name": "Bo"}})
    assert (status_a, status_b) == (202, 202)
    assert job_a["id"] != job_b["id"]
    assert await job_count(pool) == 2


async def test_twenty_concurrent_duplicates_create_one_job(
    start_app: Callable[..., Any], pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = FakeRenderer()
    gate.gate = asyncio.Event()  # keep the job queued/running: replays see it in flight
    monkeypatch.setattr(db, "POOL_MAX_SIZE", 24)  # all twenty at once, none waiting for the pool
    app: RunningApp = await start_app(renderer=gate, render_slots=1)
    _row, key = await apikeys.create_key(pool, "acme")
    results = await asyncio.gather(*(post(app, key, "burst-1") for _ in range(20)))
    gate.gate.set()
    statuses = sorted(status for status, _body, _headers in results)
    assert statuses.count(202) == 1, statuses
    assert set(statuses) <= {200, 202, 409}, statuses
    ids = {body["id"] for status, body, _h in results if status in (200, 202)}
    assert len(ids) == 1
    for status, body, headers in results:
        if status == 409:
            assert body["type"].endswith("/idempotency-key-in-use")
            assert headers["Retry-After"] == "1"
    assert await job_count(pool) == 1


async def test_key_held_by_a_request_in_flight_is_409(api: RunningApp, pool: asyncpg.Pool) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    # Another request holding the key is a transaction holding its lock: be that request.
    async with pool.acquire() as conn, conn.transaction():
        assert await conn.fetchval(query("idempotency_try_lock"), "acme", "slow-1")
        status, problem, headers = await post(api, key, "slow-1")
        assert status == 409 and headers["Retry-After"] == "1"
        assert "still being processed" in problem["detail"]
    assert (await post(api, key, "slow-1"))[0] == 202
    assert await job_count(pool) == 1


async def test_keys_expire_after_retention_and_are_pruned(
    start_app: Callable[..., Any], pool: asyncpg.Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(admission, "IDEMPOTENCY_TTL_S", 3600)
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    _row, key = await apikeys.create_key(pool, "acme")
    _status, old, _ = await post(app, key, "monthly-report")
    await pool.execute("UPDATE jobs SET created_at = now() - interval '2 hours'")
    # Past retention the key is free again, even with another body.
    status, new, _ = await post(app, key, "monthly-report", {**SEED, "data": {"name": "Cy"}})
    assert status == 202 and new["id"] != old["id"]
    keys = await pool.fetch("SELECT id::text, idempotency_key FROM jobs ORDER BY created_at")
    assert [(r["id"], r["idempotency_key"]) for r in keys] == [
        (old["id"], None),
        (new["id"], "monthly-report"),
    ]

    _status, other, _ = await post(app, key, "weekly-report")
    await pool.execute(
        "UPDATE jobs SET created_at = now() - interval '2 hours' WHERE id = $1::uuid", other["id"]
    )
    assert await pool.execute(query("idempotency_prune"), 3600) == "UPDATE 1"
    assert (
        await pool.fetchval("SELECT idempotency_key FROM jobs WHERE id = $1::uuid", other["id"])
        is None
    )


async def test_malformed_idempotency_keys_are_400(api: RunningApp, pool: asyncpg.Pool) -> None:
    _row, key = await apikeys.create_key(pool, "acme")
    for bad in ("", "x" * 256, "caf\u00e9"):
        headers = {"Authorization": f"Bearer {key}", "Idempotency-Key": bad}
        async with api.http.post(api.url("/v1/jobs"), json=SEED, headers=headers) as resp:
            assert resp.status == 400, bad
            assert (await resp.json())["type"].endswith("/bad-idempotency-key")
    assert await job_count(pool) == 0
