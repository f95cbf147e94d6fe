"""The stream protocol every transport speaks: a cursor becomes replay from the event log, then
live events from the hub, then the end of a job's stream (or a `reset`, or `closed`).

SSE (server/web/sse.py), Socket.IO (server/web/sockets.py) and the long-poll
(GET /v1/jobs/{id}?wait=) are adapters over `start` and `Stream`: they choose the wire format,
this module what is sent when.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import uuid
from collections.abc import Callable
from typing import Any, Protocol

import asyncpg

from server import events
from server.events import JobEvent, Position
from server.events.hub import SubscriberDropped, Subscription, close_code
from server.queue import jobs
from server.queue.jobs import JobState

# The one rule of which event ends a job's stream, on every transport: the events of the
# states a job never leaves by itself. A failed job may be retried by request; its stream
# still ends, and the retry is news for a new one.
FINAL_TYPES = frozenset(f"job.{state}" for state in JobState if state.final)

# Why a cursor is reset, by the code a `reset` carries: a client acts the same way on both
# (reload state), but a cursor this server never gave out is a client's bug, not the log's age.
PRUNED, UNKNOWN_CURSOR = "pruned", "unknown_cursor"
RESET_REASONS = {
    PRUNED: "the requested event is no longer kept; reload state",
    UNKNOWN_CURSOR: "this server has not given out that event; reload state",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Reset:
    """The client's cursor cannot be resumed from (`code`: pruned, or never given out to this
    tenant): reload state. `job` is the job's stored JSON for a job's stream, None for the
    all-jobs and channel streams."""

    job: dict[str, Any] | None
    code: str = PRUNED

    def body(self) -> dict[str, Any]:
        """The `reset` message every transport sends (a job's stream adds the job)."""
        return {"type": "reset", "reason": RESET_REASONS[self.code], "code": self.code}


@dataclasses.dataclass(frozen=True, slots=True)
class End:
    """The job's stream is over: its final event has been sent (or filtered out)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Closed:
    """The subscriber was dropped (it fell behind, its key was revoked or its token expired,
    shutdown): the client reconnects and resumes by event id, with new credentials if the
    code asks for them."""

    reason: str

    def body(self) -> dict[str, Any]:
        return closed_body(self.reason)


def closed_body(reason: str) -> dict[str, Any]:
    """The `closed` message every transport sends last."""
    return {"type": "closed", "reason": str(reason), "code": close_code(reason)}


Item = JobEvent | Reset | End | Closed


class Sink(Protocol):
    """An adapter's way of writing an event at once, from the hub's pass, while its stream
    waits idle: the event's bytes as the hub's encoders left them, written if the connection
    takes them now; False (not encoded for it, the connection's buffer is full) to have the
    stream return the event from `next` instead, for the adapter's own send."""

    def send_now(self, event: JobEvent) -> bool: ...


def ends(event: JobEvent) -> bool:
    """Whether `event` ends the stream of its job."""
    return event.type in FINAL_TYPES


@dataclasses.dataclass(frozen=True, slots=True)
class Start:
    """Where a stream begins: after `position` (None: now), after a reset (its code) or not;
    `history` when a job's stream without a cursor begins with the job's first event."""

    position: Position | None
    reset: str | None
    history: bool


async def start(
    pool: asyncpg.Pool,
    *,
    tenant: str,
    job_id: uuid.UUID | None,
    cursor: int | None,
    history: bool = True,
) -> Start:
    """Where the stream of `tenant`'s job (or of all its jobs) after event id `cursor` begins.

    Cursor 0 is the oldest event kept; a cursor no longer kept gives a reset first, and so
    does one never given out to this tenant (past the log's head, or another tenant's), with
    its own code. Without a cursor, a job's stream begins with the job's first event when
    `history` (SSE, Socket.IO), else now (long-poll); the all-jobs stream begins now."""
    position: Position | None = None
    reset: str | None = None
    if cursor == 0:
        position = events.START
    elif cursor is not None:
        located = await events.locate(pool, cursor)
        if located is not None and located.tenant == tenant:
            position = located.position
        elif located is None and await events.given_out(pool, cursor):
            reset = PRUNED
        else:
            reset = UNKNOWN_CURSOR
    if job_id is not None and position is None and (history or reset):
        position = events.START  # a job's stream after a reset begins with its history too
    return Start(position, reset, history)


class Stream:
    """One subscriber's items in order: a reset if any, replay after the cursor, then live
    events; an event at or before the last one handled is skipped, which makes the seam exact.

    `job` is the job as the adapter read it: a Reset carries it, and a job already final when
    a stream without history opens (read after subscribing) has nothing more to come: End."""

    __slots__ = (
        "_ended",
        "_final",
        "_pending",
        "_pool",
        "_position",
        "_read_none",
        "_replaying",
        "_sink",
        "_sub",
        "_types",
    )

    def __init__(
        self,
        pool: asyncpg.Pool,
        sub: Subscription,
        begin: Start,
        *,
        types: frozenset[str] | None = None,
        job: dict[str, Any] | None = None,
        sink: Sink | None = None,
    ) -> None:
        self._pool = pool
        self._sub = sub
        self._sink = sink
        self._position = begin.position  # None: live only
        self._types = types
        # Items ready to return (a reset, a replayed page); made only when there are some.
        self._pending: collections.deque[Item] | None = None
        if begin.reset is not None:
            self._pending = collections.deque([Reset(job, begin.reset)])
        self._replaying = begin.position is not None
        self._read_none = True  # no page of the replay has read an event yet
        # The job was final when its stream opened: with nothing newer in the log (a cursor at
        # or after its final event, or no history), the stream is over once caught up.
        self._final = sub.job_id is not None and job is not None and JobState(job["status"]).final
        self._ended = self._final and begin.position is None

    async def next(self, timeout_s: float | None) -> Item | None:
        """The next item; None after timeout_s without one (None: wait for one, with no timer).
        After End or Closed, the same again: nothing more comes. With a sink, live events it
        writes while this waits are not returned: they are sent."""
        if self._pending:
            return self._take()
        if self._ended:
            return End()
        if self._sub.dropped is not None:
            return Closed(self._sub.dropped)
        while self._replaying:
            await self._replay_page()
            if self._pending:
                return self._take()
        if self._ended:
            return End()
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        deliver = self._deliver if self._sink is not None else None
        while True:
            remaining_s = None if deadline is None else deadline - loop.time()
            if remaining_s is not None and remaining_s <= 0:
                return None
            try:
                live = await self._sub.get(remaining_s, deliver=deliver)
            except SubscriberDropped as exc:
                return Closed(exc.reason)
            if live is None:
                return None
            if self._position is not None and live.position <= self._position:
                continue  # replayed already
            self._position = live.position
            self._ended = self._sub.job_id is not None and ends(live)
            if self._sends(live):
                return live
            if self._ended:
                return End()

    @property
    def position(self) -> Position | None:
        """The log position of the last event handled (None: none yet, and live only)."""
        return self._position

    def attach(self, sink: Sink) -> None:
        """Write live events through `sink` from now on (once the response has begun)."""
        self._sink = sink

    def park(self, wake: Callable[[], None]) -> bool:
        """Wait as `next` does, with no task waiting in it: the sink writes live events in the
        hub's pass, and `wake` is called once `next` has something to return (an event the
        sink does not take, the job's final one, a drop). False when something is due now
        (a reset, replay, the end), or without a sink: call `next`."""
        if self._pending or self._replaying or self._ended or self._sink is None:
            return False
        return self._sub.park(self._deliver, wake)

    async def _replay_page(self) -> None:
        assert self._position is not None
        job_id = self._sub.job_id
        # A job's few events are all read, since its final one ends the stream whether it
        # is sent or not; the all-jobs and channel streams read only the types they send.
        batch, held = await events.after(
            self._pool,
            self._position,
            tenant=self._sub.tenant,
            job_id=job_id,
            types=self._types if job_id is None else None,
            channel=self._sub.channel,
        )
        for event in batch:
            self._position = event.position
            if self._sends(event):
                if self._pending is None:
                    self._pending = collections.deque()
                self._pending.append(event)
        if batch:
            # A failed job may have been retried since: only its latest event ends it.
            self._ended = job_id is not None and ends(batch[-1])
        elif self._read_none:
            # Nothing after the cursor: the job as read at the open says whether it is over.
            self._ended = self._final
        self._read_none = False
        if len(batch) < events.REPLAY_PAGE:
            self._replaying = False
            if self._ended and held and job_id is not None and self._sub.tenant is not None:
                # Newer events of the job may wait behind a running transaction (a failed
                # job retried just now): the row says whether it is still final.
                current = await jobs.get(self._pool, job_id, self._sub.tenant)
                self._ended = current is None or current.status.final

    def _take(self) -> Item:
        assert self._pending
        item = self._pending.popleft()
        if not self._pending:
            self._pending = None
        return item

    def _deliver(self, event: JobEvent) -> bool:
        """A live event, in the hub's pass, while `next` waits: what `next` would do with it,
        the send done by the sink. The event that ends a job's stream is left to `next`."""
        if self._position is not None and event.position <= self._position:
            return True  # replayed already
        if self._sub.job_id is not None and ends(event):
            return False
        if self._sends(event):
            assert self._sink is not None
            if not self._sink.send_now(event):
                return False
        self._position = event.position
        return True

    def _sends(self, event: JobEvent) -> bool:
        return self._types is None or event.type in self._types
