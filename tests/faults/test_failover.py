"""A database failover under load, across hosts (tests/hosts.py): PostgreSQL with a synchronous
streaming standby on a second database host, `DATABASE_URL` naming both with
`target_session_attrs=read-write`. The primary's host loses every process (SIGKILL), the
standby is promoted, and Pressroom finds the new primary by itself."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from server.errors import DB_ERRORS
from tests import netns
from tests.hosts import Site, assert_every_event_once, build_site, follow, submit, wait_rows

pytestmark = [pytest.mark.faults, pytest.mark.slow, pytest.mark.browser]

#: How long the test waits after the kill before it promotes the standby: the failover
#: manager's own detection time (Patroni's loop, a pg_auto_failover monitor's check).
DETECTION_S = 2.0
REQUEST_EVERY_S = 0.05


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Site]:
    if (why := netns.unavailable()) is not None:
        pytest.skip(why)
    site = build_site(tmp_path, servers=2, standby=True)
    try:
        yield site
    finally:
        site.close()


@pytest.mark.timeout(180)
async def test_killing_the_primary_under_load_loses_no_acknowledged_job(site: Site) -> None:
    assert site.standby is not None
    primary, standby = site.database, site.standby
    tenant, key = await site.tenant()
    # No host answering read-write is an outage like any other (503), not a failure (500).
    with pytest.raises(DB_ERRORS):
        await asyncpg.connect(standby.dsn + "&target_session_attrs=read-write")
    answers: list[tuple[float, int, str | None]] = []  # (sent at, status, job id)
    stop = asyncio.Event()
    async with site.session() as http:
        followers = await follow(http, site, key, [0, 1])

        async def load() -> None:
            n = 0
            while not stop.is_set():
                url = site.servers[n % 2].url
                sent = time.monotonic()
                status, body = await submit(http, url, key, {"template": f"<p>{n}</p>"})
                answers.append((sent, status, body["id"] if status == 202 and body else None))
                n += 1
                await asyncio.sleep(REQUEST_EVERY_S)  # a steady stream of clients

        loader = asyncio.create_task(load())
        await asyncio.sleep(2.0)  # load before the failure, as in production
        killed_at = time.monotonic()
        assert primary.host is not None
        primary.host.kill_all()
        await asyncio.sleep(DETECTION_S / 2)
        status, ready = await asyncio.to_thread(
            site.client.http_json, f"{site.servers[0].url}/readyz", timeout_s=10
        )
        assert status == 503 and ready["checks"]["database"].startswith("error"), ready
        await asyncio.sleep(DETECTION_S / 2)
        promoted_at = time.monotonic()
        await asyncio.to_thread(standby.promote)
        # Service is back once both hosts accept jobs again; then a little more load.
        for server in site.servers:
            await asyncio.to_thread(server.wait_ready, site.client, 60)
        await asyncio.sleep(2.0)
        stop.set()
        await loader
        statuses = {status for _, status, _ in answers}
        assert statuses <= {202, 503}, f"only 202 or 503 with Retry-After: {statuses}"
        refused = [sent for sent, status, _ in answers if status == 503]
        assert refused, "requests during the failover were answered 503"
        accepted = [job for _, status, job in answers if status == 202 and job]
        before_kill = [job for sent, status, job in answers if sent < killed_at and job]
        # Every acknowledged job is on the new primary, and finishes there.
        await wait_rows(
            standby.dsn,
            "SELECT count(*) FROM jobs WHERE tenant = $1 AND id = ANY($2::uuid[])"
            " AND status = 'done'",
            len(accepted),
            tenant,
            accepted,
            timeout_s=90,
        )
        conn = await asyncpg.connect(standby.dsn)
        try:
            assert await conn.fetchval(
                "SELECT count(*) FROM jobs WHERE tenant = $1", tenant
            ) >= len(accepted)
            events = await assert_every_event_once(conn, tenant, followers)
        finally:
            await conn.close()
    after = [sent for sent, status, _ in answers if status == 202 and sent > killed_at]
    first_back = min(after)
    print(
        f"\nfailover: requests={len(answers)} accepted={len(accepted)} accepted_before_kill="
        f"{len(before_kill)} refused_503={len(refused)} events={events} lost=0"
        f" promoted_after_kill_s={promoted_at - killed_at:.1f}"
        f" first_202_after_promotion_s={first_back - promoted_at:.2f}"
        f" without_service_s={first_back - killed_at:.1f}"
        f" refused_from={min(refused) - killed_at:.2f}..{max(refused) - killed_at:.2f}s"
    )
