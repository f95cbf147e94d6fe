"""One lease consumer: claim → run → heartbeat → done | retry | fail, and hand back at stop.

Renders (server/pipeline/worker.py), batch joins (server/pipeline/combiner.py) and webhook
deliveries (server/delivery/webhooks.py) are handlers on it. Each passes the SQL of its own
rows as functions (`Queries`) and a `run` for one claimed row; the consumer does the rest the
same way for all three. A claim is one statement that leases up to the free slots' worth of
due rows to this holder and counts their attempt; the heartbeat renews the leases every third
of their length and cuts off work whose lease another holder took. A lease that runs out (its
process died) is rescued by its row's SQL, in the claim or in a rescuer
(server/queue/maintenance.py). Every final write names the holder and the attempt, so a result
whose lease was lost is refused: only the holder of the lease records anything.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping
from types import MappingProxyType
from typing import Any, Generic, Protocol, TypeVar

from server.errors import DB_ERRORS, DB_OR_QUERY_ERRORS, backoff_s, jittered
from server.queue import listener as notifications
from server.tasks import background

log = logging.getLogger(__name__)

#: A final write the database could not take is tried again this often, until it answers.
RECORD_RETRY_S = 0.5
#: How long stopping waits for a claim in flight, and for work it cut off to unwind.
STOP_WAIT_S = 5.0
#: A claimed row stays its holder's this long without a heartbeat (renewed every third of it):
#: a process frozen or cut off longer loses its rows to another, one that died is rescued after.
LEASE_S = 30.0
#: The first wait before a failed attempt's next, doubled per attempt up to RETRY_MAX_S: a
#: database or bucket away for minutes is outlasted in a job's few attempts.
RETRY_BASE_S = 2.0
RETRY_MAX_S = 300.0

R = TypeVar("R")


class Claim(Protocol):
    """A claimed row, held for one attempt."""

    @property
    def key(self) -> uuid.UUID: ...

    @property
    def attempt(self) -> int: ...

    @property
    def log_extra(self) -> dict[str, str]: ...


T = TypeVar("T", bound=Claim)


class Stage(enum.StrEnum):
    """Where a lease's work is, in the order it moves through them."""

    PREPARING = "preparing"  # not begun: handed back at once when the consumer stops
    RUNNING = "running"  # begun: let finish within the grace period when the consumer stops
    SETTLING = "settling"  # past the point of no return (its result being stored), in no slot
    RECORDING = "recording"  # the final write, never cut off
    ABORTED = "aborted"  # being cancelled: nothing of it is recorded

    @property
    def abortable(self) -> bool:
        """Cut off when its row is cancelled, when the lease is lost, or at stop. Past this, the
        final statement itself refuses a row that is no longer this attempt's."""
        return self in (Stage.PREPARING, Stage.RUNNING)

    @property
    def holds_slot(self) -> bool:
        """Counted against the slots: at work, or still unwinding from an abort."""
        return self.abortable or self is Stage.ABORTED


_NEXT: Mapping[Stage, frozenset[Stage]] = {
    Stage.PREPARING: frozenset({Stage.RUNNING, Stage.SETTLING, Stage.RECORDING, Stage.ABORTED}),
    Stage.RUNNING: frozenset({Stage.RUNNING, Stage.SETTLING, Stage.RECORDING, Stage.ABORTED}),
    Stage.SETTLING: frozenset({Stage.RECORDING}),
    Stage.RECORDING: frozenset(),
    Stage.ABORTED: frozenset(),
}


class Outcome(enum.StrEnum):
    """How an attempt ended."""

    DONE = "done"
    RETRYING = "retrying"
    FAILED = "failed"
    ABORTED = "aborted"
    LATE = "late"  # its result was refused: the lease was no longer this attempt's


class Failed(Exception):
    """An attempt that failed: tried again after the backoff when `retryable`, else final."""

    def __init__(
        self, error: str, *, retryable: bool = True, retry_after_s: float | None = None
    ) -> None:
        super().__init__(error)
        self.error = error
        self.retryable = retryable
        #: How long the other side asked to be left alone (a Retry-After), if it said.
        self.retry_after_s = retry_after_s


#: Seconds before the attempt after failed attempt `n` (1-based), given the wait the other side
#: asked for (or None); None when no attempt is left.
Backoff = Callable[[int, float | None], float | None]


def doubling(base_s: float, max_s: float) -> Backoff:
    """About base_s, doubled per attempt up to max_s, jittered; the row counts its attempts."""
    return lambda attempt, _asked_s: backoff_s(attempt, base_s=base_s, max_s=max_s)


