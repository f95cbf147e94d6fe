"""pressroom tenants webhook-secret TENANT [--rotate] | secret TENANT --rotate | token-key |
origins | cache: a tenant's own settings, on the database `pressroom serve` would use (`tenants
webhooks` is server/cli/endpoints.py)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
from pathlib import Path

from server.access import tenants, token_keys
from server.cli.common import cell, database
from server.settings import Settings, check_origin


async def run_tenants(settings: Settings, args: argparse.Namespace) -> int:
    """tenants webhook-secret TENANT [--rotate] | secret TENANT --rotate | token-key | origins
    | cache."""
    if args.tenants_command == "secret":
        return await run_token_secret(settings, args)
    if args.tenants_command == "token-key":
        return await run_token_keys(settings, args)
    if args.tenants_command == "origins":
        return await run_origins(settings, args)
    if args.tenants_command == "cache":
        return await run_cache(settings, args)
    overlap_s = tenants.ROTATION_OVERLAP_S
    async with database(settings) as conn:
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
            f"{cell(found.previous_until)} ({overlap_s / 3600:g} h after the rotation)",
            file=sys.stderr,
        )
    print(found.current)  # alone on stdout, as with keys create
    return 0


async def run_token_secret(settings: Settings, args: argparse.Namespace) -> int:
    """tenants secret TENANT --rotate: a new token signing secret, shown once."""
    if not args.rotate:
        print(
            "pressroom: a token signing secret is shown only when it is made; "
            f"`pressroom tenants secret {args.tenant} --rotate` makes a new one (the tokens "
            "signed with the current one stop working)",
            file=sys.stderr,
        )
        return 2
    async with database(settings) as conn:
        secret = await tenants.set_token_secret(conn, args.tenant, rotate=True)
    if secret is None:
        print(
            f"pressroom: tenant {args.tenant!r} has no API key, so no token secret of its own "
            "(the dev-mode tenant's tokens are signed with PRESSROOM_SECRET); create a key "
            f"first: pressroom keys create --tenant {args.tenant}",
            file=sys.stderr,
        )
        return 1
    print(
        f"rotated the token signing secret of tenant {args.tenant!r}: every server refuses "
        "the tokens signed with the old one, and closes the streams they opened, from now on; "
        "mint new ones with this (shown only now):",
        file=sys.stderr,
    )
    print(secret)  # alone on stdout, as with keys create
    return 0


async def run_token_keys(settings: Settings, args: argparse.Namespace) -> int:
    """tenants token-key TENANT --add FILE.pem [--kid KID] | --list | --remove KID: the public
    keys its backend may sign subscription tokens with."""
    tenant = args.tenant
    if args.kid is not None and args.add is None:
        print("pressroom: --kid names the key --add adds", file=sys.stderr)
        return 2
    key = None
    if args.add is not None:
        # Read and checked before the database is touched: a refused file changes nothing.
        try:
            pem = await asyncio.to_thread(Path(args.add).read_bytes)
            key = token_keys.read_public_key(pem)
        except OSError as exc:
            print(f"pressroom: cannot read {args.add}: {exc.strerror}", file=sys.stderr)
            return 2
        except token_keys.TokenKeyError as exc:
            print(f"pressroom: {args.add}: {exc}", file=sys.stderr)
            return 2
        if args.kid is not None:
            key = dataclasses.replace(key, kid=args.kid)
    async with database(settings) as conn:
        if await tenants.webhook_secrets(conn, tenant, overlap_s=0) is None:
            print(
                f"pressroom: tenant {tenant!r} has no API key, so no token keys; create a key "
                f"first: pressroom keys create --tenant {tenant}",
                file=sys.stderr,
            )
            return 1
        if args.list:
            print("kid\talgorithm\tadded")
            for listed in await token_keys.list_keys(conn, tenant):
                print(f"{listed.kid}\t{listed.algorithm}\t{cell(listed.added_at)}")
            return 0
        if key is None:
            if not await token_keys.remove(conn, tenant, args.remove):
                missing = f"tenant {tenant!r} has no token key {args.remove!r}"
                print(f"pressroom: {missing}", file=sys.stderr)
                return 1
            print(
                f"removed token key {args.remove!r} of tenant {tenant!r}: every server refuses "
                "the tokens signed with it, and closes the streams they opened, from now on",
                file=sys.stderr,
            )
            return 0
        try:
            added = await token_keys.add(conn, tenant, key)
        except token_keys.TokenKeyError as exc:
            print(f"pressroom: {args.add}: {exc}", file=sys.stderr)  # nothing changed
            return 1
    print(
        f"added token key {added.kid!r} ({added.algorithm}) for tenant {tenant!r}: its backend "
        f'signs tokens with the private key, "alg": "{added.algorithm}" and "kid": '
        f'"{added.kid}" in their header',
        file=sys.stderr,
    )
    print(added.kid)  # alone on stdout, as with keys create
    return 0


def kid(raw: str) -> str:
    why = token_keys.check_kid(raw)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return raw


async def run_origins(settings: Settings, args: argparse.Namespace) -> int:
    """tenants origins TENANT --add ORIGIN | --remove ORIGIN | --list (server/web/cors.py)."""
    tenant, given = args.tenant, args.add or args.remove
    origin = ""
    if given is not None:
        try:
            origin = check_origin(given)
        except ValueError as exc:
            print(f"pressroom: {given!r} {exc}", file=sys.stderr)  # nothing changed
            return 2
    also = ""
    if origin in settings.cors_origins:
        also = " (PRESSROOM_CORS_ORIGINS allows it for every tenant as well)"
    async with database(settings) as conn:
        if args.list:
            for own in await tenants.origins(conn, tenant):
                print(own)  # one per line on stdout, for scripts
            if settings.cors_origins:
                shown = ", ".join(settings.cors_origins)
                print(f"and for every tenant: {shown} (PRESSROOM_CORS_ORIGINS)", file=sys.stderr)
            return 0
        if args.remove is not None:
            if not await tenants.remove_origin(conn, tenant, origin):
                print(
                    f"pressroom: tenant {tenant!r} does not allow {origin}{also}", file=sys.stderr
                )
                return 1
            print(
                f"tenant {tenant!r} no longer allows {origin}{also}; every server stops "
                "answering its pages now",
                file=sys.stderr,
            )
            return 0
        added = await tenants.add_origin(conn, tenant, origin)
    if added is None:
        print(
            f"pressroom: tenant {tenant!r} has no API key, so no origins of its own "
            "(PRESSROOM_CORS_ORIGINS allows origins for every tenant, the dev-mode one too); "
            f"create a key first: pressroom keys create --tenant {tenant}",
            file=sys.stderr,
        )
        return 1
    done = "now allows" if added else "already allowed"
    print(
        f"tenant {tenant!r} {done} {origin}{also}; every server answers its pages now",
        file=sys.stderr,
    )
    return 0


async def run_cache(settings: Settings, args: argparse.Namespace) -> int:
    """tenants cache TENANT --on | --off | --show: whether the render cache serves every job of
    the tenant that leaves `cache` out (server/web/defaults.py)."""
    tenant = args.tenant
    async with database(settings) as conn:
        if args.show:
            found = await tenants.render_cache(conn, tenant)
        else:
            found = await tenants.set_render_cache(conn, tenant, on=args.on)
    if found is None:
        print(
            f"pressroom: tenant {tenant!r} has no API key, so no render cache default of its "
            'own (the dev-mode tenant\'s jobs use the cache when they say "cache": true); '
            f"create a key first: pressroom keys create --tenant {tenant}",
            file=sys.stderr,
        )
        return 1
    if args.show:
        print("on" if found else "off")  # alone on stdout, for scripts
        return 0
    if args.on:
        state = "now serves" if found else "already serves"
        print(
            f"tenant {tenant!r} {state} its jobs from the render cache unless they say "
            '"cache": false; every server does so now',
            file=sys.stderr,
        )
    else:
        state = "no longer serves" if found else "does not serve"
        print(
            f"tenant {tenant!r} {state} its jobs from the render cache unless they say "
            '"cache": true; every server does so now',
            file=sys.stderr,
        )
    return 0
