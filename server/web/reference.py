"""The API reference at /docs: Swagger UI over /v1/openapi.json. Every file the page loads comes
from this server (Swagger UI's release files ship in the swagger-ui-py package), none from a CDN,
and its Content-Security-Policy lets the page load nothing else."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from aiohttp import web

routes = web.RouteTableDef()

STATIC_DIR = Path(__file__).resolve().parents[2] / "static"
PAGE = STATIC_DIR / "docs.html"
#: Where the page finds Swagger UI's files.
ASSETS_PATH = "/docs/swagger-ui"
#: The files of Swagger UI the page loads, by name, with their types.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
}
# Its own scripts, styles and requests only: Swagger UI draws its icons from data: URLs, and
# shows an image that an operation answers ("Try it out") from a blob: URL.
CSP = "; ".join(
    (
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",
        "font-src 'self'",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)
PAGE_HEADERS = {
    "Content-Type": "text/html; charset=utf-8",
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidated on every load (ETag), as /pressroom.js: the page matches the server's files.
    "Cache-Control": "no-cache",
}


def swagger_ui_dir() -> Path:
    """The release files of the installed swagger-ui-py. Found, not imported: the package's
    code (a handler per web framework, PyYAML) is not needed to serve them."""
    spec = importlib.util.find_spec("swagger_ui")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("swagger-ui-py is not installed (make install)")
    return Path(next(iter(spec.submodule_search_locations))) / "static"


@routes.get("/docs")
async def page(request: web.Request) -> web.FileResponse:
    """The reference page."""
    return web.FileResponse(PAGE, headers=PAGE_HEADERS)


@routes.get(ASSETS_PATH + "/{name}")
async def asset(request: web.Request) -> web.FileResponse:
    """One of Swagger UI's files the page loads; nothing else of the package."""
    name = request.match_info["name"]
    if name not in ASSETS:
        raise web.HTTPNotFound()
    return web.FileResponse(
        swagger_ui_dir() / name,
        headers={
            "Content-Type": ASSETS[name],
            "X-Content-Type-Options": "nosniff",
            "Cache-Control": "no-cache",
        },
    )
