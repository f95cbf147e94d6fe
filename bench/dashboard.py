"""The dashboard's list on a big tenant: GET /v1/jobs with each filter and search, and GET
/v1/jobs/counts, each asked N times one after another through the real HTTP route, p50 and
p95 printed beside the same statement run straight through asyncpg (the baseline: what the
route adds), with the indexes each plan reads (EXPLAIN ANALYZE).

The tenant holds --jobs jobs (inserted with generate_series), another tenant a fifth as many:
mostly done, 3% failed, 1% cancelled; one in 50 in one of 200 channels; each with an `order`
in its metadata and one in ten with an idempotency key; one in four made from the stored
template `invoice` (12 versions), one in eight from `receipt`; created over 30 days.

    python -m bench.dashboard [--jobs 100000] [--requests 200]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import ClientSession
from asyncpg import Connection, Pool

from bench import common
from bench.common import QUICK, database, percentile, running_app
from server.queue import db, listing
from server.schemas.listing import JobCountsQuery, JobListQuery, encode_cursor
from server.sql import query

TENANT = "default"  # dev mode's tenant: the routes answer for it without a key


async def fill(conn: Connection, count: int) -> None:
    """`count` jobs of the tenant and count // 5 of another, then VACUUM ANALYZE."""
    for tenant, n in ((TENANT, count), ("other", count // 5)):
        await conn.execute(
            """INSERT INTO jobs (id, tenant, template, data, max_attempts, status, attempts,
                                 object_key, bytes, pages, created_at, started_at, finished_at,
                                 channel, metadata, idempotency_key, template_name,
                                 template_version)
               SELECT gen_random_uuid(), $1, '<p>{{ n }}</p>', '{"n": 1}', 3, s.status, 1,
                      CASE WHEN s.status = 'done' THEN 'key' END,
                      CASE WHEN s.status = 'done' THEN 1000 END,
                      CASE WHEN s.status = 'done' THEN 1 END,
                      s.at, s.at, s.at + interval '1 second',
                      CASE WHEN i % 50 = 0 THEN 'user-' || (i / 50) % 200 END,
                      jsonb_build_object('order', 'O-' || i),
                      CASE WHEN i % 10 = 0 THEN 'key-' || i END,
                      CASE WHEN i % 4 = 1 THEN 'invoice' WHEN i % 8 = 2 THEN 'receipt' END,
                      CASE WHEN i % 4 = 1 THEN 1 + (i / 4) % 12 WHEN i % 8 = 2 THEN 1 END
               FROM generate_series(1, $2) AS i,
                    LATERAL (SELECT CASE WHEN i % 100 < 3 THEN 'failed'
                                         WHEN i % 100 = 3 THEN 'cancelled'
                                         ELSE 'done' END AS status,
                                    now() - make_interval(secs => i * 2592000.0 / $2) AS at) s""",
            tenant,
            n,
        )
    await conn.execute("VACUUM ANALYZE jobs")


def index_names(plan: dict[str, Any]) -> list[str]:
    """The indexes a plan reads, and "Seq Scan" where it reads a whole table."""
    found = [plan["Index Name"]] if "Index Name" in plan else []
    if plan.get("Node Type") == "Seq Scan":
        found.append(f"Seq Scan on {plan['Relation Name']}")
    for child in plan.get("Plans", []):
        found += index_names(child)
    return found


async def explain(conn: Connection, sql: str, args: list[Any]) -> list[str]:
    """The indexes the statement's plan reads (EXPLAIN ANALYZE)."""
    raw = await conn.fetchval(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}", *args)
    document = json.loads(raw) if isinstance(raw, str) else raw
    return sorted(set(index_names(document[0]["Plan"])))


async def timed(n: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    await call()  # warm: the statement prepared, the pages cached
    out = []
    for _ in range(n):
        started = time.perf_counter()
        await call()
        out.append((time.perf_counter() - started) * 1000)
    return out


async def run(args: argparse.Namespace) -> None:
    count, requests = args.jobs, args.requests
    async with database() as dsn:
        conn = await db.connect(dsn)
        try:
            started = time.perf_counter()
            await fill(conn, count)
            print(f"{count + count // 5:,} jobs inserted in {time.perf_counter() - started:.1f} s")
            picked = await conn.fetchrow(
                "SELECT id, idempotency_key, metadata->>'order' AS o FROM jobs "
                "WHERE tenant = $1 AND idempotency_key IS NOT NULL ORDER BY id LIMIT 1",
                TENANT,
            )
            day = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
            last = await conn.fetchrow(
                "SELECT created_at, id FROM jobs WHERE tenant = $1 "
                "ORDER BY created_at DESC, id DESC OFFSET 49 LIMIT 1",
                TENANT,
            )
        finally:
            await conn.close()
        cursor = encode_cursor(last["created_at"], last["id"])
        filters: dict[str, dict[str, str]] = {
            "no filter": {},
            "page 2 (cursor)": {"cursor": cursor},
            "status=failed": {"status": "failed"},
            "status=done": {"status": "done"},
            "channel": {"channel": "user-7"},
            "status=failed + channel": {"status": "failed", "channel": "user-7"},
            "one day": {
                "created_from": day.isoformat(),
                "created_to": (day + dt.timedelta(days=1)).isoformat(),
            },
            "q = id prefix": {"q": str(picked["id"])[:8]},
            "q = idempotency key": {"q": picked["idempotency_key"]},
            "q = metadata value": {"q": picked["o"]},
            "q = nothing matches": {"q": "no-such-thing"},
            "template": {"template": "invoice"},
            "template@version": {"template": "invoice@7"},
            "template + status=failed": {"template": "receipt", "status": "failed"},
        }
        counted = {
            "counts": {},
            "counts, template": {"template": "invoice"},
            "counts, template@version": {"template": "invoice@7"},
            "counts, channel": {"channel": "user-7"},
        }
        async with running_app(dsn, render_slots=0) as (base, _app):
            pool = await db.create_pool(dsn, min_size=1, max_size=2)
            print(f"\n{requests} requests each, one after another, p50/p95 in ms")
            head = f"{'':26} {'HTTP p50':>9} {'p95':>7} {'SQL p50':>8} {'ratio':>6}"
            print(f"{head}  plan (EXPLAIN ANALYZE)")
            async with ClientSession(base_url=base) as http:
                for path, cases in (("/v1/jobs", filters), ("/v1/jobs/counts", counted)):
                    for name, params in cases.items():
                        await row(http, pool, path, name, params, requests)
            await pool.close()


async def row(
    http: ClientSession, pool: Pool, path: str, name: str, params: dict[str, str], requests: int
) -> None:
    query_params = {"limit": "50", **params} if path == "/v1/jobs" else params

    async def over_http() -> None:
        async with http.get(path, params=query_params) as resp:
            assert resp.status == 200, await resp.text()
            await resp.read()

    # The filter and the page as the route reads them from the same parameters.
    if path == "/v1/jobs":
        page = JobListQuery.model_validate(params)
        sql = query("list_jobs")
        args = listing.list_args(TENANT, page.matching(page.status), page.cursor, 51)
    else:
        sql = query("count_jobs")
        args = listing.count_args(TENANT, JobCountsQuery.model_validate(params).matching())

    async def straight() -> None:
        await pool.fetch(sql, *args)

    http_ms = await timed(requests, over_http)
    sql_ms = await timed(requests, straight)
    async with pool.acquire() as conn:
        plan = await explain(conn, sql, args)
    p50, p95, base50 = percentile(http_ms, 50), percentile(http_ms, 95), percentile(sql_ms, 50)
    print(f"{name:26} {p50:9.2f} {p95:7.2f} {base50:8.2f} {p50 / base50:6.1f}  {', '.join(plan)}")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.dashboard", description=__doc__)
    p.add_argument("--jobs", type=int, default=10_000 if QUICK else 100_000)
    p.add_argument("--requests", type=int, default=30 if QUICK else 200)
    return p


if __name__ == "__main__":
    common.main(parser, run)
