"""Limits with their own clear answers: per-key rate limit and per-tenant jobs in flight (429
with Retry-After), page count and template render time (the job fails, once)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import asyncpg

from server.access import apikeys
from server.queue.admission import RateLimiter
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_token_bucket_refills_at_the_rate() -> None:
    limiter = RateLimiter(rate_per_s=2.0)
    assert limiter.burst == 4  # two seconds' worth at once
    assert [limiter.take("k", now=100.0) for _ in range(4)] == [0.0] * 4
    assert limiter.take("k", now=100.0) == 0.5  # one token every 0.5 s
    assert limiter.take("other", now=100.0) == 0.0  # buckets are per key
    assert limiter.take("k", now=100.5) == 0.0
    assert limiter.take("k", now=100.5) > 0
    assert RateLimiter(rate_per_s=0.1).burst == 1, "a slow rate still lets one request through"


async def test_rate_limit_per_key_answers_429_with_retry_after(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1, rate_limit_rps=1.5)
    _row, hasty = await apikeys.create_key(pool, "acme", "hasty")
    _row, calm = await apikeys.create_key(pool, "acme", "calm")
    statuses = []
    for _ in range(4):
        async with app.http.get(app.url("/v1/jobs"), headers=bearer(hasty)) as resp:
            statuses.append(resp.status)
            if resp.status == 429:
                problem = await resp.json()
                retry_after = int(resp.headers["Retry-After"])
    assert statuses == [200, 200, 200, 429]
    assert resp.content_type == "application/problem+json"
    assert (
        problem["type"].endswith("/rate-limited")
        and "1.5 requests per second (bursts of 3)" in problem["detail"]
    )
    assert retry_after == 1
    async with app.http.get(app.url("/v1/jobs"), headers=bearer(calm)) as resp:
        assert resp.status == 200, "another key has its own bucket"
    async with app.http.get(app.url("/healthz")) as resp:
        assert resp.status == 200


async def test_jobs_in_flight_per_tenant_are_capped(
    start_app: Callable[..., Any], pool: asyncpg.Pool
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1, tenant_max_inflight=2)
    _row, alice = await apikeys.create_key(pool, "alice")
    _row, bob = await apikeys.create_key(pool, "bob")
    ids = []
    for _ in range(2):
        async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(alice)) as resp:
            assert resp.status == 202
            ids.append((await resp.json())["id"])
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(alice)) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"].isdigit()
        problem = await resp.json()
        assert problem["type"].endswith("/too-many-jobs")
        assert "2 jobs queued or running; the limit is 2" in problem["detail"]
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(bob)) as resp:
        assert resp.status == 202, "the cap is per tenant"
    assert await pool.fetchval("SELECT count(*) FROM jobs WHERE tenant = 'alice'") == 2

    renderer.gate.set()
    for job_id in ids:
        await collect(
            app.http, app.url(f"/v1/jobs/{job_id}/events"), until="job.done", headers=bearer(alice)
        )
    async with app.http.post(app.url("/v1/jobs"), json=SEED, headers=bearer(alice)) as resp:
        assert resp.status == 202, "finished jobs no longer count"


async def test_too_many_pages_fails_the_job_once(start_app: Callable[..., Any]) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(pages=7), render_slots=1, max_pages=5)
    async with app.http.post(app.url("/v1/jobs"), json=SEED) as resp:
        job = await resp.json()
    got = await collect(app.http, app.url(f"/v1/jobs/{job['id']}/events"), until="job.failed")
    failed = got[-1].json["job"]
    assert [m.event for m in got] == ["job.queued", "job.running", "job.failed"]
    assert failed["error"] == "the PDF has more than 5 pages, the limit (PRESSROOM_MAX_PAGES)"
    assert failed["attempts"] == 1 and failed["status"] == "failed"


async def test_template_render_time_is_limited(start_app: Callable[..., Any]) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1, render_timeout_s=1.0)
    endless = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    async with app.http.post(app.url("/v1/jobs"), json={"template": endless}) as resp:
        job = await resp.json()
    got = await collect(app.http, app.url(f"/v1/jobs/{job['id']}/events"), until="job.failed")
    failed = got[-1].json["job"]
    assert "template rendering took longer than 1 s" in failed["error"]
    assert failed["attempts"] == 1
    async with app.http.get(app.url("/healthz")) as resp:
        assert resp.status == 200
