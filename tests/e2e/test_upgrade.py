"""A rolling upgrade from the previous release (tests/releases.py): its process serves a database
and a files folder with jobs done, running and queued, webhooks pending and streams open; then
two processes of today's code start at once on the same database and folder. The migrations
apply once, under the lock, while the old process serves and renders (a backup running at the
same moment too); then it stops, and nothing is lost: queued jobs render, old links download,
pending webhooks arrive, and streams resume from their cursors with every event once."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import re
import socket
import subprocess
from collections import defaultdict
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from server import sql
from server.queue import db
from tests.conftest import fresh_database
from tests.integration.test_webhooks import Receiver, verify
from tests.processes import ROOT, PressroomProcess, free_port, wait_until
from tests.releases import (
    FROM_VARIABLE,
    Release,
    ReleaseProcess,
    exported,
    imported_from,
    previous_release,
)
from tests.sse import Message, collect, messages
from tests.timings import as_env

#: Quick polls; webhook retries every second for two minutes, so none gives up while the
#: receiver is down.
TIMINGS = as_env(POLL_INTERVAL_S=0.5, SCHEDULE_S=(1.0,) * 120)
WAIT_S = 45.0
#: The longest a job's submission may take while a migration waits behind a backup: a few of
#: the migration's lock waits (db.MIGRATION_LOCK_TIMEOUT).
BEHIND_BACKUP_S = 10.0
APPLIED = re.compile(r"applied (migration \S+|\d+ migrations, \S+ to \S+)")


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

    async def until_asked(self, name: str) -> None:
        async with asyncio.timeout(WAIT_S):
            await self.asked[name].wait()

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

    async def until_ended(self) -> None:
        await self.until(lambda: self.ended)

    def has(self, event: str, job_id: str) -> bool:
        return any(
            m.id and m.event == event and m.json["job"]["id"] == job_id for _, m in self.received
        )

    def event_ids(self, base: str | None = None) -> list[int]:
        return [int(m.id) for b, m in self.received if m.id and base in (None, b)]

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()


@dataclasses.dataclass
class Scene:
    """One upgrade: a database and a files folder, the old process and the two new ones (not
    started), the outside servers they reach, and the clients that watch them."""

    release: Release
    tree: Path
    dsn: str
    data: Path
    http: aiohttp.ClientSession
    watcher: asyncpg.Connection  # the test's own look at the database
    pages: HeldPages
    hook_port: int
    hook_blocker: socket.socket  # holds the receiver's port, refusing connections, until it is up
    receiver: Receiver
    bases: dict[str, str]
    old: ReleaseProcess
    new: PressroomProcess  # serve: web, render slots, webhooks
    web: PressroomProcess  # web only
    again: ReleaseProcess  # the previous release started anew, on the new schema (a rollback)
    stream: Follower  # all jobs

    @property
    def hook(self) -> str:
        return f"http://127.0.0.1:{self.hook_port}/hook"

    async def serving(self, name: str) -> None:
        """Until the process answers /healthz: it has no other way to say its port is open."""
        proc = {"old": self.old, "new": self.new, "web": self.web, "again": self.again}[name]
        async with asyncio.timeout(WAIT_S):
            while True:
                assert proc.proc is not None and proc.proc.returncode is None, proc.log()[-3000:]
                with contextlib.suppress(aiohttp.ClientConnectionError):
                    async with self.http.get(self.bases[name] + "/healthz") as resp:
                        if resp.status == 200:
                            return
                await asyncio.sleep(0.1)  # a refused connection: nothing to wait on but the port

    async def submit(self, name: str, body: dict[str, Any]) -> dict[str, Any]:
        body = {"webhook_url": self.hook, **body}
        async with self.http.post(self.bases[name] + "/v1/jobs", json=body) as resp:
            assert resp.status == 202, await resp.text()
            job: dict[str, Any] = await resp.json()
            return job

    async def job(self, name: str, job_id: str) -> dict[str, Any]:
        async with self.http.get(f"{self.bases[name]}/v1/jobs/{job_id}") as resp:
            assert resp.status == 200, await resp.text()
            job: dict[str, Any] = await resp.json()
            return job

    async def download(self, name: str, signed_url: str) -> tuple[int, bytes]:
        """A signed link as a client behind one public address follows it: its path and query,
        answered by the process `name`."""
        link = URL(signed_url)
        target = URL(self.bases[name]).with_path(link.path).with_query(link.query)
        async with self.http.get(target) as resp:
            return resp.status, await resp.read()


def invoice(n: int) -> dict[str, Any]:
    return {"template": "<h1>Invoice {{ n }}</h1>", "data": {"n": n}}


async def until_true(conn: asyncpg.Connection, query: str) -> None:
    """Until `query` returns true: for states no notification announces (lock waits)."""
    async with asyncio.timeout(WAIT_S):
        while not await conn.fetchval(query):  # noqa: ASYNC110
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def backup_running(dsn: str) -> AsyncIterator[None]:
    """What pg_dump holds while it runs: one snapshot, and ACCESS SHARE on every table."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            tables = await conn.fetch(
                "SELECT format('%I', tablename) AS name FROM pg_tables WHERE schemaname = 'public'"
            )
            names = ", ".join(row["name"] for row in tables)
            await conn.execute(f"LOCK TABLE {names} IN ACCESS SHARE MODE")
            yield
    finally:
        await conn.close()


