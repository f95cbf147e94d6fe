"""Periodic services every process runs: the rescuer, the pruner, the event log and retention.

Each is one pass on an interval, started and stopped the same way (server/tasks.py); where
several processes share a database, the passes keep out of each other's way themselves
(SKIP LOCKED, an advisory lock), so every process may run them all.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg

from server.files.storage import Storage
from server.queue import admission, combine, jobs, retention
from server.settings import Settings
from server.tasks import periodic

log = logging.getLogger(__name__)

#: How often each process looks for leases that ran out: a dead process's jobs move on within
#: the lease and this.
RESCUE_INTERVAL_S = 5.0
IDEMPOTENCY_PRUNE_INTERVAL_S = 600.0
#: The event log's pass: partitions made ahead of its writers, expired ones dropped. Often
#: enough that a burst rarely outruns the partitions made ahead (it would use the overflow).
EVENT_LOG_INTERVAL_S = 600.0
RETENTION_INTERVAL_S = 3600.0


@dataclasses.dataclass(frozen=True, slots=True)
class Service:
    name: str
    interval_s: float
    one_pass: Callable[[], Awaitable[object]]


@contextlib.asynccontextmanager
async def running(pool: asyncpg.Pool, storage: Storage, settings: Settings) -> AsyncIterator[None]:
    """Every service for the life of the `async with`; all cancelled and awaited on exit."""
    async with contextlib.AsyncExitStack() as stack:
        for service in services(pool, storage, settings):
            await stack.enter_async_context(
                periodic(service.name, service.interval_s, service.one_pass)
            )
        yield


def services(pool: asyncpg.Pool, storage: Storage, settings: Settings) -> list[Service]:
    """The services these settings turn on."""

    async def rescue() -> None:
        count = await jobs.rescue_expired(pool)
        if count:
            log.warning("rescued %s jobs whose worker stopped renewing its lease", count)
        count = await combine.rescue_expired(pool)
        if count:
            log.warning("rescued %s batch joins whose process stopped renewing its lease", count)

    async def prune_keys() -> None:
        await admission.prune_keys(pool)

    # The log keeps events no longer than retention keeps jobs: a deleted job's events go
    # with their partition, at most a stretch after the job.
    keep_s = retention.EVENT_RETENTION_S
    if settings.retention_days:
        keep_s = min(keep_s, settings.retention_days * 86400)

    async def event_log() -> None:
        await retention.extend_log(pool, stretch_s=retention.stretch_s(keep_s))
        dropped = await retention.prune_log(pool, keep_s=keep_s)
        if dropped:
            log.info("dropped event log partitions %s: events older than %s s", dropped, keep_s)

    async def sweep() -> None:
        days = settings.retention_days
        deleted = await retention.sweep(pool, storage, older_than_days=days)
        if deleted:
            log.info("retention deleted %s jobs finished more than %s days ago", deleted, days)
        deleted = await retention.sweep_batches(pool, storage, older_than_days=days)
        if deleted:
            log.info("retention deleted %s combined batches older than %s days", deleted, days)
        deleted = await retention.sweep_tenant_deliveries(pool, older_than_days=days)
        if deleted:
            log.info(
                "retention deleted %s tenant webhook deliveries older than %s days", deleted, days
            )

    found = [
        Service("rescuer", RESCUE_INTERVAL_S, rescue),
        Service("idempotency-pruner", IDEMPOTENCY_PRUNE_INTERVAL_S, prune_keys),
        Service("event-log", EVENT_LOG_INTERVAL_S, event_log),
    ]
    if settings.retention_days:
        found.append(Service("retention", RETENTION_INTERVAL_S, sweep))
    return found
