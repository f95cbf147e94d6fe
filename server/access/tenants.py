"""Tenants: which names may be one, and each tenant's secrets, made with its first API key.

The webhook signing secrets are shown and rotated by `pressroom tenants webhook-secret`, read
by the webhook sender for every delivery (so that a rotation signs the next delivery already).
The token signing secret, which a tenant's backend mints subscription tokens with, is shown
once by `pressroom keys create` (for a new tenant) and by `pressroom tenants secret --rotate`.
Its backend may sign them with its own private key instead, whose public key the tenant
registered (server/access/token_keys.py). server/web/auth.py keeps the secrets and keys in
use in memory.

The open dev mode's tenant has no key and no row; its deliveries are signed with
PRESSROOM_WEBHOOK_SECRET (settings.webhook_secret), its tokens with PRESSROOM_SECRET.

A tenant with keys may also allow browser origins of its own (`pressroom tenants origins`),
which server/web/cors.py keeps in memory, and have the render cache serve all its jobs
(`pressroom tenants cache`), which server/web/defaults.py keeps in memory.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping

import asyncpg

from server.access import token_keys
from server.access.signing import new_token_secret
from server.settings import new_webhook_secret
from server.sql import query

TENANT_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
#: After a rotation the old webhook secret signs too for a day: time for every receiver to
#: take the new one while each delivery still verifies with either.
ROTATION_OVERLAP_S = 24 * 3600.0


def check_tenant(name: str) -> str | None:
    """Why `name` cannot be a tenant, or None when it can."""
    if TENANT_PATTERN.fullmatch(name) is None:
        return "a tenant is 1-63 letters, digits, '.', '_' or '-', starting with a letter or digit"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class WebhookSecrets:
    """The secret that signs a tenant's deliveries, and the previous one during the overlap
    that follows a rotation."""

    current: str
    previous: str | None = None
    #: When the previous secret stops signing (None: no rotation is in its overlap).
    previous_until: dt.datetime | None = None

    @property
    def signing(self) -> list[str]:
        """Every secret a delivery is signed with now, the current one first."""
        return [self.current] if self.previous is None else [self.current, self.previous]


async def webhook_secrets(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, *, overlap_s: float
) -> WebhookSecrets | None:
    """The tenant's secrets, made now for a tenant whose keys predate them; None for a tenant
    without keys (the dev-mode tenant), whose deliveries the deployment's secret signs."""
    row = await conn.fetchrow(query("tenant_webhook_secrets"), tenant, overlap_s)
    if row["webhook_secret"] is None:
        if not row["has_keys"]:
            return None
        await conn.execute(query("tenant_create"), tenant, new_webhook_secret(), new_token_secret())
        row = await conn.fetchrow(query("tenant_webhook_secrets"), tenant, overlap_s)
        if row["webhook_secret"] is None:
            return None  # its keys were deleted in between
    return WebhookSecrets(
        current=row["webhook_secret"],
        previous=row["previous_webhook_secret"],
        previous_until=row["previous_until"] if row["previous_webhook_secret"] else None,
    )


async def rotate_webhook_secret(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, *, overlap_s: float
) -> WebhookSecrets | None:
    """Give the tenant a new secret; the one it replaces keeps signing for overlap_s. None for
    a tenant without keys."""
    if await webhook_secrets(conn, tenant, overlap_s=overlap_s) is None:
        return None
    await conn.execute(query("tenant_rotate_webhook_secret"), tenant, new_webhook_secret())
    return await webhook_secrets(conn, tenant, overlap_s=overlap_s)


@dataclasses.dataclass(frozen=True, slots=True)
class TokenSecret:
    """A tenant's token signing secret as last read (None: it has none yet), whether the
    tenant has an active API key (without one, none of its tokens is valid), and its token keys
    by kid."""

    secret: str | None
    active: bool
    keys: Mapping[str, token_keys.TokenKey] = dataclasses.field(default_factory=dict)


async def token_secrets(
    conn: asyncpg.Connection | asyncpg.Pool, names: list[str]
) -> dict[str, TokenSecret]:
    """The token signing secrets and token keys of these tenants, one entry per name."""
    rows = await conn.fetch(query("tenant_token_secrets"), names)
    return {
        row["name"]: TokenSecret(
            row["token_secret"], row["active"], token_keys.from_rows(row["token_keys"])
        )
        for row in rows
    }


async def set_token_secret(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, *, rotate: bool
) -> str | None:
    """The tenant's token signing secret: a new one with `rotate` (every token signed with the
    old one is refused from then on), else the one it has, made now if it has none. None for a
    tenant without keys."""
    if await webhook_secrets(conn, tenant, overlap_s=0) is None:
        return None  # no keys; else its row exists now
    secret: str | None = await conn.fetchval(
        query("tenant_set_token_secret"), tenant, new_token_secret(), rotate
    )
    return secret


async def all_origins(conn: asyncpg.Connection | asyncpg.Pool) -> dict[str, frozenset[str]]:
    """Every tenant's own CORS origins (server/web/cors.py), by tenant."""
    found: dict[str, set[str]] = {}
    for row in await conn.fetch(query("tenant_origins")):
        found.setdefault(row["tenant"], set()).add(row["origin"])
    return {tenant: frozenset(origins) for tenant, origins in found.items()}


async def origins(conn: asyncpg.Connection | asyncpg.Pool, tenant: str) -> list[str]:
    """The tenant's own CORS origins, sorted."""
    return [row["origin"] for row in await conn.fetch(query("tenant_origin_list"), tenant)]


async def add_origin(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, origin: str
) -> bool | None:
    """Allow `origin` (already checked: settings.check_origin) for the tenant: True when it is
    new, False when the tenant had it, None for a tenant without keys."""
    if await webhook_secrets(conn, tenant, overlap_s=0) is None:
        return None  # no keys; else its row exists now
    added = await conn.fetchval(query("tenant_origin_add"), tenant, origin)
    return added is not None


async def remove_origin(conn: asyncpg.Connection | asyncpg.Pool, tenant: str, origin: str) -> bool:
    """Stop allowing `origin` for the tenant; False when it was not one of its origins."""
    return await conn.fetchval(query("tenant_origin_remove"), tenant, origin) is not None


async def render_cache_tenants(conn: asyncpg.Connection | asyncpg.Pool) -> frozenset[str]:
    """The tenants whose jobs use the render cache unless they say `cache: false`."""
    return frozenset(row["name"] for row in await conn.fetch(query("tenant_render_cache")))


async def render_cache(conn: asyncpg.Connection | asyncpg.Pool, tenant: str) -> bool | None:
    """Whether the render cache serves every job of the tenant by default; None for a tenant
    without keys (the dev-mode tenant), which has no default."""
    if await webhook_secrets(conn, tenant, overlap_s=0) is None:
        return None  # no keys; else its row exists now
    on: bool = await conn.fetchval(query("tenant_render_cache_of"), tenant)
    return on


async def set_render_cache(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, *, on: bool
) -> bool | None:
    """Turn the tenant's default on or off: True when that changed it, False when it was so
    already, None for a tenant without keys."""
    if await webhook_secrets(conn, tenant, overlap_s=0) is None:
        return None  # no keys; else its row exists now
    return await conn.fetchval(query("tenant_set_render_cache"), tenant, on) is not None
