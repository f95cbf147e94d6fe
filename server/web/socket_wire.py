"""What a Socket.IO client and Pressroom say to each other: the credentials a connection
proves (a Grant), subscription targets, acknowledgements and errors (problem+json bodies),
and the websocket frames live events are written in."""

from __future__ import annotations

import dataclasses
import logging
import struct
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import socketio
from aiohttp import web
from pydantic import ValidationError

from server.access import signing
from server.keys import AUTH
from server.problems import TYPE_BASE, Problem, invalid_input
from server.schemas.streams import SubscribeRequest
from server.web import auth
from server.web.credentials import DEV_CREDENTIAL, Credential, Verified

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """Whom a connection acts for: a tenant, what of it (a token's scope), and what that
    rests on (the key it proved or its token was minted for, the token's secret)."""

    tenant: str
    scope: signing.Scope = signing.TENANT_SCOPE
    credential: Credential = DEV_CREDENTIAL

    @property
    def key_id(self) -> int:
        """The key id the download links it is shown are signed for."""
        return self.credential.minted_by


async def authenticate(environ: Mapping[str, Any], credentials: Any) -> Grant | None:
    """Whom a connecting client acts for, or None to refuse it. Credentials come in the
    Socket.IO `auth` payload ({"token": …} or {"api_key": …}) or as a Bearer header; the
    rules are those of the REST routes (server/web/auth.py)."""
    if credentials is None:
        credentials = {}
    if not isinstance(credentials, dict):
        return None
    request: web.Request = environ["aiohttp.request"]
    authenticator = request.app[AUTH]
    keyed = await authenticator.keys_required()
    token, key = credentials.get("token"), credentials.get("api_key")
    if key is None:
        scheme, _, bearer = request.headers.get("Authorization", "").strip().partition(" ")
        key = bearer.strip() if scheme.lower() == "bearer" and bearer.strip() else None
    if isinstance(token, str):
        verified = await authenticator.verify_token(token)
        if isinstance(verified, Verified):
            claims = verified.claims
            return Grant(claims.tenant, claims.scope, verified.credential)
    if isinstance(key, str):
        known = await authenticator.lookup(key)
        if known is not None:
            return Grant(known.tenant, credential=Credential(known.id))
    if not keyed and await authenticator.open_now():
        return Grant(auth.DEV_TENANT)  # open dev mode, as on the REST routes
    return None


def websocket_frame(message: bytes) -> bytes:
    """A server's websocket text frame (RFC 6455: servers do not mask) holding `message`:
    valid whether or not the connection compresses (an uncompressed frame has RSV1 clear)."""
    length = len(message)
    if length < 126:
        header = struct.pack("!BB", 0x81, length)
    elif length < 65536:
        header = struct.pack("!BBH", 0x81, 126, length)
    else:
        header = struct.pack("!BBQ", 0x81, 127, length)
    return header + message


def error_ack(problem: Problem) -> dict[str, Any]:
    """A problem+json body as a Socket.IO acknowledgement."""
    body: dict[str, Any] = {
        "type": TYPE_BASE + problem.kind,
        "title": problem.title,
        "status": problem.status,
    }
    if problem.detail:
        body["detail"] = problem.detail
    if problem.errors:
        body["errors"] = problem.errors
    return {"ok": False, "error": body}


def parse_target(data: Any) -> SubscribeRequest:
    """A subscribe payload; unsubscribe takes the same object (and needs only the target)."""
    try:
        return SubscribeRequest.model_validate(data)
    except ValidationError as exc:
        raise invalid_input(exc, "The subscription is not valid.", model=SubscribeRequest) from None


def stream_key(target: SubscribeRequest) -> str:
    """What names a client's subscription: one per job, per channel, and the all-jobs one."""
    if target.job_id is not None:
        return str(target.job_id)
    return "all" if target.channel is None else f"channel:{target.channel}"


Handler = Callable[..., Awaitable[Any]]

INTERNAL_ERROR = Problem(
    500, "Internal error", "The server failed; the error was logged.", kind="internal"
)


def answering_on_error(name: str, handler: Handler) -> Handler:
    """`handler`, acknowledging whatever it fails with: python-socketio sends no ack when a
    handler raises, so the client's call would wait for its own timeout."""

    async def answer(sid: str, *args: Any) -> Any:
        try:
            return await handler(sid, *args)
        except Exception:
            log.exception("Socket.IO %s failed", name, extra={"sid": sid})
            return error_ack(INTERNAL_ERROR)

    return answer


def refusing_on_error(handler: Handler) -> Handler:
    """The connect handler, refusing with a reason when it fails: python-socketio answers
    nothing then, and the client waits out its connect timeout."""

    async def connect(sid: str, *args: Any) -> Any:
        try:
            return await handler(sid, *args)
        except socketio.exceptions.ConnectionRefusedError:
            raise
        except Exception:
            log.exception("Socket.IO connect failed", extra={"sid": sid})
            raise socketio.exceptions.ConnectionRefusedError(
                "internal error", {"status": 500, "detail": INTERNAL_ERROR.detail}
            ) from None

    return connect


async def unknown_event(_event: str, _sid: str, *_args: Any) -> dict[str, Any]:
    """Any event without a handler: a call for it still gets an answer."""
    detail = "The events a client may send are subscribe, unsubscribe and refresh."
    return error_ack(Problem(404, "Unknown event", detail, kind="unknown-event"))
