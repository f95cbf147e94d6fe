"""A batch's combined PDF: its states, where its file lives, and the only code that runs its SQL.

The state machine and the rules that move it are in 0016_batch_combine.sql: the items move a
combined file between waiting, items_failed and pending (in the transaction of each job
change); a process claims a pending one, joins it (server/pipeline/combiner.py) and records
the result.
Every change here logs the batch's event in its transaction (a trigger on batch_combines).
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Sequence
from typing import Any

import asyncpg

from server.sql import query

#: The name of a combined file when downloaded: the batch's id and this extension.
EXTENSION = "pdf"


class CombineState(enum.StrEnum):
    """Mirrors the batch_combines_status_known CHECK constraint."""

    WAITING = "waiting"  # some item is not final yet (shown as pending)
    ITEMS_FAILED = "items_failed"  # an item failed or was cancelled (shown as failed)
    PENDING = "pending"  # every item is done: due to be joined
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


def object_key(tenant: str, batch_id: uuid.UUID | str, attempt: int) -> str:
    """Where an attempt's combined file is stored: one key per attempt, as for a job's files,
    so that a late result of an abandoned attempt can be deleted without touching the winner."""
    return f"{tenant}/batches/{batch_id}/{attempt}.{EXTENSION}"


def filename(batch_id: uuid.UUID | str) -> str:
    return f"{batch_id}.{EXTENSION}"


def attempt_keys(
    tenant: str, batch_id: uuid.UUID | str, attempts: int, max_attempts: int
) -> set[str]:
    """Every key an attempt may have written (retention deletes them all)."""
    return {object_key(tenant, batch_id, n) for n in range(1, max(attempts, max_attempts) + 1)}


@dataclasses.dataclass(frozen=True, slots=True)
class Claimed:
    """A join this process now holds for one attempt."""

    batch_id: uuid.UUID
    tenant: str
    attempt: int
    max_attempts: int
    outline: bool
    #: The combined file's signature options (combine.sign), None: not signed.
    sign: dict[str, Any] | None = None

    @property
    def key(self) -> uuid.UUID:
        return self.batch_id

    @property
    def object_key(self) -> str:
        return object_key(self.tenant, self.batch_id, self.attempt)

    @property
    def log_extra(self) -> dict[str, str]:
        return {"batch_id": str(self.batch_id), "tenant": self.tenant}


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    """One item of a batch, as the join needs it."""

    key: str
    status: str
    object_key: str | None


async def create(
    conn: asyncpg.Connection,
    batch_id: uuid.UUID,
    tenant: str,
    *,
    outline: bool,
    max_attempts: int,
    sign: dict[str, Any] | None = None,
) -> None:
    """The combined file of a new batch, waiting for its items (inserted after it)."""
    await conn.execute(query("combine_insert"), batch_id, tenant, outline, max_attempts, sign)


async def claim(pool: asyncpg.Pool, *, limit: int, worker_id: str, lease_s: float) -> list[Claimed]:
    """Claim up to `limit` due joins in one statement; the attempt is counted here."""
    rows = await pool.fetch(query("combine_claim"), limit, worker_id, lease_s)
    return [
        Claimed(
            batch_id=row["batch_id"],
            tenant=row["tenant"],
            attempt=row["attempts"],
            max_attempts=row["max_attempts"],
            outline=row["outline"],
            sign=row["sign"],
        )
        for row in rows
    ]


async def items(pool: asyncpg.Pool, batch_id: uuid.UUID) -> list[Item]:
    rows = await pool.fetch(query("combine_items"), batch_id)
    return [Item(row["key"], row["status"], row["object_key"]) for row in rows]


async def finish_done(
    pool: asyncpg.Pool, claimed: Claimed, *, worker_id: str, pages: int, size_bytes: int
) -> bool:
    """Record the stored file; False when the attempt is no longer this process's (rescued)."""
    done = await pool.fetchval(
        query("combine_done"),
        claimed.batch_id,
        worker_id,
        claimed.attempt,
        claimed.object_key,
        pages,
        size_bytes,
    )
    return done is not None


async def finish_failed(
    pool: asyncpg.Pool,
    claimed: Claimed,
    *,
    worker_id: str,
    error: str,
    retryable: bool,
    retry_in_s: float,
) -> CombineState | None:
    """Record a failed attempt: due again (backoff) or failed. None when no longer ours."""
    row = await pool.fetchrow(
        query("combine_failed"),
        claimed.batch_id,
        worker_id,
        claimed.attempt,
        error,
        retry_in_s,
        retryable,
    )
    return None if row is None else CombineState(row["status"])


async def heartbeat(
    pool: asyncpg.Pool, ids: Sequence[uuid.UUID], *, worker_id: str, lease_s: float
) -> set[uuid.UUID]:
    """Renew leases; return the batches whose join this process still holds."""
    rows = await pool.fetch(query("combine_heartbeat"), list(ids), worker_id, lease_s)
    return {row["batch_id"] for row in rows}


async def rescue_expired(pool: asyncpg.Pool, *, limit: int = 100) -> int:
    """Joins whose process stopped renewing the lease: due again (or failed); how many."""
    return len(await pool.fetch(query("combine_rescue"), limit))


async def release(pool: asyncpg.Pool, ids: Sequence[uuid.UUID], *, worker_id: str) -> int:
    """Hand unfinished joins back at shutdown, without charging the attempt."""
    if not ids:
        return 0
    return len(await pool.fetch(query("combine_release"), list(ids), worker_id))
