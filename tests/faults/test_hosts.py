"""Pressroom on separate hosts of a network that fails (tests/hosts.py, tests/netns.py): a
host cut off from the database, a slow line to the database, the storage host down, a host
killed. Three Pressroom hosts, one database host, one storage host; one network per module,
each test with a tenant of its own and the network whole again after it."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
import statistics
import sys
import time
from collections.abc import AsyncIterator, Iterator

import aiohttp
import pytest

from tests import netns
from tests.hosts import (
    SLOW_LINE_DELAY_MS,
    Follower,
    PressroomHost,
    Site,
    assert_every_event_once,
    build_site,
    connected,
    db_value,
    follow,
    logged_ids,
    slow_job,
    submit,
    until,
    wait_rows,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def whole_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    if (why := netns.unavailable()) is not None:
        pytest.skip(why)
    site = build_site(tmp_path_factory.mktemp("site"), slow_database=True)
    try:
        yield site
    finally:
        site.close()


@pytest.fixture
async def site(whole_site: Site) -> AsyncIterator[Site]:
    """The module's network, made whole again after the test: every cable in, the line to
    the database clean, every Pressroom host running and ready."""
    yield whole_site
    network = whole_site.network
    for host in network.hosts.values():
        for segment in host.addresses:
            host.link(segment, up=True)
    network.impair(network.hosts["db"], False)
    for server in whole_site.servers:
        if server.process is None or server.process.poll() is not None:
            server.kill()
            server.start()
    for server in whole_site.servers:
        await asyncio.to_thread(server.wait_ready, whole_site.client)


def running_on(server: PressroomHost) -> str:
    """SQL for the ids of a tenant's ($1) jobs running on `server` (its pid names its workers)."""
    return (
        "SELECT coalesce(array_agg(id ORDER BY id), '{}') FROM jobs WHERE status = 'running'"
        f" AND tenant = $1 AND worker_id LIKE '%:{server.worker_pid()}:%'"
    )


async def accept(http: aiohttp.ClientSession, url: str, key: str, body: dict[str, object]) -> str:
    status, created = await submit(http, url, key, body)
    assert status == 202 and created is not None, (status, created)
    job_id: str = created["id"]
    return job_id


async def assert_nothing_lost(site: Site, http: aiohttp.ClientSession, tenant: str) -> int:
    """Every job of `tenant` is done, once, with exactly its one file in the bucket."""
    async with connected(site.database.dsn) as conn:
        statuses = dict(
            await conn.fetch(
                "SELECT status, count(*) FROM jobs WHERE tenant = $1 GROUP BY status", tenant
            )
        )
        total = sum(statuses.values())
        assert statuses == {"done": total}, statuses
        twice = await conn.fetchval(
            "SELECT count(*) FROM (SELECT job_id FROM job_events WHERE tenant = $1 AND"
            " type = 'job.done' GROUP BY job_id HAVING count(*) > 1) t",
            tenant,
        )
        assert twice == 0, "no job done twice"
        rows = await conn.fetch("SELECT object_key FROM jobs WHERE tenant = $1", tenant)
    assert site.bucket is not None
    stored = await site.bucket.keys(http, f"{tenant}/")
    assert sorted(stored) == sorted(r["object_key"] for r in rows), "one file per job, its own"
    return total


def logged_at(log: str, message: str) -> list[float]:
    """When a process logged `message` (its lines start with the local time)."""
    return [
        dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for line in log.splitlines()
        if message in line
    ]


async def done_by(server: PressroomHost, http: aiohttp.ClientSession) -> float:
    """Attempts `server` recorded done (from its /metrics)."""
    async with http.get(f"{server.url}/metrics") as resp:
        text = await resp.text()
    match = re.search(r'^pressroom_job_attempts_total\{outcome="done"\} (\S+)$', text, re.M)
    return float(match.group(1)) if match else 0.0


