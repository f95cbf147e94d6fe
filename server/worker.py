"""Render slots: claim → render → store → finish, with heartbeats, rescue and cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Callable

import asyncpg

from server import jobs, options, templates
from server.errors import DB_ERRORS, PermanentError, RenderError, backoff_s
from server.events import JobEvent
from server.jobs import ClaimedJob, JobState
from server.metrics import Metrics
from server.render import Renderer
from server.storage import Storage

log = logging.getLogger(__name__)

FINISH_RETRY_S = 0.5
STOP_CLAIM_WAIT_S = 5.0


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerConfig:
    slots: int
    lease_s: float
    render_timeout_s: float
    poll_interval_s: float
    retry_base_s: float
    retry_max_s: float
    shutdown_grace_s: float
    max_pages: int = 1000
    #: Jobs claimed beyond the free render slots: each is prepared (options, template) while
    #: Chromium prints the others, and starts the moment a slot frees. Such a job waits for
    #: this process even when another process has a slot free, hence 0 unless asked.
    prefetch: int = 0
    #: A slot whose page loaded within this many seconds is about to free when it starts
    #: printing: the next job is claimed then, so that its claim and its template are done
    #: when the slot frees, instead of after (the print of a page that loads quickly is short
    #: too, so the job claimed waits briefly). 0: claim only for a free slot.
    claim_while_printing_s: float = 0.0


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Workers:
    """The render slots of one process."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        renderer: Renderer,
        storage: Storage,
        config: WorkerConfig,
        *,
        worker_id: str | None = None,
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._pool = pool
        self._renderer = renderer
        self._storage = storage
        self._config = config
        self.worker_id = worker_id or new_worker_id()
        # Renders that finish together are recorded done in one statement.
        self._done = jobs.DoneRecorder(pool, worker_id=self.worker_id)
        self._wake = asyncio.Event()
        self._running: dict[uuid.UUID, asyncio.Task[None]] = {}
        # Jobs past their render (storing the file, recording done): they hold no render slot,
        # so the next job renders while this one is written.
        self._rendered: set[uuid.UUID] = set()
        # Jobs holding a render slot now (Chromium prints them).
        self._rendering: set[uuid.UUID] = set()
        # Of those, the ones printing a page that loaded quickly: each lets one more job be
        # claimed, to take its slot when the print ends (claim_while_printing_s).
        self._printing: set[uuid.UUID] = set()
        self._slots = asyncio.Semaphore(config.slots)
        self._aborted: set[uuid.UUID] = set()
        # Slots promised to jobs being inserted by this process right now (hand-off).
        self._reserved = 0
        # Handed-off jobs, started while their rows were being inserted: whether the insert
        # committed (see jobs.HandOff.take). Kept until the job's task ends.
        self._inserting: dict[uuid.UUID, asyncio.Future[bool]] = {}
        # Waiting with nothing to do: the last claim found fewer due jobs than free slots.
        self._idle = False
        self._stopping = False
        # Clear while the claim loop runs: stop() waits for a claim in flight to come back, so
        # the jobs it took are known (and handed back) instead of left running on a lease.
        self._loop_done = asyncio.Event()
        self._loop_done.set()
        self.rendered = 0
        self.handed_off = 0

    def wake(self) -> None:
        """New work may be due (a NOTIFY, a finished slot): claim now instead of at the poll."""
        self._wake.set()

    def on_event(self, event: JobEvent) -> None:
        """Abort a render whose job was cancelled, whichever process took the request."""
        if event.type == "job.cancelled":
            self._abort(event.job_id, "cancelled")

    def _abort(self, job_id: uuid.UUID, why: str) -> None:
        if job_id in self._rendered:
            # Past its render: the finish statement itself refuses a job that is no longer
            # this attempt's (and the file is then deleted), so let it run to the end.
            return
        task = self._running.get(job_id)
        if task is not None and not task.done():
            log.info("aborting render (%s)", why, extra={"job_id": str(job_id)})
            self._aborted.add(job_id)
            task.cancel()

    @property
    def busy(self) -> int:
        return len(self._running)

    @property
    def idle(self) -> bool:
        """Waiting for work with a slot free: a job inserted by this process now is handed off."""
        return (
            self._idle
            and not self._stopping
            and not self._wake.is_set()
            and self._free(self._config.slots) > 0
        )

    @property
    def lease_s(self) -> float:
        return self._config.lease_s

    def reserve(self, wanted: int) -> int:
        """Slots for jobs this process is inserting right now, which then skip the NOTIFY,
        the claim and its commit (see jobs.create). Granted only while this worker is idle:
        its last claim found no more due jobs and no wake-up has come since, so a job taken
        this way passes none that waits in the queue."""
        if not self.idle:
            return 0
        granted = min(wanted, self._free(self._config.slots))
        self._reserved += granted
        return granted

    def take(self, handed: list[ClaimedJob], inserted: asyncio.Future[bool]) -> None:
        """Start the jobs given the slots just reserved while their rows are inserted: the
        template and the render run meanwhile; storing and recording wait for `inserted`."""
        self._reserved -= len(handed)
        for job in handed:
            self._inserting[job.id] = inserted
            self._start(job)
        inserted.add_done_callback(lambda _f: self._inserted(handed, inserted.result()))

    def _inserted(self, handed: list[ClaimedJob], committed: bool) -> None:
        if not committed:
            for job in handed:
                self._abort(job.id, "its insert failed")
            return
        self.handed_off += len(handed)
        self._metrics.jobs_started.labels("hand_off").inc(len(handed))
        for job in handed:
            self._announce(job)

    async def _exists(self, job: ClaimedJob) -> bool:
        """Whether the job's row is there to record to: False only for a handed-off job whose
        insert failed (it never existed; nothing of its render is kept)."""
        inserting = self._inserting.get(job.id)
        # Shielded: the future is shared by the jobs of one insert, and cancelling this task
        # (an abort, a shutdown) must not cancel it for the others or for the inserter.
        return inserting is None or await asyncio.shield(inserting)

    def _held(self, job_id: uuid.UUID) -> bool:
        """Whether the row says this worker holds the job: not yet for a handed-off job whose
        insert has not committed (a heartbeat would find no row and abort it)."""
        inserting = self._inserting.get(job_id)
        return inserting is None or (inserting.done() and inserting.result())

    def _free(self, capacity: int) -> int:
        """Slots of `capacity` not held by a job before its render ends or promised to one."""
        return capacity - (len(self._running) - len(self._rendered)) - self._reserved

    async def run(self) -> None:
        """Claim while slots are free; sleep until woken, a slot frees, or the jittered poll."""
        self._loop_done.clear()
        try:
            await self._claim_loop()
        finally:
            self._loop_done.set()

    async def _claim_loop(self) -> None:
        while not self._stopping:
            # Cleared before looking, so a wake-up that arrives while claiming is not lost
            # and a set flag never turns this loop into a spin while every slot is busy.
            self._wake.clear()
            self._idle = False
            free = self._free(self._config.slots + self._config.prefetch + len(self._printing))
            if free > 0:
                claimed: list[ClaimedJob] = []
                try:
                    with self._metrics.claim_seconds.time():
                        claimed = await jobs.claim(
                            self._pool,
                            limit=free,
                            worker_id=self.worker_id,
                            lease_s=self._config.lease_s,
                        )
                except (*DB_ERRORS, asyncpg.PostgresError) as exc:
                    log.warning("claim failed: %s", exc)
                else:
                    self._idle = len(claimed) < free
                    self._metrics.jobs_started.labels("claim").inc(len(claimed))
                for job in claimed:
                    self._announce(job)
                    self._start(job)
                if claimed and len(claimed) == free:
                    continue  # the queue may hold more: claim again as soon as a slot frees
            poll_s = self._config.poll_interval_s * random.uniform(0.5, 1.5)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_s):
                    await self._wake.wait()

    def _announce(self, job: ClaimedJob) -> None:
        log.info(
            "job running (attempt %s/%s)",
            job.attempt,
            job.max_attempts,
            extra={"job_id": str(job.id), "tenant": job.tenant},
        )

    def _start(self, job: ClaimedJob) -> None:
        task = asyncio.create_task(self._run_job(job), name=f"render-{job.id}")
        self._running[job.id] = task
        task.add_done_callback(lambda _t: self._finished(job.id))

    def _finished(self, job_id: uuid.UUID) -> None:
        self._running.pop(job_id, None)
        self._inserting.pop(job_id, None)
        self._rendered.discard(job_id)
        self._aborted.discard(job_id)
        self._wake.set()

    def _printing_callback(self, job_id: uuid.UUID) -> Callable[[], None] | None:
        """What the renderer calls when the page is loaded and printing begins: a quick load
        means a short print, so the slot's next job is claimed now (claim_while_printing_s)."""
        limit_s = self._config.claim_while_printing_s
        if limit_s <= 0:
            return None
        started = time.monotonic()

        def printing() -> None:
            if time.monotonic() - started <= limit_s and job_id in self._rendering:
                self._printing.add(job_id)
                # The last claim found the queue empty and nothing woke the loop since (a new
                # job would have: its NOTIFY): the claim then can wait for that wake-up.
                if not (self._idle and not self._wake.is_set()):
                    self._wake.set()

        return printing

    async def _run_job(self, job: ClaimedJob) -> None:
        warnings: list[str] = []
        try:
            render_options = options.parse(job.options)
            html = await templates.render_async(
                job.template, job.data, timeout_s=self._config.render_timeout_s
            )
            async with self._slots:
                self._rendering.add(job.id)
                try:
                    with self._metrics.render_seconds.time():
                        result = await self._renderer.render(
                            html,
                            render_options,
                            timeout_s=self._config.render_timeout_s,
                            on_print=self._printing_callback(job.id),
                        )
                finally:
                    self._rendering.discard(job.id)
                    self._printing.discard(job.id)
            warnings = result.warnings
            if result.pages > self._config.max_pages:
                limit = self._config.max_pages
                raise PermanentError(f"the PDF has more than {limit} pages, the limit")
            self._rendered.add(job.id)
            self._wake.set()
            if not await self._exists(job):
                return
            await self._storage.put(job.object_key, result.pdf, filename=f"{job.id}.pdf")
        except asyncio.CancelledError:
            if job.id in self._aborted:
                log.info("render aborted", extra={"job_id": str(job.id), "tenant": job.tenant})
                self._metrics.jobs_finished.labels("aborted").inc()
                return  # the job is no longer ours (cancelled or rescued): nothing to record
            raise
        except RenderError as exc:
            await self._fail(job, str(exc), retryable=exc.retryable, warnings=warnings)
            return
        except options.OptionsError as exc:
            await self._fail(job, f"invalid options: {exc}", retryable=False, warnings=warnings)
            return
        except Exception as exc:
            log.exception("render crashed", extra={"job_id": str(job.id), "tenant": job.tenant})
            await self._fail(
                job, f"internal error: {type(exc).__name__}", retryable=True, warnings=warnings
            )
            return
        # The bytes are durable; now the final write. Shielded so that a shutdown cannot cut
        # it in half: the job either is done or stays running until its lease is rescued.
        done = await asyncio.shield(self._finish_done(job, len(result.pdf), result.pages, warnings))
        self.rendered += 1
        if not done:
            log.info("late result discarded", extra={"job_id": str(job.id), "tenant": job.tenant})
            with contextlib.suppress(Exception):
                await self._storage.delete(job.object_key)
            return
        # Earlier attempts of this job may have stored a file before their worker died.
        for attempt in range(1, job.attempt):
            with contextlib.suppress(Exception):
                await self._storage.delete(jobs.object_key(job.tenant, job.id, attempt))

    async def _finish_done(
        self, job: ClaimedJob, size: int, pages: int, warnings: list[str]
    ) -> bool:
        while True:
            try:
                ok = await self._done.submit(jobs.Done(job, size, pages, warnings))
            except DB_ERRORS as exc:
                # The database is away; the file is stored, so keep trying while the lease
                # would still be ours. After that the rescuer re-runs the job.
                log.warning(
                    "could not record done, retrying: %s", exc, extra={"job_id": str(job.id)}
                )
                await asyncio.sleep(FINISH_RETRY_S)
                continue
            if ok:
                log.info("job done", extra={"job_id": str(job.id), "tenant": job.tenant})
                self._metrics.jobs_finished.labels("done").inc()
            return ok

    async def _fail(
        self, job: ClaimedJob, error: str, *, retryable: bool, warnings: list[str]
    ) -> None:
        if not await self._exists(job):
            return
        retry_in_s = backoff_s(
            job.attempt, base_s=self._config.retry_base_s, max_s=self._config.retry_max_s
        )
        while True:
            try:
                state = await asyncio.shield(
                    jobs.finish_failed(
                        self._pool,
                        job,
                        worker_id=self.worker_id,
                        error=error,
                        retryable=retryable,
                        retry_in_s=retry_in_s,
                        warnings=warnings,
                    )
                )
                break
            except DB_ERRORS as exc:
                log.warning("could not record failure, retrying: %s", exc)
                await asyncio.sleep(FINISH_RETRY_S)
        extra = {"job_id": str(job.id), "tenant": job.tenant}
        if state is JobState.QUEUED:
            log.info("job retrying in %.1f s: %s", retry_in_s, error, extra=extra)
            self._metrics.jobs_finished.labels("retrying").inc()
        elif state is JobState.FAILED:
            log.info("job failed: %s", error, extra=extra)
            self._metrics.jobs_finished.labels("failed").inc()

    async def heartbeat(self) -> None:
        """Renew the leases of running jobs; abort those this worker no longer holds."""
        interval_s = self._config.lease_s / 3
        while True:
            await asyncio.sleep(interval_s)
            ids = [job_id for job_id in self._running if self._held(job_id)]
            if not ids:
                continue
            try:
                held = await jobs.heartbeat(
                    self._pool, ids, worker_id=self.worker_id, lease_s=self._config.lease_s
                )
            except (*DB_ERRORS, asyncpg.PostgresError) as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            for job_id in set(ids) - held:
                if job_id in self._running:
                    self._abort(job_id, "no longer held")

    async def stop(self) -> None:
        """Stop claiming; let renders finish within the grace period; release the rest."""
        self._stopping = True
        self._wake.set()
        # A claim in flight commits whether or not its answer is read: let it come back, so
        # the jobs it took are ours to hand back below (a database that does not answer is
        # not waited for long; its jobs then wait for their lease to run out).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_CLAIM_WAIT_S):
                await self._loop_done.wait()
        # Likewise jobs handed off while their insert is in flight.
        inserting = {f for f in self._inserting.values() if not f.done()}
        if inserting:
            await asyncio.wait(inserting, timeout=STOP_CLAIM_WAIT_S)
        # Jobs not yet rendering (their template, or waiting for a slot when claimed ahead) go
        # back to the queue at once: another process can take them now.
        early = {
            job_id: task
            for job_id, task in self._running.items()
            if job_id not in self._rendering and job_id not in self._rendered
        }
        for job_id, task in early.items():
            self._aborted.add(job_id)
            task.cancel()
        if early:
            await asyncio.wait(early.values(), timeout=5)
            await self._release(list(early))
        pending = [t for t in self._running.values() if not t.done()]
        if pending:
            log.info(
                "waiting up to %.0f s for %s renders", self._config.shutdown_grace_s, len(pending)
            )
            await asyncio.wait(pending, timeout=self._config.shutdown_grace_s)
        # Renders still going are cut off; jobs past their render are only storing and
        # recording, so they are let finish.
        finishing = [t for j, t in self._running.items() if j in self._rendered and not t.done()]
        unfinished = {
            job_id: task
            for job_id, task in self._running.items()
            if not task.done() and job_id not in self._rendered
        }
        for job_id, task in unfinished.items():
            self._aborted.add(job_id)
            task.cancel()
        if unfinished or finishing:
            await asyncio.wait([*unfinished.values(), *finishing], timeout=5)
        if unfinished:
            await self._release(list(unfinished))

    async def _release(self, job_ids: list[uuid.UUID]) -> None:
        with contextlib.suppress(*DB_ERRORS, asyncpg.PostgresError):
            released = await jobs.release(self._pool, job_ids, worker_id=self.worker_id)
            log.info("released %s unfinished jobs back to the queue", released)
