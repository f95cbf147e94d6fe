"""The dashboard's view of many jobs: a tenant's jobs that match a filter, a page of them, their
counts by state, and a retry or cancel of all of them in batches."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from server.errors import backoff_s
from server.queue.jobs import JobState, JsonDict, StoredJob, cancel_many, retry_many
from server.sql import query

log = logging.getLogger(__name__)

#: Hexadecimal digits of an id a search takes for the start of an id (fewer: no id matches).
MIN_ID_PREFIX = 4
_HEX = frozenset("0123456789abcdef")


@dataclasses.dataclass(frozen=True, slots=True)
class JobFilter:
    """Which of a tenant's jobs a list, its counts or a bulk action read. `q` finds a job by
    its id (whole, or its first MIN_ID_PREFIX or more digits), its idempotency key or the value
    of any key of its metadata."""

    status: JobState | None = None
    channel: str | None = None
    created_from: dt.datetime | None = None
    created_to: dt.datetime | None = None
    q: str | None = None
    #: Made from this stored template: (name, version), or (name, None) for every version.
    template: tuple[str, int | None] | None = None

    def id_range(self) -> tuple[uuid.UUID | None, uuid.UUID | None]:
        """The ids `q` is the start of, lowest and highest (None, None: q is not one)."""
        digits = (self.q or "").replace("-", "").lower()
        if not MIN_ID_PREFIX <= len(digits) <= 32 or not set(digits) <= _HEX:
            return None, None
        return uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))


@dataclasses.dataclass(frozen=True, slots=True)
class Listed:
    """A job of a page: as the API shows it, with where it comes from."""

    stored: StoredJob
    source: str
    page_url: str | None  # a page_url job's page
    template: str | None = None  # a stored template's job: name@version


@dataclasses.dataclass(frozen=True, slots=True)
class Page:
    items: list[Listed]
    next_cursor: tuple[dt.datetime, uuid.UUID] | None


async def list_page(
    pool: asyncpg.Pool,
    tenant: str,
    matching: JobFilter,
    *,
    after: tuple[dt.datetime, uuid.UUID] | None,
    limit: int,
) -> Page:
    """One page of a tenant's jobs that match, newest first."""
    rows = await pool.fetch(query("list_jobs"), *list_args(tenant, matching, after, limit + 1))
    items = [
        Listed(
            StoredJob(
                job=row["job"], status=JobState(row["job"]["status"]), object_key=row["object_key"]
            ),
            source=row["source"],
            page_url=row["page_url"],
            template=(
                f"{row['template_name']}@{row['template_version']}"
                if row["template_name"] is not None
                else None
            ),
        )
        for row in rows[:limit]
    ]
    next_cursor = (
        (rows[limit - 1]["created_at"], rows[limit - 1]["id"]) if len(rows) > limit else None
    )
    return Page(items=items, next_cursor=next_cursor)


async def count(pool: asyncpg.Pool, tenant: str, matching: JobFilter) -> dict[JobState, int]:
    """How many of a tenant's jobs match, by state (every state, 0 included); the filter's own
    state is not applied."""
    rows = await pool.fetch(query("count_jobs"), *count_args(tenant, matching))
    return {JobState(row["status"]): int(row["n"]) for row in rows}


def list_args(
    tenant: str,
    matching: JobFilter,
    after: tuple[dt.datetime, uuid.UUID] | None,
    rows: int,
) -> list[Any]:
    """The parameters of list_jobs: at most `rows` jobs that match, after the cursor."""
    low, high = matching.id_range()
    name, version = matching.template or (None, None)
    return [
        tenant,
        matching.status.value if matching.status else None,
        matching.created_from,
        matching.created_to,
        after[0] if after else None,
        after[1] if after else None,
        rows,
        matching.channel,
        matching.q,
        low,
        high,
        name,
        version,
    ]


def count_args(tenant: str, matching: JobFilter) -> list[Any]:
    """The parameters of count_jobs: the filter but its state, in every state."""
    low, high = matching.id_range()
    name, version = matching.template or (None, None)
    return [
        tenant,
        matching.created_from,
        matching.created_to,
        matching.channel,
        matching.q,
        low,
        high,
        [state.value for state in JobState],
        name,
        version,
    ]


