"""API keys in PostgreSQL: made, listed and revoked (`pressroom keys`), looked up by hash.

A key is shown once when it is made; the table keeps its SHA-256 and its first characters.
Which request a key authenticates, and for how long an answer is trusted, is server/web/auth.py's.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import secrets
from typing import TypeAlias

import asyncpg

from server.access.signing import new_token_secret
from server.access.tenants import check_tenant
from server.settings import new_webhook_secret
from server.sql import query

KEY_PREFIX = "prk_"
SHOWN_PREFIX_CHARS = 12
# Longer than any key this module makes: refused without hashing it.
MAX_KEY_CHARS = 200

Connection: TypeAlias = asyncpg.Connection | asyncpg.Pool


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def could_be_key(credential: str) -> bool:
    """Whether a credential has the shape of a key this module makes (else it is not looked up)."""
    return credential.startswith(KEY_PREFIX) and len(credential) <= MAX_KEY_CHARS


@dataclasses.dataclass(frozen=True, slots=True)
class ApiKey:
    """A key as listed: never the key itself, only its first characters."""

    id: int
    tenant: str
    name: str
    prefix: str
    created_at: dt.datetime
    revoked_at: dt.datetime | None
    last_used_at: dt.datetime | None

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> ApiKey:
        return cls(**dict(row))


@dataclasses.dataclass(frozen=True, slots=True)
class KnownKey:
    """An active key as a lookup finds it: its id and tenant."""

    id: int
    tenant: str


async def create_key(conn: Connection, tenant: str, name: str = "") -> tuple[ApiKey, str]:
    """A new key for `tenant`: the row, and the key itself (shown once, never stored)."""
    made, key, _secret = await create_key_and_tenant(conn, tenant, name)
    return made, key


async def create_key_and_tenant(
    conn: Connection, tenant: str, name: str = ""
) -> tuple[ApiKey, str, str | None]:
    """`create_key`, and the token signing secret of the tenant when this key made it (its
    first key): shown once, like the key."""
    if (why := check_tenant(tenant)) is not None:
        raise ValueError(why)
    key = KEY_PREFIX + secrets.token_urlsafe(32)
    row = dict(
        await conn.fetchrow(
            query("api_key_create"),
            tenant,
            name,
            hash_key(key),
            key[:SHOWN_PREFIX_CHARS],
            new_webhook_secret(),  # the tenant's own, if this is its first key
            new_token_secret(),  # likewise
        )
    )
    token_secret = row.pop("new_token_secret")
    return ApiKey(**row), key, token_secret


async def list_keys(conn: Connection) -> list[ApiKey]:
    return [ApiKey.from_row(row) for row in await conn.fetch(query("api_key_list"))]


async def revoke_key(conn: Connection, key_id: int) -> ApiKey | None:
    """Revoke a key; None when there is no such key."""
    row = await conn.fetchrow(query("api_key_revoke"), key_id)
    return None if row is None else ApiKey.from_row(row)


async def active_ids(conn: Connection) -> set[int]:
    """The ids of every key not revoked."""
    return {row["id"] for row in await conn.fetch(query("api_keys_active_ids"))}


async def is_active(conn: Connection, key_id: int) -> bool:
    active: bool = await conn.fetchval(query("api_key_is_active"), key_id)
    return active


async def lookup(conn: Connection, digests: list[str]) -> dict[str, KnownKey]:
    """The active keys among these hashes, by hash; their last use is recorded."""
    rows = await conn.fetch(query("api_key_lookup"), digests)
    return {row["key_hash"]: KnownKey(id=row["id"], tenant=row["tenant"]) for row in rows}
