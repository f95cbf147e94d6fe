"""GET /v1/stats: the tenant's last hour minute by minute (jobs done, failed, submit→done p50
and p95, from the jobs' created and finished times) and its queue now (depth, the due ones,
the oldest due job), for the dashboard's health page."""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from server.sql import query
from server.web import stats_api
from tests.conftest import RunningApp


async def finished(
    pool: asyncpg.Pool, status: str, *, minutes_ago: float, took_s: float, tenant: str = "default"
) -> None:
    """A job that finished `minutes_ago`, `took_s` after it was submitted."""
    await pool.execute(
        """INSERT INTO jobs (id, tenant, template, max_attempts, status, attempts, object_key,
                             bytes, created_at, started_at, finished_at)
           SELECT gen_random_uuid(), $1, '<p>x</p>', 3, $2, 1,
                  CASE WHEN $2 = 'done' THEN 'key' END, CASE WHEN $2 = 'done' THEN 1 END,
                  f - make_interval(secs => $4),
                  f - make_interval(secs => $4 / 2), f
           FROM (SELECT now() - make_interval(secs => $3 * 60) AS f) AS t""",
        tenant,
        status,
        minutes_ago,
        took_s,
    )


async def queued(pool: asyncpg.Pool, *, age_s: float, run_in_s: float = 0) -> None:
    await pool.execute(
        """INSERT INTO jobs (id, tenant, template, max_attempts, created_at, run_after)
           VALUES (gen_random_uuid(), 'default', '<p>x</p>', 3,
                   now() - make_interval(secs => $1), now() + make_interval(secs => $2))""",
        age_s,
        run_in_s,
    )


async def stats(app: RunningApp) -> dict[str, Any]:
    async with app.http.get(app.url("/v1/stats")) as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


@pytest.fixture
async def app(start_app: Callable[..., Any]) -> RunningApp:
    running: RunningApp = await start_app(render_slots=0)  # dev mode; no worker
    return running


async def test_an_empty_tenant_has_sixty_empty_minutes(app: RunningApp) -> None:
    body = await stats(app)
    assert len(body["minutes"]) == 60
    assert all(m["done"] == m["failed"] == 0 and m["p50_s"] is None for m in body["minutes"])
    starts = [dt.datetime.fromisoformat(m["at"]) for m in body["minutes"]]
    assert all(b - a == dt.timedelta(minutes=1) for a, b in itertools.pairwise(starts))
    now = dt.datetime.fromisoformat(body["at"])
    assert starts[-1] <= now < starts[-1] + dt.timedelta(minutes=1)  # the last is this minute
    assert body["hour"] == {"done": 0, "failed": 0, "p50_s": None, "p95_s": None}
    assert body["queue"] == {"depth": 0, "due": 0, "oldest_due_at": None, "oldest_age_s": None}


async def test_minutes_percentiles_and_the_queue(app: RunningApp, pool: asyncpg.Pool) -> None:
    # Ten minutes ago: 20 jobs done taking 1..20 s, and 2 failed; 30 min ago, one done in 100 s.
    for took in range(1, 21):
        await finished(pool, "done", minutes_ago=10.5, took_s=took)
    for _ in range(2):
        await finished(pool, "failed", minutes_ago=10.5, took_s=3)
    await finished(pool, "done", minutes_ago=30.5, took_s=100)
    await finished(pool, "cancelled", minutes_ago=5.5, took_s=1)  # neither done nor failed
    await finished(pool, "done", minutes_ago=61, took_s=1)  # before the hour
    await finished(pool, "done", minutes_ago=5.5, took_s=1, tenant="other")  # not this tenant's
    await queued(pool, age_s=300)
    await queued(pool, age_s=90)
    await queued(pool, age_s=900, run_in_s=3600)  # scheduled: counted, not due

    body = await stats(app)
    by_minute = {n: m for n, m in enumerate(reversed(body["minutes"]))}  # 0: this minute
    # A job 10.5 minutes ago falls in the minute 10 or 11 back, as the clock's seconds go.
    [ten] = [m for n, m in by_minute.items() if n in (10, 11) and m["done"]]
    assert (ten["done"], ten["failed"]) == (20, 2)
    assert ten["p50_s"] == pytest.approx(10.5, abs=0.01)  # percentile_cont over 1..20
    assert ten["p95_s"] == pytest.approx(19.05, abs=0.01)
    [thirty] = [m for n, m in by_minute.items() if n in (30, 31) and m["done"]]
    assert (thirty["done"], thirty["p50_s"]) == (1, pytest.approx(100, abs=0.01))
    assert sum(m["done"] for m in body["minutes"]) == 21
    assert sum(m["failed"] for m in body["minutes"]) == 2
    hour = body["hour"]
    assert (hour["done"], hour["failed"]) == (21, 2)
    assert hour["p50_s"] == pytest.approx(11, abs=0.01)  # 1..20 and 100
    queue = body["queue"]
    assert (queue["depth"], queue["due"]) == (3, 2)
    assert 299 <= queue["oldest_age_s"] < 330


async def test_the_hour_is_read_through_an_index_not_the_whole_table(pool: asyncpg.Pool) -> None:
    """20,000 jobs over a day, a few hundred of them in the last hour: the hour's read finds
    them by an index (jobs_finished), as its start is a parameter the planner can weigh."""
    await pool.execute(
        """INSERT INTO jobs (id, tenant, template, max_attempts, status, attempts, object_key,
                             bytes, created_at, finished_at)
           SELECT gen_random_uuid(), 't' || (n % 4), '<p>x</p>', 3, 'done', 1, 'key', 1,
                  f - interval '2 s', f
           FROM generate_series(1, 20000) AS n,
                LATERAL (SELECT now() - make_interval(secs => n * 4.32) AS f) AS t"""
    )
    await pool.execute("ANALYZE jobs")
    async with pool.acquire() as connection:
        at = await connection.fetchval("SELECT now()")
        since = stats_api.first_minute(at)
        [plan] = await connection.fetchval(
            "EXPLAIN (FORMAT JSON) " + query("job_stats_hour"), "t1", since
        )

    def nodes(node: dict[str, Any]) -> list[dict[str, Any]]:
        return [node, *(n for child in node.get("Plans", []) for n in nodes(child))]

    scans = [n for n in nodes(plan["Plan"]) if n.get("Relation Name") == "jobs"]
    assert scans and all(n["Node Type"] != "Seq Scan" for n in scans), scans
