"""Reads of the event log: positions, replay after a cursor, the live head (pruning drops its
partitions: server/queue/retention.py)."""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import time
import uuid
from collections.abc import Iterable
from typing import Any

import asyncpg

from server.sql import query

REPLAY_PAGE = 500

# Every type of event the log holds.
TYPES = frozenset(
    {
        "job.queued",
        "job.running",
        "job.progress",
        "job.retrying",
        "job.done",
        "job.failed",
        "job.cancelled",
        "batch.progress",
        "batch.done",
        "template.published",
    }
)
#: The events of a tenant as a whole, naming no job and no batch, which a tenant's own webhook
#: endpoints take (`pressroom tenants webhooks`; the CHECK tenant_webhooks_types_known).
TENANT_TYPES = frozenset({"template.published"})


def type_errors(field: str, asked: Iterable[str]) -> list[tuple[str, str]]:
    """A field error for each type in `asked` that no event has."""
    known = ", ".join(sorted(TYPES))
    return [
        (field, f"unknown event type {name[:100]!r}; the types are {known}")
        for name in sorted(set(asked) - TYPES)
    ]


@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Position:
    """Where an event stands in the log: log order is (transaction id, event id)."""

    xid: int
    id: int


START = Position(0, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class JobEvent:
    id: int
    position: Position
    job_id: uuid.UUID
    tenant: str
    type: str
    job: dict[str, Any]
    at: dt.datetime
    #: The channel of the event's job or batch, None for none.
    channel: str | None = None
    #: Encodings by transport and download-link key (an SSE frame, a websocket frame):
    #: every subscriber of this process writes the same bytes instead of presenting and
    #: encoding the event again.
    encoded: dict[str, bytes] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def wire(self) -> dict[str, Any]:
        """The JSON every transport carries for this event."""
        return {
            "event_id": self.id,
            "type": self.type,
            "at": self.at.isoformat(),
            "job": self.job,
        }


async def head(pool: asyncpg.Pool) -> Position:
    """The newest final position: a reader starting here sees only what comes after."""
    row = await pool.fetchrow(query("events_head"))
    return START if row is None else Position(row["xid"], row["id"])


#: How long a process reads the log's partitions from what it last read of them. An older view
#: only makes a read ask more partitions than it must, never fewer: a range it does not know of
#: is above all it knows, and a range sealed stays as it was sealed.
RANGES_TTL_S = 60.0
MIN_ID = -(2**63)


@dataclasses.dataclass(frozen=True, slots=True)
class _Range:
    lo: int
    sealed: bool
    newest_xid: int | None


#: What each pool (a process has one; a test, a few) last read of the ranges, and when: kept
#: with the pool itself, so that its id names it while it is here.
_ranges: collections.OrderedDict[int, tuple[object, float, list[_Range]]] = (
    collections.OrderedDict()
)
RANGES_KEPT = 16


async def floor(pool: asyncpg.Pool | asyncpg.Connection, xid: int) -> int:
    """An id below which no event of the log has an xid of `xid` or more, so none after a
    position of that xid: the start of the first range that is not sealed, or whose newest xid
    reaches `xid` (0017), or of the overflow's events. Those the overflow takes after this was
    read have ids past every range known here, so above it."""
    now = time.monotonic()
    known = _ranges.get(id(pool))
    if known is None or known[0] is not pool or now - known[1] > RANGES_TTL_S:
        rows = await pool.fetch(query("event_log_ranges"))
        parts = [
            _Range(MIN_ID if r["lo"] is None else r["lo"], r["sealed"], r["newest_xid"])
            for r in rows
        ]
        known = (pool, now, parts)
        _ranges[id(pool)] = known
        _ranges.move_to_end(id(pool))
        while len(_ranges) > RANGES_KEPT:
            _ranges.popitem(last=False)
    ranges = known[2]
    for part in ranges:
        if not part.sealed or (part.newest_xid is not None and part.newest_xid >= xid):
            return part.lo
    return ranges[-1].lo if ranges else MIN_ID


async def after(
    pool: asyncpg.Pool | asyncpg.Connection,
    position: Position,
    *,
    limit: int = REPLAY_PAGE,
    tenant: str | None = None,
    job_id: uuid.UUID | None = None,
    types: frozenset[str] | None = None,
    channel: str | None = None,
) -> tuple[list[JobEvent], bool]:
    """Final events after `position` in log order (of `types` only, and of one tenant's
    `channel` only, when given), and whether newer ones are held back."""
    cursor = (str(position.xid), position.id, limit)
    below = await floor(pool, position.xid)
    if tenant is None and job_id is None and not types and channel is None:
        rows = await pool.fetch(query("events_after_all"), *cursor, below)
    else:
        assert channel is None or tenant is not None, "a channel is one tenant's"
        rows = await pool.fetch(
            query("events_after"),
            *cursor,
            tenant,
            job_id,
            sorted(types) if types else None,
            channel,
            below,
        )
    held = bool(rows[0]["held"]) if rows else False
    events = [
        JobEvent(
            id=row["id"],
            position=Position(row["xid"], row["id"]),
            job_id=row["job_id"],
            tenant=row["tenant"],
            type=row["type"],
            job=row["payload"],
            at=row["created_at"],
            channel=row["payload"].get("channel"),
        )
        for row in rows
        if row["id"] is not None
    ]
    return events, held


@dataclasses.dataclass(frozen=True, slots=True)
class Cursor:
    position: Position
    job_id: uuid.UUID
    tenant: str


async def locate(pool: asyncpg.Pool, event_id: int) -> Cursor | None:
    """Where a client's last event id stands; None when it was pruned or never existed."""
    row = await pool.fetchrow(query("event_position"), event_id)
    if row is None:
        return None
    return Cursor(Position(row["xid"], row["id"]), row["job_id"], row["tenant"])


async def given_out(pool: asyncpg.Pool, event_id: int) -> bool:
    """Whether this server has handed out `event_id` (kept or pruned since): below the next."""
    next_id: int = await pool.fetchval(query("events_next_id"))
    return event_id < next_id
