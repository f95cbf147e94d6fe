"""The joins of one process: claim → fetch → join → store → done, with heartbeats and release.

A batch with `combine` is due once every item is done (0016_batch_combine.sql). A process with
join slots (PRESSROOM_COMBINE_SLOTS) claims it, copies the items' PDFs from storage into a
temporary folder, a few at a time, joins them in a child process (server/pdf/join.py: the
event loop never runs PDF code, and the child's memory is given back when it ends), stores the
file and only then records it done, as a job's file. Wake-ups come from the batch events the
hub reads (a batch whose items are all final, its join pending); a poll is the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import asyncpg

from server.errors import DB_ERRORS, DB_OR_QUERY_ERRORS, StorageError, backoff_s, jittered
from server.events import JobEvent
from server.files.storage import Storage
from server.pdf import join
from server.queue import combine
from server.queue.combine import Claimed, CombineState
from server.queue.metrics import Metrics

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Items' PDFs read from storage at once for one join (their bytes are in memory meanwhile).
FETCH_CONCURRENCY = 8
RECORD_RETRY_S = 0.5
STOP_WAIT_S = 5.0
# `python -m server.pdf.join` runs from the folder that holds this package, so that the child
# imports this very copy of it.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: Failures another attempt may get past: the storage or the database away for a while.
TRANSIENT: tuple[type[Exception], ...] = (StorageError, *DB_OR_QUERY_ERRORS)


@dataclasses.dataclass(frozen=True, slots=True)
class CombinerConfig:
    slots: int
    lease_s: float
    time_limit_s: float
    poll_interval_s: float
    retry_base_s: float
    retry_max_s: float


class JoinError(Exception):
    """A join that failed; `retryable` says whether another attempt may succeed."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


@dataclasses.dataclass(frozen=True, slots=True)
class Joined:
    pages: int
    size_bytes: int
    max_rss_kb: int


