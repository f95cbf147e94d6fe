"""A rolling upgrade from the previous release (tests/releases.py): its process serves a database
and a files folder with jobs done, running and queued, webhooks pending and streams open; then
two processes of today's code start at once on the same database and folder. The migrations
apply once, under the lock, while the old process serves and renders; then it stops, and
nothing is lost: queued jobs render, old links download, pending webhooks arrive, and streams
resume from their cursors with every event once."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, unused_port
from yarl import URL

from server import sql
from server.queue import db
from tests.conftest import fresh_database
from tests.integration.test_webhooks import Receiver, verify
from tests.processes import PressroomProcess, wait_until
from tests.releases import (
    ReleaseProcess,
    exported,
    imported_from,
    previous_release,
)
from tests.sse import Message, messages
from tests.timings import as_env

#: Quick polls; webhook retries every second for two minutes, so none gives up while the
#: receiver is down.
TIMINGS = as_env(POLL_INTERVAL_S=0.5, SCHEDULE_S=(1.0,) * 120)
WAIT_S = 45.0
APPLIED = re.compile(r"applied (migration \S+|\d+ migrations, \S+ to \S+)")


@pytest.fixture
async def empty_dsn(server_dsn: str) -> AsyncIterator[str]:
    """A database without any schema: the previous release makes its own."""
    async with fresh_database(server_dsn, "template0") as made:
        yield made


class HeldPages:
    """Pages a render waits on: GET /held/NAME answers once `release(NAME)` was called."""

    def __init__(self) -> None:
        self.asked: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._released: defaultdict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self._server: TestServer | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/held/{name}", self._page)
        self._server = TestServer(app, host="127.0.0.1")
        await self._server.start_server()

    def url(self, name: str) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.port}/held/{name}"

    def release(self, name: str) -> None:
        self._released[name].set()

    async def stop(self) -> None:
        for event in self._released.values():
            event.set()
        if self._server is not None:
            await self._server.close()

    async def _page(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        self.asked[name].set()
        await self._released[name].wait()
        return web.Response(text=f"<h1>Held page {name}</h1>", content_type="text/html")


class Follower:
    """An SSE client that keeps its cursor, as EventSource does: it reads a connection to its
    end, and `open` on another process resumes with Last-Event-ID."""

    def __init__(self, http: aiohttp.ClientSession, path: str) -> None:
        self.http = http
        self.path = path
        self.received: list[tuple[str, Message]] = []  # (the process's base URL, message)
        self.cursor: str | None = None
        self.changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def open(self, base: str, cursor: str | None = None) -> None:
        headers = {"Last-Event-ID": cursor} if cursor is not None else {}
        resp = await self.http.get(base + self.path, headers=headers)
        assert resp.status == 200, await resp.text()
        self._task = asyncio.create_task(self._read(base, resp))

    async def _read(self, base: str, resp: aiohttp.ClientResponse) -> None:
        try:
            async with resp:
                async for message in messages(resp):
                    self.received.append((base, message))
                    if message.id:
                        self.cursor = message.id
                    self.changed.set()
        finally:
            self.changed.set()

    @property
    def ended(self) -> bool:
        return self._task is not None and self._task.done()

    async def until(self, done: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
        async with asyncio.timeout(timeout_s):
            while not done():
                self.changed.clear()
                await self.changed.wait()
        if self._task is not None and self._task.done():
            self._task.result()  # a connection that broke instead of ending says so here

    def event_ids(self, base: str | None = None) -> list[int]:
        return [int(m.id) for b, m in self.received if m.id and base in (None, b)]

    def has(self, event: str, job_id: str) -> bool:
        return any(
            m.id and m.event == event and m.json["job"]["id"] == job_id for _, m in self.received
        )

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


async def serving(http: aiohttp.ClientSession, base: str, proc: PressroomProcess) -> None:
    """Until the process answers /healthz: it has no other way to say its port is open."""
    async with asyncio.timeout(WAIT_S):
        while True:
            assert proc.proc is not None and proc.proc.returncode is None, proc.log()[-3000:]
            with contextlib.suppress(aiohttp.ClientConnectionError):
                async with http.get(base + "/healthz") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.1)  # a refused connection: nothing to wait on but the port


async def submit(http: aiohttp.ClientSession, base: str, body: dict[str, Any]) -> dict[str, Any]:
    async with http.post(base + "/v1/jobs", json=body) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


async def get_job(http: aiohttp.ClientSession, base: str, job_id: str) -> dict[str, Any]:
    async with http.get(f"{base}/v1/jobs/{job_id}") as resp:
        assert resp.status == 200, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


async def download(http: aiohttp.ClientSession, base: str, signed_url: str) -> tuple[int, bytes]:
    """A signed link as a client behind one public address follows it: its path and query,
    answered by whichever process `base` is."""
    link = URL(signed_url)
    async with http.get(URL(base).with_path(link.path).with_query(link.query)) as resp:
        return resp.status, await resp.read()


def invoice(n: int, hook: str) -> dict[str, Any]:
    return {"template": "<h1>Invoice {{ n }}</h1>", "data": {"n": n}, "webhook_url": hook}


def reserved_port() -> tuple[socket.socket, int]:
    """A port bound and not listening: connections to it are refused until it is closed and a
    server takes it (a webhook receiver that is down)."""
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    port: int = blocker.getsockname()[1]
    return blocker, port


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(150)
async def test_rolling_upgrade_from_the_previous_release_loses_nothing(
    empty_dsn: str, tmp_path: Path
) -> None:
    release = previous_release()
    dsn = empty_dsn
    data = tmp_path / "data"
    env = {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(data),
        "PRESSROOM_ALLOW_HOSTS": "127.0.0.1",  # the held pages and the webhook receiver
        "PRESSROOM_RENDER_TIMEOUT_S": "60",
        "PRESSROOM_SHUTDOWN_GRACE_S": "3",
        **TIMINGS,
    }
    ports = {name: unused_port() for name in ("old", "new", "web")}
    bases = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    blocker, hook_port = reserved_port()
    hook = f"http://127.0.0.1:{hook_port}/hook"
    pages = HeldPages()
    await pages.start()
    http = aiohttp.ClientSession()
    watcher = await asyncpg.connect(dsn)
    stream = Follower(http, "/v1/events")
    job_stream: Follower | None = None
    receiver = Receiver()
    with exported(release) as tree:
        found = imported_from(tree)
        assert all(Path(found[name]).is_relative_to(tree) for name in ("server", "pressroom"))
        assert Path(found["timings"]).is_relative_to(tree), found
        old = ReleaseProcess(
            tree,
            "serve",
            {**env, "PRESSROOM_PORT": str(ports["old"]), "PRESSROOM_RENDER_SLOTS": "1"},
            tmp_path / "old.log",
        )
        new = PressroomProcess(
            "serve",
            {**env, "PRESSROOM_PORT": str(ports["new"]), "PRESSROOM_RENDER_SLOTS": "2"},
            tmp_path / "new.log",
        )
        web_only = PressroomProcess(
            "web", {**env, "PRESSROOM_PORT": str(ports["web"])}, tmp_path / "web.log"
        )
        processes = [old, new, web_only]
        try:
            # --- The previous release, with history -------------------------------------
            await old.start()
            await serving(http, bases["old"], old)
            known = {v for (v,) in await watcher.fetch("SELECT version FROM schema_migrations")}
            assert max(known) == found["newest"], "the old process made the schema it knows"
            pending = [version for version, _ in sql.migrations() if version not in known]
            assert pending, f"no migration since {release.why}"

            done = [await submit(http, bases["old"], invoice(n, hook)) for n in range(2)]
            await stream.open(bases["old"], cursor="1")  # a cursor in the log's history
            await stream.until(lambda: all(stream.has("job.done", j["id"]) for j in done))
            links = {}
            for job in done:
                shown = await get_job(http, bases["old"], job["id"])
                status, body = await download(http, bases["old"], shown["url"])
                assert status == 200 and body.startswith(b"%PDF-")
                links[job["id"]] = (shown["url"], body)
            # The receiver is down: both deliveries are pending, each tried at least once.
            await wait_until(
                dsn,
                "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' AND attempts > 0",
                2,
                timeout_s=WAIT_S,
            )

            running = await submit(
                http, bases["old"], {"page_url": pages.url("running"), "webhook_url": hook}
            )
            async with asyncio.timeout(WAIT_S):
                await pages.asked["running"].wait()  # in the old process's one render slot
            holder = await watcher.fetchval(
                "SELECT worker_id FROM jobs WHERE id = $1", running["id"]
            )
            assert old.proc is not None and holder.split(":")[1] == str(old.proc.pid), holder
            queued = [await submit(http, bases["old"], invoice(n, hook)) for n in range(2, 5)]

            # --- Two new processes at once, while the old one works --------------------
            # The test holds the migration lock first, so both are seen waiting on it.
            locker = await asyncpg.connect(dsn)
            await locker.execute("SELECT pg_advisory_lock($1)", db.MIGRATION_LOCK)
            await new.start()
            await web_only.start()
            await wait_until(
                dsn,
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
                f" AND objid = {db.MIGRATION_LOCK} AND NOT granted",
                2,
                timeout_s=WAIT_S,
            )
            # Meanwhile the old process takes jobs and streams their events.
            during = await submit(http, bases["old"], invoice(5, hook))
            await stream.until(lambda: stream.has("job.queued", during["id"]))
            assert (await get_job(http, bases["old"], during["id"]))["status"] == "queued"
            await locker.execute("SELECT pg_advisory_unlock($1)", db.MIGRATION_LOCK)
            await locker.close()
            await serving(http, bases["new"], new)
            await serving(http, bases["web"], web_only)

            applied_by = [proc for proc in (new, web_only) if APPLIED.search(proc.log())]
            assert len(applied_by) == 1, [proc.log()[-2000:] for proc in (new, web_only)]
            rows = await watcher.fetch("SELECT version FROM schema_migrations ORDER BY version")
            assert [row["version"] for row in rows] == sorted(known | set(pending))

            # Queued jobs render on the new process: the old one's only slot is still held.
            waiting = [*queued, during]
            await stream.until(lambda: all(stream.has("job.done", j["id"]) for j in waiting))
            assert not stream.has("job.done", running["id"])

            # The old process goes on after the migration: it finishes its render, takes a
            # job, streams, and its links download.
            pages.release("running")
            await stream.until(lambda: stream.has("job.done", running["id"]))
            claims = await watcher.fetchval(
                "SELECT count(*) FROM job_events WHERE job_id = $1 AND type = 'job.running'",
                running["id"],
            )
            assert claims == 1, "the old process finished the render it had started"
            last = await submit(
                http, bases["old"], {"page_url": pages.url("last"), "webhook_url": hook}
            )
            job_stream = Follower(http, f"/v1/jobs/{last['id']}/events")
            await job_stream.open(bases["old"])
            async with asyncio.timeout(WAIT_S):
                await pages.asked["last"].wait()
            shown = await get_job(http, bases["old"], running["id"])
            status, body = await download(http, bases["old"], shown["url"])
            assert status == 200 and body.startswith(b"%PDF-")

            # --- The old process stops; its clients resume on the new ones -------------
            assert await old.stop() == 0, old.log()[-3000:]
            await stream.until(lambda: stream.ended)
            await job_stream.until(lambda: job_stream.ended)
            for follower in (stream, job_stream):
                base, closing = follower.received[-1]
                assert base == bases["old"] and closing.event == "closed", closing
                assert closing.json["code"] == "shutdown"
            await stream.open(bases["new"], cursor=stream.cursor)
            await job_stream.open(bases["web"], cursor=job_stream.cursor)
            pages.release("last")
            await job_stream.until(lambda: job_stream.ended)
            await stream.until(lambda: stream.has("job.done", last["id"]))

            # Pending webhooks, the old process's among them, arrive once the receiver is up.
            blocker.close()
            await receiver.start(hook_port)
            await wait_until(
                dsn,
                "SELECT count(*) FILTER (WHERE status <> 'delivered') FROM webhook_deliveries",
                0,
                timeout_s=WAIT_S,
            )
            deliveries = await watcher.fetch("SELECT id, job_id, type FROM webhook_deliveries")
            secret = (data / "webhook_secret").read_text().strip()
            got = {
                r.headers["webhook-id"]: verify(secret, r.headers, r.body)
                for r in receiver.received
            }
            assert len(got) == len(receiver.received), "each delivery arrived once"
            assert got.keys() == {str(row["id"]) for row in deliveries}
            for row in deliveries:
                payload = got[str(row["id"])]
                assert (payload["type"], payload["data"]["job"]["id"]) == (
                    row["type"],
                    str(row["job_id"]),
                )
            assert {str(row["job_id"]) for row in deliveries} >= {
                j["id"] for j in [*done, *waiting]
            }

            # Links the old process signed download from the new ones, and only as signed.
            for signed, body in links.values():
                for base in (bases["new"], bases["web"]):
                    assert await download(http, base, signed) == (200, body)
                tampered = URL(signed).update_query(sig="0" * 10)
                status, _ = await download(http, bases["new"], str(tampered))
                assert status in (401, 403), status
        finally:
            stream.close()
            if job_stream is not None:
                job_stream.close()
            await receiver.stop()
            blocker.close()
            await pages.stop()
            codes = [await proc.stop(timeout_s=20) for proc in processes]
            await http.close()

    # Every stream got each event after its cursor once, in order, across the two processes.
    log = await watcher.fetch("SELECT id, job_id FROM job_events ORDER BY id")
    await watcher.close()
    assert stream.event_ids() == [row["id"] for row in log if row["id"] > 1]
    assert stream.event_ids(bases["new"]), "the stream resumed on a new process"
    assert job_stream.event_ids() == [row["id"] for row in log if str(row["job_id"]) == last["id"]]
    assert job_stream.received[-1][1].event == "job.done"
    assert codes[1:] == [0, 0], new.log()[-3000:] + web_only.log()[-3000:]
