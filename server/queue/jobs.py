"""Job states, rows, and the SQL of one job's life (the list, counts and bulk actions over many:
server/queue/listing.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import enum
import json
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import asyncpg

from server.access import signing
from server.options import outputs
from server.sql import query

JsonDict = dict[str, Any]
T = TypeVar("T")
R = TypeVar("R")


class JobState(enum.StrEnum):
    """Mirrors the jobs_status_known CHECK constraint."""

    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def final(self) -> bool:
        return self in (JobState.DONE, JobState.FAILED, JobState.CANCELLED)


@dataclasses.dataclass(frozen=True, slots=True)
class NewJob:
    """A validated submission, ready to insert. `template` is the source's text: Jinja2 HTML
    (source "template"), Jinja2 Markdown ("markdown") or the page's URL ("page_url")."""

    tenant: str
    template: str
    data: JsonDict
    options: JsonDict
    metadata: JsonDict
    max_attempts: int
    channel: str | None = None
    priority: int = 0
    webhook_url: str | None = None
    run_at: dt.datetime | None = None
    idempotency_key: str | None = None
    request_hash: str | None = None
    #: The files its page uses: path → {"id", "content_type"} (None: none, the usual case).
    assets: JsonDict | None = None
    id: uuid.UUID = dataclasses.field(default_factory=uuid.uuid4)
    source: str = "template"
    #: Cookie and header values, sealed for this job's id (server/pipeline/vault.py).
    secrets: bytes | None = None
    #: The W3C traceparent of the request that submitted it (None: tracing off).
    traceparent: str | None = None
    #: The stored template it is made from (template_id): its name and version (None: none).
    template_name: str | None = None
    template_version: int | None = None
    #: What makes its PDF, hashed, for a job that asked for the render cache (None: it did not):
    #: a done job of its tenant with the same key serves it (server/web/submission.py).
    cache_key: str | None = None


def object_key(
    tenant: str, job_id: uuid.UUID | str, attempt: int, output: outputs.Output = outputs.PDF
) -> str:
    """Where an attempt's file (its PDF or image) is stored. One key per attempt: a late result
    of an abandoned attempt can then be deleted without touching the file of the attempt that
    won."""
    return f"{tenant}/{job_id}/{attempt}.{output.extension}"


@dataclasses.dataclass(frozen=True, slots=True)
class JobFile:
    """One file an attempt of a job stores: where, and how it is downloaded."""

    key: str
    filename: str
    output: outputs.Output
    route: str  # its download route under /v1/jobs/{id}/ (signing.DOCUMENT or THUMBNAIL)


def job_files(
    tenant: str, job_id: uuid.UUID | str, attempt: int, options: JsonDict
) -> list[JobFile]:
    """The files an attempt of a job with these stored options writes: its document (the PDF
    or the image), then the thumbnail of its first page when the options ask for one."""
    output = outputs.of(options)
    files = [
        JobFile(
            object_key(tenant, job_id, attempt, output),
            f"{job_id}.{output.extension}",
            output,
            signing.DOCUMENT,
        )
    ]
    if outputs.wants_thumbnail(options):
        thumbnail = outputs.THUMBNAIL
        files.append(
            JobFile(
                f"{tenant}/{job_id}/{attempt}-thumbnail.{thumbnail.extension}",
                f"{job_id}-thumbnail.{thumbnail.extension}",
                thumbnail,
                signing.THUMBNAIL,
            )
        )
    return files


@dataclasses.dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A job this worker now holds for one attempt."""

    id: uuid.UUID
    tenant: str
    template: str
    data: JsonDict
    options: JsonDict
    attempt: int
    max_attempts: int
    assets: JsonDict | None = None  # as NewJob.assets
    source: str = "template"
    secrets: bytes | None = None
    traceparent: str | None = None  # as NewJob.traceparent
    #: Its stored template (as NewJob's), for the provenance of its PDF.
    template_name: str | None = None
    template_version: int | None = None

    @property
    def key(self) -> uuid.UUID:
        return self.id

    @property
    def log_extra(self) -> dict[str, str]:
        return {"job_id": str(self.id), "tenant": self.tenant}

    @property
    def object_key(self) -> str:
        return object_key(self.tenant, self.id, self.attempt, outputs.of(self.options))

    def files(self, attempt: int | None = None) -> list[JobFile]:
        """The files this attempt (or another attempt of the job) writes."""
        return job_files(self.tenant, self.id, attempt or self.attempt, self.options)


@dataclasses.dataclass(frozen=True, slots=True)
class StoredJob:
    """A job as read for the API: its public JSON plus what only the server needs."""

    job: JsonDict
    status: JobState
    object_key: str | None


async def create(conn: asyncpg.Connection | asyncpg.Pool, new: list[NewJob]) -> list[JsonDict]:
    """Insert jobs and their job.queued events in one transaction, with one NOTIFY; a job whose
    cache key a done job of its tenant has is inserted done with that job's file, and its
    job.done event (the render cache)."""
    rows = await conn.fetch(
        query("insert_jobs"),
        *job_columns(new),
        [j.idempotency_key for j in new],
        [j.request_hash for j in new],
        [j.assets for j in new],
        *source_columns(new),
        [j.channel for j in new],
        [j.traceparent for j in new],
        *template_columns(new),
        [j.cache_key for j in new],
    )
    by_id = {row["id"]: row["job"] for row in rows}
    return [by_id[j.id] for j in new]


def job_columns(new: list[NewJob]) -> list[list[Any]]:
    """The first ten parameters of insert_jobs and insert_batch_jobs: one array per column,
    one element per job (the channels go last, `[j.channel for j in new]`)."""
    return [
        [j.id for j in new],
        [j.tenant for j in new],
        [j.template for j in new],
        [j.data for j in new],
        [j.options for j in new],
        [j.metadata for j in new],
        [j.webhook_url for j in new],
        [j.priority for j in new],
        [j.max_attempts for j in new],
        [j.run_at for j in new],
    ]


def source_columns(new: list[NewJob]) -> list[list[Any]]:
    """The last two parameters of insert_jobs and insert_batch_jobs: each job's source and
    sealed secrets."""
    return [[j.source for j in new], [j.secrets for j in new]]


def template_columns(new: list[NewJob]) -> list[list[Any]]:
    """The final two parameters of insert_jobs and insert_batch_jobs: the name and version of
    each job's stored template (None for a job made from none)."""
    return [[j.template_name for j in new], [j.template_version for j in new]]


