"""What a request or a stream proved, and what ends a stream: the credential it rests on (an API
key, a token and what checked it), the Watch a stream holds on it, and the reasons it is closed
with. server/web/auth.py decides them and fires the watches."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from collections.abc import Callable

from server.access.signing import NO_KEY, TokenClaims
from server.events.hub import Reason

log = logging.getLogger(__name__)

REVOKED_REASON = Reason(
    "the API key this stream was opened with (or its token's) has been revoked", "revoked"
)
KEYED_REASON = Reason(
    "API keys are required now; reconnect with a key or a subscription token", "revoked"
)
ROTATED_REASON = Reason(
    "the token signing secret of this stream's token has been rotated", "revoked"
)
TENANT_CLOSED_REASON = Reason("this stream's tenant has no active API key any more", "revoked")
KEY_REMOVED_REASON = Reason(
    "the token key this stream's token was signed with has been removed", "revoked"
)
EXPIRED_REASON = Reason(
    "the subscription token this stream was opened with has expired; reconnect with a new "
    "one from the last event id",
    "token_expired",
)


@dataclasses.dataclass(frozen=True, slots=True)
class TokenKeyHold:
    """The token key a stream's token was checked with: its tenant, kid and thumbprint (a key
    added again under the same kid is another key)."""

    tenant: str
    kid: str
    thumbprint: str


#: What ends a stream: an API key's id (NO_KEY: the open dev mode), a tenant and the digest of
#: the token secret its token was checked with, or the token key its token was checked with.
Hold = int | tuple[str, str] | TokenKeyHold


@dataclasses.dataclass(frozen=True, slots=True)
class Credential:
    """What a request or connection proved: the id of its API key (its own, or the one its
    token was minted for; NO_KEY in dev mode; None for a token the tenant's backend minted),
    and for a token, what it was checked with: its tenant and the secret's digest, or a token
    key."""

    key_id: int | None
    signer: tuple[str, str] | TokenKeyHold | None = None
    #: When a token's right ends (unix s): its streams close then. None for API keys.
    expires_at: int | None = None

    @property
    def holds(self) -> tuple[Hold, ...]:
        key: tuple[Hold, ...] = () if self.key_id is None else (self.key_id,)
        return key + (() if self.signer is None else (self.signer,))

    @property
    def minted_by(self) -> int:
        """The key id download links shown on this credential's streams are signed for."""
        return NO_KEY if self.key_id is None else self.key_id


DEV_CREDENTIAL = Credential(NO_KEY)


@dataclasses.dataclass(frozen=True, slots=True)
class Verified:
    """A valid subscription token: what it grants and what it rests on."""

    claims: TokenClaims
    credential: Credential


class Watch:
    """A stream's hold on what it was opened with (its key, the key its token was minted for,
    the secret its token was signed with): `on_revoked` runs once, with a reason, when the
    authenticator finds one of them revoked or rotated."""

    __slots__ = ("_expiry", "_on_close", "_on_revoked", "holds", "reason")

    def __init__(
        self,
        on_close: Callable[[Watch], None],
        holds: tuple[Hold, ...],
        on_revoked: Callable[[str], None],
        expires_at: int | None = None,
    ) -> None:
        self._on_close = on_close
        self._on_revoked = on_revoked
        self.holds = holds
        self.reason: str | None = None  # why it was revoked, once it was
        # A token's stream ends when the token does: no stream outlives its right.
        self._expiry: asyncio.TimerHandle | None = None
        if expires_at is not None:
            loop = asyncio.get_running_loop()
            delay_s = max(0.0, expires_at - time.time())
            self._expiry = loop.call_later(delay_s, self.fire, EXPIRED_REASON)

    def fire(self, reason: str) -> None:
        if self.reason is not None:
            return
        self.reason = reason
        try:
            self._on_revoked(reason)
        except Exception:
            log.exception("closing a stream of a revoked key failed")

    @property
    def revoked(self) -> bool:
        return self.reason is not None

    def close(self) -> None:
        """The stream ended: stop watching (idempotent)."""
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self._on_close(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def tenant_of(hold: tuple[str, str] | TokenKeyHold) -> str:
    return hold.tenant if isinstance(hold, TokenKeyHold) else hold[0]
