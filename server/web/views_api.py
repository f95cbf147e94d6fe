"""The dashboard's batches, templates and assets views: pages of their own beside the job list,
each reading the API with the dashboard's key (which only the browser holds)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

STATIC = Path(__file__).resolve().parents[2] / "static"
#: The page each path serves; an unknown id or name is told on the page, which reads the API.
PAGES = {
    "/batches": "batches.html",
    "/batches/{batch_id}": "batches.html",
    "/templates": "templates.html",
    "/templates/{name}": "templates.html",
    "/assets": "assets.html",
}


def _serve(filename: str) -> Callable[[web.Request], Awaitable[web.FileResponse]]:
    async def page(request: web.Request) -> web.FileResponse:
        return web.FileResponse(STATIC / filename, headers={"Cache-Control": "no-cache"})

    return page


routes = [web.get(path, _serve(filename)) for path, filename in PAGES.items()]