@dataclasses.dataclass(frozen=True, slots=True)
class Queries(Generic[T]):
    """The SQL of one kind of leased row, as its own module's functions, each naming the
    holder of the lease."""

    #: (limit, holder, lease_s) → up to `limit` due rows, leased to the holder, attempt counted.
    claim: Callable[[int, str, float], Awaitable[list[T]]]
    #: (row, holder, failure, retry_in_s) → the failed attempt recorded: due again in
    #: retry_in_s, or final when that is None or the row's attempts are used up (RETRYING or
    #: FAILED); None when the row is no longer this attempt's.
    fail: Callable[[T, str, Failed, float | None], Awaitable[Outcome | None]]
    #: (keys, holder) → how many rows went back to the queue, their attempt not charged.
    release: Callable[[list[uuid.UUID], str], Awaitable[int]]
    #: (keys, holder, lease_s) → the keys still held, their leases renewed. None: the lease
    #: outlasts any run, and there is no heartbeat.
    renew: Callable[[list[uuid.UUID], str, float], Awaitable[set[uuid.UUID]]] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Config:
    #: What one row is called in task names and log lines: "job", "join", "webhook".
    name: str
    slots: int
    lease_s: float
    poll_interval_s: float
    backoff: Backoff
    #: At stop, how long work that has begun may go on before it is cut off and handed back.
    grace_s: float = 0.0


def standard(name: str, slots: int, *, grace_s: float = 0.0) -> Config:
    """A consumer at the standard lease, poll and backoff, as they are when it starts."""
    return Config(
        name=name,
        slots=slots,
        lease_s=LEASE_S,
        poll_interval_s=notifications.POLL_INTERVAL_S,
        backoff=doubling(RETRY_BASE_S, RETRY_MAX_S),
        grace_s=grace_s,
    )


class Lease(Generic[T]):
    """A row this consumer holds, from its claim until its work and its final write ended."""

    __slots__ = ("_consumer", "item", "phase", "since", "stage", "task", "write")

    def __init__(self, item: T, consumer: Consumer[T] | None = None) -> None:
        self.item = item
        self.stage = Stage.PREPARING
        #: The handler's name for what the work does now (the time spent in each is observed).
        self.phase: str = Stage.PREPARING.value
        #: When it entered its phase (time.perf_counter).
        self.since = time.perf_counter()
        self.task: asyncio.Task[None] | None = None
        #: The attempt's final write, a task of its own so that cancelling `task` cannot cut it.
        self.write: asyncio.Task[Any] | None = None
        self._consumer = consumer

    @property
    def key(self) -> uuid.UUID:
        return self.item.key

    @property
    def log_extra(self) -> dict[str, str]:
        return self.item.log_extra

    @property
    def ended(self) -> bool:
        return all(task is None or task.done() for task in (self.task, self.write))

    def enter(self, stage: Stage, phase: str | None = None) -> None:
        """Move on to `stage`; `phase` names it for the handler (the stage's name if not)."""
        if stage not in _NEXT[self.stage]:
            raise RuntimeError(f"{self.key} cannot go from {self.stage} to {stage}")
        now = time.perf_counter()
        left, spent, held = self.phase, now - self.since, self.stage.holds_slot
        self.stage, self.phase, self.since = stage, phase or stage.value, now
        if self._consumer is not None:
            self._consumer._moved(left, spent, freed=held and not stage.holds_slot)

    async def record(self, write: Callable[[], Awaitable[R]]) -> R | None:
        """The attempt's final write, in a task of its own that neither an abort nor a stop cuts
        in half, so the row is recorded or stays leased until its lease is rescued. None when
        it could not be written."""
        self.enter(Stage.RECORDING)
        task = asyncio.create_task(self._retrying(write), name=f"record-{self.key}")
        self.write = task
        if self._consumer is not None:
            self._consumer._own(self, task)
        return await asyncio.shield(task)

    async def _retrying(self, write: Callable[[], Awaitable[R]]) -> R | None:
        # While the database is away, try again until it answers, even past the lease: only its
        # answer says whether the attempt is still this holder's (one that is not is refused);
        # a write given up on could have committed, so what it recorded must be kept.
        while True:
            try:
                return await write()
            except DB_ERRORS as exc:
                log.warning("could not record the result, retrying: %s", exc, extra=self.log_extra)
                await asyncio.sleep(RECORD_RETRY_S)
            except Exception:
                log.exception("could not record the result", extra=self.log_extra)
                return None


