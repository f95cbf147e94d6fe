"""The joins of one process: fetch → join → store → done, a handler on the lease consumer.

A batch with `combine` is due once every item is done (0016_batch_combine.sql). A process that
renders (`serve` or `worker`) claims it, copies the items' PDFs from storage into a
temporary folder, a few at a time, joins them in a child process (server/pdf/join.py: the
event loop never runs PDF code, and the child's memory is given back when it ends), stores the
file and only then records it done, as a job's file. The consumer (server/queue/lease.py)
claims, renews the lease, retries a failed join after its backoff and hands joins back at
shutdown (a join starts over cheaply, so none is waited for). Wake-ups come from the batch
events the hub reads (a batch whose items are all final, its join pending); a poll is the
safety net.
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
from typing import Any

import asyncpg

from server.errors import DB_OR_QUERY_ERRORS, PermanentError, StorageError, TransientError
from server.events import JobEvent
from server.files.storage import Storage
from server.options import RenderOptions
from server.pdf import join
from server.pdf.finishing import FinishPool, Work
from server.queue import combine, lease
from server.queue.combine import Claimed, CombineState
from server.queue.lease import Consumer, Failed, Lease, Outcome, Queries, Stage
from server.queue.metrics import Metrics
from server.signkey import SigningKey

log = logging.getLogger(__name__)

#: Items' PDFs read from storage at once for one join (their bytes are in memory meanwhile).
FETCH_CONCURRENCY = 8
# `python -m server.pdf.join` runs from the folder that holds this package, so that the child
# imports this very copy of it.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
#: Failures another attempt may get past: the storage or the database away for a while.
TRANSIENT: tuple[type[Exception], ...] = (StorageError, *DB_OR_QUERY_ERRORS)


#: Joins at once in a process: a join is a copy and a page-tree merge, bound by the bucket and
#: the disk, and many processes share the batches.
SLOTS = 1


class JoinError(Failed):
    """A join that failed; `retryable` says whether another attempt may succeed."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message, retryable=retryable)


@dataclasses.dataclass(frozen=True, slots=True)
class Joined:
    pages: int
    size_bytes: int
    max_rss_kb: int


