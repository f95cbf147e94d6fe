"""Pressroom on a network of hosts (tests/netns.py): a database host, a storage host running
moto's S3 server, Pressroom hosts (`python -m server serve`: web app and render slots, real
Chromium) and a client host the test process speaks from.

Two segments, as a deployment has them: `db` (Pressroom hosts and the database) and `front`
(clients, Pressroom hosts and the bucket), so that a host can lose the database while its
clients and the bucket still reach it. Everything here is synchronous: a module fixture builds
it once and every test, each on its own event loop, uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import subprocess
import sys
import time
import urllib.request
import uuid
import xml.etree.ElementTree as ET
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg

from server.access import apikeys
from server.queue import db
from server.queue.listener import CHANNEL
from server.web import sse
from tests.netns import Host, Network, wait_for
from tests.pgcluster import Cluster
from tests.sse import messages
from tests.timings import as_env

DB_CIDR = "198.18.0.0/24"
#: The delay of the slow line to the database host (Network.impair), towards that host.
SLOW_LINE_DELAY_MS = 50
FRONT_CIDR = "198.18.1.0/24"
PORT = 8080
S3_PORT = 9000
BUCKET = "pressroom"
ACCESS_KEY_ID = "AKIAPRESSROOMNET01"
SECRET_ACCESS_KEY = "pressroom-network-secret-0123456789"
START_TIMEOUT_S = 90.0

#: Quick leases, polls and retries, so that a lost host's jobs move within seconds.
QUICK = {
    "PRESSROOM_RENDER_SLOTS": "2",
    "PRESSROOM_SHUTDOWN_GRACE_S": "2",
    **as_env(
        LEASE_S=3, RESCUE_INTERVAL_S=0.5, POLL_INTERVAL_S=0.5, RETRY_BASE_S=0.2, RETRY_MAX_S=2
    ),
}

# A page that takes about `ms` to become printable: scripts run in their own context.
SLOW_PAGE = """<div id="out">waiting</div><script>
  setTimeout(() => { const done = document.createElement("p"); done.id = "ready";
    done.textContent = "ready {{ n }}"; document.body.appendChild(done); }, {{ ms }});
