"""What every benchmark needs: a throwaway database, the app on a socket, the invoice template."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import statistics
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
from aiohttp import ClientSession, web

from server import db
from server.app import create_app
from server.settings import Settings

QUICK = os.environ.get("BENCH_QUICK") == "1"

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
    rows = [
        {"item": f"Service {i}", "qty": i % 5 + 1, "price": 9.5 + i, "total": (i % 5 + 1) * (9.5 + i)}
        for i in range(lines)
    ]
    return {"number": f"INV-{n:05d}", "customer": "Ana Lima", "due": "2026-12-31", "lines": rows}


def machine() -> str:
    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def percentile(values: list[float], p: float) -> float:
    if len(values) < 2:
        return values[0] if values else float("nan")
    return statistics.quantiles(values, n=100, method="inclusive")[int(p) - 1]


@contextlib.asynccontextmanager
async def database() -> AsyncIterator[str]:
    """A fresh database on DATABASE_URL's server, or on an embedded one."""
    embedded = None
    server = os.environ.get("DATABASE_URL")
    if server is None:
        embedded = db.EmbeddedPostgres(Path(tempfile.mkdtemp(prefix="prb-")) / "pg")
        server = await embedded.start()
    name = f"pressroom_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(server)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    dsn = urlunsplit(urlsplit(server)._replace(path="/" + name))
    try:
        yield dsn
    finally:
        admin = await asyncpg.connect(server)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        if embedded is not None:
            await embedded.stop()


@contextlib.asynccontextmanager
async def running_app(dsn: str, **overrides: Any) -> AsyncIterator[tuple[str, web.Application]]:
    """The real app on a free port; yields its base URL."""
    data_dir = Path(tempfile.mkdtemp(prefix="prb-data-"))
    env = {"DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": str(data_dir)}
    settings = Settings.from_env(env, **overrides)
    app = create_app(settings, renderer_factory=overrides.pop("renderer_factory", None))
    runner = web.AppRunner(app, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}", app
    finally:
        await runner.cleanup()


async def wait_done(session: ClientSession, base: str, ids: set[str]) -> None:
    """Follow the all-jobs stream until every id in `ids` is done (or failed, which raises)."""
    pending = set(ids)
    async with session.get(f"{base}/v1/events", headers={"Last-Event-ID": "0"}) as resp:
        event = ""
        async for raw in resp.content:
            line = raw.decode().strip()
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:") and event in ("job.done", "job.failed"):
                import json

                job = json.loads(line[5:])["job"]
                if event == "job.failed":
                    raise RuntimeError(f"job failed: {job['error']}")
                pending.discard(job["id"])
                if not pending:
                    return


async def submit_many(session: ClientSession, base: str, bodies: list[dict[str, Any]], concurrency: int) -> list[str]:
    semaphore = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> str:
        async with semaphore, session.post(f"{base}/v1/jobs", json=body) as resp:
            assert resp.status == 202, await resp.text()
            return str((await resp.json())["id"])

    return list(await asyncio.gather(*(one(b) for b in bodies)))
