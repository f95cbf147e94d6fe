"""What the benchmarks share: one PostgreSQL server, throwaway databases, the app on a socket,
the invoice, the clients' calls and a few statistics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import platform
import statistics
import sys
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psutil
from aiohttp import ClientResponse, ClientSession, web

from server.queue import db

QUICK = os.environ.get("BENCH_QUICK") == "1"
ROOT = Path(__file__).resolve().parent.parent
#: The all-jobs stream filtered to the events that end a job's attempts.
FINAL_TYPES = "job.done,job.failed"

INVOICE = """<!doctype html><html><head><meta charset="utf-8"><style>
  body { font-family: "DejaVu Sans", sans-serif; margin: 24px; color: #222; }
  h1 { font-size: 22px; margin: 0 0 4px; } .muted { color: #777; font-size: 12px; }
  table { width: 100%; border-collapse: collapse; margin-top: 18px; font-size: 12px; }
  th, td { padding: 6px 8px; border-bottom: 1px solid #ddd; text-align: left; }
  td.n { text-align: right; } tfoot td { font-weight: bold; border-top: 2px solid #222; }
</style></head><body>
  <h1>Invoice {{ number }}</h1><div class="muted">{{ customer }} · due {{ due }}</div>
  <table><thead><tr><th>Item</th><th>Qty</th><th>Price</th><th>Total</th></tr></thead><tbody>
  {% for line in lines %}<tr><td>{{ line.item }}</td><td class="n">{{ line.qty }}</td>
  <td class="n">{{ "%.2f"|format(line.price) }}</td>
  <td class="n">{{ "%.2f"|format(line.qty * line.price) }}</td></tr>{% endfor %}
  </tbody><tfoot><tr><td colspan="3">Total</td>
  <td class="n">{{ "%.2f"|format(lines|sum(attribute="total")) }}</td></tr></tfoot></table>
</body></html>"""


def invoice_data(n: int, lines: int = 20) -> dict[str, Any]:
    """Invoice number `n` with `lines` table lines (about 32 fill an A4 page)."""
    rows = [
        {
            "item": f"Service {i}",
            "qty": i % 5 + 1,
            "price": 9.5 + i,
            "total": (i % 5 + 1) * (9.5 + i),
        }
        for i in range(lines)
    ]
    return {"number": f"INV-{n:05d}", "customer": "Ana Lima", "due": "2026-12-31", "lines": rows}


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


def command(module: str, *args: object) -> str:
    """The shell command that reproduces a figure."""
    prefix = "BENCH_QUICK=1 " if QUICK else ""
    return f"{prefix}python -m {module} " + " ".join(str(a) for a in args)


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
        embedded = db.EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="prb-")) / "pg")
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
    """The real app on a free port; yields its base URL and the app.

    `renderer_factory` is passed to create_app; every other keyword overrides a setting, as
    does a PRESSROOM_* variable of the environment (another engine, a mechanism turned off).
    The per-tenant cap on jobs in flight is lifted: benchmarks queue far more than a tenant
    would.
    """
    # Imported here: the clients import this module in child processes of their own, and the
    # app's modules would make each of them start in five seconds instead of one.
    from server.settings import Settings
    from server.web.app import create_app

    renderer_factory = overrides.pop("renderer_factory", None)
    env = {name: value for name, value in os.environ.items() if name.startswith("PRESSROOM_")}
    env |= {"DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": tempfile.mkdtemp(prefix="prb-data-")}
    overrides.setdefault("tenant_max_inflight", 10**9)
    app = create_app(Settings.from_env(env, **overrides), renderer_factory=renderer_factory)
    async with serving(app) as base:
        yield base, app


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


async def submit_many(
    session: ClientSession, base: str, bodies: list[dict[str, Any]], concurrency: int
) -> list[str]:
    """POST every body to /v1/jobs, `concurrency` at a time; the jobs' ids."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> str:
        async with semaphore, session.post(f"{base}/v1/jobs", json=body) as resp:
            assert resp.status == 202, await resp.text()
            return str((await resp.json())["id"])

    return list(await asyncio.gather(*(one(b) for b in bodies)))


async def until_done(resp: ClientResponse, ids: set[str]) -> None:
    """Read an open event stream until every id in `ids` is done (or failed, which raises)."""
    pending = set(ids)
    event = ""
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event in ("job.done", "job.failed"):
            job = json.loads(line[5:])["job"]
            if event == "job.failed":
                raise RuntimeError(f"job failed: {job['error']}")
            pending.discard(job["id"])
            if not pending:
                return


async def run_module(module: str, *args: str) -> Any:
    """Run `python -m module args…` in a child process and return the JSON it prints last.

    Clients run in their own process, so the client's CPU is not charged to the server's
    event loop, as a real client's is not."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", module, *args, cwd=ROOT, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"python -m {module} {' '.join(args)} exited {proc.returncode}")
    return json.loads(out.decode().strip().splitlines()[-1])
