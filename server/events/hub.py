"""In-process fan-out of the event log to every stream connected to this process.

One reader per process follows the log (woken by NOTIFY, with a slow poll as the safety net)
and hands each event to the matching subscribers. Every subscriber has a bounded buffer: one
that falls too far behind is dropped with a reason and resumes by event id, so a slow client
never grows memory.

Before an event is handed out, each transport encodes it once (`add_encoder`: its frame per
download-link key in use); a subscriber waiting idle with nothing buffered is then handed the
event directly (`Subscription.get(deliver=…)`), and its transport writes those same bytes to
its connection there and then, without waking the stream's task. That is what fan-out to
tens of thousands of streams costs per event: one write each.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import asyncpg

from server import events
from server.errors import DB_OR_QUERY_ERRORS
from server.events import JobEvent, Position

log = logging.getLogger(__name__)

HELD_RETRY_MIN_S = 0.005
HELD_RETRY_MAX_S = 0.2
ERROR_RETRY_S = 1.0
#: Events a subscriber may fall behind before it is dropped: a client that keeps up holds a
#: handful; a thousand ride out a burst of submissions, and the dropped one resumes by id.
SUBSCRIBER_QUEUE = 1000


class Reason(str):
    """Why a stream was closed: the text a person reads, and a `code` a client acts on
    (`closed` events carry both): "token_expired" asks for a fresh token, "revoked" for new
    credentials, the others ("behind", "shutdown", "unavailable", "internal") for a
    reconnect from the last event id."""

    code: str

    def __new__(cls, text: str, code: str) -> Reason:
        reason = super().__new__(cls, text)
        reason.code = code
        return reason


BEHIND, SHUTDOWN, UNAVAILABLE, INTERNAL = "behind", "shutdown", "unavailable", "internal"


SHUTDOWN_REASON = Reason("server shutting down; reconnect and resume by event id", SHUTDOWN)


def close_code(reason: str) -> str:
    """The code of a reason a stream was closed for; a plain string counts as a reconnect."""
    return reason.code if isinstance(reason, Reason) else UNAVAILABLE


class SubscriberDropped(Exception):
    """The stream must end: the subscriber fell behind or the server is shutting down; its
    argument is the Reason."""

    @property
    def reason(self) -> str:
        reason: str = self.args[0]
        return reason


class Subscription:
    """One stream's view of the hub: a bounded buffer of matching events, read by one task.

    A waiting reader holds a bare future (and a timer, if it asked for a timeout), not an
    asyncio.Event and a timeout scope: the hub wakes every subscriber of an event in one pass,
    so for 10,000 SSE streams this is most of what an event costs before the first byte is
    written. A parked one (`park`) holds no task at all while its events are delivered."""

    __slots__ = (
        "_deliver",
        "_hub",
        "_items",
        "_on_wake",
        "_waiter",
        "channel",
        "dropped",
        "job_id",
        "key",
        "limit",
        "tenant",
        "transport",
    )

    def __init__(
        self,
        hub: Hub,
        tenant: str | None,
        job_id: uuid.UUID | None,
        channel: str | None,
        limit: int,
        transport: str,
    ) -> None:
        self._hub = hub
        self.transport = transport
        self.tenant = tenant
        self.job_id = job_id
        self.channel = channel
        self.key = _key(tenant, job_id, channel)
        self.limit = limit
        # Made when an event waits, dropped when none does: an idle subscriber of tens of
        # thousands holds no buffer (an empty deque takes over 600 bytes).
        self._items: collections.deque[JobEvent] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._deliver: Deliver | None = None
        self._on_wake: Callable[[], None] | None = None  # while parked (see park)
        self.dropped: str | None = None

    def push(self, event: JobEvent) -> None:
        if self.dropped is not None:
            return
        if self._deliver is not None and not self._items:
            try:
                if self._deliver(event):
                    return
            except Exception:
                log.exception("direct delivery failed", extra={"event_id": event.id})
            self._deliver = None  # the task takes it from here, in order
        if self._items is None:
            self._items = collections.deque()
        elif len(self._items) >= self.limit:
            self._hub.slow_dropped += 1
            self.drop(
                Reason(
                    f"subscriber fell more than {self.limit} events behind; resume by event id",
                    BEHIND,
                )
            )
            return
        self._items.append(event)
        self._wake()

    def drop(self, reason: str) -> None:
        if self.dropped is None:
            self.dropped = reason
            self._items = None
            self._wake()
            self._hub.unsubscribe(self)

    def _wake(self) -> None:
        if self._waiter is not None:
            _wake_up(self._waiter)
        elif self._on_wake is not None:
            wake, self._on_wake, self._deliver = self._on_wake, None, None
            wake()

    def park(self, deliver: Deliver, wake: Callable[[], None]) -> bool:
        """Wait as `get` does, with no task waiting: `deliver` is offered each event in the
        hub's pass, and the first it refuses is buffered and `wake` called, once (as on a
        drop); the reader then takes it with `get`. False, with nothing parked, when there is
        something to get already."""
        if self._items or self.dropped is not None or self._waiter is not None:
            return False
        self._deliver, self._on_wake = deliver, wake
        return True

    @property
    def buffered(self) -> int:
        """Events waiting to be taken (never more than `limit`)."""
        return 0 if self._items is None else len(self._items)

    async def get(
        self, timeout_s: float | None, *, deliver: Deliver | None = None
    ) -> JobEvent | None:
        """The next event, None after timeout_s of quiet (None: no timer, wait for an event
        or the drop); SubscriberDropped when cut off.

        While it waits with nothing buffered, `deliver` is offered each event first, in the
        hub's pass: True when it has dealt with it (written it, or skipped it), False to have
        it buffered and returned here as usual (and every event after it, in order)."""
        self._on_wake = None
        if not self._items and self.dropped is None:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = None if timeout_s is None else loop.call_later(timeout_s, _wake_up, waiter)
            self._deliver = deliver
            try:
                await waiter
            finally:
                if timer is not None:
                    timer.cancel()
                self._waiter = None
                self._deliver = None
        if self.dropped is not None:
            raise SubscriberDropped(self.dropped)
        if not self._items:
            return None
        event = self._items.popleft()
        if not self._items:
            self._items = None
        return event


def _wake_up(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


#: Takes an event in the hub's pass (see Subscription.get); False: buffer it instead.
Deliver = Callable[[JobEvent], bool]
#: Encodes an event for a transport before it is handed out (see Hub.add_encoder).
Encoder = Callable[[JobEvent], Awaitable[None]]

#: What a subscription follows: a job, a tenant's channel, or a tenant (None: every tenant).
Key = tuple[str, uuid.UUID] | tuple[str, str | None, str] | tuple[str, str | None]


def _key(tenant: str | None, job_id: uuid.UUID | None, channel: str | None) -> Key:
    if job_id is not None:
        return ("job", job_id)
    if channel is not None:
        return ("channel", tenant, channel)
    return ("tenant", tenant)


class Hub:
    """Follows the event log from the newest final position and fans events out."""

    def __init__(self, pool: asyncpg.Pool, *, poll_interval_s: float) -> None:
        self._pool = pool
        self._poll_interval_s = poll_interval_s
        self._groups: dict[Key, set[Subscription]] = {}
        self._listeners: list[Callable[[JobEvent], None]] = []
        self._encoders: list[Encoder] = []
        self._poked = asyncio.Event()
        self.position: Position | None = None
        self.published = 0
        self.slow_dropped = 0

    @property
    def subscriber_count(self) -> int:
        return sum(len(group) for group in self._groups.values())

    def poke(self) -> None:
        """Something was committed: read the log now."""
        self._poked.set()

    def add_listener(self, callback: Callable[[JobEvent], None]) -> None:
        """Call back for every event (in-process consumers such as the workers' cancel path)."""
        self._listeners.append(callback)

    def add_encoder(self, encode: Encoder) -> None:
        """Await `encode(event)` before every event is handed out: a transport encodes it
        there, once, into `event.encoded`, for all its subscribers in this process."""
        self._encoders.append(encode)

    async def _encode(self, event: JobEvent) -> None:
        for encode in self._encoders:
            try:
                await encode(event)
            except DB_OR_QUERY_ERRORS:
                raise  # read again, like the log itself
            except Exception:
                # The streams encode it themselves, one by one, as without an encoder.
                log.exception("encoding an event failed", extra={"event_id": event.id})

    def subscribe(
        self,
        *,
        tenant: str | None,
        job_id: uuid.UUID | None = None,
        channel: str | None = None,
        transport: str = "sse",
    ) -> Subscription:
        """Start buffering the events of a job, of one of the tenant's channels, or of all
        its jobs and batches; tenant None means every tenant."""
        assert channel is None or tenant is not None, "a channel is one tenant's"
        sub = Subscription(self, tenant, job_id, channel, SUBSCRIBER_QUEUE, transport)
        self._groups.setdefault(sub.key, set()).add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        group = self._groups.get(sub.key)
        if group is not None:
            group.discard(sub)
            if not group:
                del self._groups[sub.key]

    def subscribers_by_transport(self) -> dict[str, int]:
        """How many subscriptions each transport (sse, socketio, longpoll) holds now."""
        counts: collections.Counter[str] = collections.Counter()
        for group in self._groups.values():
            counts.update(sub.transport for sub in group)
        return {name: counts.get(name, 0) for name in ("sse", "socketio", "longpoll")}

    @contextlib.contextmanager
    def subscription(
        self,
        *,
        tenant: str | None,
        job_id: uuid.UUID | None = None,
        channel: str | None = None,
        transport: str = "sse",
    ) -> Iterator[Subscription]:
        sub = self.subscribe(tenant=tenant, job_id=job_id, channel=channel, transport=transport)
        try:
            yield sub
        finally:
            self.unsubscribe(sub)

    def close_all(self, reason: str) -> None:
        """End every stream (shutdown); clients reconnect elsewhere and resume by event id."""
        for group in list(self._groups.values()):
            for sub in list(group):
                sub.drop(reason)

    def dispatch(self, event: JobEvent) -> None:
        self.published += 1
        keys: list[Key] = [("tenant", event.tenant), ("tenant", None)]
        if event.channel is not None:
            keys.insert(0, ("channel", event.tenant, event.channel))
        if event.job_id is not None:
            keys.insert(0, ("job", event.job_id))
        for key in keys:
            for sub in list(self._groups.get(key, ())):
                sub.push(event)
        for callback in self._listeners:
            try:
                callback(event)
            except Exception:
                log.exception("event listener failed", extra={"event_id": event.id})

    async def run(self) -> None:
        """Follow the log until cancelled. A failed read is retried; nothing is skipped."""
        held_wait_s = HELD_RETRY_MIN_S
        while True:
            try:
                if self.position is None:
                    self.position = await events.head(self._pool)
                before = self.position
                held = await self._read_new()
            except DB_OR_QUERY_ERRORS as exc:
                log.warning("event log read failed, retrying: %s", exc)
                await asyncio.sleep(ERROR_RETRY_S)
                continue
            # Committed events behind a running transaction: look again shortly, since that
            # transaction may finish without a NOTIFY of its own (a heartbeat, say).
            if not held:
                wait_s = self._poll_interval_s
            else:
                held_wait_s = HELD_RETRY_MIN_S if self.position != before else held_wait_s
                wait_s = held_wait_s
                held_wait_s = min(held_wait_s * 2, HELD_RETRY_MAX_S)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._poked.wait()

    async def _read_new(self) -> bool:
        assert self.position is not None
        while True:
            self._poked.clear()
            batch, held = await events.after(self._pool, self.position)
            for event in batch:
                if self._encoders:
                    await self._encode(event)
                self.dispatch(event)
                self.position = event.position
            if len(batch) < events.REPLAY_PAGE:
                return held


def etag(job: Mapping[str, Any]) -> str:
    """A weak validator of a job's public state; every event of the job changes it."""
    canonical = json.dumps(job, sort_keys=True, separators=(",", ":"), default=str)
    return 'W/"' + hashlib.blake2b(canonical.encode(), digest_size=12).hexdigest() + '"'


def etag_matches(if_none_match: str, current: str) -> bool:
    """Weak comparison of an If-None-Match header with the current ETag (RFC 9110, 13.1.2)."""
    if if_none_match.strip() == "*":
        return True
    opaque = current.removeprefix("W/")
    return any(tag.strip().removeprefix("W/") == opaque for tag in if_none_match.split(","))