@pytest.fixture
async def scene(server_dsn: str, tmp_path: Path) -> AsyncIterator[Scene]:
    release = previous_release()
    async with contextlib.AsyncExitStack() as stack:
        # An empty database: the previous release makes the schema it knows.
        dsn = await stack.enter_async_context(fresh_database(server_dsn, "template0"))
        tree = stack.enter_context(exported(release))
        watcher = await asyncpg.connect(dsn)
        stack.push_async_callback(watcher.close)
        http = aiohttp.ClientSession()
        stack.push_async_callback(http.close)
        data = tmp_path / "data"
        env = {
            "DATABASE_URL": dsn,
            "PRESSROOM_DATA_DIR": str(data),
            "PRESSROOM_ALLOW_HOSTS": "127.0.0.1",  # the held pages and the webhook receiver
            "PRESSROOM_RENDER_TIMEOUT_S": "60",
            "PRESSROOM_SHUTDOWN_GRACE_S": "1",  # a held render goes back to the queue at once
            **TIMINGS,
        }
        ports = {name: free_port() for name in ("old", "new", "web", "again")}

        def settings(name: str, **more: str) -> dict[str, str]:
            return {**env, "PRESSROOM_PORT": str(ports[name]), **more}

        old = ReleaseProcess(
            tree, "serve", settings("old", PRESSROOM_RENDER_SLOTS="1"), tmp_path / "old.log"
        )
        new = PressroomProcess(
            "serve", settings("new", PRESSROOM_RENDER_SLOTS="2"), tmp_path / "new.log"
        )
        web_only = PressroomProcess("web", settings("web"), tmp_path / "web.log")
        again = ReleaseProcess(
            tree, "serve", settings("again", PRESSROOM_RENDER_SLOTS="1"), tmp_path / "again.log"
        )
        for proc in (old, new, web_only, again):
            stack.push_async_callback(proc.stop, timeout_s=20)
        pages = HeldPages()
        await pages.start()
        stack.push_async_callback(pages.stop)
        hook_blocker = socket.socket()
        hook_blocker.bind(("127.0.0.1", 0))  # bound, not listening: connections are refused
        stack.callback(hook_blocker.close)
        receiver = Receiver()
        stack.push_async_callback(receiver.stop)
        stream = Follower(http, "/v1/events")
        stack.callback(stream.close)
        yield Scene(
            release=release,
            tree=tree,
            dsn=dsn,
            data=data,
            http=http,
            watcher=watcher,
            pages=pages,
            hook_port=hook_blocker.getsockname()[1],
            hook_blocker=hook_blocker,
            receiver=receiver,
            bases={name: f"http://127.0.0.1:{port}" for name, port in ports.items()},
            old=old,
            new=new,
            web=web_only,
            again=again,
            stream=stream,
        )


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(150)
async def test_rolling_upgrade_from_the_previous_release_loses_nothing(scene: Scene) -> None:
    s, stream = scene, scene.stream

    # --- The previous release, with jobs done, running and queued ---------------------------
    await s.old.start()
    found = await imported_from(s.tree)  # what its processes import, asked while it starts
    for module in ("server", "pressroom", "timings"):
        assert Path(found[module]).is_relative_to(s.tree), (module, found)
    await s.serving("old")
    known = {v for (v,) in await s.watcher.fetch("SELECT version FROM schema_migrations")}
    assert max(known) == found["newest"], "the old process made the schema it knows"
    pending = [version for version, _ in sql.migrations() if version not in known]
    assert pending, f"no migration since the previous release, {s.release.why}"

    done = [await s.submit("old", invoice(n)) for n in range(2)]
    first = await s.watcher.fetchval("SELECT id FROM job_events ORDER BY xid, id LIMIT 1")
    await stream.open(s.bases["old"], cursor=str(first))  # a cursor in the log's history
    await stream.until(lambda: all(stream.has("job.done", j["id"]) for j in done))
    links = {}
    for job in done:
        signed = (await s.job("old", job["id"]))["url"]
        status, body = await s.download("old", signed)
        assert status == 200 and body.startswith(b"%PDF-")
        links[signed] = body
    # The receiver is down: both deliveries are pending, each tried at least once.
    await wait_until(
        s.dsn,
        "SELECT count(*) FROM webhook_deliveries WHERE status = 'pending' AND attempts > 0",
        2,
        timeout_s=WAIT_S,
    )
    running = await s.submit("old", {"page_url": s.pages.url("running")})
    await s.pages.until_asked("running")
    holder = await s.watcher.fetchval("SELECT worker_id FROM jobs WHERE id = $1", running["id"])
    assert s.old.proc is not None and holder.split(":")[1] == str(s.old.proc.pid), holder
    # The old process's one render slot is taken: these wait.
    queued = [await s.submit("old", invoice(n)) for n in range(2, 5)]

    # --- Two new processes at once, while the old one works ---------------------------------
    # The test holds the migration lock first, so that both are seen waiting for it.
    locker = await asyncpg.connect(s.dsn)
    try:
        await locker.execute("SELECT pg_advisory_lock($1)", db.MIGRATION_LOCK)
        await s.new.start()
        await s.web.start()
        await wait_until(
            s.dsn,
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
            f" AND objid = {db.MIGRATION_LOCK} AND NOT granted",
            2,
            timeout_s=WAIT_S,
        )
        during = await s.submit("old", invoice(5))
        await stream.until(lambda: stream.has("job.queued", during["id"]))
        # A backup runs as the lock is let go: DDL waits for it, and the old process's queries
        # of that table would wait behind the DDL if it did not give way.
        async with backup_running(s.dsn):
            await locker.execute("SELECT pg_advisory_unlock($1)", db.MIGRATION_LOCK)
            await until_true(
                s.watcher,
                "SELECT EXISTS (SELECT FROM pg_locks WHERE locktype = 'relation' AND NOT granted)"
                f" OR (SELECT count(*) FROM schema_migrations) = {len(known) + len(pending)}",
            )
            try:
                async with asyncio.timeout(BEHIND_BACKUP_S):
                    behind = await s.submit("old", invoice(6))
                    await stream.until(lambda: stream.has("job.queued", behind["id"]))
            except TimeoutError:
                pytest.fail(
                    "the old process could not take a job while a migration waited behind a "
                    "backup (its queries queued behind the migration's lock):\n"
                    + "\n".join(proc.log()[-2000:] for proc in (s.new, s.web))
                )
    finally:
        await locker.close()
    await s.serving("new")
    await s.serving("web")

    applied_by = [proc for proc in (s.new, s.web) if APPLIED.search(proc.log())]
    assert len(applied_by) == 1, [proc.log()[-2000:] for proc in (s.new, s.web)]
    rows = await s.watcher.fetch("SELECT version FROM schema_migrations ORDER BY version")
    assert [row["version"] for row in rows] == sorted(known | set(pending))

    # Queued jobs render on the new process (the old one's only slot is still held).
    waiting = [*queued, during, behind]
    await stream.until(lambda: all(stream.has("job.done", j["id"]) for j in waiting))
    assert not stream.has("job.done", running["id"])

    # --- The old process goes on after the migration ----------------------------------------
    # It finishes the render it had started, takes a job, streams, and its links download.
    s.pages.release("running")
    await stream.until(lambda: stream.has("job.done", running["id"]))
    claims = await s.watcher.fetchval(
        "SELECT count(*) FROM job_events WHERE job_id = $1 AND type = 'job.running'",
        running["id"],
    )
    assert claims == 1, "the old process finished the render it had started"
    last = await s.submit("old", {"page_url": s.pages.url("last")})
    job_stream = Follower(s.http, f"/v1/jobs/{last['id']}/events")
    try:
        await job_stream.open(s.bases["old"])
        await s.pages.until_asked("last")  # in whichever process claimed it
        status, body = await s.download("old", (await s.job("old", running["id"]))["url"])
        assert status == 200 and body.startswith(b"%PDF-")

        # --- The old process stops; its clients resume on the new ones ----------------------
        assert await s.old.stop() == 0, s.old.log()[-3000:]
        for follower in (stream, job_stream):
            await follower.until_ended()
            base, closing = follower.received[-1]
            assert base == s.bases["old"] and closing.event == "closed", closing
            assert closing.json["code"] == "shutdown"
        await stream.open(s.bases["new"], cursor=stream.cursor)
        await job_stream.open(s.bases["web"], cursor=job_stream.cursor)
        s.pages.release("last")  # a render the old process gave back at its stop, or the new one's
        await job_stream.until_ended()
        await stream.until(lambda: stream.has("job.done", last["id"]))
    finally:
        job_stream.close()

    # --- Pending webhooks, the old process's among them, arrive once the receiver is up -----
    s.hook_blocker.close()
    await s.receiver.start(s.hook_port)
    await wait_until(
        s.dsn,
        "SELECT count(*) FILTER (WHERE status <> 'delivered') FROM webhook_deliveries",
        0,
        timeout_s=WAIT_S,
    )
    deliveries = await s.watcher.fetch("SELECT id, job_id, type FROM webhook_deliveries")
    secret = (s.data / "webhook_secret").read_text().strip()
    got = {r.headers["webhook-id"]: verify(secret, r.headers, r.body) for r in s.receiver.received}
    assert len(got) == len(s.receiver.received), "each delivery arrived once"
    assert got.keys() == {str(row["id"]) for row in deliveries}
    for row in deliveries:
        payload = got[str(row["id"])]
        assert payload["type"] == row["type"]
        assert payload["data"]["job"]["id"] == str(row["job_id"])
    every_job = {j["id"] for j in [*done, running, *waiting, last]}
    assert {str(row["job_id"]) for row in deliveries} == every_job

    # --- Links the old process signed download from the new ones, and only as signed --------
    for signed, body in links.items():
        for name in ("new", "web"):
            assert await s.download(name, signed) == (200, body)
        tampered = URL(signed).update_query(sig="0" * 10)
        status, _ = await s.download("new", str(tampered))
        assert status in (401, 403), status

    # --- Every stream got each event after its cursor once, in order, across processes ------
    # Log order is commit order (server/events): by transaction, then id.
    log = await s.watcher.fetch("SELECT id, job_id FROM job_events ORDER BY xid, id")
    ids = [row["id"] for row in log]
    assert stream.event_ids() == ids[ids.index(first) + 1 :]
    assert stream.event_ids(s.bases["new"]), "the stream resumed on a new process"
    assert job_stream.event_ids() == [row["id"] for row in log if str(row["job_id"]) == last["id"]]
    assert job_stream.event_ids(s.bases["web"]), "the job's stream resumed on a new process"
    assert job_stream.received[-1][1].event == "job.done"
    codes = await asyncio.gather(s.new.stop(), s.web.stop())
    assert list(codes) == [0, 0], s.new.log()[-3000:] + s.web.log()[-3000:]

    # --- Rolled back, the code only: the previous release alone on the new schema ------------
    await s.again.start()
    await s.serving("again")
    job = await s.submit("again", invoice(7))
    got_events = await collect(
        s.http, f"{s.bases['again']}/v1/jobs/{job['id']}/events", until="job.done", timeout_s=WAIT_S
    )
    kinds = [m.event for m in got_events]
    assert (kinds[0], kinds[-1], kinds.count("job.running")) == ("job.queued", "job.done", 1), kinds
    status, body = await s.download("again", got_events[-1].json["job"]["url"])
    assert status == 200 and body.startswith(b"%PDF-")
    for signed, old_body in links.items():
        assert await s.download("again", signed) == (200, old_body)
    assert await s.again.stop() == 0, s.again.log()[-3000:]


def test_without_git_history_the_upgrade_test_fails_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(FROM_VARIABLE, raising=False)
    with pytest.raises(
        pytest.fail.Exception, match=r"no git history at .*; run it in a full clone"
    ):
        previous_release(tmp_path)


def test_a_shallow_clone_fails_saying_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FROM_VARIABLE, raising=False)
    shallow = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "--quiet", "--depth", "1", f"file://{ROOT}", str(shallow)], check=True
    )
    with pytest.raises(
        pytest.fail.Exception,
        match=r"lacks the previous release \w+ \(a shallow clone\); run it in a full clone",
    ):
        previous_release(shallow)
    # Told which commit to start from, it exports that one.
    head = subprocess.run(
        ["git", "-C", str(shallow), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    monkeypatch.setenv(FROM_VARIABLE, head)
    release = previous_release(shallow)
    assert release.commit == head and FROM_VARIABLE in release.why
    with exported(release, shallow) as tree:
        assert (tree / "server" / "__init__.py").is_file()