# A process of the host with a transaction open, as a request between its insert and its
# commit: the event log's commit watermark waits for it, on every host.
HOLD_TRANSACTION = """
import asyncio, sys
from server.queue import db
async def main():
    conn = await db.connect(sys.argv[1])
    await conn.execute("BEGIN")
    await conn.fetchval("SELECT pg_current_xact_id()")
    print("holding", flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


@pytest.mark.timeout(240)
async def test_a_host_cut_off_from_the_database_loses_nothing(site: Site) -> None:
    tenant, key = await site.tenant()
    h1 = site.servers[0]
    dsn = site.database.dsn
    async with site.session() as http, connected(dsn) as conn:
        # Three clients of h1, and one of h2 that never has to move.
        followers = await follow(http, site, key, [0, 0, 0, 1])
        accepted = [await accept(http, h1.url, key, slow_job(n, ms=3000)) for n in range(6)]
        accepted += [
            await accept(http, site.servers[n % 3].url, key, slow_job(n, ms=1500))
            for n in range(6, 12)
        ]
        held = await db_value(
            dsn, running_on(h1), tenant, until=lambda ids: len(ids) >= 2, timeout_s=30
        )
        holder = h1.host.spawn(
            [sys.executable, "-c", HOLD_TRANSACTION, site.database.url],
            stdout=asyncio.subprocess.PIPE,
        )
        assert holder.stdout is not None
        assert (await asyncio.to_thread(holder.stdout.readline)).strip() == b"holding"
        before = await done_by(h1, http)
        cut = time.monotonic()
        h1.host.link("db", up=False)
        try:
            # Its jobs are rescued after the lease and finish elsewhere.
            await wait_rows(
                dsn,
                "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'done'",
                len(held),
                held,
                timeout_s=60,
            )
            rescued_s = time.monotonic() - cut

            # Its clients move to other hosts, and every client has every event so far,
            # though h1's open transaction never ends.
            async def caught_up() -> bool:
                logged = await logged_ids(conn, tenant)
                return all(f.moved_since(cut, away_from=0) for f in followers[:3]) and all(
                    f.ids[: len(logged)] == logged for f in followers
                )

            await until(caught_up, followers[0].progress, timeout_s=60, what="clients caught up")
            moved_s = time.monotonic() - cut
            status, ready = await asyncio.to_thread(
                site.client.http_json, f"{h1.url}/readyz", timeout_s=10
            )
            assert status == 503 and ready["checks"]["database"].startswith("error"), ready
        finally:
            h1.host.link("db", up=True)
        healed, healed_clock = time.monotonic(), time.time()
        await asyncio.to_thread(h1.wait_ready, site.client, 60)
        rejoined_s = time.monotonic() - healed
        holder.kill()
        holder.wait()
        holder.stdout.close()
        # It takes jobs again.
        accepted += [await accept(http, h1.url, key, slow_job(n, ms=200)) for n in range(12, 18)]
        await wait_rows(
            dsn,
            "SELECT count(*) FROM jobs WHERE tenant = $1 AND status = 'done'",
            len(accepted),
            tenant,
            timeout_s=60,
        )
        assert await done_by(h1, http) > before, "the host renders again after it rejoined"
        total = await assert_nothing_lost(site, http, tenant)
        events = await assert_every_event_once(conn, tenant, followers)
    # Its renders that ended while it was cut off were refused once it was back (not given
    # up on while it was away), and their files deleted: assert_nothing_lost found one each.
    late = logged_at(h1.log(), "late result discarded")
    assert late and min(late) >= healed_clock - 0.5, (late, healed_clock)
    print(
        f"\npartition: jobs={total} running_on_cut_host={len(held)} rescued_and_done_s="
        f"{rescued_s:.1f} clients_moved_and_caught_up_s={moved_s:.1f} rejoined_s="
        f"{rejoined_s:.1f} late_results_refused={len(late)} events={events} lost=0"
    )


INVOICE = "<h1>Invoice {{ n }}</h1>" + "<p>line {{ n }} of the invoice</p>" * 40


async def _done(follower: Follower, jobs: list[str], timeout_s: float) -> None:
    async def all_done() -> bool:
        return all(job in follower.done_at for job in jobs)

    await until(all_done, follower.progress, timeout_s=timeout_s, what="every job done")


async def _burst(
    site: Site, http: aiohttp.ClientSession, key: str, follower: Follower, jobs: int
) -> float:
    """`jobs` submitted at once, spread over the hosts: jobs/s from the first submission to
    the last job.done at the client."""
    began = time.monotonic()
    sent = await asyncio.gather(
        *(
            accept(http, site.servers[n % 3].url, key, {"template": INVOICE, "data": {"n": n}})
            for n in range(jobs)
        )
    )
    await _done(follower, sent, timeout_s=120)
    return jobs / (max(follower.done_at[job] for job in sent) - began)


async def _one_by_one(
    site: Site, http: aiohttp.ClientSession, key: str, follower: Follower, jobs: int
) -> tuple[list[float], list[float]]:
    """`jobs` submitted one after the other, each once the one before is done: (submission
    → 202, submission → job.done at the client), in seconds."""
    accepted, done = [], []
    for n in range(jobs):
        at = time.monotonic()
        url = site.servers[n % 3].url
        job = await accept(http, url, key, {"template": INVOICE, "data": {"n": n}})
        accepted.append(time.monotonic() - at)
        await _done(follower, [job], timeout_s=60)
        done.append(follower.done_at[job] - at)
    return accepted, done


def _ms(values: list[float], percent: int) -> float:
    return 1000 * statistics.quantiles(values, n=100, method="inclusive")[percent - 1]


@pytest.mark.timeout(240)
async def test_a_slow_line_to_the_database_completes_everything(site: Site) -> None:
    tenant, key = await site.tenant()
    db_host = site.network.hosts["db"]
    figures: dict[str, dict[str, float]] = {}
    async with site.session() as http, connected(site.database.dsn) as conn:
        [follower] = await follow(http, site, key, [1])
        try:
            for line, impaired in (("clean", False), ("50 ms, 1 % loss", True)):
                site.network.impair(db_host, impaired)
                accepted, done = await _one_by_one(site, http, key, follower, 10)
                figures[line] = {
                    "jobs_per_s": await _burst(site, http, key, follower, 30),
                    "202_min_ms": 1000 * min(accepted),
                    "202_p50_ms": _ms(accepted, 50),
                    "pdf_p50_ms": _ms(done, 50),
                    "pdf_p90_ms": _ms(done, 90),
                }
        finally:
            site.network.impair(db_host, False)
        total = await assert_nothing_lost(site, http, tenant)
        await assert_every_event_once(conn, tenant, [follower])
    _, slow = figures.values()
    # The line was slow indeed: every 202 waits for the insert's commit, so for at least one
    # trip across the delayed link (a bound a busy machine cannot break, as it could a
    # comparison of medians with the clean line's).
    assert slow["202_min_ms"] >= SLOW_LINE_DELAY_MS, figures
    print(f"\nslow-line: jobs={total} lost=0")
    for line, values in figures.items():
        print(f"  {line}: " + " ".join(f"{k}={v:.1f}" for k, v in values.items()))


@pytest.mark.timeout(240)
async def test_the_storage_host_down_during_renders(site: Site) -> None:
    tenant, key = await site.tenant()
    assert site.bucket is not None
    storage = site.bucket.host
    dsn = site.database.dsn
    urls = [s.url for s in site.servers]
    async with site.session() as http, connected(dsn) as conn:
        followers = await follow(http, site, key, [2])
        accepted = [await accept(http, urls[n % 3], key, slow_job(n, ms=1500)) for n in range(12)]
        await wait_rows(
            dsn,
            "SELECT count(*) >= 3 FROM jobs WHERE tenant = $1 AND status = 'running'",
            True,
            tenant,
            timeout_s=30,
        )
        cut = time.monotonic()
        storage.link("front", up=False)
        try:
            # Renders that end now cannot store their file: they are retried, none is done.
            await wait_rows(
                dsn,
                "SELECT count(*) >= 3 FROM jobs WHERE tenant = $1"
                " AND errors::text LIKE '%could not write%'",
                True,
                tenant,
                timeout_s=90,
            )
            for server in site.servers:
                status, ready = await asyncio.to_thread(
                    site.client.http_json, f"{server.url}/readyz", timeout_s=10
                )
                assert status == 503, ready
                assert ready["checks"]["storage"].startswith("error"), ready
                assert ready["checks"]["database"] == "ok", ready
            down_s = time.monotonic() - cut
        finally:
            storage.link("front", up=True)
        back = time.monotonic()
        await wait_rows(
            dsn,
            "SELECT count(*) FROM jobs WHERE tenant = $1 AND status = 'done'",
            len(accepted),
            tenant,
            timeout_s=120,
        )
        recovered_s = time.monotonic() - back
        for server in site.servers:
            await asyncio.to_thread(server.wait_ready, site.client, 30)
        total = await assert_nothing_lost(site, http, tenant)
        retried = await conn.fetchval(
            "SELECT count(*) FROM jobs WHERE tenant = $1 AND errors::text LIKE '%could not write%'",
            tenant,
        )
        attempts = await conn.fetchval("SELECT sum(attempts) FROM jobs WHERE tenant = $1", tenant)
        await assert_every_event_once(conn, tenant, followers)
    print(
        f"\nstorage-down: jobs={total} retried_for_storage={retried} attempts={attempts}"
        f" down_s={down_s:.1f} all_done_after_back_s={recovered_s:.1f}"
        " readyz=503 naming storage on every host lost=0"
    )


@pytest.mark.timeout(240)
async def test_killing_a_host_loses_nothing(site: Site) -> None:
    tenant, key = await site.tenant()
    h3 = site.servers[2]
    dsn = site.database.dsn
    urls = [s.url for s in site.servers]
    async with site.session() as http, connected(dsn) as conn:
        followers = await follow(http, site, key, [2, 2, 2])
        accepted = [await accept(http, h3.url, key, slow_job(n, ms=2500)) for n in range(6)]
        accepted += [
            await accept(http, urls[n % 3], key, slow_job(n, ms=2500)) for n in range(6, 12)
        ]
        held = await db_value(
            dsn, running_on(h3), tenant, until=lambda ids: len(ids) >= 2, timeout_s=30
        )
        killed_at = time.monotonic()
        killed = h3.kill()
        await wait_rows(
            dsn,
            "SELECT count(*) FROM jobs WHERE id = ANY($1) AND status = 'done'",
            len(held),
            held,
            timeout_s=60,
        )
        rescued_s = time.monotonic() - killed_at
        await asyncio.to_thread(site.restart, h3)
        await wait_rows(
            dsn,
            "SELECT count(*) FROM jobs WHERE tenant = $1 AND status = 'done'",
            len(accepted),
            tenant,
            timeout_s=60,
        )
        total = await assert_nothing_lost(site, http, tenant)
        assert all(f.moved_since(killed_at, away_from=2) for f in followers)
        events = await assert_every_event_once(conn, tenant, followers)
    print(
        f"\nkill-host: jobs={total} processes_killed={killed} running_on_killed_host="
        f"{len(held)} rescued_and_done_s={rescued_s:.1f} events={events} lost=0"
    )
