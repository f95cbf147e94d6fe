"""Whether a request may go ahead: per-key rate limits, the cap on a tenant's jobs in flight,
and Idempotency-Key on submissions (same key + same body → the original job)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import logging
import math
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any

import asyncpg

from server.errors import DB_OR_QUERY_ERRORS
from server.problems import Problem
from server.queue import jobs
from server.queue.jobs import NewJob
from server.sql import query

log = logging.getLogger(__name__)

IN_FLIGHT_RETRY_S = 5
IDEMPOTENCY_BUSY_RETRY_S = 1
MAX_IDEMPOTENCY_KEY_CHARS = 255
#: How long an Idempotency-Key is remembered: a day outlasts a client's retries through an
#: outage, as payment APIs keep theirs.
IDEMPOTENCY_TTL_S = 24 * 3600


#: A key may send this many seconds' worth of its rate at once: a page load's or a batch's
#: first requests come together.
BURST_S = 2.0


class RateLimiter:
    """A token bucket per key, in this process's memory: `rate_per_s` sustained, `burst` at once
    (BURST_S of the rate, at least one request)."""

    def __init__(self, rate_per_s: float) -> None:
        self._rate_per_s = rate_per_s
        self.burst = max(1, math.ceil(rate_per_s * BURST_S))
        self._burst = float(self.burst)
        self._buckets: dict[Hashable, tuple[float, float]] = {}

    def take(self, key: Hashable, now: float | None = None) -> float:
        """Spend one token: 0.0 when allowed, else the seconds until one is available."""
        now = time.monotonic() if now is None else now
        tokens, last = self._buckets.get(key, (self._burst, now))
        tokens = min(self._burst, tokens + (now - last) * self._rate_per_s)
        if tokens >= 1.0:
            self._buckets[key] = (tokens - 1.0, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1.0 - tokens) / self._rate_per_s


def request_hash(body: Any) -> str:
    """A fingerprint of a JSON body that ignores key order and whitespace."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def idempotency_key(raw: str | None) -> str | None:
    """The Idempotency-Key header's value (a quoted string per the IETF draft, bare accepted)."""
    if raw is None:
        return None
    key = raw.strip()
    if len(key) >= 2 and key.startswith('"') and key.endswith('"'):
        key = key[1:-1]
    if not key or len(key) > MAX_IDEMPOTENCY_KEY_CHARS or not (key.isascii() and key.isprintable()):
        raise Problem(
            400,
            "Bad Idempotency-Key",
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY_CHARS} printable ASCII characters.",
            kind="bad-idempotency-key",
        )
    return key


@dataclasses.dataclass(frozen=True, slots=True)
class Admitted:
    """The job a submission stands for; `replayed` when an earlier request made it."""

    job: dict[str, Any]
    replayed: bool


async def submit(
    pool: asyncpg.Pool,
    new: NewJob,
    *,
    max_in_flight: int,
    insert: Callable[[NewJob], Awaitable[dict[str, Any]]] | None = None,
    in_flight: InFlight | None = None,
) -> Admitted:
    """Insert the job unless the tenant is at its cap or its Idempotency-Key was seen.

    `insert` (e.g. jobs.GroupCommit.create) inserts a job without a key; with a key the job
    is inserted in the transaction that holds the key's lock."""
    if new.idempotency_key is None:
        if in_flight is not None:
            await in_flight.check(pool, new.tenant, max_in_flight)
        else:
            await _check_in_flight(pool, new.tenant, max_in_flight)
        if insert is not None:
            job = await insert(new)
        else:
            [job] = await jobs.create(pool, [new])
        if in_flight is not None:
            in_flight.admitted(pool, new.tenant)
        return Admitted(job, replayed=False)
    try:
        async with pool.acquire() as conn, conn.transaction():
            return await _submit_once(conn, new, max_in_flight=max_in_flight)
    except asyncpg.UniqueViolationError:
        raise _busy() from None  # another process inserted the key between our find and insert


async def _submit_once(conn: asyncpg.Connection, new: NewJob, *, max_in_flight: int) -> Admitted:
    # The lock is held until this transaction ends, so one request per key runs at a time;
    # the others answer 409 at once rather than queueing behind it.
    if not await conn.fetchval(query("idempotency_try_lock"), new.tenant, new.idempotency_key):
        raise _busy()
    row = await conn.fetchrow(
        query("idempotency_find"), new.tenant, new.idempotency_key, IDEMPOTENCY_TTL_S
    )
    if row is not None and not row["expired"]:
        if row["request_hash"] != new.request_hash:
            raise Problem(
                422,
                "Idempotency-Key reused",
                "This Idempotency-Key was already used with a different request body.",
                kind="idempotency-key-reused",
            )
        return Admitted(row["job"], replayed=True)
    if row is not None:
        await conn.execute(query("idempotency_forget"), row["id"])  # past retention: reusable
    await _check_in_flight(conn, new.tenant, max_in_flight)
    [job] = await jobs.create(conn, [new])
    return Admitted(job, replayed=False)


