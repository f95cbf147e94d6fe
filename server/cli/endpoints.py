"""pressroom tenants webhooks TENANT --add URL [--type TYPE] | --remove URL | --list: the
endpoints a tenant's own events (template.published) are POSTed to
(server/delivery/endpoints.py)."""

from __future__ import annotations

import argparse
import datetime as dt
import sys
from collections.abc import Callable

from server import events
from server.access import tenants
from server.cli.common import database
from server.delivery import endpoints
from server.netpolicy import NetworkPolicy
from server.settings import Settings

TYPES = sorted(events.TENANT_TYPES)


def add_parser(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], tenant: Callable[[str], str]
) -> None:
    """`tenants webhooks` among the `tenants` commands; `tenant` checks the name."""
    hooks = commands.add_parser(
        "webhooks", help="the URLs a tenant's own events (template.published) are POSTed to"
    )
    hooks.add_argument("tenant", type=tenant, help="a tenant with API keys")
    change = hooks.add_mutually_exclusive_group(required=True)
    change.add_argument(
        "--add",
        metavar="URL",
        help="POST the tenant's events there, signed with its webhook secret (checked as a "
        "job's webhook_url); again: other types, or enabled again after a 410",
    )
    change.add_argument(
        "--remove", metavar="URL", help="POST nothing more there (its pending deliveries stop)"
    )
    change.add_argument(
        "--list", action="store_true", help="url, types, added, disabled, the latest delivery"
    )
    hooks.add_argument(
        "--type",
        action="append",
        choices=TYPES,
        dest="types",
        help=f"with --add: an event to POST, repeatable (default: all of {', '.join(TYPES)})",
    )


async def run(settings: Settings, args: argparse.Namespace) -> int:
    """Add, remove or list the tenant's endpoints."""
    tenant = args.tenant
    if args.types is not None and args.add is None:
        print("pressroom: --type names the events --add POSTs", file=sys.stderr)
        return 2
    if args.add is not None:
        # Checked before the database is touched: a refused URL changes nothing.
        why = NetworkPolicy(settings.allow_hosts).validate_webhook_url(args.add)
        if why is not None:
            print(f"pressroom: {why}", file=sys.stderr)
            return 2
    types = sorted(set(args.types or TYPES))
    async with database(settings) as conn:
        if await tenants.webhook_secrets(conn, tenant, overlap_s=0) is None:
            return _no_keys(tenant)
        if args.list:
            print("url\ttypes\tadded\tdisabled\tlast_delivery\tlast_error")
            for hook in await endpoints.listed(conn, tenant):
                last = f"{hook.last_status} {_cell(hook.last_at)}" if hook.last_status else None
                cells = (hook.url, ",".join(hook.types), hook.created_at, hook.disabled_at, last)
                print("\t".join(_cell(value) for value in (*cells, hook.last_error)))
            return 0
        if args.remove is not None:
            stopped = await endpoints.remove(conn, tenant, args.remove)
            if stopped is None:
                missing = f"tenant {tenant!r} has no webhook endpoint {args.remove}"
                print(f"pressroom: {missing}", file=sys.stderr)
                return 1
            also = f"; {stopped} deliveries still pending to it are stopped" if stopped else ""
            print(f"tenant {tenant!r} POSTs nothing more to {args.remove}{also}", file=sys.stderr)
            return 0
        added = await endpoints.add(conn, tenant, args.add, types)
    if added is None:
        return _no_keys(tenant)  # its keys were deleted in between
    again = ""
    if added.was_disabled is not None:
        again = f" (enabled again: a 410 Gone disabled it at {_cell(added.was_disabled)})"
    elif not added.added:
        again = " (it had this endpoint: its types are these now)"
    print(
        f"tenant {tenant!r} POSTs {', '.join(types)} to {args.add}{again}, signed with its "
        f"webhook secret (pressroom tenants webhook-secret {tenant})",
        file=sys.stderr,
    )
    return 0


def _no_keys(tenant: str) -> int:
    print(
        f"pressroom: tenant {tenant!r} has no API key, so no webhook endpoints of its own (the "
        "dev-mode tenant's jobs and batches name theirs in webhook_url); create a key first: "
        f"pressroom keys create --tenant {tenant}",
        file=sys.stderr,
    )
    return 1


def _cell(value: str | dt.datetime | None) -> str:
    if value is None:
        return "-"
    if isinstance(value, dt.datetime):
        return value.isoformat(timespec="seconds")
    return value
