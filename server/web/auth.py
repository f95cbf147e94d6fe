"""Who is calling: every /v1 request's tenant, the key behind it, and what a token opens.

A request's tenant comes from its API key (`Authorization: Bearer KEY`), from a subscription
token (`?token=`, on the streams and the long-poll only: EventSource cannot send headers) or,
while no key exists at all, is "default" (dev mode: open, and only on a loopback address). A
token opens its scope only (server/access/signing.py): `check_scope` answers 403 for anything else.

Keys are kept by server/access/apikeys.py; download links and the tokens this server mints name the
key that minted them. Tokens are signed with their tenant's token secret (server/access/tenants.py)
or with a private key whose public key the tenant registered (a token key, by `kid`:
server/access/token_keys.py), which each process keeps in memory for the tenants in use.
Creating, revoking and removing are writes to the database from any process (`pressroom keys
create`, `keys revoke`, `tenants secret --rotate`, `tenants token-key --remove`), which announce
themselves when they commit (NOTIFY pressroom_access, server/queue/listener.py). Each process
then trusts nothing it kept, reads again which keys are active and the secrets and token keys
of the tenants in use, and closes the streams (SSE, Socket.IO, long-polls) that rested on what
went: a revoked key, its tokens and its links, the tokens signed with a rotated secret or with
a removed token key. While the LISTEN connection is away no change can be heard, so every
request reads for itself until it is back.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import ipaddress
import logging
import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable

import asyncpg
from aiohttp import hdrs, web

from server.access import apikeys, tenants
from server.access.signing import (
    NO_KEY,
    TOKEN_ALGORITHM,
    Scope,
    TokenClaims,
    check_token,
    dashboard_secret,
    secret_digest,
    token_signer,
)
from server.errors import DB_OR_QUERY_ERRORS
from server.problems import Problem
from server.queue import listener as notifications
from server.queue.admission import RateLimiter
from server.settings import Settings
from server.web.credentials import (
    KEY_REMOVED_REASON,
    KEYED_REASON,
    REVOKED_REASON,
    ROTATED_REASON,
    TENANT_CLOSED_REASON,
    Credential,
    Hold,
    TokenKeyHold,
    Verified,
    Watch,
    tenant_of,
)

log = logging.getLogger(__name__)

DEV_TENANT = "default"
#: How often the keys answered from memory are recorded as used (last_used_at, kept to the
#: minute) and, while no change can be heard, how often the streams' keys are checked.
USED_KEYS_S = 60.0
MAX_CACHED_KEYS = 10_000
MAX_CACHED_TENANTS = 10_000

INVALID_TOKEN = "The subscription token is invalid or has expired; get a new one."
REVOKED_TOKEN = (
    "The subscription token was made with an API key that has been revoked (or before API "
    "keys were required); get a new one."
)
CLOSED_TENANT_TOKEN = "The subscription token's tenant has no active API key."
SUBSCRIPTION_NOT_KEY = (
    "A subscription token opens streams only (as ?token=), not the API: send an API key, or "
    'a dashboard token (POST /v1/tokens {"scope": "dashboard"}).'
)
UNKNOWN_KEY_TOKEN = (
    "The subscription token's kid names no token key of its tenant (or one since removed); get "
    "a new one."
)


# What the middleware sets on each request: the tenant, how the request proved it, the id of
# the key behind it (the key itself, or the one that minted its token) or NO_KEY, and for a
# token what it opens and what it rests on.
TENANT = web.RequestKey("tenant", str)
VIA = web.RequestKey("auth", str)
KEY_ID = web.RequestKey("key_id", int)
SCOPE = web.RequestKey("scope", Scope)
CREDENTIAL = web.RequestKey("credential", Credential)
#: A dashboard token's claims, for its renewal (POST /v1/tokens).
CLAIMS = web.RequestKey("claims", TokenClaims)
VIA_KEY, VIA_TOKEN, VIA_SIGNATURE, VIA_DEV = "key", "token", "signature", "dev"
#: A dashboard token as `Authorization: Bearer`: the API as its key, until the token expires.
VIA_DASHBOARD = "dashboard"

# Reachable without credentials: health, metrics, the dashboard's files, the API description.
OPEN_V1_PATHS = frozenset({"/v1/openapi.json"})
# Where a subscription token is a credential: the streams and a job's GET (the long-poll).
_TOKEN_PATH = re.compile(r"/v1/(?:events|jobs/[^/]+(?:/events)?)")
# Downloads, where a signed link (its expires, key and sig) is the credential.
_DOWNLOAD_PATH = re.compile(r"/v1/(?:jobs/[^/]+/(?:pdf|thumbnail)|batches/[^/]+/pdf)")
_LINK_PARAMETERS = ("expires", "key", "sig")

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


def _unauthorized(detail: str, *, error: str | None = None) -> Problem:
    challenge = 'Bearer realm="pressroom"' + (f', error="{error}"' if error else "")
    return Problem(
        401, "Unauthorized", detail, kind="unauthorized", headers={"WWW-Authenticate": challenge}
    )


class Authenticator:
    """Decides every /v1 request's tenant; the answers it reads are kept until a change to
    access is heard. Streams hold a Watch on their key, which ends them when the key is found
    revoked."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._pool: asyncpg.Pool | None = None
        self._loopback = is_loopback(settings.host)
        # Every answer in memory is kept with the generation it was read in: one is trusted
        # while no change was heard since it was read, and while changes can be heard at all.
        self._generation = 0
        self._listening = False
        self._changed = asyncio.Event()
        self._keys_active = False
        self._keys_generation: int | None = None
        self._known: dict[str, tuple[int, apikeys.KnownKey | None]] = {}
        # Keys answered from the cache since the last refresh (see refresh_loop).
        self._used: set[str] = set()
        # The ids of active keys as last read (with those found active since), ids found
        # inactive since, and when ids were found active (so that a read which began before
        # a key was made does not drop it): tokens, links and streams are checked on these.
        self._active_ids: set[int] = set()
        self._inactive_ids: set[int] = set()
        self._found_active_at: dict[int, float] = {}
        # Token secrets of the tenants in use, as last read, with the generation of each.
        self._secrets: dict[str, tuple[int, tenants.TokenSecret]] = {}
        self._watches: dict[Hold, set[Watch]] = {}
        self._limiter = RateLimiter(settings.rate_limit_rps)

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

    def access_changed(self, *, listening: bool = True) -> None:
        """A change to access was heard, or the LISTEN connection listens again (`listening`),
        or it was lost (not `listening`: nothing can be heard until it is back). Nothing kept
        is trusted from now on, and a pass reads again what the streams rest on."""
        self._generation += 1
        self._listening = listening
        self._changed.set()

    def _trusted(self, generation: int | None) -> bool:
        return self._listening and generation == self._generation

    async def keys_required(self) -> bool:
        """True once any unrevoked key exists (keyed mode); False in dev mode."""
        if not self._trusted(self._keys_generation):
            await self._read_keys_active()
        return self._keys_active

    async def open_now(self) -> bool:
        """Whether a request without credentials may be answered open (dev mode): on loopback,
        while no key exists as of this request. Read every time: the first key closes dev mode
        on every process as soon as its commit is done, not when the notification arrives."""
        if not self._loopback:
            return False
        await self._read_keys_active()
        return not self._keys_active

    async def _read_keys_active(self) -> None:
        """Read which keys are active, then close the streams of every other key."""
        assert self._pool is not None, "Authenticator.start() was not called"
        now, generation = time.monotonic(), self._generation
        active = await apikeys.active_ids(self._pool)
        found_since = {key_id for key_id, at in self._found_active_at.items() if at >= now}
        self._found_active_at = {key_id: self._found_active_at[key_id] for key_id in found_since}
        self._active_ids = active | found_since
        self._inactive_ids = set()
        self._keys_active = bool(self._active_ids)
        self._keys_generation = generation
        # Whatever this process has just learnt is revoked, every answer of it says so now:
        # the key itself, its tokens and links, and the streams they opened.
        for digest, (generation, known) in list(self._known.items()):
            if known is not None and known.id not in self._active_ids:
                self._known[digest] = (generation, None)
        self._close_revoked()

    def _found_active(self, key_id: int) -> None:
        self._keys_active = True  # an active key proves keyed mode at once
        self._active_ids.add(key_id)
        self._inactive_ids.discard(key_id)
        self._found_active_at[key_id] = time.monotonic()

    async def key_active(self, key_id: int) -> bool:
        """Whether credentials minted for this key still count, as last known: the key is not
        revoked; for NO_KEY, the server runs open (dev mode)."""
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

    async def token_secret(self, tenant: str) -> tenants.TokenSecret:
        """The tenant's token signing secret, as last known."""
        cached = self._secrets.get(tenant)
        if cached is not None and self._trusted(cached[0]):
            return cached[1]
        assert self._pool is not None, "Authenticator.start() was not called"
        generation = self._generation
        found = await tenants.token_secrets(self._pool, [tenant])
        self._remember_secrets(found, generation)
        return found[tenant]

    def _remember_secrets(self, found: dict[str, tenants.TokenSecret], generation: int) -> None:
        if len(self._secrets) + len(found) > MAX_CACHED_TENANTS:
            # A flood of made-up tenants must not grow memory; those with streams stay.
            watched = {tenant_of(hold) for hold in self._watches if not isinstance(hold, int)}
            self._secrets = {t: known for t, known in self._secrets.items() if t in watched}
        for tenant, known in found.items():
            self._secrets[tenant] = (generation, known)

    async def signing_secret(self, tenant: str) -> str:
        """The secret that signs the tokens this server mints for `tenant`: its own (made now
        if it has none yet), or PRESSROOM_SECRET for a tenant without keys (dev mode)."""
        known = await self.token_secret(tenant)
        if known.secret is not None:
            return known.secret
        assert self._pool is not None, "Authenticator.start() was not called"
        made = await tenants.set_token_secret(self._pool, tenant, rotate=False)
        if made is None:
            return self._settings.secret
        made_one = dataclasses.replace(known, secret=made, active=True)
        self._remember_secrets({tenant: made_one}, self._generation)
        return made

    async def verify_token(self, token: str) -> Verified | str:
        """What a subscription token grants, or why it is refused (a 401's detail): it must
        be signed with its tenant's current secret (HS256) or with the token key its `kid`
        names (by that key's algorithm), unexpired, its tenant must have an active key, and the
        key it was minted for (if any) must be active. A token of the dev-mode tenant, signed
        with PRESSROOM_SECRET, counts while the server runs open."""
        signer = token_signer(token)
        if signer is None or tenants.check_tenant(signer.tenant) is not None:
            return INVALID_TOKEN
        tenant = signer.tenant
        known = await self.token_secret(tenant)
        held: tuple[str, str] | TokenKeyHold
        if signer.dashboard:
            # Pressroom's own (HS256, its dashboard key): no backend or token key makes one.
            if signer.algorithm != TOKEN_ALGORITHM:
                return INVALID_TOKEN
            if known.secret is None:
                return await self._verify_dev_token(tenant, token, dashboard=True)
            key = dashboard_secret(self._settings.secret, known.secret)
            claims = check_token(key, token)
            held = (tenant, secret_digest(known.secret))
        elif signer.algorithm != TOKEN_ALGORITHM and signer.kid is not None:
            # Signed with a private key of the tenant's backend: the tenant's key of that kid
            # checks it, by its one algorithm. HS256 is the secret's, whatever its kid says.
            token_key = known.keys.get(signer.kid)
            if token_key is None:
                return UNKNOWN_KEY_TOKEN
            claims = check_token(token_key.verifier, token, algorithm=token_key.algorithm)
            held = TokenKeyHold(tenant, token_key.kid, token_key.thumbprint)
        elif known.secret is not None:
            claims = check_token(known.secret, token)
            held = (tenant, secret_digest(known.secret))
        else:
            return await self._verify_dev_token(tenant, token)
        if claims is None or claims.scope.dashboard != signer.dashboard:
            return INVALID_TOKEN
        if not known.active:
            return CLOSED_TENANT_TOKEN
        if claims.key_id is not None and not await self.key_active(claims.key_id):
            return REVOKED_TOKEN
        return Verified(claims, Credential(claims.key_id, held, claims.expires_at))

    async def _verify_dev_token(
        self, tenant: str, token: str, *, dashboard: bool = False
    ) -> Verified | str:
        """A token of a tenant without a secret: the dev-mode tenant's, signed with
        PRESSROOM_SECRET (a dashboard token with the dashboard key made of it), while the
        server runs open."""
        if tenant != DEV_TENANT:
            return INVALID_TOKEN
        secret = self._settings.secret
        claims = check_token(dashboard_secret(secret, secret) if dashboard else secret, token)
        if claims is None or claims.key_id not in (None, NO_KEY):
            return INVALID_TOKEN
        if claims.scope.dashboard != dashboard:
            return INVALID_TOKEN
        if not await self.key_active(NO_KEY):
            return REVOKED_TOKEN
        return Verified(claims, Credential(NO_KEY, expires_at=claims.expires_at))

    def watch(self, credential: Credential, on_revoked: Callable[[str], None]) -> Watch:
        """Call on_revoked (once) when what `credential` rests on is found revoked: its key,
        NO_KEY once the server stops running open, its token's secret once rotated or its
        token key once removed (or its tenant left without an active key); close the Watch
        when the stream ends."""
        watch = Watch(self.unwatch, credential.holds, on_revoked, credential.expires_at)
        for hold in watch.holds:
            self._watches.setdefault(hold, set()).add(watch)
        return watch

    def unwatch(self, watch: Watch) -> None:
        for hold in watch.holds:
            group = self._watches.get(hold)
            if group is not None:
                group.discard(watch)
                if not group:
                    del self._watches[hold]

    def _close_revoked(self) -> None:
        for hold in list(self._watches):
            reason = self._revoked(hold)
            if reason is not None:
                for watch in self._watches.pop(hold, ()):
                    watch.fire(reason)

    def _revoked(self, hold: Hold) -> str | None:
        """Why what a stream holds no longer counts, None while it does."""
        if not isinstance(hold, int):
            cached = self._secrets.get(tenant_of(hold))
            if cached is None:
                return None  # not read since (kept while watched): as it was
            known = cached[1]
            if not known.active:
                return TENANT_CLOSED_REASON
            if isinstance(hold, TokenKeyHold):
                token_key = known.keys.get(hold.kid)
                if token_key is None or token_key.thumbprint != hold.thumbprint:
                    return KEY_REMOVED_REASON
                return None
            if known.secret is None or secret_digest(known.secret) != hold[1]:
                return ROTATED_REASON
            return None
        if hold == NO_KEY:
            return None if not self._keys_active and self._loopback else KEYED_REASON
        return None if hold in self._active_ids else REVOKED_REASON

    async def refresh_loop(self) -> None:
        """After every change heard (and every USED_KEYS_S), read again which keys are active
        and the token secrets and keys of the tenants in use, and close the streams that
        rested on what went. The same pass records the keys answered from memory since the
        last as used, in one statement. While no change can be heard it runs every poll
        interval, for the streams: requests read for themselves meanwhile."""
        if not self._settings.run_web:
            return  # nothing asks
        while True:
            wait_s = USED_KEYS_S if self._listening else notifications.POLL_INTERVAL_S
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._changed.wait()
            self._changed.clear()
            try:
                await self._refresh_used_keys()
                await self._refresh_secrets()
                await self._read_keys_active()
            except DB_OR_QUERY_ERRORS as exc:
                log.warning("could not refresh API keys: %s", exc)  # requests read them

    async def _refresh_secrets(self) -> None:
        """Read the token secrets and token keys of the tenants in use again, in one
        statement: a rotated secret or a removed key is noticed here (and its streams closed by
        the pass that follows)."""
        if not self._secrets:
            return
        assert self._pool is not None, "Authenticator.start() was not called"
        generation = self._generation
        found = await tenants.token_secrets(self._pool, list(self._secrets))
        self._remember_secrets(found, generation)

    async def _refresh_used_keys(self) -> None:
        used, self._used = self._used, set()
        if not used:
            return
        assert self._pool is not None, "Authenticator.start() was not called"
        generation = self._generation
        found = await apikeys.lookup(self._pool, list(used))
        for known in found.values():
            self._found_active(known.id)
        for digest in used:
            if digest in self._known:  # not dropped meanwhile (a flood of made-up keys)
                self._known[digest] = (generation, found.get(digest))

    async def tenant_for_key(self, key: str) -> str | None:
        """The tenant of an active API key, else None (for transports other than HTTP)."""
        known = await self.lookup(key)
        return None if known is None else known.tenant

    async def lookup(self, key: str) -> apikeys.KnownKey | None:
        """The id and tenant of an active API key, else None."""
        if not apikeys.could_be_key(key):
            return None
        digest = apikeys.hash_key(key)
        cached = self._known.get(digest)
        if cached is not None and self._trusted(cached[0]):
            self._used.add(digest)
            return cached[1]
        assert self._pool is not None, "Authenticator.start() was not called"
        generation = self._generation
        known = (await apikeys.lookup(self._pool, [digest])).get(digest)
        if known is not None:
            self._found_active(known.id)
        if len(self._known) >= MAX_CACHED_KEYS:
            self._known.clear()  # a flood of made-up keys must not grow memory
            self._used.clear()
        self._known[digest] = (generation, known)
        return known

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Set request["tenant"] for every /v1 route, or answer 401 / 429 (problem+json)."""
        path = request.path
        if not path.startswith("/v1/") or path in OPEN_V1_PATHS:
            return await handler(request)
        if request.method == hdrs.METH_OPTIONS:
            return await handler(
                request
            )  # a CORS preflight has no credentials (server/web/cors.py)
        if "%00" in request.raw_path or "\x00" in path:
            # No text column can hold NUL; refuse it here rather than in every query.
            raise Problem(
                400,
                "Malformed request",
                "The URL must not contain NUL (%00) characters.",
                kind="malformed-request",
            )
        if _DOWNLOAD_PATH.fullmatch(path) and any(p in request.query for p in _LINK_PARAMETERS):
            # The signed link is the credential; server/web/files.py checks it (a link with a
            # part missing is refused there) and finds the tenant.
            request[VIA] = VIA_SIGNATURE
            return await handler(request)
        await self._authenticate(request)
        return await handler(request)

    def _check_rate(self, known: apikeys.KnownKey) -> None:
        self._limit(known.id)

    def _limit(self, key_id: int) -> None:
        wait_s = self._limiter.take(key_id)
        if wait_s > 0:
            raise Problem(
                429,
                "Too many requests",
                f"This API key may make {self._settings.rate_limit_rps:g} requests per "
                f"second (bursts of {self._limiter.burst}); retry later.",
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
            if keyed and token_signer(credential) is not None:
                await self._authenticate_dashboard(request, credential)
                return
            if keyed:
                raise _unauthorized("The API key is unknown or revoked.", error="invalid_token")
        stream = _TOKEN_PATH.fullmatch(request.path)
        token = request.query.get("token")
        if token is not None and stream is not None and request.method in ("GET", "HEAD"):
            verified = await self.verify_token(token)
            if isinstance(verified, Verified):
                claims, proved = verified.claims, verified.credential
                request[TENANT], request[VIA] = claims.tenant, VIA_TOKEN
                request[KEY_ID], request[CREDENTIAL] = proved.minted_by, proved
                request[SCOPE] = claims.scope  # what the handler lets it open (check_scope)
                return
            if keyed:
                raise _unauthorized(verified, error="invalid_token")
        if not keyed and self._loopback:
            keyed = not await self.open_now()
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

    async def _authenticate_dashboard(self, request: web.Request, token: str) -> None:
        """A token as `Authorization: Bearer`: a dashboard token acts as its key (rate limit
        included) until it expires; any other token is refused."""
        verified = await self.verify_token(token)
        if not isinstance(verified, Verified):
            raise _unauthorized(verified, error="invalid_token")
        claims, proved = verified.claims, verified.credential
        if not claims.scope.dashboard or claims.key_id is None:
            raise _unauthorized(SUBSCRIPTION_NOT_KEY, error="invalid_token")
        self._limit(claims.key_id)
        request[TENANT], request[VIA], request[KEY_ID] = (
            claims.tenant,
            VIA_DASHBOARD,
            proved.minted_by,
        )
        request[CREDENTIAL], request[SCOPE] = proved, claims.scope
        request[CLAIMS] = claims


def key_id_of(request: web.Request) -> int:
    """The id of the key behind a request (its own, or its token's minter), else NO_KEY."""
    key_id: int = request.get(KEY_ID, NO_KEY)
    return key_id


def credential_of(request: web.Request) -> Credential:
    """What the request proved, for a Watch on the streams it opens."""
    return request.get(CREDENTIAL) or Credential(key_id_of(request))


def forbidden(scope: Scope) -> Problem:
    return Problem(
        403,
        "Forbidden",
        f"This subscription token opens {scope.describe()} only.",
        kind="forbidden",
    )


def check_scope(request: web.Request, *, job_id: uuid.UUID | None, channel: str | None) -> None:
    """403 unless the request's token (if it came with one) opens this: a job (`job_id`,
    with that job's `channel`, None when there is no such job), a channel's stream (`channel`
    alone) or the tenant's (neither)."""
    scope = request.get(SCOPE)
    if scope is not None and not scope.opens(job_id=job_id, channel=channel):
        raise forbidden(scope)


def session_ended() -> Problem:
    """The 401 of a dashboard token renewed past its session (PRESSROOM_DASHBOARD_SESSION_S)."""
    return _unauthorized(
        "The dashboard's session has ended (its renewals last PRESSROOM_DASHBOARD_SESSION_S "
        "from when its API key was given): exchange the API key again.",
        error="invalid_token",
    )


def revoked(detail: str = f"The wait ended: {REVOKED_REASON}.") -> Problem:
    """The 401 of a credential whose key was revoked: a long-poll's while it waited, a link's."""
    return _unauthorized(detail, error="invalid_token")