</script>"""


def slow_job(n: int, ms: int) -> dict[str, Any]:
    """A job body whose render takes about `ms` (scripts on, waiting for a selector)."""
    return {
        "template": SLOW_PAGE,
        "data": {"n": n, "ms": ms},
        "options": {"wait_for_selector": "#ready", "javascript": True},
        "max_attempts": 10,
    }


class PressroomHost:
    """`python -m server serve` on a host, listening on its front address."""

    def __init__(self, host: Host, env: Mapping[str, str], log: Path) -> None:
        self.host = host
        self.name = host.name
        self.url = f"http://{host.address('front')}:{PORT}"
        self.env = {
            **env,
            "PRESSROOM_HOST": host.address("front"),
            "PRESSROOM_PORT": str(PORT),
            "PRESSROOM_PUBLIC_URL": self.url,
        }
        self.log_path = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = self.host.spawn(
            [sys.executable, "-m", "tests.timings", "serve"], env=self.env, log=self.log_path
        )

    def ready(self, client: Host) -> bool:
        try:
            status, _ = client.http_json(f"{self.url}/readyz", timeout_s=3)
        except OSError:
            return False
        return status == 200

    def wait_ready(self, client: Host, timeout_s: float = START_TIMEOUT_S) -> None:
        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.log()[-3000:]}")
            return self.ready(client)

        wait_for(up, timeout_s=timeout_s, what=f"{self.name} answers /readyz 200", every_s=0.2)

    def kill(self) -> int:
        """SIGKILL every process of the host: the server and its Chromium."""
        killed = self.host.kill_all()
        self.process = None
        return killed

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def worker_pid(self) -> int | None:
        return self.process.pid if self.process is not None else None


class Bucket:
    """moto's S3 server on the storage host, with one bucket."""

    def __init__(self, host: Host, log: Path) -> None:
        self.host = host
        self.endpoint = f"http://{host.address('front')}:{S3_PORT}"
        self.log_path = log

    def spawn(self) -> None:
        self.host.spawn(
            [sys.executable, "-m", "moto.server", "-H", self.host.address("front"),
             "-p", str(S3_PORT)],
            log=self.log_path,
        )  # fmt: skip

    def wait_ready(self, client: Host) -> None:
        """Wait for the server, then create the bucket."""

        def up() -> bool:
            try:
                client.http_json(f"{self.endpoint}/moto-api/data.json", timeout_s=2)
            except OSError:
                return False
            return True

        wait_for(up, timeout_s=START_TIMEOUT_S, what="moto answers", every_s=0.2)
        client.call(_request, "PUT", f"{self.endpoint}/{BUCKET}")

    def env(self) -> dict[str, str]:
        """The bucket, and the AWS SDK's own variables that lead to it (botocore reads them)."""
        return {
            "PRESSROOM_STORAGE": f"s3://{BUCKET}",
            "AWS_ENDPOINT_URL_S3": self.endpoint,
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        }

    async def keys(self, http: aiohttp.ClientSession, prefix: str) -> list[str]:
        """Every object key under `prefix` (moto checks no signature, so a plain GET lists)."""
        found: list[str] = []
        token: str | None = None
        while True:
            params = {"list-type": "2", "prefix": prefix}
            if token:
                params["continuation-token"] = token
            async with http.get(f"{self.endpoint}/{BUCKET}", params=params) as resp:
                assert resp.status == 200, await resp.text()
                root = ET.fromstring(await resp.read())
            ns = {"s3": root.tag.split("}")[0].strip("{")}
            found += [k.text or "" for k in root.findall("s3:Contents/s3:Key", ns)]
            token = root.findtext("s3:NextContinuationToken", namespaces=ns)
            if not token:
                return found


def _request(method: str, url: str) -> int:
    with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as resp:
        status: int = resp.status
        return status


@dataclass
class Site:
    """The network, its database (and standby), its bucket and its Pressroom hosts."""

    network: Network
    database: Cluster
    client: Host
    servers: list[PressroomHost]
    bucket: Bucket | None = None
    standby: Cluster | None = None
    env: dict[str, str] = field(default_factory=dict)

    def session(self, **options: Any) -> aiohttp.ClientSession:
        """An HTTP client on the client host (call from the test's event loop)."""
        return aiohttp.ClientSession(connector=self.client.connector(**options))

    async def tenant(self) -> tuple[str, str]:
        """A tenant of its own for one test, and its API key."""
        tenant = f"t{uuid.uuid4().hex[:10]}"
        conn = await asyncpg.connect(self.database.dsn)
        try:
            _, key = await apikeys.create_key(conn, tenant, "network test")
        finally:
            await conn.close()
        return tenant, key

    def restart(self, server: PressroomHost) -> None:
        server.start()
        server.wait_ready(self.client)

    def close(self) -> None:
        for server in self.servers:
            with contextlib.suppress(Exception):
                server.kill()
        self.network.close()
        self.database.destroy()
        if self.standby is not None:
            self.standby.destroy()


