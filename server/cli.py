"""pressroom serve | web | worker | migrate | keys | tenants | submit | jobs | watch | batch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg
from aiohttp import web

from server import apikeys, auth, db, tenants
from server.app import create_app
from server.commands import CLIENT_COMMANDS, add_client_parsers, run_client_command
from server.keys import CHROMIUM, WORKERS
from server.protocol import AppRunner
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
    runner = AppRunner(app, handle_signals=False, shutdown_timeout=settings.shutdown_grace_s)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await runner.setup()
    except BaseException:
        await runner.cleanup()  # what did start (the embedded database) stops again
        raise
    if settings.webhook_secret_generated:
        log.warning(
            "generated a webhook signing secret for dev mode (kept in %s); give it to your "
            "receivers: %s. Tenants with API keys have their own: "
            "pressroom tenants webhook-secret TENANT",
            settings.data_dir / "webhook_secret",
            settings.webhook_secret,
        )
    try:
        if settings.run_web:
            site = web.TCPSite(runner, settings.host, settings.port)
            await site.start()
            log.info(
                "Pressroom listening on http://%s:%s; links name %s",
                settings.host,
                settings.port,
                settings.public_base_url,
            )
            if settings.listens_everywhere and not settings.public_url:
                log.warning(
                    "links name %s, which only this machine reaches: set PRESSROOM_PUBLIC_URL "
                    "to the URL clients use",
                    settings.public_base_url,
                )
        if WORKERS in app:
            chromium = (
                f" with {app[CHROMIUM].executable or 'Playwright Chromium'}"
                if CHROMIUM in app
                else ""
            )
            log.info("%s render slots%s", settings.render_slots, chromium)
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()


async def run_migrate(settings: Settings) -> None:
    async with db.server(settings) as dsn:
        applied = await db.migrate_at(dsn)
    print(f"applied {len(applied)} migrations" + (f": {', '.join(applied)}" if applied else ""))


@contextlib.asynccontextmanager
async def _database(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A migrated connection to the database `pressroom serve` would use."""
    async with db.server(settings) as dsn:
        conn = await db.connect(dsn)
        try:
            await db.migrate(conn)
            yield conn
        finally:
            await conn.close()


async def run_keys(settings: Settings, args: argparse.Namespace) -> int:
    """keys create | list | revoke, on the database `pressroom serve` would use."""
    async with _database(settings) as conn:
        if args.keys_command == "create":
            row, key = await apikeys.create_key(conn, args.tenant, args.name)
            print(
                f"created API key {row.id} for tenant {row.tenant!r} ({row.prefix}...); "
                "it is shown only now:",
                file=sys.stderr,
            )
            print(key)  # alone on stdout, so `KEY=$(pressroom keys create ...)` works
        elif args.keys_command == "list":
            print("id\ttenant\tname\tprefix\tcreated\trevoked\tlast_used")
            for row in await apikeys.list_keys(conn):
                cells = (row.id, row.tenant, row.name, row.prefix, row.created_at, row.revoked_at)
                shown = [_cell(value) for value in (*cells, row.last_used_at)]
                print("\t".join(shown))
        else:
            revoked = await apikeys.revoke_key(conn, args.id)
            if revoked is None:
                print(f"pressroom: no API key with id {args.id}", file=sys.stderr)
                return 1
            print(
                f"revoked API key {revoked.id} of tenant {revoked.tenant!r}; servers refuse "
                "it, its tokens and links, and close its streams within PRESSROOM_AUTH_CACHE_S",
                file=sys.stderr,
            )
    return 0


async def run_tenants(settings: Settings, args: argparse.Namespace) -> int:
    """tenants webhook-secret TENANT [--rotate]: the secret that signs a tenant's webhooks."""
    overlap_s = settings.webhook_rotation_overlap_s
    async with _database(settings) as conn:
        if args.rotate:
            found = await tenants.rotate_webhook_secret(conn, args.tenant, overlap_s=overlap_s)
        else:
            found = await tenants.webhook_secrets(conn, args.tenant, overlap_s=overlap_s)
    if found is None:
        print(
            f"pressroom: tenant {args.tenant!r} has no API key, so no webhook secret of its "
            "own (the dev-mode tenant's webhooks are signed with PRESSROOM_WEBHOOK_SECRET); "
            f"create a key first: pressroom keys create --tenant {args.tenant}",
            file=sys.stderr,
        )
        return 1
    if args.rotate:
        print(
            f"rotated the webhook signing secret of tenant {args.tenant!r}; give the new one "
            "to its receivers:",
            file=sys.stderr,
        )
    if found.previous_until is not None:
        print(
            f"deliveries carry a signature with the previous secret too until "
            f"{_cell(found.previous_until)} (PRESSROOM_WEBHOOK_ROTATION_OVERLAP_S={overlap_s:g})",
            file=sys.stderr,
        )
    print(found.current)  # alone on stdout, as with keys create
    return 0


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return str(value) or "-"


def _tenant(raw: str) -> str:
    why = tenants.check_tenant(raw)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return raw


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pressroom", description="Asynchronous PDF service.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="web app and render workers in one process")
    web_cmd = commands.add_parser("web", help="web app only (no render workers, no joins)")
    worker = commands.add_parser("worker", help="render workers only (no web app)")
    for command in (serve, web_cmd, worker):
        command.add_argument("--host", help="listen address (PRESSROOM_HOST)")
        command.add_argument("--port", type=int, help="listen port (PRESSROOM_PORT)")
        command.add_argument("--slots", type=int, help="render slots (PRESSROOM_RENDER_SLOTS)")
    commands.add_parser("migrate", help="apply database migrations and exit")
    keys = commands.add_parser("keys", help="create, list and revoke API keys")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_commands.add_parser("create", help="print a new key for a tenant, once")
    create.add_argument("--tenant", required=True, type=_tenant, help="the key's tenant")
    create.add_argument("--name", default="", help="a label to tell keys apart")
    keys_commands.add_parser("list", help="every key: id, tenant, prefix, created, revoked")
    revoke = keys_commands.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("id", type=int, help="the key's id (see keys list)")
    tenants_cmd = commands.add_parser("tenants", help="a tenant's webhook signing secret")
    tenants_commands = tenants_cmd.add_subparsers(dest="tenants_command", required=True)
    secret = tenants_commands.add_parser(
        "webhook-secret", help="print the secret that signs a tenant's webhooks"
    )
    secret.add_argument("tenant", type=_tenant, help="a tenant with API keys")
    secret.add_argument(
        "--rotate",
        action="store_true",
        help="make a new secret and print it; the old one also signs for "
        "PRESSROOM_WEBHOOK_ROTATION_OVERLAP_S (24 h)",
    )
    add_client_parsers(commands)  # submit, jobs, watch, batch: clients of a running server
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in CLIENT_COMMANDS:
        return run_client_command(args)
    overrides: dict[str, Any] = {}
    for name, field in (("host", "host"), ("port", "port"), ("slots", "render_slots")):
        value = getattr(args, name, None)
        if value is not None:
            overrides[field] = value
    if args.command == "web":
        overrides["render_slots"] = 0
        overrides["combine_slots"] = 0
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
        elif args.command == "keys":
            return asyncio.run(run_keys(settings, args))
        elif args.command == "tenants":
            return asyncio.run(run_tenants(settings, args))
        else:
            try:
                asyncio.run(run_server(settings))
            except auth.DevModeRefused as exc:
                print(f"pressroom: {exc}", file=sys.stderr)
                return 2
    return 0
