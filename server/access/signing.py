"""Subscription tokens and download links.

Tokens are standard JWTs (PyJWT), so that a tenant's backend can mint them itself: HS256
signed with the tenant's token secret (migration 0014; the open dev mode's tenant, which has
none, uses PRESSROOM_SECRET), or signed with a private key of the tenant's whose public key it
registered (a token key, server/access/token_keys.py: RS256, ES256 or EdDSA, named by the header's
`kid`). Every token is checked with one key and that key's one algorithm, chosen by the
header: `alg` HS256 means the secret, whatever `kid` says; any other `alg` needs the `kid` of
one of the tenant's token keys, and must be that key's algorithm. The claims are the same:

    {"sub": TENANT, "iat": …, "exp": …, "pressroom": {"scope": "tenant" | "job" | "channel" |
     "channels" | "dashboard", "job_id": …, "channel": …, "channels": [… up to 20], "key": …,
     "since": …}}

`scope` names what the token opens, with `job_id` for a job's, `channel` for a channel's,
`channels` for several; `key`, only in the tokens Pressroom mints, is the id of the API key
that asked for it, which the token then needs to stay active. A `dashboard` token is the one
kind that calls the API (as `Authorization: Bearer`): Pressroom alone mints it, for an API
key, signed with a key derived from both PRESSROOM_SECRET and the tenant's token secret (so
neither the tenant's backend nor a token key can make one); `since` is when that key was
exchanged, which bounds its renewals.

Download links carry `expires`, `key` (the minting key's id) and `sig` in their query; `sig` is
an HMAC-SHA256 made by itsdangerous with PRESSROOM_SECRET, so that a link stays about as short
as its path. Whether a key is still active, and which secret or token key is a tenant's now,
is server/web/auth.py's to say.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import hmac
import secrets
import time
import uuid
from typing import TYPE_CHECKING, Any

import itsdangerous
import jwt

from server.channels import is_channel

if TYPE_CHECKING:
    from server.access.token_keys import Verifier

# The key id that credentials minted without an API key carry (open dev mode; the download
# links of webhook deliveries). Key ids start at 1.
NO_KEY = 0
# Longer than any token a tenant needs (20 channels of the longest name, signed with a
# 4096-bit RSA key: about 6,400), shorter than aiohttp's request line (8,190 bytes) with the
# route around it; refused before any decoding.
MAX_TOKEN_CHARS = 7168
MAX_TOKEN_CHANNELS = 20
# How many channels a 403 names before it counts the rest.
DESCRIBED_CHANNELS = 3
TOKEN_ALGORITHM = "HS256"
# The routes under /v1/jobs/{id}/ a download link may open: the job's document (a PDF, or an
# image) and its thumbnail. A link names one: it opens no other file of the job. COMBINED is a
# batch's combined PDF, at /v1/batches/{id}/pdf.
DOCUMENT = "pdf"
THUMBNAIL = "thumbnail"
TOKEN_CLAIM = "pressroom"
TOKEN_SECRET_PREFIX = "prts_"
# How far ahead of this server's clock a backend's `iat` may be.
CLOCK_SKEW_S = 60


def new_token_secret() -> str:
    """A fresh token signing secret: 32 random bytes, as HS256 wants its keys."""
    return TOKEN_SECRET_PREFIX + secrets.token_urlsafe(32)


@dataclasses.dataclass(frozen=True, slots=True)
class Scope:
    """What a token opens: every stream of its tenant (neither field), one job's stream and
    long-poll (`job_id`), the streams of 1-20 channels and the jobs in them (`channels`), or,
    for the dashboard (`dashboard`), the tenant's API as its key would, and every stream."""

    job_id: str | None = None
    channels: frozenset[str] = frozenset()
    dashboard: bool = False

    @property
    def name(self) -> str:
        if self.dashboard:
            return DASHBOARD
        if self.job_id is not None:
            return "job"
        # One channel keeps the claim it had before tokens could name several.
        return "channels" if len(self.channels) > 1 else "channel" if self.channels else "tenant"

    def opens(self, *, job_id: str | uuid.UUID | None, channel: str | None) -> bool:
        """May the holder follow this: a job (`job_id`, with that job's `channel`), a
        channel's stream (`channel` alone) or the tenant's (neither)?"""
        if self.job_id is not None:
            return job_id is not None and str(job_id) == self.job_id
        if self.channels:
            return channel is not None and channel in self.channels
        return True

    def describe(self) -> str:
        if self.dashboard:
            return "the dashboard's API calls and every stream of the tenant"
        if self.job_id is not None:
            return f"the stream of job {self.job_id}"
        names = [repr(name) for name in sorted(self.channels)]
        if len(names) == 1:
            return f"channel {names[0]} (its stream and its jobs)"
        if names:
            rest = len(names) - DESCRIBED_CHANNELS
            if rest > 0:
                listed = ", ".join(names[:DESCRIBED_CHANNELS]) + f" and {rest} more"
            else:
                listed = ", ".join(names[:-1]) + f" and {names[-1]}"
            return f"channels {listed} (their streams and their jobs)"
        return "every stream of the tenant"

    def claim(self, key_id: int | None, since: int | None = None) -> dict[str, Any]:
        claim: dict[str, Any] = {"scope": self.name}
        if since is not None:
            claim["since"] = since
        if self.job_id is not None:
            claim["job_id"] = self.job_id
        if len(self.channels) == 1:
            [claim["channel"]] = self.channels
        elif self.channels:
            claim["channels"] = sorted(self.channels)
        if key_id is not None:
            claim["key"] = key_id
        return claim


