"""Subscription tokens and download links.

Tokens are standard JWTs (HS256, PyJWT), signed with the tenant's token secret (migration
0014; the open dev mode's tenant, which has none, uses PRESSROOM_SECRET), so that a tenant's
backend can mint them itself:

    {"sub": TENANT, "iat": …, "exp": …, "pressroom": {"scope": "tenant" | "job" | "channel",
     "job_id": …, "channel": …, "key": …}}

`scope` names what the token opens, with `job_id` for a job's, `channel` for a channel's;
`key`, only in the tokens Pressroom mints, is the id of the API key that asked for it, which
the token then needs to stay active. Download links carry `expires`, `key` (the minting key's
id) and `sig` in their query; `sig` is an HMAC-SHA256 made by itsdangerous with
PRESSROOM_SECRET, so that a link stays about as short as its path. Whether a key is still
active, and which secret is a tenant's now, is server/auth.py's to say.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import secrets
import time
import uuid
from typing import Any

import itsdangerous
import jwt

from server.channels import is_channel

# The key id that credentials minted without an API key carry (open dev mode; the download
# links of webhook deliveries). Key ids start at 1.
NO_KEY = 0
# Longer than any token a tenant needs; refused before any decoding.
MAX_TOKEN_CHARS = 2048
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
    long-poll (`job_id`), or one channel's stream and the jobs in it (`channel`)."""

    job_id: str | None = None
    channel: str | None = None

    @property
    def name(self) -> str:
        return "job" if self.job_id is not None else "channel" if self.channel else "tenant"

    def opens(self, *, job_id: str | uuid.UUID | None, channel: str | None) -> bool:
        """May the holder follow this: a job (`job_id`, with that job's `channel`), a
        channel's stream (`channel` alone) or the tenant's (neither)?"""
        if self.job_id is not None:
            return job_id is not None and str(job_id) == self.job_id
        if self.channel is not None:
            return channel == self.channel
        return True

    def describe(self) -> str:
        if self.job_id is not None:
            return f"the stream of job {self.job_id}"
        if self.channel is not None:
            return f"channel {self.channel!r} (its stream and its jobs)"
        return "every stream of the tenant"

    def claim(self, key_id: int | None) -> dict[str, Any]:
        claim: dict[str, Any] = {"scope": self.name}
        if self.job_id is not None:
            claim["job_id"] = self.job_id
        if self.channel is not None:
            claim["channel"] = self.channel
        if key_id is not None:
            claim["key"] = key_id
        return claim


TENANT_SCOPE = Scope()
_CLAIM_KEYS = {"tenant": {"scope"}, "job": {"scope", "job_id"}, "channel": {"scope", "channel"}}


def _scope_of(claim: Any) -> tuple[Scope, int | None] | None:
    """The scope and minting key of a `pressroom` claim, None when it is not one."""
    if not isinstance(claim, dict) or claim.get("scope") not in _CLAIM_KEYS:
        return None
    name = claim["scope"]
    key_id = claim.get("key")
    if set(claim) - {"key"} != _CLAIM_KEYS[name]:
        return None
    if key_id is not None and (isinstance(key_id, bool) or not isinstance(key_id, int)):
        return None
    if key_id is not None and key_id < 0:
        return None
    if name == "job":
        try:
            return Scope(job_id=str(uuid.UUID(claim["job_id"]))), key_id
        except (TypeError, ValueError, AttributeError):
            return None
    if name == "channel":
        return (Scope(channel=claim["channel"]), key_id) if is_channel(claim["channel"]) else None
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


def make_token(
    secret: str,
    tenant: str,
    scope: Scope = TENANT_SCOPE,
    *,
    ttl_s: int,
    key_id: int | None = None,
) -> tuple[str, int]:
    """A signed subscription token, and its expiry (unix s)."""
    issued_at = int(time.time())
    expires_at = issued_at + ttl_s
    claims = {
        "sub": tenant,
        "iat": issued_at,
        "exp": expires_at,
        TOKEN_CLAIM: scope.claim(key_id),
    }
    return jwt.encode(claims, secret, algorithm=TOKEN_ALGORITHM), expires_at


def token_tenant(token: str) -> str | None:
    """The tenant a token names (`sub`), unverified: whose secret checks it. None when it is
    not a token at all."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    try:
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.InvalidTokenError:
        return None
    tenant = claims.get("sub") if isinstance(claims, dict) else None
    return tenant if isinstance(tenant, str) else None


def check_token(secret: str, token: str) -> TokenClaims | None:
    """The claims of a token signed with `secret`, unexpired and well formed, else None."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[TOKEN_ALGORITHM],
            # iat is checked below, with room for the clock of the backend that minted it.
            options={"require": ["exp", "iat", "sub", TOKEN_CLAIM], "verify_iat": False},
            leeway=0,
        )
    except jwt.InvalidTokenError:
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
    return TokenClaims(tenant=tenant, scope=scope, expires_at=expires_at, key_id=key_id)


def secret_digest(secret: str) -> str:
    """A short fingerprint of a secret: what a stream remembers of the one its token needs."""
    return hashlib.blake2b(secret.encode(), digest_size=12).hexdigest()


def token_response(token: str, expires_at: int) -> dict[str, Any]:
    """The body of POST /v1/tokens."""
    return {
        "token": token,
        "expires_at": dt.datetime.fromtimestamp(expires_at, dt.UTC).isoformat(),
    }


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