def _claimed(row: asyncpg.Record) -> ClaimedJob:
    return ClaimedJob(
        id=row["id"],
        tenant=row["tenant"],
        template=row["template"],
        data=row["data"],
        options=row["options"],
        attempt=row["attempts"],
        max_attempts=row["max_attempts"],
        assets=row["assets"],
        source=row["source"],
        secrets=row["secrets"],
        traceparent=row["traceparent"],
        template_name=row["template_name"],
        template_version=row["template_version"],
    )


async def claim(
    pool: asyncpg.Pool, *, limit: int, worker_id: str, lease_s: float
) -> list[ClaimedJob]:
    """Claim up to `limit` due jobs in one statement; the attempt is counted here."""
    rows = await pool.fetch(query("claim_jobs"), limit, worker_id, lease_s)
    return [_claimed(row) for row in rows]


async def finish_done(
    pool: asyncpg.Pool,
    job: ClaimedJob,
    *,
    worker_id: str,
    size_bytes: int,
    pages: int | None,
    warnings: list[str],
    phases: dict[str, float] | None = None,
) -> bool:
    """Mark the attempt done; False when the job is no longer this attempt's (cancelled,
    rescued)."""
    [done] = await finish_done_many(
        pool, [Done(job, size_bytes, pages, warnings, phases)], worker_id=worker_id
    )
    return done


async def finish_done_many(pool: asyncpg.Pool, done: list[Done], *, worker_id: str) -> list[bool]:
    """Mark several attempts done in one statement; per attempt, False when the job is no
    longer that attempt's (cancelled, rescued), True again for one it already finished."""
    rows = await pool.fetch(
        query("finish_done_many"),
        [d.job.id for d in done],
        worker_id,
        [d.job.attempt for d in done],
        [d.job.object_key for d in done],
        [d.size_bytes for d in done],
        [d.pages for d in done],
        [json.dumps(d.warnings) for d in done],
        [json.dumps(attempt_phases(d.job, d.phases)) if d.phases else None for d in done],
        [_json_or_none(d.finishing) for d in done],
        [_json_or_none(d.provenance) for d in done],
        [_json_or_none(d.preflight) for d in done],
    )
    finished = {row["id"] for row in rows}
    return [d.job.id in finished for d in done]


async def finish_failed(
    pool: asyncpg.Pool,
    job: ClaimedJob,
    *,
    worker_id: str,
    error: str,
    retryable: bool,
    retry_in_s: float,
    warnings: list[str],
    phases: dict[str, float] | None = None,
) -> JobState | None:
    """Record a failed attempt: queued again (backoff) or failed. None when no longer ours."""
    row = await pool.fetchrow(
        query("finish_failed"),
        job.id,
        worker_id,
        job.attempt,
        error,
        retry_in_s,
        retryable,
        warnings,
        attempt_phases(job, phases),
    )
    return None if row is None else JobState(row["status"])


def attempt_phases(job: ClaimedJob, phases: dict[str, float] | None) -> JsonDict | None:
    """The seconds an attempt spent in each phase, as the statement that ends it writes them:
    tagged with its number, which jobs_record_attempt checks (0032)."""
    return None if phases is None else {"attempt": job.attempt, **phases}


def _json_or_none(value: Any) -> str | None:
    return None if value is None else json.dumps(value)


async def heartbeat(
    pool: asyncpg.Pool, ids: list[uuid.UUID], *, worker_id: str, lease_s: float
) -> set[uuid.UUID]:
    """Renew leases; return the ids this worker still holds."""
    rows = await pool.fetch(query("heartbeat"), ids, worker_id, lease_s)
    return {row["id"] for row in rows}


async def rescue_expired(pool: asyncpg.Pool, *, limit: int = 100) -> int:
    """Re-queue (or fail) jobs whose lease ran out; returns how many."""
    return len(await pool.fetch(query("rescue_expired"), limit))