def build_site(
    folder: Path, *, servers: int = 3, slow_database: bool = False, standby: bool = False
) -> Site:
    """A database host (behind a slow line if asked: `Network.impair` turns it on; with a
    synchronous standby on a second database host if asked), a storage host, `servers`
    Pressroom hosts and a client host; everything started and ready."""
    network = Network()
    try:
        network.add_segment("db", DB_CIDR)
        network.add_segment("front", FRONT_CIDR)
        if slow_database:
            db_host = network.add_slow_host(
                "db", "db", "198.18.0.10", delay_ms=SLOW_LINE_DELAY_MS, loss=0.01
            )
        else:
            db_host = network.add_host("db", {"db": "198.18.0.10"})
        standby_host = network.add_host("db2", {"db": "198.18.0.11"}) if standby else None
        storage = network.add_host("storage", {"front": "198.18.1.20"})
        client = network.add_host("client", {"front": "198.18.1.100"})
        hosts = [
            network.add_host(f"h{i}", {"db": f"198.18.0.{30 + i}", "front": f"198.18.1.{30 + i}"})
            for i in range(1, servers + 1)
        ]
        database = Cluster(db_host, segment="db")
    except BaseException:
        network.close()
        raise
    site = Site(network, database, client, [])
    try:
        bucket = site.bucket = Bucket(storage, folder / "moto.log")
        bucket.spawn()  # it starts while the database is made
        database.init()
        database.trust(DB_CIDR)
        database.start()
        asyncio.run(_prepare(database.dsn))
        url = database.url
        if standby_host is not None:
            site.standby = database.standby(standby_host, segment="db")
            site.standby.start()
            asyncio.run(_synchronous(database.dsn))
            # Both hosts: whichever is the primary (read-write) now is the one connected to.
            hosts_ports = f"{database.listen}:{database.port},{site.standby.listen}:{database.port}"
            url = f"postgresql://postgres@{hosts_ports}/postgres?target_session_attrs=read-write"
        bucket.wait_ready(client)
        site.env = {
            **QUICK,
            **bucket.env(),
            "DATABASE_URL": url,
            "PRESSROOM_SECRET": secrets.token_urlsafe(32),
        }
        for host in hosts:
            data = folder / host.name
            data.mkdir(parents=True, exist_ok=True)
            server = PressroomHost(
                host, {**site.env, "PRESSROOM_DATA_DIR": str(data)}, data / "log"
            )
            site.servers.append(server)
            server.start()
        for server in site.servers:
            server.wait_ready(client)
    except BaseException:
        site.close()
        raise
    return site


async def _prepare(dsn: str) -> None:
    """Migrate once, and create a key so that the hosts start keyed (not open)."""
    conn = await db.connect(dsn)
    try:
        await db.migrate(conn)
        await apikeys.create_key(conn, "setup", "network test")
    finally:
        await conn.close()