class Consumer(Generic[T]):
    """Up to `slots` leased rows at work at once, claimed as slots free, when woken (a NOTIFY,
    an event) and at a jittered poll, the safety net for a wake-up that never came."""

    def __init__(
        self,
        queries: Queries[T],
        run: Callable[[Lease[T]], Awaitable[Outcome]],
        config: Config,
        *,
        holder: str,
        observe: Callable[[str, float], None] | None = None,
        on_outcome: Callable[[Outcome], None] | None = None,
    ) -> None:
        """`run` does one attempt's work and its done write (`Lease.record`), and says how that
        went; a failure it raises as `Failed` (or any error) is recorded here. `observe` gets
        the seconds a lease spent in each phase, `on_outcome` how each attempt ended."""
        self._queries = queries
        self._run = run
        self._config = config
        self.holder = holder
        self._observe = observe
        self._on_outcome = on_outcome
        self._leases: dict[uuid.UUID, Lease[T]] = {}
        self._wake = asyncio.Event()
        # When the soonest retry recorded here falls due (time.monotonic).
        self._retry_due: float | None = None
        self._stopping = False
        self._claiming = False
        # Clear while the claim loop runs: stop() waits for a claim in flight to come back, so
        # the rows it took are known (and handed back) instead of left leased.
        self._loop_done = asyncio.Event()
        self._loop_done.set()
        #: Set while the claim loop waits for work with a slot free: a row due now is claimed
        #: when the next wake-up comes (a signal tests wait on).
        self.waiting = asyncio.Event()

    @property
    def name(self) -> str:
        return self._config.name

    @property
    def in_flight(self) -> Mapping[uuid.UUID, Lease[T]]:
        return MappingProxyType(self._leases)

    @property
    def busy(self) -> int:
        return len(self._leases)

    @property
    def free(self) -> int:
        """Slots no lease holds."""
        return self._config.slots - sum(lease.stage.holds_slot for lease in self._leases.values())

    def wake(self) -> None:
        """New work may be due: claim now instead of at the poll."""
        self._wake.set()

    def abort(self, key: uuid.UUID, why: str) -> bool:
        """Cut off the work of a lease not past its point of no return; False if it is past it,
        over, or not held here."""
        lease = self._leases.get(key)
        return lease is not None and self._abort(lease, why)

    def _abort(self, lease: Lease[T], why: str) -> bool:
        if not lease.stage.abortable or lease.task is None or lease.task.done():
            return False
        log.info("aborting %s (%s)", self.name, why, extra=lease.log_extra)
        lease.enter(Stage.ABORTED)
        lease.task.cancel()
        return True

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Claims and heartbeats for the life of the `async with`; on a normal exit, `stop`."""
        async with contextlib.AsyncExitStack() as stack:
            await stack.enter_async_context(background(f"{self.name}-claims", self.run()))
            if self._queries.renew is not None:
                beats = self.heartbeat()
                await stack.enter_async_context(background(f"{self.name}-heartbeat", beats))
            yield
            await self.stop()

    async def run(self) -> None:
        """Claim while slots are free; between claims, wait for a wake-up, a freed slot, a
        retry falling due, or the jittered poll."""
        self._loop_done.clear()
        try:
            while not self._stopping:
                # Cleared before looking, so a wake-up that arrives while claiming is not lost
                # and a set flag never turns this loop into a spin while every slot is busy.
                self._wake.clear()
                free = self.free
                if free > 0:
                    claimed = await self._claim(free)
                    for item in claimed:
                        self._start(item)
                    if len(claimed) == free:
                        continue  # more may be due: claim again as soon as a slot frees
                await self._wait(idle=free > 0)
        finally:
            self._loop_done.set()

    async def _claim(self, limit: int) -> list[T]:
        self._claiming = True
        try:
            return await self._queries.claim(limit, self.holder, self._config.lease_s)
        except DB_OR_QUERY_ERRORS as exc:
            log.warning("claiming %ss failed: %s", self.name, exc)
            return []
        finally:
            self._claiming = False

    async def _wait(self, *, idle: bool) -> None:
        wait_s = jittered(self._config.poll_interval_s, 0.5)
        if self._retry_due is not None:
            left_s = self._retry_due - time.monotonic()
            if left_s <= 0:
                self._retry_due = None
                return
            wait_s = min(wait_s, left_s)
        if idle:
            self.waiting.set()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._wake.wait()
        finally:
            self.waiting.clear()

    def _start(self, item: T) -> None:
        lease = Lease(item, self)
        lease.task = asyncio.create_task(self._attempt(lease), name=f"{self.name}-{item.key}")
        self._leases[item.key] = lease
        self._own(lease, lease.task)

    async def _attempt(self, lease: Lease[T]) -> None:
        try:
            outcome = await self._run(lease)
        except asyncio.CancelledError:
            if lease.stage is not Stage.ABORTED:
                raise
            outcome = Outcome.ABORTED
        except Exception as exc:
            if lease.stage is Stage.ABORTED:
                outcome = Outcome.ABORTED
            elif lease.stage is Stage.RECORDING:
                raise  # after its final write: nothing left to record (the task's error is logged)
            elif isinstance(exc, Failed):
                outcome = await self._fail(lease, exc)
            else:
                log.exception("%s crashed", self.name, extra=lease.log_extra)
                outcome = await self._fail(lease, Failed(f"internal error: {type(exc).__name__}"))
        if outcome is Outcome.ABORTED:
            # No longer this holder's (cancelled, rescued, handed back): nothing to record.
            log.info("%s aborted", self.name, extra=lease.log_extra)
        if self._on_outcome is not None:
            self._on_outcome(outcome)

    async def _fail(self, lease: Lease[T], failure: Failed) -> Outcome:
        retry_in_s = None
        if failure.retryable:
            retry_in_s = self._config.backoff(lease.item.attempt, failure.retry_after_s)
        outcome = await lease.record(
            lambda: self._queries.fail(lease.item, self.holder, failure, retry_in_s)
        )
        extra = lease.log_extra
        if outcome is Outcome.RETRYING and retry_in_s is not None:
            log.info("%s retrying in %.1f s: %s", self.name, retry_in_s, failure.error, extra=extra)
            due = time.monotonic() + retry_in_s
            self._retry_due = due if self._retry_due is None else min(self._retry_due, due)
        elif outcome is Outcome.FAILED:
            log.warning("%s failed: %s", self.name, failure.error, extra=extra)
        return outcome or Outcome.LATE

    def _moved(self, left: str, spent_s: float, *, freed: bool) -> None:
        if self._observe is not None:
            self._observe(left, spent_s)
        if freed:
            self._wake.set()  # its slot is free for the next row

    def _own(self, lease: Lease[T], task: asyncio.Task[Any]) -> None:
        """Log a task of `lease` that failed; forget the lease once all its tasks ended."""

        def ended(task: asyncio.Task[Any]) -> None:
            if not task.cancelled() and (exc := task.exception()) is not None:
                log.error("task %s failed", task.get_name(), exc_info=exc, extra=lease.log_extra)
            if lease.ended and self._leases.get(lease.key) is lease:
                del self._leases[lease.key]
                self._wake.set()
                if lease.stage is Stage.RECORDING and self._observe is not None:
                    self._observe(lease.phase, time.perf_counter() - lease.since)

        task.add_done_callback(ended)

    async def heartbeat(self) -> None:
        """Renew the leases held, every third of their length; cut off the work of those this
        consumer no longer holds."""
        renew = self._queries.renew
        if renew is None:
            return
        while True:
            await asyncio.sleep(self._config.lease_s / 3)
            keys = [k for k, lease in self._leases.items() if lease.stage is not Stage.ABORTED]
            if not keys:
                continue
            try:
                held = await renew(keys, self.holder, self._config.lease_s)
            except DB_OR_QUERY_ERRORS as exc:
                log.warning("%s heartbeat failed: %s", self.name, exc)
                continue
            for key in set(keys) - held:
                self.abort(key, "no longer held")

    async def stop(self) -> None:
        """Stop claiming; hand work not yet begun back at once; let the rest go on within the
        grace period, then cut it off and hand it back too, its attempt not charged. Final
        writes under way are let finish."""
        self._stopping = True
        self._wake.set()
        # A claim in flight commits whether or not its answer is read: let it come back, so
        # the rows it took are known and handed back below (a database that does not answer is
        # not waited for long; its rows then wait for their lease to run out).
        if self._claiming:
            log.info("stopping: waiting up to %.0f s for a claim in flight", STOP_WAIT_S)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(STOP_WAIT_S):
                await self._loop_done.wait()
        await self._cut_off(
            [lease for lease in self._leases.values() if lease.stage is Stage.PREPARING]
        )
        grace_s = self._config.grace_s
        if grace_s > 0 and (pending := _tasks(self._leases.values())):
            log.info("waiting up to %.0f s for %s %ss in flight", grace_s, self.busy, self.name)
            await asyncio.wait(pending, timeout=grace_s)
        await self._cut_off(list(self._leases.values()))

    async def _cut_off(self, leases: list[Lease[T]]) -> None:
        """Abort those of `leases` not past their point of no return, wait briefly for every
        one of them to end, and hand the aborted ones back."""
        aborted = [lease.key for lease in leases if self._abort(lease, "stopping")]
        if pending := _tasks(leases):
            await asyncio.wait(pending, timeout=STOP_WAIT_S)
        if not aborted:
            return
        try:
            released = await self._queries.release(aborted, self.holder)
        except DB_OR_QUERY_ERRORS as exc:
            log.warning("could not release unfinished %ss (their leases will): %s", self.name, exc)
        else:
            log.info("released %s unfinished %ss back to the queue", released, self.name)


def _tasks(leases: Collection[Lease[Any]]) -> set[asyncio.Task[Any]]:
    """The tasks of `leases` still running."""
    return {
        task
        for lease in leases
        for task in (lease.task, lease.write)
        if task is not None and not task.done()
    }
