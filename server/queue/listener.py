"""The dedicated LISTEN connection: NOTIFY hints become worker wake-ups and hub reads.

Never a pooled connection (a pool drops listeners on release). Kept alive with a periodic
query; on loss it reconnects with backoff and then pokes everyone, since notifications sent
while it was away are gone but the rows they pointed at are not. `hold` keeps such a
connection; the Socket.IO manager (server/web/sockets.py) holds its own with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

import asyncpg

from server.errors import DB_OR_QUERY_ERRORS, backoff_s
from server.queue import db

log = logging.getLogger(__name__)

CHANNEL = "pressroom"
#: New rows in the webhook outbox (server/delivery/webhooks.py); the payload carries nothing.
WEBHOOK_CHANNEL = "pressroom_webhooks"
#: API keys, token secrets, token keys, origins or a tenant's defaults changed (access_changed
#: in schema.sql); the payload names the table.
ACCESS_CHANNEL = "pressroom_access"
#: How a LISTEN connection is named in pg_stat_activity (the others are "pressroom").
LISTEN_APPLICATION = "pressroom listen"
KEEPALIVE_S = 10.0
KEEPALIVE_TIMEOUT_S = 5.0
RECONNECT_BASE_S = 0.1
RECONNECT_MAX_S = 5.0
#: How often work queues and the event log are read when no NOTIFY woke anyone: a notification
#: sent while this connection was away is gone, and this bounds how late that leaves anyone.
POLL_INTERVAL_S = 1.0


#: What asyncpg calls on a notification: connection, sender's pid, channel, payload.
Callback = Callable[[object, int, str, str], None]


class Rereads:
    """A read of what a process keeps in memory (the tenants' origins, their defaults), run
    again whenever a change to access is heard, and every POLL_INTERVAL_S while none can be
    (the LISTEN connection is away)."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._listening = False
        self._changed = asyncio.Event()

    def changed(self, *, listening: bool = True) -> None:
        """A change to access was heard, or the LISTEN connection listens again, or it was
        lost (not `listening`): read again now, and poll until it is back."""
        self._listening = listening
        self._changed.set()

    async def run(self, read: Callable[[], Awaitable[None]]) -> None:
        """Call `read` on every change until cancelled (a background task); a read that fails
        is logged, and the next change or poll reads again."""
        while True:
            if not self._listening:
                await asyncio.sleep(POLL_INTERVAL_S)
            else:
                await self._changed.wait()
            self._changed.clear()
            try:
                await read()
            except DB_OR_QUERY_ERRORS as exc:
                log.warning("could not read %s again: %s", self._what, exc)


async def hold(
    dsn: str,
    channels: Mapping[str, Callback],
    *,
    connected: asyncio.Event,
    on_connect: Callable[[], None] = lambda: None,
    on_lost: Callable[[], None] = lambda: None,
    name: str = "LISTEN connection",
) -> None:
    """Hold a dedicated connection listening on `channels` until cancelled: kept alive with a
    periodic query, reconnected with jittered backoff when lost. `connected` is set while it
    listens; `on_connect` runs after every connect, reconnects included, `on_lost` whenever a
    connection that listened is lost."""
    losses = 0
    while True:
        conn: asyncpg.Connection | None = None
        reason = "connection closed"
        try:
            conn = await db.connect(dsn, application_name=LISTEN_APPLICATION)
            lost = asyncio.Event()
            conn.add_termination_listener(lambda _c, lost=lost: lost.set())
            for channel, callback in channels.items():
                await conn.add_listener(channel, callback)
            connected.set()
            on_connect()
            losses = 0
            while not lost.is_set():
                try:
                    async with asyncio.timeout(KEEPALIVE_S):
                        await lost.wait()
                except TimeoutError:
                    async with asyncio.timeout(KEEPALIVE_TIMEOUT_S):
                        await conn.execute("SELECT 1")
        except DB_OR_QUERY_ERRORS as exc:
            reason = str(exc) or type(exc).__name__
        finally:
            listened = connected.is_set()
            connected.clear()
            if conn is not None and not conn.is_closed():
                conn.terminate()
            if listened:
                on_lost()
        losses += 1
        delay_s = backoff_s(losses, base_s=RECONNECT_BASE_S, max_s=RECONNECT_MAX_S)
        log.warning("%s lost (%s); reconnecting in %.1f s", name, reason, delay_s)
        await asyncio.sleep(delay_s)


class Listener:
    def __init__(
        self,
        dsn: str,
        *,
        on_event: Callable[[], None],
        on_work: Callable[[], None],
        on_webhook: Callable[[], None] = lambda: None,
        on_access: Callable[[], None] = lambda: None,
        on_lost: Callable[[], None] = lambda: None,
    ) -> None:
        self._dsn = dsn
        self._on_event = on_event
        self._on_work = on_work
        self._on_webhook = on_webhook
        self._on_access = on_access
        self._on_lost = on_lost
        self.connected = asyncio.Event()
        self.connects = 0

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload.startswith("q:"):
            self._on_work()
        self._on_event()

    def _webhook_notified(self, _conn: object, _pid: int, _channel: str, _payload: str) -> None:
        self._on_webhook()

    def _access_notified(self, _conn: object, _pid: int, _channel: str, _payload: str) -> None:
        self._on_access()

    def _listening(self) -> None:
        if self.connects:
            log.info("LISTEN connection restored")
        self.connects += 1
        # Anything committed while we were not listening: read it now.
        self._on_work()
        self._on_event()
        self._on_webhook()
        self._on_access()

    async def run(self) -> None:
        """Hold the LISTEN connection until cancelled, reconnecting whenever it is lost."""
        channels = {
            CHANNEL: self._notified,
            WEBHOOK_CHANNEL: self._webhook_notified,
            ACCESS_CHANNEL: self._access_notified,
        }
        await hold(
            self._dsn,
            channels,
            connected=self.connected,
            on_connect=self._listening,
            on_lost=self._on_lost,
        )
