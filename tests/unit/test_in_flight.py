"""The per-tenant cap on jobs in flight reads the database at most every `ttl_s` and never
makes a submission far under the cap wait for that read, nor start it before the job is
inserted."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import asyncpg
import pytest

from server.problems import Problem
from server.queue.admission import InFlight


class CountingPool:
    """Answers the in-flight count query with `count`; `gate`, when set, holds the answer;
    `asked` is set by every read."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.reads = 0
        self.gate: asyncio.Event | None = None
        self.asked = asyncio.Event()

    async def fetchval(self, _query: str, _tenant: str) -> int:
        self.reads += 1
        self.asked.set()
        if self.gate is not None:
            await self.gate.wait()
        return self.count


def as_pool(fake: CountingPool) -> asyncpg.Pool:
    return cast(asyncpg.Pool, fake)


def started_elsewhere() -> set[asyncio.Task[Any]]:
    """The tasks running beside the test's own: the background reads the cap has started."""
    return {task for task in asyncio.all_tasks() if task is not asyncio.current_task()}


async def settled() -> None:
    """Until every background read has ended (answered or failed)."""
    async with asyncio.timeout(5):
        while pending := started_elsewhere():
            await asyncio.wait(pending)


async def test_the_first_check_reads_then_counts_locally() -> None:
    fake = CountingPool(count=3)
    in_flight = InFlight(ttl_s=60)
    await in_flight.check(as_pool(fake), "t", 5)
    in_flight.admitted(as_pool(fake), "t")
    await in_flight.check(as_pool(fake), "t", 5)  # 4 of 5: still admitted, from memory
    in_flight.admitted(as_pool(fake), "t")
    assert fake.reads == 1
    fake.count = 5
    with pytest.raises(Problem) as refused:
        await in_flight.check(as_pool(fake), "t", 5)  # at the cap: read again before refusing
    assert refused.value.status == 429 and fake.reads == 2


async def test_a_stale_count_far_under_the_cap_is_read_again_without_waiting() -> None:
    fake = CountingPool(count=1)
    in_flight = InFlight(ttl_s=0)  # always stale
    await in_flight.check(as_pool(fake), "t", 100)
    in_flight.admitted(as_pool(fake), "t")
    await settled()
    reads = fake.reads
    fake.gate = asyncio.Event()  # the next read does not answer until let go
    fake.count = 100  # another process filled the tenant's cap meanwhile
    await asyncio.wait_for(in_flight.check(as_pool(fake), "t", 100), 1)  # admitted at once
    # Nothing read ahead of the insert (it may be handed off), and nothing started to.
    assert fake.reads == reads and not started_elsewhere()
    fake.asked.clear()
    in_flight.admitted(as_pool(fake), "t")  # inserted: now the stale count is read again
    async with asyncio.timeout(5):
        await fake.asked.wait()  # the read is held at the gate
    await asyncio.wait_for(in_flight.check(as_pool(fake), "t", 100), 1)
    in_flight.admitted(as_pool(fake), "t")
    fake.gate.set()
    await settled()
    assert fake.reads == reads + 1  # one read in the background, not one per submission
    with pytest.raises(Problem):
        await in_flight.check(as_pool(fake), "t", 100)  # the fresh count refuses


async def test_a_stale_count_near_the_cap_waits_for_the_read() -> None:
    fake = CountingPool(count=60)
    in_flight = InFlight(ttl_s=0)
    await in_flight.check(as_pool(fake), "t", 100)
    fake.gate = asyncio.Event()
    fake.asked.clear()
    checking: asyncio.Task[Any] = asyncio.create_task(in_flight.check(as_pool(fake), "t", 100))
    async with asyncio.timeout(5):
        await fake.asked.wait()  # the fresh count is asked for and held at the gate
    assert not checking.done()  # 60 of 100: the submission waits for the fresh count
    fake.count = 100
    fake.gate.set()
    with pytest.raises(Problem):
        await checking


async def test_a_failed_background_read_is_tried_again_by_the_next_check() -> None:
    class Failing(CountingPool):
        async def fetchval(self, _query: str, _tenant: str) -> int:
            self.reads += 1
            if self.reads > 1:
                raise OSError("connection refused")
            return self.count

    fake = Failing(count=1)
    in_flight = InFlight(ttl_s=0)
    await in_flight.check(as_pool(fake), "t", 100)
    in_flight.admitted(as_pool(fake), "t")  # its background read fails
    await settled()
    assert fake.reads == 2
    await in_flight.check(as_pool(fake), "t", 100)
    in_flight.admitted(as_pool(fake), "t")
    await settled()
    assert fake.reads == 3
