"""Subscription tokens and download links, signed with PRESSROOM_SECRET (settings.secret).

Tokens are JWTs (HS256, PyJWT): `{"tenant", "job"?, "kid", "exp"}`, where `job` limits one to
that job's stream and `kid` is the id of the API key that minted it. Download links carry
`expires`, `key` (the minting key's id) and `sig` in their query; `sig` is an HMAC-SHA256
made by itsdangerous, so that a link stays about as short as its path. Whether the key that
minted a credential is still active is server/auth.py's to say.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import hashlib
import time
import uuid
from typing import Any

import itsdangerous
import jwt

# The key id that credentials minted without an API key carry (open dev mode; the download
# links of webhook deliveries). Key ids start at 1.
NO_KEY = 0
# Longer than any token this module makes; refused before any decoding.
MAX_TOKEN_CHARS = 2048
TOKEN_ALGORITHM = "HS256"
# The routes under /v1/jobs/{id}/ a download link may open: the job's document (a PDF, or an
# image) and its thumbnail. A link names one: it opens no other file of the job. COMBINED is a
# batch's combined PDF, at /v1/batches/{id}/pdf.
DOCUMENT = "pdf"
THUMBNAIL = "thumbnail"
COMBINED = "combined"


@dataclasses.dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a subscription token grants: one tenant's streams, or one job's stream only, for
    as long as the key that minted it is active."""

    tenant: str
    job_id: str | None
    expires_at: int
    key_id: int

    def allows(self, job_id: str | uuid.UUID | None) -> bool:
        """May the holder subscribe to this job's stream (None: the tenant's all-jobs stream)?"""
        if self.job_id is None:
            return True
        return job_id is not None and str(job_id) == self.job_id


def make_token(
    secret: str, tenant: str, *, job_id: str | uuid.UUID | None, key_id: int, ttl_s: int
) -> tuple[str, int]:
    """A signed subscription token naming the key that mints it, and its expiry (unix s)."""
    expires_at = int(time.time()) + ttl_s
    claims: dict[str, Any] = {"tenant": tenant, "kid": key_id, "exp": expires_at}
    if job_id is not None:
        claims["job"] = str(job_id)
    return jwt.encode(claims, secret, algorithm=TOKEN_ALGORITHM), expires_at


def check_token(secret: str, token: str) -> TokenClaims | None:
    """The claims of a token this server signed and that has not expired, else None."""
    if len(token) > MAX_TOKEN_CHARS:
        return None
    try:
        claims = jwt.decode(
            token,
            secret,
            algorithms=[TOKEN_ALGORITHM],
            options={"require": ["exp", "tenant", "kid"]},
            leeway=0,
        )
    except jwt.InvalidTokenError:
        return None
    tenant, job_id, key_id, expires_at = (claims.get(k) for k in ("tenant", "job", "kid", "exp"))
    if not isinstance(tenant, str) or not isinstance(expires_at, int):
        return None
    if job_id is not None and not isinstance(job_id, str):
        return None
    if isinstance(key_id, bool) or not isinstance(key_id, int) or key_id < 0:
        return None
    return TokenClaims(tenant=tenant, job_id=job_id, expires_at=expires_at, key_id=key_id)


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
