"""Retention: jobs finished more than PRESSROOM_RETENTION_DAYS ago lose files (documents and
thumbnails; not a file that a job kept points at too, served from the render cache), then
rows; so do batches whose combined PDF was finished that long ago (the file, then the batch,
whose jobs stay theirs to the sweep above), and a tenant's own webhook deliveries settled that
long ago (a job's and a batch's go with it). The event log is pruned apart
from them, by dropping whole partitions of it (0017_event_log_partitions.sql), and kept ahead
of its writers the same way.

server/queue/maintenance.py runs these passes in every process; one at a time runs each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import asyncpg

from server.errors import StorageError
from server.files.storage import LocalStorage, Storage
from server.queue import combine, jobs
from server.sql import query

log = logging.getLogger(__name__)

# Any fixed number works; it only has to be the same in every Pressroom process.
RETENTION_LOCK = 0x70726574
BATCH = 100
DELETE_CONCURRENCY = 8

# The log's own lock, so that a sweep never holds back its partitions.
EVENT_LOG_LOCK = 0x70726576
#: How long the log keeps events for replay: a client away over a long weekend still resumes
#: from its cursor; one away longer gets a `reset` with the job's state, which it needs anyway.
EVENT_RETENTION_S = 7 * 24 * 3600
#: A partition of the log fills for about this share of the time events are kept, and at
#: least an hour: so the log spans a handful of partitions (fewer to plan for the reads that
#: cannot skip them, from an old cursor), and an event goes at most that share of the keep
#: time late.
LOG_STRETCHES = 4
MIN_STRETCH_S = 3600
#: The fewest ids a new partition spans (a quiet log), so a burst after a quiet stretch rarely
#: outruns the ranges before the next pass (it would land in the overflow partition).
MIN_PARTITION_IDS = 10_000
#: How long a pass waits for the log's locks before it gives up and tries again later: the
#: writers and readers that queue behind a waiting DROP wait no longer than this.
LOG_LOCK_TIMEOUT = "1s"


def stretch_s(keep_s: int) -> int:
    """The time one partition of a log that keeps events `keep_s` seconds fills for."""
    return max(MIN_STRETCH_S, keep_s // LOG_STRETCHES)


async def extend_log(pool: asyncpg.Pool, *, stretch_s: int) -> int | None:
    """Make the log's partitions ahead of its writers (and close one that has filled for
    longer than `stretch_s`); how many were made, or None when another process is at it."""
    async with _log_pass(pool) as conn:
        if conn is None:
            return None
        made: int = await conn.fetchval(query("extend_event_log"), stretch_s, MIN_PARTITION_IDS)
        return made


async def prune_log(pool: asyncpg.Pool, *, keep_s: int) -> list[str] | None:
    """Drop the log's partitions whose newest event is older than `keep_s` seconds; their
    names, or None when another process is at it."""
    async with _log_pass(pool) as conn:
        if conn is None:
            return None
        return [row[0] for row in await conn.fetch(query("prune_event_log"), keep_s)]


@contextlib.asynccontextmanager
async def _log_pass(pool: asyncpg.Pool) -> AsyncIterator[asyncpg.Connection | None]:
    """A transaction holding the log's lock, its waits for table locks bounded; None when
    another process holds it."""
    async with pool.acquire() as conn, conn.transaction():
        if not await conn.fetchval(query("retention_lock"), EVENT_LOG_LOCK):
            yield None
            return
        await conn.execute(f"SET LOCAL lock_timeout = '{LOG_LOCK_TIMEOUT}'")
        yield conn


def attempt_keys(row: asyncpg.Record) -> set[str]:
    """Every key an attempt of this job may have written (its document, and its thumbnail when
    asked for): retries and rescues each get their own."""
    last = max(row["attempts"], row["max_attempts"])
    keys = {
        file.key
        for attempt in range(1, last + 1)
        for file in jobs.job_files(row["tenant"], row["id"], attempt, row["options"])
    }
    if row["object_key"]:
        keys.add(row["object_key"])
    return keys


#: What one expired row stands for: its id, the keys of its files, the folder they are in.
Expired = tuple[object, set[str], Path]


def _job_files(row: asyncpg.Record) -> Expired:
    keys = attempt_keys(row)
    if row["shared"]:
        # A job kept points at its file (the render cache): that file stays.
        keys.discard(row["object_key"])
    return row["id"], keys, Path(row["tenant"], str(row["id"]))


def _combined_files(row: asyncpg.Record) -> Expired:
    tenant, batch_id = row["tenant"], row["batch_id"]
    keys = combine.attempt_keys(tenant, batch_id, row["attempts"], row["max_attempts"])
    return batch_id, keys, Path(tenant, "batches", str(batch_id))


async def sweep(pool: asyncpg.Pool, storage: Storage, *, older_than_days: int) -> int | None:
    """Delete expired jobs batch by batch, files first; None when another process is sweeping.

    A batch's rows stay locked while their files go, so a manual retry cannot slip in between;
    a job whose files cannot be deleted keeps its row and is tried again at the next sweep."""
    return await _sweep(pool, storage, older_than_days, ("expired_jobs", "delete_jobs"), _job_files)


async def sweep_batches(
    pool: asyncpg.Pool, storage: Storage, *, older_than_days: int
) -> int | None:
    """Delete batches whose combined PDF is final since before retention, its files first, as
    `sweep` does jobs (the batch's jobs are that sweep's)."""
    return await _sweep(
        pool, storage, older_than_days, ("expired_combines", "delete_batches"), _combined_files
    )


async def sweep_tenant_deliveries(pool: asyncpg.Pool, *, older_than_days: int) -> int:
    """Delete a tenant's own webhook deliveries (no job, no batch: template.published) settled
    before retention, their attempts with them; a job's and a batch's go with it. How many."""
    status: str = await pool.execute(query("delete_tenant_deliveries"), older_than_days)
    return int(status.rsplit(" ", 1)[-1])


async def _sweep(
    pool: asyncpg.Pool,
    storage: Storage,
    older_than_days: int,
    statements: tuple[str, str],
    files_of: Callable[[asyncpg.Record], Expired],
) -> int | None:
    expired, delete_rows = statements
    total = 0
    while True:
        async with pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(query("retention_lock"), RETENTION_LOCK):
                return total or None
            rows = await conn.fetch(query(expired), older_than_days, BATCH)
            deleted = await _delete_files(storage, [files_of(row) for row in rows])
            if deleted:
                await conn.execute(query(delete_rows), deleted)
        total += len(deleted)
        if len(rows) < BATCH or len(deleted) < len(rows):
            return total


async def _delete_files(storage: Storage, files: list[Expired]) -> list[object]:
    """The ids of those (id, keys, folder) whose every file is gone now."""
    gate = asyncio.Semaphore(DELETE_CONCURRENCY)

    async def delete(key: str) -> None:
        async with gate:
            await storage.delete(key)

    async def delete_all(subject: object, keys: set[str], folder: Path) -> bool:
        try:
            await asyncio.gather(*(delete(key) for key in sorted(keys)))
        except StorageError as exc:
            log.warning("retention could not delete a file of %s: %s", subject, exc)
            return False
        if isinstance(storage, LocalStorage):
            # Its folder is empty now; leave no empty folder per job or batch behind.
            with contextlib.suppress(OSError):
                await asyncio.to_thread(Path.rmdir, storage.root / folder)
        return True

    results = await asyncio.gather(*(delete_all(*entry) for entry in files))
    return [entry[0] for entry, ok in zip(files, results, strict=True) if ok]
