"""Who is calling: every /v1 request's tenant, and the key behind it.

A request's tenant comes from its API key (`Authorization: Bearer KEY`), from a subscription
token (`?token=`, streams only: EventSource cannot send headers) or, while no key exists at
all, is "default" (dev mode: open, and only on a loopback address).

Keys are kept by server/apikeys.py; tokens and download links (server/signing.py) name the
key that minted them. Each process reads which keys are active every auth_cache_s / 2; a
revoked key, its tokens and its links are refused from then on, and the streams they opened
(SSE, Socket.IO, long-polls) are closed: revoking is a write to the database from any process
(`pressroom keys revoke`), noticed by every server.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
from aiohttp import web

from server import apikeys
from server.admission import RateLimiter
from server.errors import DB_OR_QUERY_ERRORS
from server.problems import Problem
from server.settings import Settings
from server.signing import NO_KEY, TokenClaims, check_token

log = logging.getLogger(__name__)

DEV_TENANT = "default"
# Lookups answered from memory: revoking a key takes effect within settings.auth_cache_s.
MAX_CACHED_KEYS = 10_000

REVOKED_REASON = "the API key this stream was opened with (or its token's) has been revoked"
KEYED_REASON = "API keys are required now; reconnect with a key or a subscription token"

# What the middleware sets on each request: the tenant, how the request proved it, and the
# id of the key behind it (the key itself, or the one that minted its token), or NO_KEY.
TENANT = web.RequestKey("tenant", str)
VIA = web.RequestKey("auth", str)
KEY_ID = web.RequestKey("key_id", int)
VIA_KEY, VIA_TOKEN, VIA_SIGNATURE, VIA_DEV = "key", "token", "signature", "dev"

# Reachable without credentials: health, metrics, the dashboard's files, the API description.
OPEN_V1_PATHS = frozenset({"/v1/openapi.json"})
_STREAM_PATH = re.compile(r"/v1/(?:jobs/([^/]+)/)?events")
_DOWNLOAD_PATH = re.compile(r"/v1/jobs/[^/]+/pdf")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class DevModeRefused(RuntimeError):
    """No API key exists and the server would listen beyond loopback: it must not start open."""


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Watch:
    """A stream's hold on the key it was opened with (or its token was minted by):
    `on_revoked` runs once, with a reason, when the authenticator finds that key revoked."""

    __slots__ = ("_authenticator", "_on_revoked", "key_id", "revoked")

    def __init__(
        self, authenticator: Authenticator, key_id: int, on_revoked: Callable[[str], None]
    ) -> None:
        self._authenticator = authenticator
        self._on_revoked = on_revoked
        self.key_id = key_id
        self.revoked = False

    def fire(self, reason: str) -> None:
        if self.revoked:
            return
        self.revoked = True
        try:
            self._on_revoked(reason)
        except Exception:
            log.exception("closing a stream of a revoked key failed")

    def close(self) -> None:
        """The stream ended: stop watching (idempotent)."""
        self._authenticator.unwatch(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _unauthorized(detail: str, *, error: str | None = None) -> Problem:
    challenge = 'Bearer realm="pressroom"' + (f', error="{error}"' if error else "")
    return Problem(
        401, "Unauthorized", detail, kind="unauthorized", headers={"WWW-Authenticate": challenge}
    )


class Authenticator:
    """Decides every /v1 request's tenant; the answers it reads are cached for a few seconds.
    Streams hold a Watch on their key, which ends them when the key is found revoked."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pool: asyncpg.Pool | None = None
        self._loopback = is_loopback(settings.host)
        self._keys_active = False
        self._keys_checked_until = -math.inf
        self._known: dict[str, tuple[float, apikeys.KnownKey | None]] = {}
        # Keys answered from the cache since the last refresh (see refresh_loop).
        self._used: set[str] = set()
        # The ids of active keys as last read (with those found active since), ids found
        # inactive since, and when ids were found active (so that a read which began before
        # a key was made does not drop it): tokens, links and streams are checked on these.
        self._active_ids: set[int] = set()
        self._inactive_ids: set[int] = set()
        self._found_active_at: dict[int, float] = {}
        self._watches: dict[int, set[Watch]] = {}
        self._limiter = RateLimiter(settings.rate_limit_rps, settings.rate_limit_burst)

    async def start(self, pool: asyncpg.Pool) -> None:
        """Refuse to serve open beyond loopback; say which mode the server runs in."""
        self._pool = pool
        if not self._settings.run_web:
            return
        host = self._settings.host
        if await self.keys_required():
            log.info("API keys required: every /v1 request needs Authorization: Bearer KEY")
        elif not self._loopback:
            raise DevModeRefused(
                f"no API key exists, so Pressroom would run open (dev mode), which it does on "
                f"127.0.0.1 only, but PRESSROOM_HOST={host} is not a loopback address. "
                f"Create a key first: pressroom keys create --tenant NAME"
            )
        else:
            log.warning(
                "dev mode: no API key exists; open single-tenant API (tenant %r) on %s only. "
                "Create a key with `pressroom keys create --tenant NAME` to require keys.",
                DEV_TENANT,
                host,
            )

    async def keys_required(self) -> bool:
        """True once any unrevoked key exists (keyed mode); False in dev mode."""
        if time.monotonic() >= self._keys_checked_until:
            await self._read_keys_active()
        return self._keys_active

    async def _read_keys_active(self) -> None:
        """Read which keys are active, then close the streams of every other key."""
        assert self._pool is not None, "Authenticator.start() was not called"
        now = time.monotonic()
        active = await apikeys.active_ids(self._pool)
        found_since = {key_id for key_id, at in self._found_active_at.items() if at >= now}
        self._found_active_at = {key_id: self._found_active_at[key_id] for key_id in found_since}
        self._active_ids = active | found_since
        self._inactive_ids = set()
        self._keys_active = bool(self._active_ids)
        self._keys_checked_until = now + self._settings.auth_cache_s
        # Whatever this process has just learnt is revoked, every answer of it says so now:
        # the key itself, its tokens and links, and the streams they opened.
        for digest, (until, known) in list(self._known.items()):
            if known is not None and known.id not in self._active_ids:
                self._known[digest] = (until, None)
        self._close_revoked()

    def _found_active(self, key_id: int) -> None:
        self._keys_active = True  # an active key proves keyed mode at once
        self._active_ids.add(key_id)
        self._inactive_ids.discard(key_id)
        self._found_active_at[key_id] = time.monotonic()

    async def key_active(self, key_id: int) -> bool:
        """Whether credentials minted for this key still count, as known at most
        auth_cache_s ago: the key is not revoked; for NO_KEY, the server runs open (dev mode)."""
        keyed = await self.keys_required()  # the ids are as fresh as this answer
        if key_id == NO_KEY:
            return not keyed and self._loopback
        if key_id in self._active_ids:
            return True
        if key_id in self._inactive_ids:
            return False
        # Made since the ids were read (its token reached this process first), or revoked.
        assert self._pool is not None, "Authenticator.start() was not called"
        if await apikeys.is_active(self._pool, key_id):
            self._found_active(key_id)
            return True
        if len(self._inactive_ids) >= MAX_CACHED_KEYS:
            self._inactive_ids.clear()
        self._inactive_ids.add(key_id)
        return False

    async def token_claims(self, token: str) -> TokenClaims | None:
        """The claims of a token this server signed, unexpired, whose key is still active."""
        claims = check_token(self._settings.secret, token)
        if claims is None or not await self.key_active(claims.key_id):
            return None
        return claims

    def watch(self, key_id: int, on_revoked: Callable[[str], None]) -> Watch:
        """Call on_revoked (once) when key `key_id` is found revoked, or for NO_KEY when the
        server stops running open; close the Watch when the stream ends."""
        watch = Watch(self, key_id, on_revoked)
        self._watches.setdefault(key_id, set()).add(watch)
        return watch

    def unwatch(self, watch: Watch) -> None:
        group = self._watches.get(watch.key_id)
        if group is not None:
            group.discard(watch)
            if not group:
                del self._watches[watch.key_id]

    def _close_revoked(self) -> None:
        dev_open = not self._keys_active and self._loopback
        for key_id in list(self._watches):
            if key_id in self._active_ids or (key_id == NO_KEY and dev_open):
                continue
            reason = KEYED_REASON if key_id == NO_KEY else REVOKED_REASON
            for watch in self._watches.pop(key_id, ()):
                watch.fire(reason)

    async def refresh_loop(self) -> None:
        """Read the cached answers again before they expire, so that a request seldom waits
        for the database: every auth_cache_s / 2, which keys are active, and every key
        answered from the cache since the last pass, in one statement. An answer is still
        never older than auth_cache_s (a request that finds one expired reads it itself), so
        a revoked key stops working as soon as it did before. Without it every request
        after an answer expired waited for a read (about 1-2 ms, bench.queue).

        The same pass closes the streams opened with a key that is no longer active (or
        with a token it minted); with the cache off, it runs every poll interval for them."""
        if not self._settings.run_web:
            return  # nothing asks
        interval_s = self._settings.auth_cache_s / 2 or self._settings.poll_interval_s
        while True:
            await asyncio.sleep(interval_s)
            try:
                await self._refresh_used_keys()
                await self._read_keys_active()
            except DB_OR_QUERY_ERRORS as exc:
                log.warning("could not refresh API keys: %s", exc)  # requests read them

    async def _refresh_used_keys(self) -> None:
        used, self._used = self._used, set()
        if not used:
            return
        assert self._pool is not None, "Authenticator.start() was not called"
        now = time.monotonic()
        found = await apikeys.lookup(self._pool, list(used))
        for known in found.values():
            self._found_active(known.id)
        until = now + self._settings.auth_cache_s
        for digest in used:
            if digest in self._known:  # not dropped meanwhile (a flood of made-up keys)
                self._known[digest] = (until, found.get(digest))

    async def tenant_for_key(self, key: str) -> str | None:
        """The tenant of an active API key, else None (for transports other than HTTP)."""
        known = await self.lookup(key)
        return None if known is None else known.tenant

    async def lookup(self, key: str) -> apikeys.KnownKey | None:
        """The id and tenant of an active API key, else None."""
        if not apikeys.could_be_key(key):
            return None
        digest = apikeys.hash_key(key)
        now = time.monotonic()
        cached = self._known.get(digest)
        if cached is not None and cached[0] > now:
            self._used.add(digest)
            return cached[1]
        assert self._pool is not None, "Authenticator.start() was not called"
        known = (await apikeys.lookup(self._pool, [digest])).get(digest)
        if known is not None:
            self._found_active(known.id)
        if self._settings.auth_cache_s > 0:
            if len(self._known) >= MAX_CACHED_KEYS:
                self._known.clear()  # a flood of made-up keys must not grow memory
                self._used.clear()
            self._known[digest] = (now + self._settings.auth_cache_s, known)
        return known

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Set request["tenant"] for every /v1 route, or answer 401 / 429 (problem+json)."""
        path = request.path
        if not path.startswith("/v1/") or path in OPEN_V1_PATHS:
            return await handler(request)
        if "%00" in request.raw_path or "\x00" in path:
            # No text column can hold NUL; refuse it here rather than in every query.
            raise Problem(
                400,
                "Malformed request",
                "The URL must not contain NUL (%00) characters.",
                kind="malformed-request",
            )
        if _DOWNLOAD_PATH.fullmatch(path) and (
            "sig" in request.query or "expires" in request.query
        ):
            # The signature is the credential; api.download checks it and finds the tenant.
            request[VIA] = VIA_SIGNATURE
            return await handler(request)
        await self._authenticate(request)
        return await handler(request)

    def _check_rate(self, known: apikeys.KnownKey) -> None:
        wait_s = self._limiter.take(known.id)
        if wait_s > 0:
            raise Problem(
                429,
                "Too many requests",
                f"This API key may make {self._settings.rate_limit_rps:g} requests per "
                f"second (bursts of {self._settings.rate_limit_burst}); retry later.",
                kind="rate-limited",
                headers={"Retry-After": str(max(1, math.ceil(wait_s)))},
            )

    async def _authenticate(self, request: web.Request) -> None:
        keyed = await self.keys_required()
        header = request.headers.get("Authorization")
        if header is not None:
            scheme, _, credential = header.strip().partition(" ")
            credential = credential.strip() if scheme.lower() == "bearer" else ""
            known = await self.lookup(credential) if credential else None
            if known is not None:
                # A valid key proves keyed mode at once, whatever the cached answer said.
                self._keys_active = True
                self._check_rate(known)
                request[TENANT], request[VIA], request[KEY_ID] = known.tenant, VIA_KEY, known.id
                return
            if keyed and not credential:
                raise _unauthorized(
                    "Send the API key as `Authorization: Bearer KEY`.", error="invalid_request"
                )
            if keyed:
                raise _unauthorized("The API key is unknown or revoked.", error="invalid_token")
        stream = _STREAM_PATH.fullmatch(request.path)
        token = request.query.get("token")
        if token is not None and stream is not None and request.method in ("GET", "HEAD"):
            claims = check_token(self._settings.secret, token)
            if claims is not None and claims.allows(_normal_job_id(stream.group(1))):
                if await self.key_active(claims.key_id):
                    request[TENANT], request[VIA] = claims.tenant, VIA_TOKEN
                    request[KEY_ID] = claims.key_id
                    return
                if keyed:
                    raise _unauthorized(
                        "The subscription token was made with an API key that has been "
                        "revoked (or before API keys were required); get a new one.",
                        error="invalid_token",
                    )
            elif keyed and claims is None:
                raise _unauthorized(
                    "The subscription token is invalid or has expired; get a new one.",
                    error="invalid_token",
                )
            elif keyed:
                raise _unauthorized(
                    "This subscription token is for another job's stream.", error="invalid_token"
                )
        if not keyed:
            if not self._loopback:
                # Every key was revoked while serving beyond loopback: stay closed, not open.
                raise _unauthorized(
                    "No API key is active on this server; create one with "
                    "`pressroom keys create --tenant NAME`."
                )
            request[TENANT], request[VIA], request[KEY_ID] = DEV_TENANT, VIA_DEV, NO_KEY
            return
        raise _unauthorized(
            "This server requires an API key: send `Authorization: Bearer KEY`"
            + (" or a subscription token as ?token=." if stream is not None else ".")
        )


def _normal_job_id(raw: str | None) -> str | None:
    if raw is None:
        return None
    try:
        return str(uuid.UUID(raw))
    except ValueError:
        return raw


def key_id_of(request: web.Request) -> int:
    """The id of the key behind a request (its own, or its token's minter), else NO_KEY."""
    key_id: int = request.get(KEY_ID, NO_KEY)
    return key_id


def revoked(detail: str = f"The wait ended: {REVOKED_REASON}.") -> Problem:
    """The 401 of a credential whose key was revoked: a long-poll's while it waited, a link's."""
    return _unauthorized(detail, error="invalid_token")
