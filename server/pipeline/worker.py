"""Render slots: claim → render → store → finish, with heartbeats, rescue and cancellation.

Each job in flight is one `InFlightJob`, held in `Workers._jobs` by id from its start until
its task (and its final write) ended; its `phase` says what the worker does with it, and every
count the worker acts on (free slots) is read from those objects."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any, TypeVar

import asyncpg

from server import options
from server.errors import (
    DB_ERRORS,
    DB_OR_QUERY_ERRORS,
    PermanentError,
    RenderError,
    backoff_s,
    jittered,
)
from server.events import JobEvent
from server.files import assets
from server.files.assets import AssetCache
from server.files.storage import Storage
from server.pdf.finishing import FinishPool, Work
from server.pipeline import vault
from server.queue import jobs
from server.queue.jobs import ClaimedJob, JobState
from server.queue.metrics import Metrics
from server.render import images, sources
from server.render.chromium import Renderer, RenderResult
from server.signkey import SigningKey

log = logging.getLogger(__name__)
T = TypeVar("T")

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
    #: PRESSROOM_SECRET: opens the secrets sealed with a job (server/pipeline/vault.py).
    secret: str = ""
    #: The key `sign` uses (None: none configured, and `sign` is refused at submission).
    signing: SigningKey | None = None
    #: PRESSROOM_RENDER_MAX_MB: what a finishing process may take beyond its libraries.
    finish_max_mb: int = 0


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Phase(enum.StrEnum):
    """Where a job in flight is in this worker, in the order a job moves through them."""

    PREPARING = "preparing"  # options, template and assets, holding a render slot
    RENDERING = "rendering"  # in Chromium
    FINISHING = "finishing"  # its PDF in a finishing process (server/pdf/finishing.py), in its slot
    STORING = "storing"  # past its render, holding no slot: writes the file
    RECORDING = "recording"  # the attempt's final write (done or failed), never cut off
    ABORTED = "aborted"  # its task is being cancelled: nothing of it is recorded

    @property
    def abortable(self) -> bool:
        """Not past its render yet: cut off when cancelled, no longer held, or at shutdown. Past
        it, the final statement itself refuses a job that is no longer this attempt's."""
        return Phase.ABORTED in _NEXT[self]

    @property
    def holds_slot(self) -> bool:
        """Counted against the render slots: in Chromium, about to be, or still unwinding."""
        return self.abortable or self is Phase.ABORTED


_NEXT: Mapping[Phase, frozenset[Phase]] = {
    Phase.PREPARING: frozenset({Phase.RENDERING, Phase.RECORDING, Phase.ABORTED}),
    Phase.RENDERING: frozenset({Phase.FINISHING, Phase.STORING, Phase.RECORDING, Phase.ABORTED}),
    Phase.FINISHING: frozenset({Phase.STORING, Phase.RECORDING, Phase.ABORTED}),
    Phase.STORING: frozenset({Phase.RECORDING}),
    Phase.RECORDING: frozenset(),
    Phase.ABORTED: frozenset(),
}


@dataclasses.dataclass(slots=True, eq=False)
class InFlightJob:
    """One job this worker holds, from its claim until its task ended."""

    job: ClaimedJob
    phase: Phase = Phase.PREPARING
    task: asyncio.Task[None] = dataclasses.field(init=False)
    #: The attempt's final write, a task of its own so that cancelling `task` cannot cut it.
    write: asyncio.Task[Any] | None = None
    #: When it entered its phase (time.perf_counter).
    since: float = dataclasses.field(default_factory=time.perf_counter)

    def enter(self, phase: Phase) -> float:
        """Move on to `phase`; the seconds spent in the one it leaves."""
        if phase not in _NEXT[self.phase]:
            raise RuntimeError(f"job {self.job.id} cannot go from {self.phase} to {phase}")
        now = time.perf_counter()
        spent, self.phase, self.since = now - self.since, phase, now
        return spent

    @property
    def ended(self) -> bool:
        return self.task.done() and (self.write is None or self.write.done())

    @property
    def log_extra(self) -> dict[str, str]:
        return {"job_id": str(self.job.id), "tenant": self.job.tenant}


