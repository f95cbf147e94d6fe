"""CORS: which browser origins may use the API, the streams, the downloads and Socket.IO.

An origin is allowed for every tenant by PRESSROOM_CORS_ORIGINS, or for one tenant by
`pressroom tenants origins TENANT --add ORIGIN` (tenant_origins). A preflight carries no
credentials, so it is answered for an origin that any tenant allows; an actual response names
the origin only if the request's tenant allows it (any tenant, for a request without one: a
401, the open paths, the Socket.IO transport). Socket.IO connections are checked in
server/web/sockets.py, with the tenant their credentials prove.

Pressroom's credentials are bearer keys and tokens, never cookies: no response allows
credentials, and none names `*`. Each process keeps every tenant's origins in memory, read
again whenever a change to access is heard, as the API keys are (server/web/auth.py), so a
request pays a set lookup; while no change can be heard, every poll interval.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
from aiohttp import hdrs, web
from multidict import CIMultiDict
from yarl import URL

from server.access import tenants
from server.keys import POOL
from server.problems import Problem
from server.queue import listener as notifications
from server.settings import Settings
from server.tasks import background
from server.web import auth

#: The methods of Pressroom's routes that need a preflight's leave (HEAD needs none).
ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
#: Request headers a page may send; a preflight's answer names the first four always, the
#: others when it asks for them.
ALWAYS_ALLOWED = ("Authorization", "Content-Type", "Idempotency-Key", "Last-Event-ID")
ALLOWED_HEADERS = {
    name.lower(): name for name in (*ALWAYS_ALLOWED, "If-None-Match", "traceparent", "tracestate")
}
#: Response headers a page may read beyond those every response shows (Content-Type, …).
EXPOSE_HEADERS = ", ".join(
    (
        "Location",
        "ETag",
        "Retry-After",
        "Idempotent-Replayed",
        "Content-Disposition",
        "Pressroom-Pages",
        "WWW-Authenticate",
    )
)
# How long a browser may reuse a preflight's answer (Chromium keeps one 2 h at most). A removed
# origin loses access sooner: the actual responses stop naming it at the next read.
PREFLIGHT_MAX_AGE_S = 7200
PREFLIGHT_VARY = "Origin, Access-Control-Request-Method, Access-Control-Request-Headers"


def how_to_allow(origin: str, tenant: str | None = None) -> str:
    """What an operator runs to allow `origin`: the words of every refusal."""
    return (
        f"The origin {origin} is not allowed; allow it for every tenant in "
        f"PRESSROOM_CORS_ORIGINS, or for one with "
        f"`pressroom tenants origins {tenant or 'TENANT'} --add {origin}`."
    )


class Cors:
    """The allowed origins of one process, the preflight middleware and the response headers."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self.deployment = frozenset(settings.cors_origins)
        self._public_url = settings.public_base_url
        # Swapped whole by each read, so a request sees one read or the next, never half.
        self._by_tenant: dict[str, frozenset[str]] = {}
        self._anywhere = self.deployment
        self._rereads = notifications.Rereads("the tenants' CORS origins")

    def access_changed(self, *, listening: bool = True) -> None:
        """A change to access was heard, or the LISTEN connection listens again, or it was
        lost (not `listening`): read the origins again now, and poll until it is back."""
        self._rereads.changed(listening=listening)

    # --- what is allowed --------------------------------------------------------------------

    def allows(self, origin: str, tenant: str | None) -> bool:
        """Whether a response to `tenant` (None: a request without one) may name `origin`."""
        if origin in self.deployment:
            return True
        if tenant is None:
            return origin in self._anywhere
        own = self._by_tenant.get(tenant)
        return own is not None and origin in own

    def refuses_socket(self, request: web.Request, tenant: str) -> str | None:
        """Why a Socket.IO connection opened by `request` for `tenant` is refused, or None: it
        has no Origin (not a browser), this server's own, or one the tenant allows."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or self.allows(origin, tenant) or self._same_origin(request, origin):
            return None
        return how_to_allow(origin, tenant)

    def _same_origin(self, request: web.Request, origin: str) -> bool:
        try:
            given = URL(origin).origin()
            # Behind a proxy the request's own scheme and host are the proxy's: public_url is it.
            if str(given) == self._public_url:
                return True
            return given == URL(f"{request.scheme}://{request.host}").origin()
        except ValueError:
            return False  # not an origin at all (`null`), or a Host header that is none

    # --- reading the tenants' origins -------------------------------------------------------

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx step: the tenants' origins, read before serving and kept fresh after."""
        if not self._settings.run_web:
            yield
            return
        pool = app[POOL]
        await self._read(pool)
        async with background("cors-refresh", self._rereads.run(lambda: self._read(pool))):
            yield

    async def _read(self, pool: asyncpg.Pool) -> None:
        by_tenant = await tenants.all_origins(pool)
        self._by_tenant = by_tenant
        self._anywhere = self.deployment.union(*by_tenant.values())

    # --- HTTP -------------------------------------------------------------------------------

    async def preflight(self, request: web.Request) -> web.StreamResponse:
        """The OPTIONS route of every path: a CORS preflight's answer (it carries no
        credentials, so authentication lets it through). A disallowed origin gets a 403
        without CORS headers, which the browser reports."""
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is None or hdrs.ACCESS_CONTROL_REQUEST_METHOD not in request.headers:
            raise Problem(
                405,
                "Method not allowed",
                "OPTIONS is answered for CORS preflights only (with Origin and "
                "Access-Control-Request-Method).",
                kind="method-not-allowed",
            )
        if origin not in self._anywhere:
            raise Problem(
                403, "Origin not allowed", how_to_allow(origin), kind="origin-not-allowed"
            )
        allowed = list(ALWAYS_ALLOWED)
        for name in request.headers.get(hdrs.ACCESS_CONTROL_REQUEST_HEADERS, "").split(","):
            known = ALLOWED_HEADERS.get(name.strip().lower())
            if known is not None and known not in allowed:
                allowed.append(known)
        return web.Response(
            status=204,
            headers={
                hdrs.ACCESS_CONTROL_ALLOW_ORIGIN: origin,
                hdrs.ACCESS_CONTROL_ALLOW_METHODS: ALLOW_METHODS,
                hdrs.ACCESS_CONTROL_ALLOW_HEADERS: ", ".join(allowed),
                hdrs.ACCESS_CONTROL_MAX_AGE: str(PREFLIGHT_MAX_AGE_S),
                hdrs.VARY: PREFLIGHT_VARY,
            },
        )

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every response, streams and files included: the CORS headers for an allowed origin."""
        if not self._anywhere:
            return  # no origin is allowed anywhere: no answer depends on the Origin
        headers = response.headers
        if hdrs.ACCESS_CONTROL_ALLOW_ORIGIN in headers:
            return  # a preflight's answer, complete
        _vary_origin(headers)
        origin = request.headers.get(hdrs.ORIGIN)
        if origin is not None and self.allows(origin, request.get(auth.TENANT)):
            headers[hdrs.ACCESS_CONTROL_ALLOW_ORIGIN] = origin
            headers[hdrs.ACCESS_CONTROL_EXPOSE_HEADERS] = EXPOSE_HEADERS


def _vary_origin(headers: CIMultiDict[str]) -> None:
    """Caches must keep answers apart by Origin, also those to requests without one."""
    vary = headers.get(hdrs.VARY)
    if vary is None:
        headers[hdrs.VARY] = hdrs.ORIGIN
    elif vary.strip() != "*" and "origin" not in vary.lower():
        headers[hdrs.VARY] = f"{vary}, {hdrs.ORIGIN}"
