"""The answers the authenticator caches are read again in the background before they expire:
a request does not wait for the database, and a revoked key still stops within the cache's
lifetime."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, cast

import asyncpg

from server.access import apikeys, signing, tenants
from server.settings import Settings
from server.web import auth

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


async def test_tokens_are_checked_from_memory_and_a_rotation_is_noticed_in_the_background(
    pool: asyncpg.Pool, make_settings: Callable[..., Settings]
) -> None:
    _row, _key, secret = await apikeys.create_key_and_tenant(pool, "acme")
    assert secret is not None
    recording = RecordingPool(pool)
    authenticator = auth.Authenticator(make_settings(auth_cache_s=CACHE_S))
    await authenticator.start(cast(asyncpg.Pool, recording))
    refresher = asyncio.create_task(authenticator.refresh_loop(), name="auth-refresh")
    channel_a = signing.Scope(channels=frozenset({"A"}))
    token, _ = signing.make_token(secret, "acme", channel_a, ttl_s=60)

    async def connections(seconds: float) -> list[tuple[float, bool]]:
        """What a connection every 20 ms is told of the token (valid or not), and when."""
        answers: list[tuple[float, bool]] = []
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            verified = await authenticator.verify_token(token)
            answers.append((time.monotonic(), isinstance(verified, auth.Verified)))
            await asyncio.sleep(0.02)  # the connections' pace: the cache ages between them
        return answers

    try:
        assert isinstance(await authenticator.verify_token(token), auth.Verified)  # first read
        recording.readers.clear()
        answers = await asyncio.create_task(connections(4 * CACHE_S), name="connections")
        assert all(valid for _, valid in answers) and len(answers) > 20
        assert "connections" not in recording.readers, "a connection waited for a read"
        assert "auth-refresh" in recording.readers

        await tenants.set_token_secret(pool, "acme", rotate=True)
        rotated_at = time.monotonic()
        answers = await asyncio.create_task(connections(CACHE_S + 0.1), name="connections")
        refused_at = [at for at, valid in answers if not valid]
        assert refused_at and not answers[-1][1]
        assert refused_at[0] - rotated_at <= CACHE_S, "a rotated secret outlived the cache"
        assert "connections" not in recording.readers
    finally:
        refresher.cancel()