async def release(pool: asyncpg.Pool, ids: list[uuid.UUID], *, worker_id: str) -> int:
    """Hand unfinished jobs back to the queue at shutdown, without charging the attempt."""
    if not ids:
        return 0
    return len(await pool.fetch(query("release_jobs"), ids, worker_id))


async def cancel(pool: asyncpg.Pool, job_id: uuid.UUID, tenant: str) -> JsonDict | None:
    """Cancel a queued or running job; None when it is unknown or already final."""
    cancelled = await cancel_many(pool, [job_id], tenant)
    return cancelled[0] if cancelled else None


async def retry(pool: asyncpg.Pool, job_id: uuid.UUID, tenant: str) -> JsonDict | None:
    """Re-queue a failed job with fresh attempts; None when it is unknown or not failed."""
    requeued = await retry_many(pool, [job_id], tenant)
    return requeued[0] if requeued else None


async def cancel_many(pool: asyncpg.Pool, ids: list[uuid.UUID], tenant: str) -> list[JsonDict]:
    """Cancel those of the jobs that are queued or running, each with its job.cancelled."""
    rows = await pool.fetch(query("cancel_jobs"), ids, tenant)
    return [dict(row["job"]) for row in rows]


async def retry_many(pool: asyncpg.Pool, ids: list[uuid.UUID], tenant: str) -> list[JsonDict]:
    """Re-queue those of the jobs that failed (and kept no secrets), each with its job.queued."""
    rows = await pool.fetch(query("retry_jobs"), ids, tenant)
    return [dict(row["job"]) for row in rows]


async def get(
    conn: asyncpg.Connection | asyncpg.Pool, job_id: uuid.UUID, tenant: str
) -> StoredJob | None:
    row = await conn.fetchrow(query("get_job"), job_id, tenant)
    if row is None:
        return None
    return StoredJob(job=row["job"], status=JobState(row["status"]), object_key=row["object_key"])


async def next_due_at(pool: asyncpg.Pool) -> dt.datetime | None:
    """When the earliest queued job is due (None when the queue is empty)."""
    value: dt.datetime | None = await pool.fetchval(query("next_due_at"))
    return value


class Batcher(Generic[T, R]):
    """Runs concurrent calls together: `run` gets every item waiting and answers each.

    A lone call runs at once. While a run is in flight, new calls wait for it and then go
    together in the next one, so batches grow with load and shrink to one when the server is
    quiet; nobody waits on a timer. A failed batch is retried item by item, so one bad item
    fails only its own caller.
    """

    def __init__(
        self, run: Callable[[list[T]], Awaitable[list[R]]], *, name: str, max_batch: int = 500
    ) -> None:
        self._run = run
        self._name = name
        self._max_batch = max_batch
        self._waiting: list[tuple[T, asyncio.Future[R]]] = []
        self._flusher: asyncio.Task[None] | None = None  # a strong reference keeps it alive
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.append((item, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush(), name=self._name)
        return await future

    async def _flush(self) -> None:
        while self._waiting:
            batch = self._waiting[: self._max_batch]
            self._waiting = self._waiting[self._max_batch :]
            await self._run_batch(batch)

    async def _run_batch(self, batch: list[tuple[T, asyncio.Future[R]]]) -> None:
        try:
            results = await self._run([item for item, _ in batch])
        except Exception as exc:
            if len(batch) == 1:
                if not batch[0][1].done():
                    batch[0][1].set_exception(exc)
                return
            for one in batch:
                await self._run_batch([one])
            return
        self.batches += 1
        self.items += len(batch)
        for (_, future), result in zip(batch, results, strict=True):
            if not future.done():
                future.set_result(result)


class GroupCommit(Batcher[NewJob, JsonDict]):
    """Concurrent submissions inserted together: one statement, one transaction, one NOTIFY."""

    def __init__(self, pool: asyncpg.Pool, *, max_batch: int = 500) -> None:
        super().__init__(lambda new: create(pool, new), name="group-commit", max_batch=max_batch)

    async def create(self, new: NewJob) -> JsonDict:
        """Insert one job (with its event and NOTIFY) and return its public JSON."""
        return await self.submit(new)

    @property
    def inserted(self) -> int:
        return self.items


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    """A finished attempt, ready to be recorded."""

    job: ClaimedJob
    size_bytes: int
    pages: int | None  # None for an image
    warnings: list[str]
    #: The seconds it spent in each phase it went through (template, render, finishing, store).
    phases: dict[str, float] | None = None
    #: What the job shows of its PDF: what finishing did (`finishing`), what made it
    #: (`provenance`), what preflight found (`preflight`); None: nothing to say.
    finishing: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    preflight: list[dict[str, Any]] | None = None


class DoneRecorder(Batcher[Done, bool]):
    """Concurrent `done` writes of one worker recorded together in one statement."""

    def __init__(self, pool: asyncpg.Pool, *, worker_id: str) -> None:
        super().__init__(
            lambda done: finish_done_many(pool, done, worker_id=worker_id), name="finish-done"
        )
