"""The dashboard's health at a glance: GET /v1/stats (a tenant's last hour minute by minute, and
its queue now, read from the jobs table) and its page, /health."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import asyncpg
from aiohttp import web

from server.keys import POOL
from server.schemas.stats import MINUTES, Stats
from server.sql import query
from server.web.common import json_response, tenant_of

routes = web.RouteTableDef()

HEALTH_PAGE = Path(__file__).resolve().parents[2] / "static" / "health.html"
_MINUTE = dt.timedelta(minutes=1)


@routes.get("/health")
async def page(request: web.Request) -> web.FileResponse:
    """The health page: it reads GET /v1/stats with the dashboard's credential."""
    return web.FileResponse(HEALTH_PAGE, headers={"Cache-Control": "no-cache"})


@routes.get("/v1/stats")
async def stats(request: web.Request) -> web.Response:
    tenant = tenant_of(request)
    async with request.app[POOL].acquire() as connection:
        # One snapshot for both reads: the hour and the queue are of the same moment.
        async with connection.transaction(isolation="repeatable_read", readonly=True):
            queue = await connection.fetchrow(query("job_stats_queue"), tenant)
            since = first_minute(queue["at"])
            rows = await connection.fetch(query("job_stats_hour"), tenant, since)
    body = stats_of(queue, rows)
    return json_response(Stats.model_validate(body).model_dump(mode="json"))


def _latency(row: asyncpg.Record | None) -> dict[str, Any]:
    if row is None:
        return {"done": 0, "failed": 0, "p50_s": None, "p95_s": None}
    return {key: row[key] for key in ("done", "failed", "p50_s", "p95_s")}


def first_minute(at: dt.datetime) -> dt.datetime:
    """The start of the first of the MINUTES minutes that end with the one `at` is in."""
    return at.replace(second=0, microsecond=0) - (MINUTES - 1) * _MINUTE


def stats_of(queue: asyncpg.Record, rows: list[asyncpg.Record]) -> dict[str, Any]:
    """The body of GET /v1/stats from its two reads, with a zero for each minute without jobs."""
    at: dt.datetime = queue["at"]
    by_minute = {row["minute"]: row for row in rows if row["minute"] is not None}
    whole = next((row for row in rows if row["minute"] is None), None)
    first = first_minute(at)
    minutes = []
    for n in range(MINUTES):
        start = first + n * _MINUTE
        minutes.append({"at": start, **_latency(by_minute.get(start))})
    oldest = queue["oldest_due_at"]
    return {
        "at": at,
        "minutes": minutes,
        "hour": _latency(whole),
        "queue": {
            "depth": queue["depth"],
            "due": queue["due"],
            "oldest_due_at": oldest,
            "oldest_age_s": None if oldest is None else max(0.0, (at - oldest).total_seconds()),
        },
    }