DASHBOARD = "dashboard"
TENANT_SCOPE = Scope()
DASHBOARD_SCOPE = Scope(dashboard=True)
_CLAIM_KEYS = {
    "tenant": {"scope"},
    "job": {"scope", "job_id"},
    "channel": {"scope", "channel"},
    "channels": {"scope", "channels"},
    DASHBOARD: {"scope", "since"},
}


def _channels_of(names: Any) -> frozenset[str] | None:
    """The channels a `channels` claim names: 1-20 of them, each once, else None."""
    if not isinstance(names, list) or not 1 <= len(names) <= MAX_TOKEN_CHANNELS:
        return None
    if not all(is_channel(name) for name in names) or len(set(names)) != len(names):
        return None
    return frozenset(names)


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _scope_of(claim: Any) -> tuple[Scope, int | None] | None:
    """The scope and minting key of a `pressroom` claim, None when it is not one."""
    if not isinstance(claim, dict) or claim.get("scope") not in _CLAIM_KEYS:
        return None
    name = claim["scope"]
    key_id = claim.get("key")
    if set(claim) - {"key"} != _CLAIM_KEYS[name]:
        return None
    if key_id is not None and not _is_count(key_id):
        return None
    if name == DASHBOARD:
        # Minted by Pressroom (for an API key, or NO_KEY in dev mode), with when it was asked.
        if key_id is None or not _is_count(claim["since"]):
            return None
        return DASHBOARD_SCOPE, key_id
    if name == "job":
        try:
            return Scope(job_id=str(uuid.UUID(claim["job_id"]))), key_id
        except (TypeError, ValueError, AttributeError):
            return None
    if name == "channel":
        channel = claim["channel"]
        return (Scope(channels=frozenset([channel])), key_id) if is_channel(channel) else None
    if name == "channels":
        channels = _channels_of(claim["channels"])
        return None if channels is None else (Scope(channels=channels), key_id)
    return TENANT_SCOPE, key_id


COMBINED = "combined"


@dataclasses.dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a valid subscription token grants: its tenant's streams within its scope, until it
    expires (and, when minted for an API key, as long as that key is active)."""

    tenant: str
    scope: Scope
    expires_at: int
    key_id: int | None  # the API key it was minted for; None: minted by the tenant's backend
    #: A dashboard token's: when its API key was exchanged (unix s); renewals keep it.
    since: int | None = None


def make_token(
    secret: str,
    tenant: str,
    scope: Scope = TENANT_SCOPE,
    *,
    ttl_s: int,
    key_id: int | None = None,
    since: int | None = None,
) -> tuple[str, int]:
    """A signed token, and its expiry (unix s); `since` for a dashboard token."""
    issued_at = int(time.time())
    expires_at = issued_at + ttl_s
    claims = {
        "sub": tenant,
        "iat": issued_at,
        "exp": expires_at,
        TOKEN_CLAIM: scope.claim(key_id, since),
    }
    return jwt.encode(claims, secret, algorithm=TOKEN_ALGORITHM), expires_at


@dataclasses.dataclass(frozen=True, slots=True)
class Signer:
    """Who a token says signed it, unverified: the tenant it names (`sub`), and the `alg` and
    `kid` of its header. They choose the one key that checks it."""

    tenant: str
    algorithm: str
    kid: str | None
    #: Whether it says it is a dashboard token (checked with the dashboard key, see above).
    dashboard: bool = False


def dashboard_secret(server_secret: str, token_secret: str) -> str:
    """The key that signs a tenant's dashboard tokens: PRESSROOM_SECRET's HMAC of its token
    secret, so that a rotated secret ends them too and the secret alone cannot make one."""
    mac = hmac.new(
        server_secret.encode(), b"pressroom.dashboard." + token_secret.encode(), "sha256"
    )
    return mac.hexdigest()


def token_signer(token: str) -> Signer | None:
    """Who a token says signed it, unverified; None when it is not a token at all."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return None
    tenant = claims.get("sub") if isinstance(claims, dict) else None
    algorithm, kid = header.get("alg"), header.get("kid")
    if not isinstance(tenant, str) or not isinstance(algorithm, str):
        return None
    if kid is not None and not isinstance(kid, str):
        return None
    claim = claims.get(TOKEN_CLAIM)
    dashboard = isinstance(claim, dict) and claim.get("scope") == DASHBOARD
    return Signer(tenant, algorithm, kid, dashboard)


