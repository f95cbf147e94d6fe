"""pressroom serve | web | worker | migrate | doctor | backup | restore | keys | tenants | submit |
jobs | watch | batch."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import resource
import signal
import sys
from collections.abc import Sequence
from typing import Any

from pressroom.cli.commands import CLIENT_COMMANDS, add_client_parsers, run_client_command
from server.access import apikeys, tenants
from server.cli import backup, doctor, endpoints, restore, tenant_settings
from server.cli.common import cell, database
from server.queue import db
from server.queue.embedded import EmbeddedPostgresError
from server.settings import (
    Settings,
    SettingsError,
    new_webhook_secret,
    unread_variables,
)

log = logging.getLogger("server")

# The soft limit to ask for where the hard one is unlimited (the kernel's nr_open is often
# 1048576; asking for more fails).
OPEN_FILES_WITHOUT_LIMIT = 1_048_576

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


def setup_logging(settings: Settings, *, least: int = logging.DEBUG) -> None:
    """Log lines to stderr from PRESSROOM_LOG_LEVEL up, and from `least` up in any case, with
    the trace and span ids of a span current then; traces as the OTEL_* variables ask."""
    from server import tracing

    handler = logging.StreamHandler(sys.stderr)
    handler.addFilter(tracing.LogIds())
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(logging.getLevelNamesMapping()[settings.log_level], least))
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    # Its one INFO line says that it set up its own logging, at every start.
    logging.getLogger("pikepdf._core").setLevel(logging.WARNING)
    tracing.start()  # once lines have their handler: it says whether tracing is on


def raise_open_files_limit() -> None:
    """Every stream holds a socket: the soft open-file limit (often 1024) goes up to the hard
    one, the most an unprivileged process may have (`ulimit -Hn` shows it)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY:
        hard = max(soft, OPEN_FILES_WITHOUT_LIMIT)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-file limit from %s to %s: %s", soft, hard, exc)
            return
    log.info("open-file limit %s: at most about that many streams in this process", hard)


class CannotListen(Exception):
    """The listen address is taken or not this machine's."""


async def run_server(settings: Settings) -> None:
    """Serve until SIGTERM or SIGINT, then shut down gracefully."""
    # The app (aiohttp's server, Playwright, S3, the PDF libraries) is loaded by the commands
    # that serve only: `keys`, `tenants` and `migrate` start in a third of the time without it.
    from aiohttp import web

    from server.keys import CHROMIUM, WORKERS
    from server.web.app import create_app
    from server.web.protocol import AppRunner

    raise_open_files_limit()
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
        # Where it is, never what it is: a log is read by more people than a secret may be.
        log.warning(
            "generated a webhook signing secret for dev mode; give your receivers the contents "
            "of %s. Tenants with API keys have their own: pressroom tenants webhook-secret TENANT",
            settings.data_dir / "webhook_secret",
        )
    try:
        port, variable = (
            (settings.port, "PRESSROOM_PORT (or --port)")
            if settings.run_web
            else (settings.health_port, "PRESSROOM_HEALTH_PORT")
        )
        if port is not None:
            site = web.TCPSite(runner, settings.host, port)
            try:
                await site.start()
            except OSError as exc:
                raise CannotListen(
                    f"cannot listen on {settings.host} port {port}: "
                    f"{os.strerror(exc.errno) if exc.errno else exc}; set {variable} to a free one"
                ) from None
        if settings.run_web:
            if settings.public_url:
                log.info("listening on %s port %s", settings.host, settings.port)
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
        log.info("%s", ready_line(settings))
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()


def ready_line(settings: Settings) -> str:
    """The last line of a start: where a person goes next."""
    if not settings.run_web:
        if settings.health_port is not None:
            return (
                f"Pressroom is ready: render slots, probes and metrics on "
                f"http://{settings.host}:{settings.health_port}/ (healthz, readyz, metrics)"
            )
        return "Pressroom is ready: render slots only, no web app"
    base = settings.public_base_url
    return f"Pressroom is ready: dashboard {base}/  API {base}/v1/  docs {base}/docs"


