"""A tenant's own webhook endpoints (tenant_webhooks, 0040): the URLs its events of the tenant
as a whole (events.TENANT_TYPES: template.published) are POSTed to, kept by `pressroom tenants
webhooks`. The event's trigger writes one outbox row per endpoint that takes its type
(schema.sql, job_events_to_tenant_webhooks); server/delivery/webhooks.py sends them as any
other, signed with the tenant's secret. Only a tenant with API keys has a row to hang them on:
the dev-mode tenant has none."""

from __future__ import annotations

import dataclasses
import datetime as dt

import asyncpg

from server.access import tenants
from server.sql import query


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    """One endpoint, with its latest delivery (last_status None: none yet)."""

    url: str
    types: tuple[str, ...]
    created_at: dt.datetime
    #: Since when a 410 Gone disabled it (None: it gets deliveries).
    disabled_at: dt.datetime | None
    last_status: str | None
    last_at: dt.datetime | None
    last_error: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Added:
    """What adding an endpoint did: made a new one, or changed one the tenant had (enabled
    again if a 410 had disabled it, since `was_disabled`)."""

    added: bool
    was_disabled: dt.datetime | None


async def listed(conn: asyncpg.Connection | asyncpg.Pool, tenant: str) -> list[Endpoint]:
    """The tenant's endpoints, by URL."""
    rows = await conn.fetch(query("tenant_webhook_list"), tenant)
    return [Endpoint(**{**dict(row), "types": tuple(row["types"])}) for row in rows]


async def add(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, url: str, types: list[str]
) -> Added | None:
    """POST the tenant's events of `types` to `url` (checked as a job's webhook_url is:
    NetworkPolicy.validate_webhook_url) from now on; None for a tenant without keys."""
    if await tenants.webhook_secrets(conn, tenant, overlap_s=0) is None:
        return None  # no keys; else its row exists now
    row = await conn.fetchrow(query("tenant_webhook_add"), tenant, url, types)
    return Added(row["added"], row["was_disabled"])


async def remove(conn: asyncpg.Connection | asyncpg.Pool, tenant: str, url: str) -> int | None:
    """POST nothing more to `url`: how many of its deliveries still pending were stopped, or
    None when it is none of the tenant's endpoints."""
    stopped: int | None = await conn.fetchval(query("tenant_webhook_remove"), tenant, url)
    return stopped
