"""The answers the authenticator caches are read again in the background before they expire:
a request does not wait for the database, and a revoked key still stops within the cache's
lifetime."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import asyncpg

from server import apikeys, auth
from server.settings import Settings

CACHE_S = 0.4


class RecordingPool:
    """The real pool, noting which task asked for every read."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self._pool = pool
        self.readers: list[str] = []

    def _note(self) -> None:
        task = asyncio.current_task()
        self.readers.append(task.get_name() if task is not None else "-")

    async def fetchval(self, *args: Any) -> Any:
        self._note()
        return await self._pool.fetchval(*args)

    async def fetchrow(self, *args: Any) -> Any:
        self._note()
        return await self._pool.fetchrow(*args)

    async def fetch(self, *args: Any) -> Any:
        self._note()
        return await self._pool.fetch(*args)


async def test_cached_answers_are_renewed_before_requests_need_them(
    pool: asyncpg.Pool, make_settings: Callable[..., Settings]
) -> None:
    row, key = await apikeys.create_key(pool, "acme")
    await apikeys.create_key(pool, "other")  # keyed mode stays when the first key is revoked
    recording = RecordingPool(pool)
    authenticator = auth.Authenticator(make_settings(auth_cache_s=CACHE_S))
    await authenticator.start(cast(asyncpg.Pool, recording))
    refresher = asyncio.create_task(authenticator.refresh_loop(), name="auth-refresh")

    async def requests(seconds: float) -> list[tuple[float, str | None]]:
        """What a request every 20 ms is told (keyed mode, and the key's tenant), and when."""
        answers: list[tuple[float, str | None]] = []
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            assert await authenticator.keys_required()
            answers.append((time.monotonic(), await authenticator.tenant_for_key(key)))
            await asyncio.sleep(0.02)  # the requests' pace: the cache ages between them
        return answers

    try:
        assert await authenticator.tenant_for_key(key) == "acme"  # the key's first read
        recording.readers.clear()
        answers = await asyncio.create_task(requests(4 * CACHE_S), name="requests")
        assert {tenant for _, tenant in answers} == {"acme"}
        assert "requests" not in recording.readers, "a request waited for a read"
        assert recording.readers.count("auth-refresh") >= 6  # keys and the key, every pass

        await apikeys.revoke_key(pool, row.id)
        revoked_at = time.monotonic()
        answers = await asyncio.create_task(requests(CACHE_S + 0.1), name="requests")
        refused_at = [at for at, tenant in answers if tenant is None]
        assert refused_at and answers[-1][1] is None
        assert refused_at[0] - revoked_at <= CACHE_S, "a revoked key outlived the cache"
        assert "requests" not in recording.readers
    finally:
        refresher.cancel()