async def run_migrate(settings: Settings) -> None:
    async with db.server(settings) as dsn:
        applied = await db.migrate_at(dsn)
    print(f"applied {len(applied)} migrations" + (f": {', '.join(applied)}" if applied else ""))


async def run_keys(settings: Settings, args: argparse.Namespace) -> int:
    """keys create | list | revoke, on the database `pressroom serve` would use."""
    async with database(settings) as conn:
        if args.keys_command == "create":
            row, key, token_secret = await apikeys.create_key_and_tenant(
                conn, args.tenant, args.name
            )
            if token_secret is not None:
                print(
                    f"tenant {row.tenant!r} is new; its token signing secret, for minting "
                    "subscription tokens in its own backend (HS256 JWTs), is shown only now:\n"
                    f"{token_secret}\n(a new one: pressroom tenants secret {row.tenant} "
                    "--rotate)",
                    file=sys.stderr,
                )
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
                shown = [cell(value) for value in (*cells, row.last_used_at)]
                print("\t".join(shown))
        else:
            revoked = await apikeys.revoke_key(conn, args.id)
            if revoked is None:
                print(f"pressroom: no API key with id {args.id}", file=sys.stderr)
                return 1
            print(
                f"revoked API key {revoked.id} of tenant {revoked.tenant!r}; every server "
                "refuses it, its tokens and links, and closes its streams, from now on",
                file=sys.stderr,
            )
    return 0