def _busy() -> Problem:
    return Problem(
        409,
        "Conflict",
        "A request with this Idempotency-Key is still being processed; retry shortly.",
        kind="idempotency-key-in-use",
        headers={"Retry-After": str(IDEMPOTENCY_BUSY_RETRY_S)},
    )


class InFlight:
    """A tenant's queued + running count, read at most every `ttl_s` and counted up locally in
    between, so the cap costs no query per submission. Other processes' admissions show up at
    the next read: the cap can be passed by what they admit within `ttl_s` (and one read),
    never by more. A stale count under half the cap admits at once and is read again in the
    background once the job is inserted (see `admitted`); nearer the cap, the submission waits
    for the fresh count."""

    def __init__(self, ttl_s: float = 0.5) -> None:
        self._ttl_s = ttl_s
        self._counts: dict[str, tuple[int, float]] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._refreshing: dict[str, asyncio.Task[int]] = {}  # held: the loop keeps weak refs

    async def check(self, pool: asyncpg.Pool, tenant: str, max_in_flight: int) -> None:
        count, read_at = self._counts.get(tenant, (0, float("-inf")))
        stale = time.monotonic() - read_at > self._ttl_s
        if (
            read_at == float("-inf")
            or count >= max_in_flight
            or (stale and 2 * count >= max_in_flight)
        ):
            # Never read, about to refuse (jobs may have finished since), or stale near the cap.
            count = await self._read(pool, tenant, read_at)
        if count >= max_in_flight:
            raise _too_many(count, max_in_flight)

    async def _read(self, pool: asyncpg.Pool, tenant: str, seen_at: float) -> int:
        lock = self._locks.setdefault(tenant, asyncio.Lock())
        async with lock:  # one read per tenant at a time; those waiting use its answer
            count, read_at = self._counts.get(tenant, (0, float("-inf")))
            if read_at == seen_at:
                count = await pool.fetchval(query("tenant_in_flight"), tenant)
                self._counts[tenant] = (count, time.monotonic())
            return count

    async def _refresh(self, pool: asyncpg.Pool, tenant: str, seen_at: float) -> int:
        try:
            return await self._read(pool, tenant, seen_at)
        except DB_OR_QUERY_ERRORS as exc:
            log.warning("could not read jobs in flight: %s", exc)  # the next admission tries again
            return -1

    def admitted(self, pool: asyncpg.Pool, tenant: str) -> None:
        """Count a job just inserted. A stale count is read again in the background from
        here, not from `check`: a read started before the insert would run first on the same
        connection and delay the submission's answer."""
        count, read_at = self._counts.get(tenant, (0, float("-inf")))
        self._counts[tenant] = (count + 1, read_at)
        if time.monotonic() - read_at > self._ttl_s and tenant not in self._refreshing:
            task = asyncio.create_task(self._refresh(pool, tenant, read_at), name="in-flight")
            self._refreshing[tenant] = task
            task.add_done_callback(lambda _t: self._refreshing.pop(tenant, None))


def _too_many(count: int, max_in_flight: int) -> Problem:
    return Problem(
        429,
        "Too many jobs in flight",
        f"This tenant has {count} jobs queued or running; the limit is {max_in_flight}.",
        kind="too-many-jobs",
        headers={"Retry-After": str(IN_FLIGHT_RETRY_S)},
    )


async def _check_in_flight(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, max_in_flight: int
) -> None:
    # Counted, not reserved: concurrent submissions may pass the cap by a few, never by many.
    count: int = await conn.fetchval(query("tenant_in_flight"), tenant)
    if count >= max_in_flight:
        raise _too_many(count, max_in_flight)


async def prune_keys(pool: asyncpg.Pool) -> None:
    """Forget Idempotency-Keys older than IDEMPOTENCY_TTL_S, so they can be used again."""
    while (
        pruned := await pool.execute(query("idempotency_prune"), IDEMPOTENCY_TTL_S)
    ) != "UPDATE 0":
        log.info("forgot expired idempotency keys: %s", pruned)
