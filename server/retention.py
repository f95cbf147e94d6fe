"""Retention: jobs finished more than PRESSROOM_RETENTION_DAYS ago lose files (documents and
thumbnails), then rows.

server/maintenance.py runs the sweep hourly in every process; one at a time sweeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import asyncpg

from server import jobs
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


async def sweep(pool: asyncpg.Pool, storage: Storage, *, older_than_days: int) -> int | None:
    """Delete expired jobs batch by batch, files first; None when another process is sweeping.

    A batch's rows stay locked while their files go, so a manual retry cannot slip in between;
    a job whose files cannot be deleted keeps its row and is tried again at the next sweep."""
    total = 0
    while True:
        async with pool.acquire() as conn, conn.transaction():
            if not await conn.fetchval(query("retention_lock"), RETENTION_LOCK):
                return total or None
            rows = await conn.fetch(query("expired_jobs"), older_than_days, BATCH)
            deleted = await _delete_files(storage, rows)
            if deleted:
                await conn.execute(query("delete_jobs"), deleted)
        total += len(deleted)
        if len(rows) < BATCH or len(deleted) < len(rows):
            return total


async def _delete_files(storage: Storage, rows: list[asyncpg.Record]) -> list[object]:
    """The ids of jobs whose every file is gone now."""
    gate = asyncio.Semaphore(DELETE_CONCURRENCY)

    async def delete(key: str) -> None:
        async with gate:
            await storage.delete(key)

    async def delete_job(row: asyncpg.Record) -> bool:
        try:
            await asyncio.gather(*(delete(key) for key in sorted(attempt_keys(row))))
        except StorageError as exc:
            log.warning(
                "retention could not delete a file: %s", exc, extra={"job_id": str(row["id"])}
            )
            return False
        if isinstance(storage, LocalStorage):
            # The job's folder is empty now; leave no empty folder per job behind.
            folder = storage.root / row["tenant"] / str(row["id"])
            with contextlib.suppress(OSError):
                await asyncio.to_thread(Path.rmdir, folder)
        return True

    results = await asyncio.gather(*(delete_job(row) for row in rows))
    return [row["id"] for row, ok in zip(rows, results, strict=True) if ok]