def _tenant(raw: str) -> str:
    why = tenants.check_tenant(raw)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return raw


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pressroom", description="Asynchronous PDF service.")
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="web app and render workers in one process")
    web_cmd = commands.add_parser(
        "web", help="web app only (no renders, batch joins or webhook deliveries)"
    )
    worker = commands.add_parser("worker", help="render workers only (no web app)")
    for command in (serve, web_cmd, worker):
        command.add_argument("--host", help="listen address (PRESSROOM_HOST)")
        command.add_argument("--port", type=int, help="listen port (PRESSROOM_PORT)")
        command.add_argument("--slots", type=int, help="render slots (PRESSROOM_RENDER_SLOTS)")
    commands.add_parser("migrate", help="apply database migrations and exit")
    doctor.add_parser(commands)
    backup.add_parser(commands)
    restore.add_parser(commands)
    keys = commands.add_parser("keys", help="create, list and revoke API keys")
    keys_commands = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_commands.add_parser("create", help="print a new key for a tenant, once")
    create.add_argument("--tenant", required=True, type=_tenant, help="the key's tenant")
    create.add_argument("--name", default="", help="a label to tell keys apart")
    keys_commands.add_parser("list", help="every key: id, tenant, prefix, created, revoked")
    revoke = keys_commands.add_parser("revoke", help="revoke a key by id")
    revoke.add_argument("id", type=int, help="the key's id (see keys list)")
    tenants_cmd = commands.add_parser(
        "tenants", help="a tenant's secrets, token keys, origins and render cache default"
    )
    tenants_commands = tenants_cmd.add_subparsers(dest="tenants_command", required=True)
    secret = tenants_commands.add_parser(
        "webhook-secret", help="print the secret that signs a tenant's webhooks"
    )
    secret.add_argument("tenant", type=_tenant, help="a tenant with API keys")
    secret.add_argument(
        "--rotate",
        action="store_true",
        help="make a new secret and print it; the old one also signs for 24 h",
    )
    endpoints.add_parser(tenants_commands, _tenant)
    token_secret = tenants_commands.add_parser(
        "secret", help="make a new secret that signs a tenant's subscription tokens"
    )
    token_secret.add_argument("tenant", type=_tenant, help="a tenant with API keys")
    token_secret.add_argument(
        "--rotate",
        action="store_true",
        help="required: print a new secret; tokens signed with the old one stop working",
    )
    token_key = tenants_commands.add_parser(
        "token-key", help="the public keys a tenant's backend signs subscription tokens with"
    )
    token_key.add_argument("tenant", type=_tenant, help="a tenant with API keys")
    key_change = token_key.add_mutually_exclusive_group(required=True)
    key_change.add_argument(
        "--add",
        metavar="FILE.pem",
        help="register a public key (RSA 2048-4096 bits: RS256, EC P-256: ES256, Ed25519: "
        "EdDSA); prints its kid",
    )
    key_change.add_argument("--list", action="store_true", help="kid, algorithm, added at")
    key_change.add_argument(
        "--remove",
        metavar="KID",
        help="remove a key: its tokens stop working, their streams end (--remove=KID for a kid "
        "that starts with -)",
    )
    token_key.add_argument(
        "--kid",
        type=tenant_settings.kid,
        help="with --add: the key's id (default: from its thumbprint)",
    )
    origins = tenants_commands.add_parser(
        "origins", help="the browser origins a tenant's pages call Pressroom from (CORS)"
    )
    origins.add_argument("tenant", type=_tenant, help="a tenant with API keys")
    change = origins.add_mutually_exclusive_group(required=True)
    change.add_argument("--add", metavar="ORIGIN", help="allow an origin: https://app.example.com")
    change.add_argument("--remove", metavar="ORIGIN", help="stop allowing an origin")
    change.add_argument("--list", action="store_true", help="print the tenant's own origins")
    cache = tenants_commands.add_parser(
        "cache", help="whether the render cache serves every job of a tenant (its default)"
    )
    cache.add_argument("tenant", type=_tenant, help="a tenant with API keys")
    switch = cache.add_mutually_exclusive_group(required=True)
    switch.add_argument(
        "--on",
        action="store_true",
        help='serve its jobs from the render cache unless they say "cache": false',
    )
    switch.add_argument(
        "--off", action="store_true", help='only its jobs that say "cache": true (the default)'
    )
    switch.add_argument("--show", action="store_true", help="print on or off")
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
        overrides["run_background"] = False
    if args.command == "worker":
        overrides["run_web"] = False
    if args.command == "restore":
        # Values for what a start would generate into the data folder, which must stay empty:
        # the restore brings the backup's secrets, and uses none itself.
        overrides.update(secret="restore", webhook_secret=new_webhook_secret())
    try:
        settings = Settings.from_env(os.environ, **overrides)
    except SettingsError as exc:
        print(f"pressroom: {exc}", file=sys.stderr)
        return 2
    # An operator command's output is what it prints; its log, warnings and errors only.
    serving = args.command in ("serve", "web", "worker")
    setup_logging(settings, least=logging.DEBUG if serving else logging.WARNING)
    for warning in unread_variables(os.environ):
        log.warning("%s", warning)
    with contextlib.suppress(KeyboardInterrupt):
        try:
            if args.command == "migrate":
                asyncio.run(run_migrate(settings))
            elif args.command == "doctor":
                return asyncio.run(doctor.run(settings, args))
            elif args.command == "backup":
                return asyncio.run(backup.run_backup(settings, args))
            elif args.command == "restore":
                return asyncio.run(restore.run_restore(settings, args))
            elif args.command == "keys":
                return asyncio.run(run_keys(settings, args))
            elif args.command == "tenants" and args.tenants_command == "webhooks":
                return asyncio.run(endpoints.run(settings, args))
            elif args.command == "tenants":
                return asyncio.run(tenant_settings.run_tenants(settings, args))
            else:
                from server.web.auth import DevModeRefused

                try:
                    asyncio.run(run_server(settings))
                except DevModeRefused as exc:
                    print(f"pressroom: {exc}", file=sys.stderr)
                    return 2
        except (EmbeddedPostgresError, CannotListen) as exc:
            print(f"pressroom: {exc}", file=sys.stderr)
            return 1
        except BrokenPipeError:
            # The reader has gone (`pressroom doctor | head`): end quietly, as filters do, with
            # standard output on /dev/null so that the exit's own flush does not fail again.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