class Combiner:
    """The join slots of one process: a handler on the lease consumer (server/queue/lease.py)."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        storage: Storage,
        *,
        time_limit_s: float,
        worker_id: str,
        metrics: Metrics | None = None,
        signing: SigningKey | None = None,
        max_mb: int = 0,
    ) -> None:
        self._pool = pool
        self._storage = storage
        self._time_limit_s = time_limit_s
        self._signing = signing
        # The process a combined file is signed in (a finishing process, started at the first
        # signed join): pyHanko never runs on the event loop, nor in this process.
        self._signer = FinishPool(SLOTS, max_mb=max_mb)
        self._metrics = metrics or Metrics()
        self.worker_id = worker_id
        self.leases: Consumer[Claimed] = Consumer(
            Queries(claim=self._claim, fail=self._fail, release=self._release, renew=self._renew),
            self._attempt,
            lease.standard("join", SLOTS),
            holder=worker_id,
            on_outcome=self._count,
        )
        self.joined = 0

    def on_event(self, event: JobEvent) -> None:
        """A batch whose items are all final and whose join is pending: claim now."""
        if event.type != "batch.progress":
            return
        combined = event.job.get("combined")
        if isinstance(combined, dict) and combined.get("status") == "pending":
            if event.job.get("progress") == 100:
                self.leases.wake()

    # --- The join SQL the consumer calls (server/queue/combine.py) ------------------------

    async def _claim(self, limit: int, holder: str, lease_s: float) -> list[Claimed]:
        claimed = await combine.claim(self._pool, limit=limit, worker_id=holder, lease_s=lease_s)
        for one in claimed:
            log.info(
                "joining batch (attempt %s/%s)",
                one.attempt,
                one.max_attempts,
                extra=one.log_extra,
            )
        return claimed

    async def _renew(self, ids: list[uuid.UUID], holder: str, lease_s: float) -> set[uuid.UUID]:
        return await combine.heartbeat(self._pool, ids, worker_id=holder, lease_s=lease_s)

    async def _release(self, ids: list[uuid.UUID], holder: str) -> int:
        return await combine.release(self._pool, ids, worker_id=holder)

    async def _fail(
        self, claimed: Claimed, holder: str, failure: Failed, retry_in_s: float | None
    ) -> Outcome | None:
        state = await combine.finish_failed(
            self._pool,
            claimed,
            worker_id=holder,
            error=failure.error,
            retryable=retry_in_s is not None,
            retry_in_s=retry_in_s or 0.0,
        )
        if state is CombineState.PENDING:
            return Outcome.RETRYING
        return Outcome.FAILED if state is CombineState.FAILED else None

    def _count(self, outcome: Outcome) -> None:
        if outcome in (Outcome.DONE, Outcome.RETRYING, Outcome.FAILED):
            self._metrics.combines_finished.labels(outcome).inc()

    # --- One attempt ----------------------------------------------------------------------

    async def _attempt(self, held: Lease[Claimed]) -> Outcome:
        claimed = held.item
        started = time.perf_counter()
        held.enter(Stage.RUNNING)
        try:
            items = await combine.items(self._pool, claimed.batch_id)
            joined = await join_stored(
                self._storage,
                items,
                claimed.object_key,
                filename=combine.filename(claimed.batch_id),
                outline=claimed.outline,
                time_limit_s=self._time_limit_s,
                finish=self._signed(claimed.sign) if claimed.sign is not None else None,
            )
        except PermanentError as exc:
            raise JoinError(str(exc), retryable=False) from None
        except TransientError as exc:
            raise JoinError(str(exc), retryable=True) from None
        except TRANSIENT as exc:
            raise Failed(str(exc)) from exc
        self._metrics.combine_seconds.observe(time.perf_counter() - started)
        done = await held.record(
            lambda: combine.finish_done(
                self._pool,
                claimed,
                worker_id=self.worker_id,
                pages=joined.pages,
                size_bytes=joined.size_bytes,
            )
        )
        if not done:
            log.info("late join discarded", extra=claimed.log_extra)
            await self._delete([claimed.object_key])
            return Outcome.LATE
        self.joined += 1
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
        return Outcome.DONE

    def _signed(self, sign: dict[str, Any]) -> Callable[[bytes], Awaitable[bytes]]:
        """The combined file signed as `sign` asks, in a finishing process."""
        options = RenderOptions.model_validate({"sign": sign})

        async def signed(data: bytes) -> bytes:
            work = Work(data, options, signing=self._signing)
            finished = await self._signer.run(work, timeout_s=self._time_limit_s)
            return finished.pdf

        return signed

    async def close(self) -> None:
        await self._signer.close()

    async def _delete(self, keys: list[str]) -> None:
        """Files nobody will download; one that cannot be deleted is retention's to remove."""
        for key in keys:
            with contextlib.suppress(Exception):
                await self._storage.delete(key)


async def join_stored(
    storage: Storage,
    items: list[combine.Item],
    key: str,
    *,
    filename: str,
    outline: bool,
    time_limit_s: float,
    finish: Callable[[bytes], Awaitable[bytes]] | None = None,
) -> Joined:
    """Join the stored PDFs of `items`, in order, and store the result at `key`: the items are
    copied into a temporary folder a few at a time, joined there by a child process, and the
    folder is removed whatever happens. `finish` makes the joined file what is stored (signs it)."""
    folder = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix="pressroom-join-"))
    try:
        parts = await _fetch(storage, items, folder)
        output = folder / "joined.pdf"
        pages, max_rss_kb = await run_join(
            parts, output, outline=outline, time_limit_s=time_limit_s
        )
        data = await asyncio.to_thread(output.read_bytes)
        if finish is not None:
            data = await finish(data)
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
