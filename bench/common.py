"""What the benchmarks share: one PostgreSQL server, throwaway databases, the app on a socket,
the clients in processes of their own (bench/clients.py), and the machine's name."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import uuid
from asyncio.subprocess import PIPE, Process
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psutil
from aiohttp import web

from server.queue import db
from server.queue.embedded import EmbeddedPostgres
from server.queue.jobs import NewJob
from server.settings import Settings
from server.web.app import create_app

QUICK = os.environ.get("BENCH_QUICK") == "1"
ROOT = Path(__file__).resolve().parent.parent


def machine() -> str:
    """One line naming the hardware and software the figures came from."""
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gib = psutil.virtual_memory().total / 2**30
    return (
        f"{cpu}, {os.cpu_count()} cores, {memory_gib:.0f} GiB RAM, {platform.system()} "
        f"{platform.release()}, Python {platform.python_version()}"
    )


def percentile(values: list[float], p: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=1000, method="inclusive")[round(p * 10) - 1]


def summary(latencies_ms: list[float]) -> dict[str, float]:
    """p50 and p99 of a list of milliseconds."""
    return {"p50": percentile(latencies_ms, 50), "p99": percentile(latencies_ms, 99)}


def new_job(template: str, data: dict[str, Any], attempts: int = 3) -> NewJob:
    """A job of dev mode's tenant ("default"), with no options or metadata."""
    return NewJob("default", template, data, options={}, metadata={}, max_attempts=attempts)


#: A database migrated once per run, which every migrated database of the run is a copy of.
_template: str | None = None
_users = 0  # postgres() contexts open; the last one to close drops the template


@contextlib.asynccontextmanager
async def postgres() -> AsyncIterator[str]:
    """The PostgreSQL server every benchmark of this run shares: DATABASE_URL, else an embedded
    one, started once and published through DATABASE_URL so nested benchmarks reuse it."""
    global _template, _users
    server = os.environ.get("DATABASE_URL")
    embedded = None
    if server is None:
        embedded = EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="prb-")) / "pg")
        server = os.environ["DATABASE_URL"] = await embedded.start()
    _users += 1
    try:
        yield server
    finally:
        _users -= 1
        if _users == 0 and _template is not None:
            await execute(server, f'DROP DATABASE IF EXISTS "{_template}" WITH (FORCE)')
            _template = None
        if embedded is not None:
            del os.environ["DATABASE_URL"]
            await embedded.stop()


async def execute(dsn: str, statement: str) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def at(server: str, name: str) -> str:
    """The DSN of database `name` on `server`."""
    return urlunsplit(urlsplit(server)._replace(path="/" + name))


@contextlib.asynccontextmanager
async def database(*, migrated: bool = True) -> AsyncIterator[str]:
    """A fresh database on the shared server, with Pressroom's schema (a copy of the run's
    migrated template) or, not `migrated`, empty; dropped afterwards."""
    global _template
    async with postgres() as server:
        if migrated and _template is None:
            _template = f"pressroom_bench_template_{uuid.uuid4().hex[:8]}"
            await execute(server, f'CREATE DATABASE "{_template}"')
            await db.migrate_at(at(server, _template))
        name = f"pressroom_bench_{uuid.uuid4().hex[:8]}"
        copy = f' TEMPLATE "{_template}"' if migrated else ""
        await execute(server, f'CREATE DATABASE "{name}"{copy}')
        try:
            yield at(server, name)
        finally:
            await execute(server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def checkpoint(dsn: str) -> None:
    """Write out what earlier benchmarks left dirty on the shared server (CHECKPOINT) and in
    the page cache (sync), so a figure is not charged for another benchmark's writes."""
    await asyncio.to_thread(os.sync)
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("CHECKPOINT")
    except asyncpg.InsufficientPrivilegeError:
        print("bench: CHECKPOINT not permitted for this user; figures may carry earlier writes")
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def running_app(dsn: str, **overrides: Any) -> AsyncIterator[tuple[str, web.Application]]:
    """The real app on a free port: its base URL and the app. `renderer_factory` goes to
    create_app; every other keyword overrides a setting, as a PRESSROOM_* variable does (another
    engine, a mechanism turned off). The tenant's cap on jobs in flight is lifted: benchmarks
    queue far more than a tenant would."""
    renderer_factory = overrides.pop("renderer_factory", None)
    env = {name: value for name, value in os.environ.items() if name.startswith("PRESSROOM_")}
    env |= {"DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": tempfile.mkdtemp(prefix="prb-data-")}
    overrides.setdefault("tenant_max_inflight", 10**9)
    app = create_app(Settings.from_env(env, **overrides), renderer_factory=renderer_factory)
    async with serving(app) as base:
        yield base, app


def free_port() -> int:
    """A port of 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    """`app` on a free port of 127.0.0.1; yields its base URL."""
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


def arguments(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser, its module's text as its --help."""
    return argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )


def main(
    parser: Callable[[], argparse.ArgumentParser], run: Callable[[Any], Coroutine[Any, Any, Any]]
) -> None:
    """`python -m bench.<name>`: the machine's line, then the benchmark."""
    args = parser().parse_args()
    # Each line out as soon as it is printed, to a pipe or a file too.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    print(f"machine: {machine()}")
    asyncio.run(run(args))


async def start_python(*args: str, cwd: Path = ROOT) -> Process:
    """`python args…` in a child process, its stdin and stdout piped to this one."""
    return await asyncio.create_subprocess_exec(
        sys.executable, *args, cwd=cwd, stdin=PIPE, stdout=PIPE
    )


async def run_client(*args: str) -> Any:
    """Run `python -m bench.clients args…` in a child process (its CPU is not charged to the
    server's event loop, as a real client's is not) and return the JSON it prints last."""
    proc = await start_python("-m", "bench.clients", *args)
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"python -m bench.clients {' '.join(args)} exited {proc.returncode}")
    return json.loads(out.decode().strip().splitlines()[-1])