async def _synchronous(dsn: str) -> None:
    """Once the standby streams, make it synchronous: a commit is acknowledged only once it
    is on both. Set on the primary alone (the standby, once promoted, waits for nobody)."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
        await conn.execute("SELECT pg_reload_conf()")
        async with asyncio.timeout(START_TIMEOUT_S):
            # Replication reports its state in a view only: look again shortly.
            while await conn.fetchval("SELECT sync_state FROM pg_stat_replication") != "sync":  # noqa: ASYNC110
                await asyncio.sleep(0.1)
    finally:
        await conn.close()


# --- clients -------------------------------------------------------------------------------


@dataclass
class Follower:
    """An SSE client of `/v1/events`, as EventSource behind a load balancer: when its stream
    ends or cannot be opened it reconnects, to the next host, with `Last-Event-ID`."""

    http: aiohttp.ClientSession
    urls: list[str]
    key: str
    at: int = 0
    #: Set on every event and every connection (share one among followers to wait on all).
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    ids: list[int] = field(default_factory=list)
    #: (host index, time) of every connection that answered 200.
    connections: list[tuple[int, float]] = field(default_factory=list)
    done_at: dict[str, float] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sse-follower")

    async def _run(self) -> None:
        # A stream that hears nothing, not even a keep-alive, for two pings has lost its host.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=3, sock_read=2 * sse.PING_S)
        while True:
            headers = {
                "Authorization": f"Bearer {self.key}",
                "Last-Event-ID": str(self.ids[-1]) if self.ids else "0",
            }
            try:
                async with self.http.get(
                    f"{self.urls[self.at]}/v1/events", headers=headers, timeout=timeout
                ) as resp:
                    if resp.status == 200:
                        self.connections.append((self.at, time.monotonic()))
                        self.progress.set()
                        async for message in messages(resp):
                            if message.id:
                                self.ids.append(int(message.id))
                                if message.event == "job.done":
                                    self.done_at[message.json["job"]["id"]] = time.monotonic()
                                self.progress.set()
            except (aiohttp.ClientError, TimeoutError):
                pass
            self.at = (self.at + 1) % len(self.urls)
            await asyncio.sleep(0.2)  # EventSource's reconnection delay

    def moved_since(self, moment: float, away_from: int) -> bool:
        """Whether it connected to a host other than `away_from` after `moment`."""
        return any(host != away_from and at > moment for host, at in self.connections)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def until(
    check: Callable[[], Awaitable[bool]], progress: asyncio.Event, *, timeout_s: float, what: str
) -> None:
    """Look again at every `progress` (and every second) until `check()` holds (bounded)."""
    try:
        async with asyncio.timeout(timeout_s):
            while not await check():
                progress.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await progress.wait()
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s:g} s: {what}") from None


async def follow(
    http: aiohttp.ClientSession, site: Site, key: str, hosts: list[int]
) -> list[Follower]:
    """One SSE client per entry of `hosts`, connected first to that host; all share one
    progress event."""
    progress = asyncio.Event()
    urls = [s.url for s in site.servers]
    followers = [Follower(http, urls, key, at=at, progress=progress) for at in hosts]
    for follower in followers:
        follower.start()

    async def connected_all() -> bool:
        return all(f.connections for f in followers)

    await until(connected_all, progress, timeout_s=30, what="every client connected")
    return followers


async def logged_ids(conn: asyncpg.Connection, tenant: str) -> list[int]:
    rows = await conn.fetch("SELECT id FROM job_events WHERE tenant = $1 ORDER BY xid, id", tenant)
    return [r["id"] for r in rows]


async def assert_every_event_once(
    conn: asyncpg.Connection, tenant: str, followers: list[Follower]
) -> int:
    """Each follower got the tenant's whole log, in log order, none twice; then it stops."""
    logged = await logged_ids(conn, tenant)

    async def complete() -> bool:
        return all(len(f.ids) >= len(logged) for f in followers)

    await until(complete, followers[0].progress, timeout_s=30, what="every event at the clients")
    for follower in followers:
        await follower.stop()
        assert follower.ids == logged, "every event once, in log order, across hosts"
    return len(logged)


async def submit(
    http: aiohttp.ClientSession, url: str, key: str, body: Mapping[str, Any]
) -> tuple[int, dict[str, Any] | None]:
    """POST /v1/jobs: (status, body); status 0 when the host did not answer. A 503 must say
    when to come back."""
    try:
        async with http.post(
            f"{url}/v1/jobs",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
            timeout=aiohttp.ClientTimeout(total=15),
        ) as resp:
            text = await resp.text()
            if resp.status == 503:
                assert resp.headers.get("Retry-After"), resp.headers
            return resp.status, json.loads(text) if text else None
    except (aiohttp.ClientError, TimeoutError):
        return 0, None


async def db_value(
    dsn: str, query: str, *args: Any, until: Callable[[Any], bool], timeout_s: float
) -> Any:
    """Re-run `query` on every NOTIFY of Pressroom's channel (and every second) until
    `until(value)` holds; the value. The rows change on other hosts, whose commits notify."""
    conn = await asyncpg.connect(dsn)
    changed = asyncio.Event()
    await conn.add_listener(CHANNEL, lambda *_: changed.set())
    value = None
    try:
        async with asyncio.timeout(timeout_s):
            while not until(value := await conn.fetchval(query, *args)):
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.0):
                        await changed.wait()
        return value
    except TimeoutError:
        raise AssertionError(f"{query} stayed {value!r} for {timeout_s:g} s") from None
    finally:
        await conn.close()


async def wait_rows(dsn: str, query: str, expected: object, *args: Any, timeout_s: float) -> None:
    """`db_value` until the query returns `expected`."""
    await db_value(dsn, query, *args, until=lambda v: v == expected, timeout_s=timeout_s)


@contextlib.asynccontextmanager
async def connected(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()
