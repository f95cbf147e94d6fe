"""Liveness and readiness."""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from server.keys import CHROMIUM, LISTENER, METRICS, POOL, RENDERER, SETTINGS, STORAGE
from server.queue import metrics

READY_TIMEOUT_S = 2.0

routes = web.RouteTableDef()


@routes.get("/healthz")
async def healthz(request: web.Request) -> web.Response:
    """The process answers: nothing more is checked."""
    return web.json_response({"status": "ok"})


async def _probe(check: Any) -> str:
    try:
        async with asyncio.timeout(READY_TIMEOUT_S):
            await check()
    except Exception as exc:
        return f"error: {exc or type(exc).__name__}"
    return "ok"


@routes.get("/readyz")
async def readyz(request: web.Request) -> web.Response:
    """Ready when the database, the LISTEN connection, storage and the browser all answer, and
    the signing key (when one is configured) opens and has not expired."""
    app = request.app

    async def database() -> None:
        await app[POOL].fetchval("SELECT 1")

    async def listener() -> None:
        if not app[LISTENER].connected.is_set():
            raise ConnectionError("LISTEN connection is down")

    checks = {"database": database, "listener": listener, "storage": app[STORAGE].check}
    if RENDERER in app:
        checks["browser"] = app[RENDERER].check
    if (key := app[SETTINGS].signing) is not None:

        async def signing_key() -> None:
            await asyncio.to_thread(key.check)

        checks["signing_key"] = signing_key
    results = dict(
        zip(checks, await asyncio.gather(*(_probe(c) for c in checks.values())), strict=True)
    )
    ready = all(value == "ok" for value in results.values())
    body: dict[str, Any] = {"ready": ready, "checks": results}
    if CHROMIUM in app:
        body["browser"] = app[CHROMIUM].about()
    return web.json_response(body, status=200 if ready else 503)


@routes.get("/metrics")
async def prometheus(request: web.Request) -> web.Response:
    """Prometheus text format; database-derived values are read at scrape time."""
    registry = request.app[METRICS]
    await metrics.refresh(request.app, registry)
    return web.Response(body=registry.render(), headers={"Content-Type": metrics.CONTENT_TYPE})
