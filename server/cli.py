"""pressroom serve | web | worker | migrate."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from server import db
from server.app import create_app
from server.keys import CHROMIUM, WORKERS
from server.settings import Settings, SettingsError

log = logging.getLogger("server")

_STANDARD_RECORD_FIELDS = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per line, with the `extra={...}` fields (job_id, tenant) at top level."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "at": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD_RECORD_FIELDS})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Plain lines that still carry the job id and tenant."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = {k: v for k, v in record.__dict__.items() if k not in _STANDARD_RECORD_FIELDS}
        if extra:
            line += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return line


def setup_logging(settings: Settings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_json:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(os.environ.get("PRESSROOM_LOG_LEVEL", "INFO").upper())
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


async def run_server(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    app = create_app(settings)
    runner = web.AppRunner(app, handle_signals=False, shutdown_timeout=settings.shutdown_grace_s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await runner.setup()
    try:
        if settings.run_web:
            site = web.TCPSite(runner, settings.host, settings.port)
            await site.start()
            log.info("Pressroom listening on http://%s:%s", settings.host, settings.port)
        if WORKERS in app:
            chromium = (
                f" with {app[CHROMIUM].executable or 'Playwright Chromium'}"
                if CHROMIUM in app
                else ""
            )
            log.info("%s render slots%s", settings.render_slots, chromium)
        if settings.host in ("127.0.0.1", "localhost", "::1"):
            log.info("dev mode: open single-tenant API bound to %s only", settings.host)
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()


async def run_migrate(settings: Settings) -> None:
    embedded = None
    dsn = settings.database_url
    if dsn is None:
        embedded = db.EmbeddedPostgres(settings.data_dir / "postgres")
        dsn = await embedded.start()
    conn = await db.connect(dsn)
    try:
        applied = await db.migrate(conn)
        print(f"applied {len(applied)} migrations" + (f": {', '.join(applied)}" if applied else ""))
    finally:
        await conn.close()
        if embedded is not None:
            await embedded.stop()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pressroom", description="Asynchronous PDF service.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="web app and render workers in one process")
    web_cmd = commands.add_parser("web", help="web app only (no render workers)")
    worker = commands.add_parser("worker", help="render workers only (no web app)")
    for command in (serve, web_cmd, worker):
        command.add_argument("--host", help="listen address (PRESSROOM_HOST)")
        command.add_argument("--port", type=int, help="listen port (PRESSROOM_PORT)")
        command.add_argument("--slots", type=int, help="render slots (PRESSROOM_RENDER_SLOTS)")
    commands.add_parser("migrate", help="apply database migrations and exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {}
    for name, field in (("host", "host"), ("port", "port"), ("slots", "render_slots")):
        value = getattr(args, name, None)
        if value is not None:
            overrides[field] = value
    if args.command == "web":
        overrides["render_slots"] = 0
    if args.command == "worker":
        overrides["run_web"] = False
    try:
        settings = Settings.from_env(os.environ, **overrides)
    except SettingsError as exc:
        print(f"pressroom: {exc}", file=sys.stderr)
        return 2
    setup_logging(settings)
    with contextlib.suppress(KeyboardInterrupt):
        if args.command == "migrate":
            asyncio.run(run_migrate(settings))
        else:
            asyncio.run(run_server(settings))
    return 0
