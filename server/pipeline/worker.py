"""Render slots: one attempt of a job, phase by phase: options and source, Chromium, finishing,
its files, done.

The render job is a handler on the lease consumer (server/queue/lease.py), which claims jobs as
slots free, renews their leases, records a failed attempt with its backoff, cuts off a render
whose job was cancelled or taken over, and hands jobs back at shutdown; this module is what an
attempt does in its slot, and the job SQL it hands the consumer (server/queue/jobs.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import enum
import json
import logging
import os
import socket
import time
import uuid
from collections.abc import Mapping
from typing import Any

import asyncpg
import pikepdf

import server
from server import options, tracing
from server.errors import PageLimitError, PermanentError, RenderError
from server.events import JobEvent
from server.files import assets
from server.files.assets import AssetCache
from server.files.storage import Storage
from server.pdf import provenance
from server.pdf.finishing import FinishPool, Work
from server.pdf.join import Part
from server.pipeline import vault
from server.queue import jobs, lease
from server.queue.jobs import ClaimedJob, JobState
from server.queue.lease import Consumer, Failed, Lease, Outcome, Queries, Stage
from server.queue.metrics import Metrics
from server.render import docx, images, sources
from server.render.chromium import Assets, Renderer, RenderResult
from server.render.office import OfficePool
from server.signkey import SigningKey

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class WorkerConfig:
    slots: int
    render_timeout_s: float
    shutdown_grace_s: float
    max_pages: int = 1000
    #: PRESSROOM_SECRET: opens the secrets sealed with a job (server/pipeline/vault.py).
    secret: str = ""
    #: The key `sign` uses (None: none configured, and `sign` is refused at submission).
    signing: SigningKey | None = None
    #: PRESSROOM_RENDER_MAX_MB: what a finishing process may take beyond its libraries.
    finish_max_mb: int = 0
    #: PRESSROOM_CHROMIUM_USER: the user LibreOffice runs as too, when Pressroom is root.
    office_user: str = "nobody"


def new_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Phase(enum.StrEnum):
    """Where an attempt is in its worker, in the order it moves through them."""

    PREPARING = "preparing"  # options, source and assets, in its render slot
    RENDERING = "rendering"  # in Chromium
    FINISHING = "finishing"  # its PDF in a finishing process (server/pdf/finishing.py), in its slot
    STORING = "storing"  # past its render, in no slot: writes its files
    RECORDING = "recording"  # the attempt's final write (done or failed), never cut off

    @property
    def stage(self) -> Stage:
        """The consumer's stage of this phase: what cuts it off, whether it holds its slot."""
        return _STAGES[self]

    @property
    def span(self) -> str:
        """The name of its span under the attempt's (server/tracing.py)."""
        return _SPANS[self]


_STAGES: Mapping[Phase, Stage] = {
    Phase.PREPARING: Stage.PREPARING,
    Phase.RENDERING: Stage.RUNNING,
    Phase.FINISHING: Stage.RUNNING,
    Phase.STORING: Stage.SETTLING,
    Phase.RECORDING: Stage.RECORDING,
}
_SPANS: Mapping[Phase, str] = {
    Phase.PREPARING: "template",
    Phase.RENDERING: "render",
    Phase.FINISHING: "finishing",
    Phase.STORING: "store",
    Phase.RECORDING: "done",
}


class PhaseClock:
    """The seconds one attempt spends in each phase it reaches, for its row in job_attempts
    (the job's story); the attempt's final write is not one of them."""

    __slots__ = ("_phase", "_since", "spent")

    def __init__(self) -> None:
        self._phase = Phase.PREPARING
        self._since = time.perf_counter()
        self.spent: dict[str, float] = {}

    def enter(self, phase: Phase) -> None:
        self._add(time.perf_counter())
        self._phase = phase

    def seconds(self) -> dict[str, float]:
        """By span name (template, render, finishing, store): the phases ended, and the one
        under way until now (where a failed attempt stopped)."""
        self._add(time.perf_counter())
        return {name: round(spent_s, 4) for name, spent_s in self.spent.items()}

    def _add(self, now: float) -> None:
        if self._phase is not Phase.RECORDING:
            name = self._phase.span
            self.spent[name] = self.spent.get(name, 0.0) + now - self._since
        self._since = now


