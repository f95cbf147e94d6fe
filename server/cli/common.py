"""What the operator's commands share: the database `pressroom serve` would use, and a cell
of their tables."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from server.queue import db
from server.settings import Settings


@contextlib.asynccontextmanager
async def database(settings: Settings) -> AsyncIterator[asyncpg.Connection]:
    """A migrated connection to the database `pressroom serve` would use."""
    async with db.server(settings) as dsn:
        conn = await db.connect(dsn)
        try:
            await db.migrate(conn)
            yield conn
        finally:
            await conn.close()


def cell(value: Any) -> str:
    if value is None:
        return "-"
    if hasattr(value, "isoformat"):
        return str(value.isoformat(timespec="seconds"))
    return str(value) or "-"