#: Jobs one statement of a bulk action writes: no transaction holds more rows than this.
BULK_BATCH = 500
#: Tries after the first of a batch the database aborted for conflicting writes: a deadlock with
#: a worker's multi-row writes (done writes, lease renewals), or a serialization failure where
#: the server's default isolation is stricter than read committed. Those writes lock rows in
#: the heap order of a bitmap scan, not by id, so no ORDER BY here would avoid the deadlock. A
#: batch is one statement in its own transaction: an aborted try changed nothing (no job, no
#: event), and the next acts on the same jobs as if it were the first.
BULK_RETRIES = 3
BULK_RETRY_BASE_S = 0.05
BULK_RETRY_MAX_S = 0.5
CONFLICTS = (asyncpg.exceptions.DeadlockDetectedError, asyncpg.exceptions.SerializationError)
#: The states each bulk action applies to; the jobs in others are left as they are.
APPLIES_TO = {
    "retry": (JobState.FAILED,),
    "cancel": (JobState.QUEUED, JobState.RUNNING),
}


@dataclasses.dataclass(frozen=True, slots=True)
class BulkResult:
    matched: int  # jobs the filter matched when the action began
    applied: int  # retried or cancelled (with dry_run: those it would)
    skipped: int  # matched and left as they are


class BulkInterrupted(Exception):
    """A batch was still aborted for conflicting writes after BULK_RETRIES more tries; the
    `applied` jobs before it were acted on."""

    def __init__(self, action: str, applied: int) -> None:
        super().__init__(f"bulk {action} interrupted after {applied} jobs")
        self.action = action
        self.applied = applied


async def act_on_matching(
    pool: asyncpg.Pool,
    tenant: str,
    matching: JobFilter,
    action: str,
    *,
    dry_run: bool,
    batch: int = BULK_BATCH,
) -> BulkResult:
    """Retry or cancel every job that matches, in batches of `batch` jobs, each one statement
    (the single job's: each job gets its own event); with dry_run, count what it would do."""
    counts = await count(pool, tenant, matching)
    states = [s for s in counts if matching.status in (None, s)]
    matched = sum(counts[s] for s in states)
    targets = [s for s in APPLIES_TO[action] if s in states]
    if dry_run:
        applicable = sum(counts[s] for s in targets)
        return BulkResult(matched=matched, applied=applicable, skipped=matched - applicable)
    write = retry_many if action == "retry" else cancel_many
    applied = 0
    for state in targets:
        # Newest first, by the list's own cursor, so a job retried here that fails again
        # before the end is not picked a second time.
        after = None
        while True:
            page = await list_page(
                pool,
                tenant,
                dataclasses.replace(matching, status=state),
                after=after,
                limit=batch,
            )
            ids = [uuid.UUID(str(item.stored.job["id"])) for item in page.items]
            try:
                applied += await _write_batch(write, pool, ids, tenant)
            except CONFLICTS as exc:
                raise BulkInterrupted(action, applied) from exc
            if page.next_cursor is None:
                break
            after = page.next_cursor
    return BulkResult(matched=matched, applied=applied, skipped=max(matched - applied, 0))


async def _write_batch(
    write: Callable[[asyncpg.Pool, list[uuid.UUID], str], Awaitable[list[JsonDict]]],
    pool: asyncpg.Pool,
    ids: list[uuid.UUID],
    tenant: str,
) -> int:
    """How many of `ids` one batch's statement acted on, tried again while it is aborted for
    conflicting writes (CONFLICTS), up to BULK_RETRIES times."""
    retry = 0
    while True:
        try:
            return len(await write(pool, ids, tenant))
        except CONFLICTS as exc:
            retry += 1
            if retry > BULK_RETRIES:
                raise
            log.warning(
                "bulk batch of %d jobs aborted (%s), retry %d of %d",
                len(ids),
                exc.sqlstate,
                retry,
                BULK_RETRIES,
                extra={"tenant": tenant},
            )
            await asyncio.sleep(backoff_s(retry, base_s=BULK_RETRY_BASE_S, max_s=BULK_RETRY_MAX_S))
