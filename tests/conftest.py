"""Shared fixtures: a real PostgreSQL (DATABASE_URL, else the embedded one), a fresh database
per test cloned from a migrated template, and the app on a real socket."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiohttp import ClientSession, test_utils, web
from aiohttp.test_utils import get_port_socket

from server.queue import db, embedded, listener
from server.settings import Settings
from server.web import sse
from server.web.app import create_app
from server.web.protocol import AppRunner
from tests.pdfs import FakeRenderer
from tests.sio import SioClient

TEMPLATE_DB = f"pressroom_template_{os.getpid()}"
_OWN_BASETEMP = pytest.StashKey[Path]()


def pytest_configure(config: pytest.Config) -> None:
    """Before any test process starts: what every one of them would otherwise make at once."""
    if not hasattr(config, "workerinput"):  # the controller (or a run without workers)
        embedded.ensure_run_as_user()
        if os.geteuid() == 0 and config.option.basetemp is None:
            # Each session started as root closes /tmp/pytest-of-root to everyone else, and the
            # embedded servers of a session already running (their user is not root) lose their
            # folders: a session's temporary files go in a folder of its own instead.
            config.option.basetemp = tempfile.mkdtemp(prefix="pytest-pressroom-")
            config.stash[_OWN_BASETEMP] = Path(config.option.basetemp)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session's own temporary folder goes with it, unless a test failed (kept to look at)."""
    own = session.config.stash.get(_OWN_BASETEMP, None)
    if own is not None and exitstatus == 0:
        shutil.rmtree(own, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest tests first, so that under xdist none is left to run alone at the end: those
    that allow themselves a longer timeout, then slow ones, then browser ones, then the rest."""

    def weight(item: pytest.Item) -> tuple[float, bool, bool]:
        timeout = item.get_closest_marker("timeout")
        allowed = float(timeout.args[0]) if timeout is not None and timeout.args else 0.0
        slow = item.get_closest_marker("slow") is not None
        browser = item.get_closest_marker("browser") is not None
        return (-allowed, not slow, not browser)

    items.sort(key=weight)  # stable: collection order within each weight


def _with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + name))


@pytest.fixture(scope="session")
def server_dsn() -> Iterator[str]:
    """A PostgreSQL server: DATABASE_URL when set, else an embedded one for this session (one
    per xdist worker, so each has the server's connection limit to itself)."""
    if os.environ.get("DATABASE_URL"):
        yield os.environ["DATABASE_URL"]
        return
    folder = Path(tempfile.mkdtemp(prefix="prt-pg-"))
    server = embedded.EmbeddedPostgres(folder / "pg")
    dsn = asyncio.run(server.start())
    asyncio.run(_skip_fsync(dsn))
    yield dsn
    asyncio.run(server.stop())
    shutil.rmtree(folder, ignore_errors=True)


async def _skip_fsync(dsn: str) -> None:
    """A throwaway server need not survive a power cut: without fsync, the CREATE and DROP
    DATABASE of every test stop waiting on the disk (tests/pgcluster.py does the same)."""
    admin = await asyncpg.connect(dsn)
    try:
        await admin.execute("ALTER SYSTEM SET fsync = off")
        await admin.execute("SELECT pg_reload_conf()")
    finally:
        await admin.close()


@pytest.fixture(scope="session")
def template_db(server_dsn: str) -> Iterator[str]:
    """A migrated database that every test database is cloned from."""

    async def create() -> None:
        admin = await asyncpg.connect(server_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
            await admin.execute(f'CREATE DATABASE "{TEMPLATE_DB}"')
        finally:
            await admin.close()
        conn = await db.connect(_with_database(server_dsn, TEMPLATE_DB))
        try:
            await db.migrate(conn)
        finally:
            await conn.close()

    async def drop() -> None:
        admin = await asyncpg.connect(server_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{TEMPLATE_DB}" WITH (FORCE)')
        finally:
            await admin.close()

    asyncio.run(create())
    yield TEMPLATE_DB
    asyncio.run(drop())


@contextlib.asynccontextmanager
async def fresh_database(server_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A database cloned from the migrated template, dropped afterwards."""
    name = f"pressroom_test_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    finally:
        await admin.close()
    try:
        yield _with_database(server_dsn, name)
    finally:
        admin = await asyncpg.connect(server_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture
async def dsn(server_dsn: str, template_db: str) -> AsyncIterator[str]:
    """A fresh database for this test only."""
    async with fresh_database(server_dsn, template_db) as made:
        yield made


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    pool = await db.create_pool(dsn, min_size=1, max_size=8)
    yield pool
    await pool.close()


@pytest.fixture
def make_settings(
    dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[..., Settings]:
    """Settings for a test app: its own database and data folder, quick polls and pings."""
    monkeypatch.setattr(sse, "PING_S", 1.0)
    monkeypatch.setattr(listener, "POLL_INTERVAL_S", 0.5)

    def make(**overrides: Any) -> Settings:
        env = {
            "DATABASE_URL": dsn,
            "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
            "PRESSROOM_RENDER_TIMEOUT_S": "20",
        }
        env.update({k: str(v) for k, v in overrides.pop("env", {}).items()})
        return Settings.from_env(env, **overrides)

    return make


class TestServer(test_utils.TestServer):
    """aiohttp's test server, running the app as `pressroom serve` does (server.web.protocol)."""

    async def _make_runner(self, **kwargs: Any) -> web.AppRunner:
        return AppRunner(self.app, **kwargs)


class RunningApp:
    """The app on a real socket, with a client session pointed at it."""

    def __init__(self, server: TestServer, session: ClientSession) -> None:
        self.server = server
        self.http = session
        self.app: web.Application = server.app  # type: ignore[assignment]

    def url(self, path: str) -> str:
        return str(self.server.make_url(path))


@pytest.fixture
async def start_app(
    make_settings: Callable[..., Settings],
) -> AsyncIterator[Callable[..., Any]]:
    """Start apps on demand (several may share one database); all are stopped at the end."""
    running: list[RunningApp] = []

    async def start(renderer: Any = None, **overrides: Any) -> RunningApp:
        # Absolute links come from the settings (PRESSROOM_PUBLIC_URL, by default the listen
        # address): the socket is bound first, so that they name the port it listens on.
        sock = get_port_socket("127.0.0.1", 0, socket.AF_INET)
        try:
            settings = make_settings(**{"port": sock.getsockname()[1], **overrides})
        except BaseException:
            sock.close()
            raise
        factory = (lambda _settings: renderer) if renderer is not None else None
        app = create_app(settings, renderer_factory=factory)
        server = TestServer(app, host="127.0.0.1", socket_factory=lambda *_: sock)
        await server.start_server()
        session = ClientSession()
        handle = RunningApp(server, session)
        running.append(handle)
        return handle

    yield start
    for handle in reversed(running):
        await handle.http.close()
        await handle.server.close()


@pytest.fixture
def fake_renderer() -> FakeRenderer:
    return FakeRenderer()


@pytest.fixture
async def api(start_app: Callable[..., Any], fake_renderer: FakeRenderer) -> RunningApp:
    """The app with one render slot on the fake renderer: while the gate holds a render, the
    jobs after it stay queued."""
    app: RunningApp = await start_app(renderer=fake_renderer, render_slots=1)
    return app


@pytest.fixture
async def sio() -> AsyncIterator[Callable[[], SioClient]]:
    """Socket.IO clients made on demand, all closed at the end."""
    clients: list[SioClient] = []

    def make() -> SioClient:
        clients.append(SioClient())
        return clients[-1]

    yield make
    for client in clients:
        await client.close()
