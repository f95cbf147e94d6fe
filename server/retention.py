"""Retention: jobs finished more than PRESSROOM_RETENTION_DAYS ago lose files (documents and
thumbnails), then rows; so do batches whose combined PDF was finished that long ago (the file,
then the batch, whose jobs stay theirs to the sweep above).

server/maintenance.py runs the sweep hourly in every process; one at a time sweeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path

import asyncpg

from server import combine, jobs
from server.errors import StorageError
from server.sql import query
from server.storage import LocalStorage, Storage

log = logging.getLogger(__name__)

# Any fixed number works; it only has to be the same in every Pressroom process.
RETENTION_LOCK = 0x70726574
BATCH = 100
DELETE_CONCURRENCY = 8


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
    return row["id"], attempt_keys(row), Path(row["tenant"], str(row["id"]))


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
