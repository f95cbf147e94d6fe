"""PostgreSQL: the server to use (DATABASE_URL or the embedded one), the pool, and migrations."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import asyncpg

from server import jsontext, sql
from server.errors import backoff_s
from server.queue.embedded import EmbeddedPostgres

if TYPE_CHECKING:
    from server.settings import Settings

log = logging.getLogger(__name__)

# Any fixed number works; it only has to be the same in every Pressroom process.
MIGRATION_LOCK = 0x70726573
#: How long a migration's statement waits for a table's lock: while DDL waits behind a backup
#: or a long query, every query of the running processes on that table queues behind it. So
#: it gives up, lets them through, and the migration is tried again.
MIGRATION_LOCK_TIMEOUT = "1s"
MIGRATION_RETRY_BASE_S = 0.5
MIGRATION_RETRY_MAX_S = 10.0

#: Data sent and not acknowledged for this long means the network path is gone: the connection
#: fails, on either side, instead of waiting for TCP's own give-up after about 15 minutes.
TCP_USER_TIMEOUT_MS = 10_000
SERVER_SETTINGS = {
    "application_name": "pressroom",
    "timezone": "UTC",
    # The server drops a session whose host went silent (cut off, powered off) within about
    # 10 s rather than the kernel's minutes or hours: an open transaction of it would hold its
    # locks and the event log's commit watermark, which every process's streams wait behind.
    # Keep-alives find a silent idle session; the user timeout one with an answer unacknowledged.
    "tcp_keepalives_idle": "5",
    "tcp_keepalives_interval": "2",
    "tcp_keepalives_count": "3",
    "tcp_user_timeout": str(TCP_USER_TIMEOUT_MS),
}
#: A connection attempt gives up after this long: a database host that went silent makes
#: connects hang, not fail. asyncpg bounds all hosts of a multi-host DATABASE_URL together.
CONNECT_TIMEOUT_S = 5.0
#: The pool of every process, whatever its render slots: claims, heartbeats and completions
#: are short statements (no connection is held through a render, a webhook POST or a
#: stream), so ten serve the slots, the web app and the services together; two stay open so
#: that the first request after a quiet spell does not wait for a connect.
POOL_MIN_SIZE = 2
POOL_MAX_SIZE = 10


@contextlib.asynccontextmanager
async def server(settings: Settings) -> AsyncIterator[str]:
    """The DSN of the database `settings` name: DATABASE_URL, or else the embedded server in
    the data folder, started here (the only place Pressroom starts it) and stopped on exit."""
    if settings.database_url is not None:
        yield settings.database_url
        return
    embedded = EmbeddedPostgres(settings.data_dir / "postgres")
    dsn = await embedded.start()
    log.info(
        "embedded PostgreSQL running in %s (its output: %s)", embedded.folder, embedded.log_file
    )
    try:
        yield dsn
    finally:
        await embedded.stop()


async def init_connection(conn: asyncpg.Connection) -> None:
    """Decode json/jsonb into Python values on every connection; bound how long its TCP
    connection waits for a silent server."""
    # asyncpg offers no option for it; the transport is the connection's own.
    sock = conn._transport.get_extra_info("socket")
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, TCP_USER_TIMEOUT_MS)
    for type_name in ("json", "jsonb"):
        await conn.set_type_codec(
            type_name, schema="pg_catalog", encoder=jsontext.dumps, decoder=jsontext.loads
        )


async def release_connection(conn: asyncpg.Connection) -> None:
    """What a connection needs on its way back to the pool. Pressroom keeps no session state
    on pooled connections (advisory locks are transaction-scoped, LISTEN has its own
    connection), so asyncpg's full reset, a round trip on every release, is not needed."""
    if conn.is_in_transaction():
        await conn.execute("ROLLBACK")


async def create_pool(dsn: str, *, min_size: int, max_size: int) -> asyncpg.Pool:
    pool = await asyncpg.create_pool(
        dsn,
        min_size=min_size,
        max_size=max_size,
        init=init_connection,
        reset=release_connection,
        server_settings=SERVER_SETTINGS,
        timeout=CONNECT_TIMEOUT_S,
        # A restarted server leaves dead connections behind; drop idle ones quickly.
        max_inactive_connection_lifetime=60.0,
    )
    assert pool is not None
    return pool


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations in order, under an advisory lock; return the versions applied."""
    applied: list[str] = []
    await conn.execute("SELECT pg_advisory_lock($1)", MIGRATION_LOCK)
    try:
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version text PRIMARY KEY,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        done = {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, text in sql.migrations():
            if version in done:
                continue
            await _apply(conn, version, text)
            applied.append(version)
    finally:
        # One line, not one per migration: a new database has them all.
        if len(applied) == 1:
            log.info("applied migration %s", applied[0])
        elif applied:
            log.info("applied %s migrations, %s to %s", len(applied), applied[0], applied[-1])
        await conn.execute("SELECT pg_advisory_unlock($1)", MIGRATION_LOCK)
    return applied


async def _apply(conn: asyncpg.Connection, version: str, text: str) -> None:
    """One migration in one transaction, tried again while a lock it needs is held elsewhere."""
    for attempt in itertools.count(1):
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL lock_timeout = '{MIGRATION_LOCK_TIMEOUT}'")
                await conn.execute(text)
                await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
            return
        except asyncpg.LockNotAvailableError as exc:
            wait_s = backoff_s(attempt, base_s=MIGRATION_RETRY_BASE_S, max_s=MIGRATION_RETRY_MAX_S)
            log.warning(
                "migration %s waits for a lock another session holds (a backup, a long query: "
                "pg_locks shows it): %s; trying again in %.1f s",
                version,
                exc,
                wait_s,
            )
            await asyncio.sleep(wait_s)


async def migrate_at(dsn: str) -> list[str]:
    """`migrate` over a connection of its own, closed after."""
    conn = await connect(dsn)
    try:
        return await migrate(conn)
    finally:
        await conn.close()


async def connect(dsn: str, *, application_name: str = "pressroom") -> asyncpg.Connection:
    """A single connection outside the pool (LISTEN, migrations), named in pg_stat_activity."""
    conn: asyncpg.Connection = await asyncpg.connect(
        dsn,
        server_settings={**SERVER_SETTINGS, "application_name": application_name},
        timeout=CONNECT_TIMEOUT_S,
    )
    await init_connection(conn)
    return conn