class Combiner:
    """The join slots of one process."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        storage: Storage,
        config: CombinerConfig,
        *,
        worker_id: str,
        metrics: Metrics | None = None,
    ) -> None:
        self._pool = pool
        self._storage = storage
        self._config = config
        self._metrics = metrics or Metrics()
        self.worker_id = worker_id
        self._wake = asyncio.Event()
        self._stopping = False
        self._loop_done = asyncio.Event()
        self._loop_done.set()
        # Joins in flight by batch; the final write of each is a task of its own (shielded).
        self._joins: dict[uuid.UUID, asyncio.Task[None]] = {}
        self._writes: set[asyncio.Task[Any]] = set()
        self._abandoned: set[uuid.UUID] = set()
        self.joined = 0

    def on_event(self, event: JobEvent) -> None:
        """A batch whose items are all final and whose join is pending: claim now."""
        if event.type != "batch.progress":
            return
        combined = event.job.get("combined")
        if isinstance(combined, dict) and combined.get("status") == "pending":
            if event.job.get("progress") == 100:
                self._wake.set()

    async def run(self) -> None:
        """Claim while slots are free; sleep until woken, a join ends, or the jittered poll."""
        self._loop_done.clear()
        try:
            while not self._stopping:
                self._wake.clear()
                free = self._config.slots - len(self._joins)
                if free > 0:
                    try:
                        claimed = await combine.claim(
                            self._pool,
                            limit=free,
                            worker_id=self.worker_id,
                            lease_s=self._config.lease_s,
                        )
                    except DB_OR_QUERY_ERRORS as exc:
                        log.warning("claiming a join failed: %s", exc)
                        claimed = []
                    for one in claimed:
                        self._start(one)
                    if claimed and len(claimed) == free:
                        continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(jittered(self._config.poll_interval_s, 0.5)):
                        await self._wake.wait()
        finally:
            self._loop_done.set()

    def _start(self, claimed: Claimed) -> None:
        log.info(
            "joining batch (attempt %s/%s)",
            claimed.attempt,
            claimed.max_attempts,
            extra=claimed.log_extra,
        )
        task = asyncio.create_task(self._run_join(claimed), name=f"join-{claimed.batch_id}")
        self._joins[claimed.batch_id] = task

        def ended(task: asyncio.Task[None]) -> None:
            if self._joins.get(claimed.batch_id) is task:
                del self._joins[claimed.batch_id]
            self._abandoned.discard(claimed.batch_id)
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("join task failed", exc_info=exc, extra=claimed.log_extra)
            self._wake.set()

        task.add_done_callback(ended)

    async def _run_join(self, claimed: Claimed) -> None:
        started = time.perf_counter()
        try:
            joined = await self._join_and_store(claimed)
        except asyncio.CancelledError:
            if claimed.batch_id in self._abandoned or self._stopping:
                log.info("join abandoned", extra=claimed.log_extra)
                return  # rescued by another process, or handed back at shutdown
            raise
        except JoinError as exc:
            await self._fail(claimed, str(exc), retryable=exc.retryable)
            return
        except TRANSIENT as exc:
            await self._fail(claimed, str(exc), retryable=True)
            return
        except Exception as exc:
            log.exception("join crashed", extra=claimed.log_extra)
            await self._fail(claimed, f"internal error: {type(exc).__name__}", retryable=True)
            return
        self._metrics.combine_seconds.observe(time.perf_counter() - started)
        done = await self._record(
            claimed,
            lambda: combine.finish_done(
                self._pool,
                claimed,
                worker_id=self.worker_id,
                pages=joined.pages,
                size_bytes=joined.size_bytes,
            ),
        )
        if not done:
            log.info("late join discarded", extra=claimed.log_extra)
            await self._delete([claimed.object_key])
            return
        self.joined += 1
        self._metrics.combines_finished.labels("done").inc()
        log.info(
            "batch joined: %s pages, %s bytes in %.2f s (join process peak %s MiB)",
            joined.pages,
            joined.size_bytes,
            time.perf_counter() - started,
            joined.max_rss_kb // 1024,
            extra=claimed.log_extra,
        )
        # Earlier attempts may have stored their file before their process died.
        await self._delete(
            [
                combine.object_key(claimed.tenant, claimed.batch_id, n)
                for n in range(1, claimed.attempt)
            ]
        )

    async def _join_and_store(self, claimed: Claimed) -> Joined:
        items = await combine.items(self._pool, claimed.batch_id)
        return await join_stored(
            self._storage,
            items,
            claimed.object_key,
            filename=combine.filename(claimed.batch_id),
            outline=claimed.outline,
            time_limit_s=self._config.time_limit_s,
        )

    async def _fail(self, claimed: Claimed, error: str, *, retryable: bool) -> None:
        retry_in_s = backoff_s(
            claimed.attempt, base_s=self._config.retry_base_s, max_s=self._config.retry_max_s
        )
        state = await self._record(
            claimed,
            lambda: combine.finish_failed(
                self._pool,
                claimed,
                worker_id=self.worker_id,
                error=error,
                retryable=retryable,
                retry_in_s=retry_in_s,
            ),
        )
        if state is CombineState.PENDING:
            log.info("join retrying in %.1f s: %s", retry_in_s, error, extra=claimed.log_extra)
            self._metrics.combines_finished.labels("retrying").inc()
        elif state is CombineState.FAILED:
            log.warning("join failed: %s", error, extra=claimed.log_extra)
            self._metrics.combines_finished.labels("failed").inc()

    async def _record(self, claimed: Claimed, write: Callable[[], Awaitable[T]]) -> T | None:
        """The attempt's final write, shielded: a shutdown does not cut it in half. Retried
        while the database is away, as long as the lease could still be this process's."""

        async def retrying() -> T | None:
            deadline = time.monotonic() + self._config.lease_s
            while True:
                try:
                    return await write()
                except DB_ERRORS as exc:
                    if time.monotonic() + RECORD_RETRY_S > deadline:
                        log.error("could not record the join: %s", exc, extra=claimed.log_extra)
                        return None
                    await asyncio.sleep(RECORD_RETRY_S)

        task = asyncio.create_task(retrying(), name=f"record-join-{claimed.batch_id}")
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)
        return await asyncio.shield(task)

    async def _delete(self, keys: list[str]) -> None:
        """Files nobody will download; one that cannot be deleted is retention's to remove."""
        for key in keys:
            with contextlib.suppress(Exception):
                await self._storage.delete(key)

    async def heartbeat(self) -> None:
        """Renew the leases of joins in flight; abandon those this process no longer holds."""
        while True:
            await asyncio.sleep(self._config.lease_s / 3)
            ids = [batch_id for batch_id in self._joins if batch_id not in self._abandoned]
            if not ids:
                continue
            try:
                held = await combine.heartbeat(
                    self._pool, ids, worker_id=self.worker_id, lease_s=self._config.lease_s
                )
            except DB_OR_QUERY_ERRORS as exc:
                log.warning("join heartbeat failed: %s", exc)
                continue
            for batch_id in set(ids) - held:
                if task := self._joins.get(batch_id):
                    log.info("join no longer held", extra={"batch_id": str(batch_id)})
                    self._abandoned.add(batch_id)
                    task.cancel()

    async def stop(self) -> None:
        """Stop claiming; cut joins in flight off (a join starts over cheaply) and hand them
        back, after their final writes in flight have ended."""
        self._stopping = True
        self._wake.set()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_S):
                await self._loop_done.wait()
        ids = list(self._joins)
        for task in self._joins.values():
            task.cancel()
        pending = {*self._joins.values(), *self._writes}
        if pending:
            await asyncio.wait(pending, timeout=STOP_WAIT_S)
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=STOP_WAIT_S)
        try:
            released = await combine.release(self._pool, ids, worker_id=self.worker_id)
        except DB_OR_QUERY_ERRORS as exc:
            log.warning("could not release unfinished joins (their leases will): %s", exc)
        else:
            if released:
                log.info("released %s unfinished joins", released)