class Workers:
    """The render slots of one process."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        renderer: Renderer,
        storage: Storage,
        config: WorkerConfig,
        *,
        assets: AssetCache,
        worker_id: str | None = None,
        metrics: Metrics | None = None,
        finisher: FinishPool | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._pool = pool
        self._renderer = renderer
        self._storage = storage
        self._assets = assets
        self._config = config
        self._finisher = finisher or FinishPool(config.slots, max_mb=config.finish_max_mb)
        self.worker_id = worker_id or new_worker_id()
        # Renders that finish together are recorded done in one statement.
        self._done = jobs.DoneRecorder(pool, worker_id=self.worker_id)
        self._wake = asyncio.Event()
        self._jobs: dict[uuid.UUID, InFlightJob] = {}
        self._stopping = False
        # Clear while the claim loop runs: stop() waits for a claim in flight to come back, so
        # the jobs it took are known (and handed back) instead of left running on a lease.
        self._loop_done = asyncio.Event()
        self._loop_done.set()
        #: Set while the claim loop waits for work with a render slot free: a job submitted
        #: now starts when its NOTIFY wakes the loop (a signal tests wait on).
        self.waiting = asyncio.Event()
        self.rendered = 0
        #: The largest peak memory a finishing process reached, in MiB.
        self.finish_memory_mb = 0.0

    def wake(self) -> None:
        """New work may be due (a NOTIFY, a finished slot): claim now instead of at the poll."""
        self._wake.set()

    def on_event(self, event: JobEvent) -> None:
        """Abort a render whose job was cancelled, whichever process took the request."""
        if event.type == "job.cancelled" and (entry := self._jobs.get(event.job_id)):
            self._abort(entry, "cancelled")

    @property
    def in_flight(self) -> Mapping[uuid.UUID, InFlightJob]:
        return MappingProxyType(self._jobs)

    @property
    def busy(self) -> int:
        return len(self._jobs)

    def _free(self) -> int:
        """Render slots no job holds."""
        return self._config.slots - sum(entry.phase.holds_slot for entry in self._jobs.values())

    def _move(self, entry: InFlightJob, phase: Phase) -> None:
        left = entry.phase
        held_slot = left.holds_slot
        self._metrics.phase_seconds.labels(left).observe(entry.enter(phase))
        if held_slot and not phase.holds_slot:
            self._wake.set()  # its slot is free for the next job

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
            free = self._free()
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
                except DB_OR_QUERY_ERRORS as exc:
                    log.warning("claim failed: %s", exc)
                else:
                    self._metrics.jobs_started.labels("claim").inc(len(claimed))
                for job in claimed:
                    self._announce(job)
                    self._start(job)
                if claimed and len(claimed) == free:
                    continue  # the queue may hold more: claim again as soon as a slot frees
            poll_s = jittered(self._config.poll_interval_s, 0.5)
            if free > 0:
                self.waiting.set()
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(poll_s):
                        await self._wake.wait()
            finally:
                self.waiting.clear()

    def _announce(self, job: ClaimedJob) -> None:
        log.info(
            "job running (attempt %s/%s)",
            job.attempt,
            job.max_attempts,
            extra={"job_id": str(job.id), "tenant": job.tenant},
        )

    def _start(self, job: ClaimedJob) -> InFlightJob:
        entry = InFlightJob(job)
        entry.task = asyncio.create_task(self._run_job(entry), name=f"render-{job.id}")
        self._jobs[job.id] = entry
        self._own(entry, entry.task)
        return entry

    def _own(self, entry: InFlightJob, task: asyncio.Task[Any]) -> None:
        """Log a task of `entry` that failed; forget the entry once all its tasks ended."""

        def ended(task: asyncio.Task[Any]) -> None:
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("task %s failed", task.get_name(), exc_info=exc, extra=entry.log_extra)
            if entry.ended and self._jobs.get(entry.job.id) is entry:
                del self._jobs[entry.job.id]
                self._wake.set()
                if entry.phase is Phase.RECORDING:
                    spent = time.perf_counter() - entry.since
                    self._metrics.phase_seconds.labels(Phase.RECORDING).observe(spent)

        task.add_done_callback(ended)

    def _abort(self, entry: InFlightJob, why: str) -> bool:
        """Cut off a job not yet past its render; False if it is past it (or over)."""
        if not entry.phase.abortable or entry.task.done():
            return False
        log.info("aborting render (%s)", why, extra=entry.log_extra)
        self._move(entry, Phase.ABORTED)
        entry.task.cancel()
        return True

    async def _run_job(self, entry: InFlightJob) -> None:
        job = entry.job
        warnings: list[str] = []
        try:
            render_options = options.parse(job.options)
            if job.secrets is not None:
                render_options = vault.reveal(
                    render_options, job.secrets, secret=self._config.secret, job_id=job.id
                )
            html = await sources.load(
                job.source,
                job.template,
                job.data,
                render_options,
                timeout_s=self._config.render_timeout_s,
            )
            page_files = await self._assets.files(job.tenant, job.assets) if job.assets else None
            finish = await self._finish_work(job, render_options)
            self._move(entry, Phase.RENDERING)
            with self._metrics.render_seconds.time():
                result = await self._renderer.render(
                    html,
                    render_options,
                    timeout_s=self._config.render_timeout_s,
                    assets=page_files,
                )
            warnings = result.warnings
            if result.pages is not None and result.pages > self._config.max_pages:
                limit = self._config.max_pages
                raise PermanentError(f"the PDF has more than {limit} pages, the limit")
            if finish is not None:
                self._move(entry, Phase.FINISHING)
                result = await self._finished(result, finish)
            self._move(entry, Phase.STORING)
            files, contents = job.files(), [result.data]
            if render_options.thumbnail is not None:
                width = render_options.thumbnail.width
                contents.append(await images.thumbnail(result.data, width))
            for file, data in zip(files, contents, strict=True):
                await self._storage.put(
                    file.key, data, filename=file.filename, content_type=file.output.content_type
                )
        except asyncio.CancelledError:
            if entry.phase is Phase.ABORTED:
                log.info("render aborted", extra=entry.log_extra)
                self._metrics.jobs_finished.labels("aborted").inc()
                return  # the job is no longer ours (cancelled or rescued): nothing to record
            raise
        except RenderError as exc:
            await self._fail(entry, str(exc), retryable=exc.retryable, warnings=warnings)
            return
        except options.OptionsError as exc:
            await self._fail(entry, f"invalid options: {exc}", retryable=False, warnings=warnings)
            return
        except Exception as exc:
            log.exception("render crashed", extra=entry.log_extra)
            await self._fail(
                entry, f"internal error: {type(exc).__name__}", retryable=True, warnings=warnings
            )
            return
        # The bytes are durable; now the final write.
        self._move(entry, Phase.RECORDING)
        done = await self._record(
            entry,
            lambda: self._done.submit(jobs.Done(job, len(result.data), result.pages, warnings)),
        )
        self.rendered += 1
        if not done:
            log.info("late result discarded", extra=entry.log_extra)
            await self._delete(job.files())
            return
        log.info("job done", extra=entry.log_extra)
        self._metrics.jobs_finished.labels("done").inc()
        # Earlier attempts of this job may have stored files before their worker died.
        for attempt in range(1, job.attempt):
            await self._delete(job.files(attempt))

    async def _finish_work(self, job: ClaimedJob, given: options.RenderOptions) -> Work | None:
        """What the finishing step needs (None when the options ask for none): the options
        (their passwords revealed), the bytes of the assets they name, the signing key."""
        if not given.finishing:
            return None
        if given.encrypt is not None and given.encrypt.owner_password == vault.REDACTED:
            # The sealed values were erased with the job's final state (a manual retry).
            raise PermanentError(
                "the job's PDF passwords were erased when it ended; submit it again"
            )
        ids = [a.asset for a in given.attachments or ()]
        if given.stamp is not None and given.stamp.asset is not None:
            ids.append(given.stamp.asset)
        if given.facturx is not None:
            ids.append(given.facturx.xml)
        contents: dict[str, tuple[str, bytes]] = {}
        if ids:
            known = await assets.find(self._pool, job.tenant, ids)
            for asset_id in ids:
                if asset_id not in known:
                    raise PermanentError(f"the asset {asset_id} is no longer stored")
                try:
                    data = await self._assets.get(job.tenant, asset_id)
                except FileNotFoundError:
                    raise PermanentError(f"the asset {asset_id} is no longer stored") from None
                contents[asset_id] = (known[asset_id].content_type, data)
        return Work(b"", given, contents, self._config.signing)

    async def _finished(self, result: RenderResult, work: Work) -> RenderResult:
        """The printed PDF through its finishing steps, bounded by the render time limit."""
        done = await self._finisher.run(
            dataclasses.replace(work, pdf=result.data), timeout_s=self._config.render_timeout_s
        )
        for step, seconds in done.steps.items():
            self._metrics.finish_seconds.labels(step).observe(seconds)
        self.finish_memory_mb = max(self.finish_memory_mb, done.peak_rss_mb)
        self._metrics.finish_memory_bytes.set(self.finish_memory_mb * 1024 * 1024)
        return dataclasses.replace(result, data=done.pdf)

    async def _delete(self, files: list[jobs.JobFile]) -> None:
        """Files nobody will download; one that cannot be deleted is retention's to remove."""
        for file in files:
            with contextlib.suppress(Exception):
                await self._storage.delete(file.key)

    async def _fail(
        self, entry: InFlightJob, error: str, *, retryable: bool, warnings: list[str]
    ) -> None:
        self._move(entry, Phase.RECORDING)
        job = entry.job
        retry_in_s = backoff_s(
            job.attempt, base_s=self._config.retry_base_s, max_s=self._config.retry_max_s
        )
        state = await self._record(
            entry,
            lambda: jobs.finish_failed(
                self._pool,
                job,
                worker_id=self.worker_id,
                error=error,
                retryable=retryable,
                retry_in_s=retry_in_s,
                warnings=warnings,
            ),
        )
        if state is JobState.QUEUED:
            log.info("job retrying in %.1f s: %s", retry_in_s, error, extra=entry.log_extra)
            self._metrics.jobs_finished.labels("retrying").inc()
        elif state is JobState.FAILED:
            log.info("job failed: %s", error, extra=entry.log_extra)
            self._metrics.jobs_finished.labels("failed").inc()

    async def _record(self, entry: InFlightJob, write: Callable[[], Awaitable[T]]) -> T | None:
        """The attempt's final write, in a task the entry owns, shielded: neither an abort nor
        a shutdown cuts it in half, so the job is recorded or stays running until its lease is
        rescued. None when it could not be written."""
        task = asyncio.create_task(self._retrying(entry, write), name=f"record-{entry.job.id}")
        entry.write = task
        self._own(entry, task)
        return await asyncio.shield(task)

    async def _retrying(self, entry: InFlightJob, write: Callable[[], Awaitable[T]]) -> T | None:
        # While the database is away, try again until it answers, even past the lease: only its
        # answer says whether the attempt is still ours (a rescued one is refused, and its file
        # then deleted); a write given up on could have committed, so its file must stay.
        while True:
            try:
                return await write()
            except DB_ERRORS as exc:
                log.warning("could not record the result, retrying: %s", exc, extra=entry.log_extra)
                await asyncio.sleep(FINISH_RETRY_S)
            except Exception:
                log.exception("could not record the result", extra=entry.log_extra)
                return None

    async def heartbeat(self) -> None:
        """Renew the leases of running jobs; abort those this worker no longer holds."""
        interval_s = self._config.lease_s / 3
        while True:
            await asyncio.sleep(interval_s)
            ids = [
                job_id for job_id, entry in self._jobs.items() if entry.phase is not Phase.ABORTED
            ]
            if not ids:
                continue
            try:
                held = await jobs.heartbeat(
                    self._pool, ids, worker_id=self.worker_id, lease_s=self._config.lease_s
                )
            except DB_OR_QUERY_ERRORS as exc:
                log.warning("heartbeat failed: %s", exc)
                continue
            for job_id in set(ids) - held:
                if entry := self._jobs.get(job_id):
                    self._abort(entry, "no longer held")

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
        # Jobs not yet in Chromium (their template) go back to the queue at once: another
        # process can take them now.
        await self._cut_off([e for e in self._jobs.values() if e.phase is Phase.PREPARING])
        if pending := _tasks(self._jobs.values()):
            grace_s = self._config.shutdown_grace_s
            log.info("waiting up to %.0f s for %s jobs in flight", grace_s, len(self._jobs))
            await asyncio.wait(pending, timeout=grace_s)
        # Renders still going are cut off; jobs past their render are only storing and
        # recording, so they are let finish.
        await self._cut_off(list(self._jobs.values()))

    async def _cut_off(self, entries: list[InFlightJob]) -> None:
        """Abort those of `entries` not past their render, wait briefly for every one of them
        to end, and hand the aborted ones back to the queue."""
        aborted = [e.job.id for e in entries if self._abort(e, "shutting down")]
        if pending := _tasks(entries):
            await asyncio.wait(pending, timeout=STOP_CLAIM_WAIT_S)
        if not aborted:
            return
        try:
            released = await jobs.release(self._pool, aborted, worker_id=self.worker_id)
        except DB_OR_QUERY_ERRORS as exc:
            log.warning("could not release unfinished jobs (their leases will): %s", exc)
        else:
            log.info("released %s unfinished jobs back to the queue", released)

    async def close(self) -> None:
        """Stop the finishing processes (after `stop`)."""
        await self._finisher.close()


def _tasks(entries: Collection[InFlightJob]) -> set[asyncio.Task[Any]]:
    """The tasks of `entries` still running."""
    return {
        task for e in entries for task in (e.task, e.write) if task is not None and not task.done()
    }