class RenderFailed(Failed):
    """A failed attempt, with the warnings its render gave (kept on the job)."""

    def __init__(self, error: str, *, retryable: bool, warnings: list[str]) -> None:
        super().__init__(error, retryable=retryable)
        self.warnings = warnings


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
        office: OfficePool | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._pool = pool
        self._renderer = renderer
        self._storage = storage
        self._assets = assets
        self._config = config
        self._finisher = finisher or FinishPool(config.slots, max_mb=config.finish_max_mb)
        # The same slots convert Office files, in queue order: at most one LibreOffice each,
        # started on the first Office job.
        self.office = office or OfficePool(
            config.slots, user=config.office_user, max_mb=config.finish_max_mb or 1024
        )
        self.worker_id = worker_id or new_worker_id()
        # Renders that finish together are recorded done in one statement.
        self._done = jobs.DoneRecorder(pool, worker_id=self.worker_id)
        self.leases: Consumer[ClaimedJob] = Consumer(
            Queries(claim=self._claim, fail=self._fail, release=self._release, renew=self._renew),
            self._attempt,
            lease.standard("job", config.slots, grace_s=config.shutdown_grace_s),
            holder=self.worker_id,
            observe=self._observe,
            on_outcome=self._count,
        )
        self.rendered = 0
        #: The largest peak memory a finishing process reached, in MiB.
        self.finish_memory_mb = 0.0
        # While tracing: when each claimed job's claim began and ended, for its attempt's span.
        self._claimed_ns: dict[uuid.UUID, tuple[int, int]] = {}
        # Each attempt's phases so far, until its final write (done, or failed: _fail) takes them.
        self._clocks: dict[uuid.UUID, PhaseClock] = {}

    def wake(self) -> None:
        """New work may be due (a NOTIFY): claim now instead of at the poll."""
        self.leases.wake()

    def on_event(self, event: JobEvent) -> None:
        """Abort a render whose job was cancelled, whichever process took the request."""
        if event.type == "job.cancelled":
            self.leases.abort(event.job_id, "cancelled")

    async def close(self) -> None:
        """Stop the finishing and LibreOffice processes (after the consumer stopped)."""
        await self._finisher.close()
        await self.office.close()

    # --- The job SQL the consumer calls (server/queue/jobs.py) ---------------------------

    async def _claim(self, limit: int, holder: str, lease_s: float) -> list[ClaimedJob]:
        began = tracing.clock()
        with self._metrics.claim_seconds.time():
            claimed = await jobs.claim(self._pool, limit=limit, worker_id=holder, lease_s=lease_s)
        self._metrics.jobs_started.inc(len(claimed))
        if tracing.enabled():
            ended = tracing.clock()
            self._claimed_ns.update((job.id, (began, ended)) for job in claimed)
        return claimed

    async def _renew(self, ids: list[uuid.UUID], holder: str, lease_s: float) -> set[uuid.UUID]:
        return await jobs.heartbeat(self._pool, ids, worker_id=holder, lease_s=lease_s)

    async def _release(self, ids: list[uuid.UUID], holder: str) -> int:
        return await jobs.release(self._pool, ids, worker_id=holder)

    async def _fail(
        self, job: ClaimedJob, holder: str, failure: Failed, retry_in_s: float | None
    ) -> Outcome | None:
        state = await jobs.finish_failed(
            self._pool,
            job,
            worker_id=holder,
            error=failure.error,
            retryable=retry_in_s is not None,
            retry_in_s=retry_in_s or 0.0,
            warnings=failure.warnings if isinstance(failure, RenderFailed) else [],
            phases=clock.seconds() if (clock := self._clocks.pop(job.id, None)) else None,
        )
        if state is JobState.QUEUED:
            return Outcome.RETRYING
        return Outcome.FAILED if state is JobState.FAILED else None

    def _observe(self, phase: str, spent_s: float) -> None:
        self._metrics.phase_seconds.labels(phase).observe(spent_s)

    def _count(self, outcome: Outcome) -> None:
        if outcome is not Outcome.LATE:
            self._metrics.jobs_finished.labels(outcome).inc()

    # --- One attempt ----------------------------------------------------------------------

    async def _attempt(self, held: Lease[ClaimedJob]) -> Outcome:
        job = held.item
        attributes: dict[str, tracing.Attribute] = {
            tracing.JOB_ID: str(job.id),
            tracing.TENANT: job.tenant,
            tracing.SOURCE: job.source,
            tracing.ATTEMPT: job.attempt,
            tracing.MAX_ATTEMPTS: job.max_attempts,
        }
        claimed = self._claimed_ns.pop(job.id, None)
        clock = self._clocks[job.id] = PhaseClock()
        with tracing.attempt(job.traceparent, attributes, claimed=claimed) as steps:
            log.info(
                "job running (attempt %s/%s)", job.attempt, job.max_attempts, extra=job.log_extra
            )
            try:
                outcome = await self._run(held, steps, clock)
            finally:
                # A failure is recorded after this returns (_fail takes the clock); an attempt
                # done, cut off or ended in its final write records no more phases.
                if held.stage in (Stage.RECORDING, Stage.ABORTED):
                    self._clocks.pop(job.id, None)
            steps.set(tracing.OUTCOME, outcome.value)
            return outcome

    async def _run(
        self, held: Lease[ClaimedJob], steps: tracing.Steps, clock: PhaseClock
    ) -> Outcome:
        job = held.item
        warnings: list[str] = []
        try:
            steps.step(Phase.PREPARING.span)
            render_options = options.parse(job.options)
            if job.secrets is not None:
                render_options = vault.reveal(
                    render_options, job.secrets, secret=self._config.secret, job_id=job.id
                )
            engine = getattr(self._renderer, "engine_version", "") or "Chromium"
            if job.source == sources.PDFS:  # no Chromium: the uploads are joined in finishing
                engine = f"pikepdf {pikepdf.__version__}"
                finish = await self._finish_work(job, render_options)
                result = RenderResult(data=b"", pages=None, warnings=[])
            else:
                html = sources.office(job.source, job.template) or await sources.load(
                    job.source,
                    job.template,
                    job.data,
                    render_options,
                    timeout_s=self._config.render_timeout_s,
                )
                page_files = (
                    await self._assets.files(job.tenant, job.assets) if job.assets else None
                )
                finish = await self._finish_work(job, render_options)
                _enter(held, Phase.RENDERING, steps, clock)
                with self._metrics.render_seconds.time():
                    if isinstance(html, sources.OfficeFile):
                        result = await self._convert(html, page_files, render_options, job.data)
                    else:
                        result = await self._renderer.render(
                            html,
                            render_options,
                            timeout_s=self._config.render_timeout_s,
                            assets=page_files,
                        )
                warnings = result.warnings
                if isinstance(html, sources.OfficeFile):
                    engine = "LibreOffice"
                if result.pages is not None:
                    steps.set(tracing.PAGES, result.pages)
                    if result.pages > self._config.max_pages:
                        raise PageLimitError(self._config.max_pages)
            report: dict[str, object] = {}
            made = None if render_options.image else self._provenance(job, render_options, engine)
            if finish is not None:
                _enter(held, Phase.FINISHING, steps, clock)
                finish = dataclasses.replace(finish, provenance=made)
                result, report = await self._finished(result, finish, steps)
                if result.pages is not None and result.pages > self._config.max_pages:
                    raise PageLimitError(self._config.max_pages)
            elif made is not None:  # the PDF's one pass: document information, provenance
                result = dataclasses.replace(
                    result, data=await provenance.seal(result.data, render_options, made)
                )
            steps.set(tracing.BYTES, len(result.data))
            _enter(held, Phase.STORING, steps, clock)
            files, contents = job.files(), [result.data]
            if render_options.thumbnail is not None:
                width = render_options.thumbnail.width
                contents.append(await images.thumbnail(result.data, width))
            for file, data in zip(files, contents, strict=True):
                await self._storage.put(
                    file.key, data, filename=file.filename, content_type=file.output.content_type
                )
            checked = render_options.preflight_checks() is not None
        except RenderError as exc:
            raise RenderFailed(str(exc), retryable=exc.retryable, warnings=warnings) from exc
        except options.OptionsError as exc:
            error = f"invalid options: {exc}"
            raise RenderFailed(error, retryable=False, warnings=warnings) from exc
        # The bytes are durable; now the final write.
        steps.step(Phase.RECORDING.span)
        clock.enter(Phase.RECORDING)
        phases = clock.seconds()
        done = await held.record(
            lambda: self._done.submit(
                jobs.Done(
                    job,
                    len(result.data),
                    result.pages,
                    warnings,
                    phases,
                    finishing=report or None,
                    provenance=None if made is None else made.to_json(),
                    preflight=[f.to_json() for f in result.preflight] if checked else None,
                )
            )
        )
        self.rendered += 1
        if not done:
            log.info("late result discarded", extra=job.log_extra)
            await self._delete(job.files())
            return Outcome.LATE
        log.info("job done", extra=job.log_extra)
        # Earlier attempts of this job may have stored files before their worker died.
        for attempt in range(1, job.attempt):
            await self._delete(job.files(attempt))
        return Outcome.DONE

    def _provenance(
        self, job: ClaimedJob, given: options.RenderOptions, engine: str
    ) -> provenance.Provenance:
        """What makes this job's PDF (server/pdf/provenance.py), `engine` printed it."""
        name, version = job.template_name, job.template_version
        return provenance.Provenance(
            pressroom=server.version(),
            engine=engine,
            template=f"{name}@{version}" if name is not None else None,
            data_sha256=provenance.data_sha256(job.data),
            assets={**provenance.page_assets(job.assets), **provenance.finishing_assets(given)},
            finishing=provenance.steps(given),
        )

    async def _convert(
        self,
        document: sources.OfficeFile,
        files: Assets | None,
        given: options.RenderOptions,
        values: dict[str, Any],
    ) -> RenderResult:
        """An Office file (the job's one asset) converted by LibreOffice, in this slot; a Word
        template filled with the job's data first."""
        _, data = (files or {})[document.name]
        if isinstance(document, sources.WordTemplate):
            data = await docx.fill(
                data, document.name, values, files or {}, timeout_s=self._config.render_timeout_s
            )
        converted = await self.office.convert(
            data, document.name, given, timeout_s=self._config.render_timeout_s
        )
        return RenderResult(converted.pdf, converted.pages, [])

    async def _finish_work(self, job: ClaimedJob, given: options.RenderOptions) -> Work | None:
        """What the finishing step needs (None when the options ask for none): the options
        (their passwords revealed), the bytes of the assets they name, the signing key."""
        if not given.finishing and job.source != sources.PDFS:
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
        uploaded: dict[str, dt.datetime] = {}
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
                uploaded[asset_id] = known[asset_id].created_at
        parts: tuple[Part, ...] = ()
        if job.source == sources.PDFS:
            files = await self._assets.files(job.tenant, job.assets or {})
            parts = tuple(Part(files[p["path"]][1], p["title"]) for p in json.loads(job.template))
        try:
            values = given.fill_form.values(job.data) if given.fill_form else {}
        except ValueError as exc:
            raise PermanentError(f"fill_form: {exc}") from None
        return Work(b"", given, contents, self._config.signing, parts, values, uploaded=uploaded)

    async def _finished(
        self, result: RenderResult, work: Work, steps: tracing.Steps
    ) -> tuple[RenderResult, dict[str, object]]:
        """The printed PDF (or the joined uploads) through its finishing steps, bounded by the
        render time limit; and what the job shows of them."""
        done = await self._finisher.run(
            dataclasses.replace(work, pdf=result.data), timeout_s=self._config.render_timeout_s
        )
        steps.laid_out(done.steps)
        for step, seconds in done.steps.items():
            self._metrics.finish_seconds.labels(step).observe(seconds)
        self.finish_memory_mb = max(self.finish_memory_mb, done.peak_rss_mb)
        self._metrics.finish_memory_bytes.set(self.finish_memory_mb * 1024 * 1024)
        return dataclasses.replace(result, data=done.pdf, pages=done.pages), done.report

    async def _delete(self, files: list[jobs.JobFile]) -> None:
        """Files nobody will download; one that cannot be deleted is retention's to remove."""
        for file in files:
            with contextlib.suppress(Exception):
                await self._storage.delete(file.key)


def _enter(held: Lease[ClaimedJob], phase: Phase, steps: tracing.Steps, clock: PhaseClock) -> None:
    held.enter(phase.stage, phase)
    steps.step(phase.span)
    clock.enter(phase)