async def join_stored(
    storage: Storage,
    items: list[combine.Item],
    key: str,
    *,
    filename: str,
    outline: bool,
    time_limit_s: float,
) -> Joined:
    """Join the stored PDFs of `items`, in order, and store the result at `key`: the items are
    copied into a temporary folder a few at a time, joined there by a child process, and the
    folder is removed whatever happens."""
    folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="pressroom-join-"))
    try:
        parts = await _fetch(storage, items, folder)
        output = folder / "joined.pdf"
        pages, max_rss_kb = await run_join(
            parts, output, outline=outline, time_limit_s=time_limit_s
        )
        data = await asyncio.to_thread(output.read_bytes)
        await storage.put(key, data, filename=filename)
        return Joined(pages, len(data), max_rss_kb)
    finally:
        await asyncio.to_thread(shutil.rmtree, folder, True)


async def _fetch(storage: Storage, items: list[combine.Item], folder: Path) -> list[join.Part]:
    """Each item's PDF in a file of its own, in item order."""
    gate = asyncio.Semaphore(FETCH_CONCURRENCY)

    async def fetch(index: int, item: combine.Item) -> join.Part:
        if item.status != "done" or item.object_key is None:
            raise JoinError(f"item {item.key!r} is {item.status}, not done", retryable=False)
        path = folder / f"{index:05d}.pdf"
        async with gate:
            try:
                data = await storage.get(item.object_key)
            except FileNotFoundError:
                raise JoinError(
                    f"the PDF of item {item.key!r} is no longer stored", retryable=False
                ) from None
            await asyncio.to_thread(path.write_bytes, data)
        return join.Part(path, item.key)

    if not items:
        raise JoinError("the batch has no items left to join", retryable=False)
    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(fetch(i, item)) for i, item in enumerate(items)]
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None  # the others were cut off by the first
    return [task.result() for task in tasks]


async def run_join(
    parts: list[join.Part], output: Path, *, outline: bool, time_limit_s: float
) -> tuple[int, int]:
    """Join `parts` into `output` in a child process; its page count and peak memory (KiB)."""
    manifest = json.dumps(
        {
            "parts": [{"path": str(part.path), "title": part.title} for part in parts],
            "output": str(output),
            "outline": outline,
        }
    ).encode()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server.pdf.join",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=PACKAGE_ROOT,
    )
    try:
        async with asyncio.timeout(time_limit_s):
            out, err = await proc.communicate(manifest)
    except TimeoutError:
        raise JoinError(f"the join took longer than {time_limit_s:g} s", retryable=True) from None
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    why = err.decode(errors="replace").strip().splitlines()
    if proc.returncode == join.UNREADABLE:
        raise JoinError(f"item {why[-1] if why else 'unknown'}", retryable=False)
    if proc.returncode != 0:
        last = why[-1] if why else f"exit status {proc.returncode}"
        raise JoinError(f"the join process failed: {last}", retryable=True)
    answer = json.loads(out)
    return int(answer["pages"]), int(answer["max_rss_kb"])
