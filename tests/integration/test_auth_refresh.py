"""What the authenticator keeps in memory is trusted until a change to access is heard
(NOTIFY pressroom_access): a request does not wait for the database, a revocation or a
rotation is in force as soon as it commits, and while the LISTEN connection is away every
request reads for itself."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import asyncpg

from server.access import apikeys, signing, tenants
from server.queue.listener import Listener
from server.settings import Settings
from server.tasks import background
from server.web import auth, credentials

#: A change's commit to the first answer that knows it: a notification and a read, a few ms on
#: an idle machine; the bound allows for a busy one.
WITHIN_S = 1.0


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


@dataclasses.dataclass
class Hearing:
    authenticator: auth.Authenticator
    recording: RecordingPool
    listener: Listener
    #: Set when the LISTEN connection is lost.
    lost: asyncio.Event


@contextlib.asynccontextmanager
async def hearing(
    dsn: str, pool: asyncpg.Pool, make_settings: Callable[..., Settings]
) -> AsyncIterator[Hearing]:
    """An authenticator on a recording pool, told of changes by a LISTEN connection of its
    own as a server's is (server/web/app.py), with its refresh pass running."""
    recording = RecordingPool(pool)
    authenticator = auth.Authenticator(make_settings())
    await authenticator.start(cast(asyncpg.Pool, recording))
    lost = asyncio.Event()

    def listen_lost() -> None:
        authenticator.access_changed(listening=False)
        lost.set()

    listener = Listener(
        dsn,
        on_event=lambda: None,
        on_work=lambda: None,
        on_access=authenticator.access_changed,
        on_lost=listen_lost,
    )
    async with (
        background("listener", listener.run()),
        background("auth-refresh", authenticator.refresh_loop()),
    ):
        await asyncio.wait_for(listener.connected.wait(), 10)
        yield Hearing(authenticator, recording, listener, lost)


async def until(answer: Callable[[], Any], expected: object, name: str) -> float:
    """Ask every 20 ms, in a task called `name`, until the answer is `expected`: when it was."""

    async def ask() -> float:
        while True:
            if await answer() == expected:
                return time.monotonic()
            await asyncio.sleep(0.02)  # the requests' pace

    return await asyncio.wait_for(asyncio.create_task(ask(), name=name), 10)


async def test_keys_are_answered_from_memory_until_a_revocation_is_heard(
    dsn: str, pool: asyncpg.Pool, make_settings: Callable[..., Settings]
) -> None:
    row, key = await apikeys.create_key(pool, "acme")
    await apikeys.create_key(pool, "other")  # keyed mode stays when the first key is revoked
    async with hearing(dsn, pool, make_settings) as heard:
        authenticator, recording = heard.authenticator, heard.recording
        assert await authenticator.tenant_for_key(key) == "acme"  # the key's first read

        async def requests(seconds: float) -> set[str | None]:
            """What a request every 20 ms is told (keyed mode, and the key's tenant)."""
            answers: set[str | None] = set()
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                assert await authenticator.keys_required()
                answers.add(await authenticator.tenant_for_key(key))
                await asyncio.sleep(0.02)
            return answers

        recording.readers.clear()
        assert await asyncio.create_task(requests(1.0), name="requests") == {"acme"}
        assert recording.readers == [], "nothing changed, yet something was read"

        await apikeys.revoke_key(pool, row.id)
        revoked_at = time.monotonic()
        refused_at = await until(lambda: authenticator.tenant_for_key(key), None, "requests")
        assert refused_at - revoked_at <= WITHIN_S
        # Heard once: a request may read its key and the active keys itself, before the pass
        # that the change woke has read them; from then on, memory answers again.
        assert await asyncio.create_task(requests(0.5), name="requests") == {None}
        assert recording.readers.count("requests") <= 2
        recording.readers.clear()
        assert await asyncio.create_task(requests(0.5), name="requests") == {None}
        assert recording.readers == []


async def test_a_rotation_is_heard_and_while_nothing_can_be_heard_requests_read(
    dsn: str, pool: asyncpg.Pool, make_settings: Callable[..., Settings]
) -> None:
    _row, _key, secret = await apikeys.create_key_and_tenant(pool, "acme")
    assert secret is not None
    token, _ = signing.make_token(secret, "acme", signing.Scope(), ttl_s=60)
    async with hearing(dsn, pool, make_settings) as heard:
        authenticator, recording, listener = heard.authenticator, heard.recording, heard.listener

        async def valid() -> bool:
            return isinstance(await authenticator.verify_token(token), credentials.Verified)

        assert await valid()  # the first read
        recording.readers.clear()
        for _ in range(20):
            assert await asyncio.create_task(valid(), name="connection")
        assert recording.readers == [], "a token was checked against the database"

        # The LISTEN connection goes: a change made now cannot be heard, so nothing kept is
        # trusted, and every connection reads for itself until it is back.
        connects = listener.connects
        # Its last statement was a LISTEN (its keep-alive query comes after 10 s).
        killed = await pool.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE datname = current_database() AND query LIKE 'LISTEN %'"
        )
        assert killed == 1
        await asyncio.wait_for(heard.lost.wait(), 10)
        recording.readers.clear()
        assert await asyncio.create_task(valid(), name="connection")
        assert "connection" in recording.readers
        await asyncio.wait_for(listener.connected.wait(), 30)
        assert listener.connects > connects

        await tenants.set_token_secret(pool, "acme", rotate=True)
        rotated_at = time.monotonic()
        refused_at = await until(valid, False, "connection")
        assert refused_at - rotated_at <= WITHIN_S