def check_token(
    key: str | Verifier, token: str, *, algorithm: str = TOKEN_ALGORITHM
) -> TokenClaims | None:
    """The claims of a token signed with `key` by `algorithm` (a tenant's secret and HS256, or
    a token key and its algorithm), unexpired and well formed, else None."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    try:
        claims = jwt.decode(
            token,
            key,
            # One algorithm per key: a token that names another (none, or HS256 keyed with a
            # public key's PEM) is refused by PyJWT before any signature is computed.
            algorithms=[algorithm],
            # iat is checked below, with room for the clock of the backend that minted it.
            options={"require": ["exp", "iat", "sub", TOKEN_CLAIM], "verify_iat": False},
            leeway=0,
        )
    except jwt.PyJWTError:  # InvalidKeyError too: a key that is not one for its algorithm
        return None
    tenant, issued_at, expires_at = claims["sub"], claims["iat"], claims["exp"]
    if not isinstance(tenant, str) or not all(
        isinstance(value, int) and not isinstance(value, bool) for value in (issued_at, expires_at)
    ):
        return None
    if issued_at > time.time() + CLOCK_SKEW_S:
        return None
    scoped = _scope_of(claims[TOKEN_CLAIM])
    if scoped is None:
        return None
    scope, key_id = scoped
    since = claims[TOKEN_CLAIM].get("since") if scope.dashboard else None
    return TokenClaims(tenant, scope, expires_at, key_id, since)


def secret_digest(secret: str) -> str:
    """A short fingerprint of a secret: what a stream remembers of the one its token needs."""
    return hashlib.blake2b(secret.encode(), digest_size=12).hexdigest()


def token_response(token: str, expires_at: int) -> dict[str, Any]:
    """The body of POST /v1/tokens."""
    return {"token": token, "expires_at": expiry_text(expires_at)}


def expiry_text(expires_at: int) -> str:
    """A token's expiry (unix s) as the API shows times."""
    return dt.datetime.fromtimestamp(expires_at, dt.UTC).isoformat()


@functools.lru_cache(maxsize=8)
def _link_signer(secret: str) -> itsdangerous.Signer:
    # The salt gives links a key of their own, so no link signature is ever valid elsewhere.
    return itsdangerous.Signer(secret, salt="pressroom.download", digest_method=hashlib.sha256)


def _link_message(job_id: str, expires: int, key_id: int, route: str) -> bytes:
    # The document's links sign what they signed before there were other files.
    file = "" if route == DOCUMENT else f"/{route}"
    return f"{job_id}{file}.{expires}.{key_id}".encode()


def download_path(subject_id: str, route: str) -> str:
    """The route a download link for one file opens (without its query)."""
    if route == COMBINED:
        return f"/v1/batches/{subject_id}/pdf"
    return f"/v1/jobs/{subject_id}/{route}"


def sign_download(
    secret: str, job_id: str, expires: int, key_id: int, *, route: str = DOCUMENT
) -> str:
    """The signature that lets anyone holding the URL download one file of one job (`route`:
    its document or its thumbnail) until `expires`, as long as key `key_id`, which it was
    minted for, is not revoked."""
    message = _link_message(job_id, expires, key_id, route)
    return _link_signer(secret).get_signature(message).decode()


def check_download(
    secret: str, job_id: str, expires: str, key: str, signature: str, *, route: str = DOCUMENT
) -> int | None:
    """The id of the key a link to `route` was minted for when its signature matches and it
    has not expired (NO_KEY: none), else None. Whether that key is still active is for the
    caller."""
    try:
        expires_at, key_id = int(expires), int(key)
    except ValueError:
        return None
    if expires_at < time.time() or key_id < 0:
        return None
    message = _link_message(job_id, expires_at, key_id, route)
    if not _link_signer(secret).verify_signature(message, signature):
        return None
    return key_id
