"""The tenants' defaults for their jobs: whether the render cache serves every job of a tenant
that does not say `cache: false` (`pressroom tenants cache TENANT --on`, tenants.render_cache).

A submission reads it from memory, not from the database (docs/decisions/003): each process
keeps which tenants have it, read before serving and again whenever a change to access is
heard, as the tenants' origins are (server/web/cors.py); while no change can be heard, every
poll interval. The dev-mode tenant has no tenants row, so no default.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
from aiohttp import web

from server.access import tenants
from server.keys import POOL
from server.queue import listener as notifications
from server.settings import Settings
from server.tasks import background


class TenantDefaults:
    """The tenants' defaults as this process last read them."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._render_cache: frozenset[str] = frozenset()
        self._rereads = notifications.Rereads("the tenants' render cache defaults")

    def render_cache(self, tenant: str) -> bool:
        """Whether the render cache serves the tenant's jobs that leave `cache` out."""
        return tenant in self._render_cache

    def access_changed(self, *, listening: bool = True) -> None:
        """A change to access was heard, or the LISTEN connection listens again, or it was
        lost (not `listening`): read the defaults again now, and poll until it is back."""
        self._rereads.changed(listening=listening)

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx step: the defaults, read before serving and kept fresh after."""
        if not self._settings.run_web:
            yield
            return
        pool = app[POOL]
        await self._read(pool)
        async with background("defaults-refresh", self._rereads.run(lambda: self._read(pool))):
            yield

    async def _read(self, pool: asyncpg.Pool) -> None:
        self._render_cache = await tenants.render_cache_tenants(pool)
