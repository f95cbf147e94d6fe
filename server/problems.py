"""RFC 9457 problem+json: every error the API returns is built here."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.compression_utils import HAS_BROTLI, HAS_ZSTD
from aiohttp.http_exceptions import ContentEncodingError
from aiohttp.web_protocol import RequestPayloadError
from pydantic import BaseModel, ValidationError

from server.errors import DB_ERRORS
from server.fields import field_errors
from server.keys import SETTINGS

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://pressroom.dev/problems/"
DB_UNAVAILABLE_RETRY_S = 2
#: The content codings a request body may come in: what aiohttp decodes (br and zstd only
#: with their optional packages installed).
CONTENT_CODINGS = (
    "gzip",
    "deflate",
    *(("br",) if HAS_BROTLI else ()),
    *(("zstd",) if HAS_ZSTD else ()),
)
_SHOWN_CODING_CHARS = 40

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Problem(Exception):
    """Raised anywhere in a handler; the middleware answers with it."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str | None = None,
        *,
        kind: str | None = None,
        errors: list[dict[str, str]] | None = None,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(detail or title)
        self.status = status
        self.title = title
        self.detail = detail
        self.kind = kind or title.lower().replace(" ", "-")
        self.errors = errors
        self.headers = headers or {}
        self.extra = extra or {}

    def response(self, instance: str | None = None) -> web.Response:
        body: dict[str, Any] = {
            "type": TYPE_BASE + self.kind,
            "title": self.title,
            "status": self.status,
        }
        if self.detail:
            body["detail"] = self.detail
        if instance:
            body["instance"] = instance
        if self.errors:
            body["errors"] = self.errors
        body.update(self.extra)
        return web.Response(
            status=self.status,
            text=json.dumps(body),
            content_type=CONTENT_TYPE,
            headers=self.headers,
        )


def invalid(
    errors: list[tuple[str, str]], detail: str = "The request body is not valid."
) -> Problem:
    """422 with field-level errors."""
    return Problem(
        422,
        "Validation failed",
        detail,
        kind="validation",
        errors=[{"field": field, "message": message} for field, message in errors],
    )


def invalid_input(
    exc: ValidationError,
    detail: str = "The request body is not valid.",
    *,
    model: type[BaseModel] | None = None,
) -> Problem:
    """422 naming every field pydantic refused (an unknown one with the `model`'s field it may
    have meant)."""
    return invalid(field_errors(exc, model=model), detail)


# --- bodies the server cannot take -----------------------------------------------------------


def size_text(count: int) -> str:
    """A size in bytes, as a setting gives it, then as a person reads it: `2097152 bytes (2
    MiB)`."""
    human = human_size(count)
    return f"{count} bytes" if human.endswith(" bytes") else f"{count} bytes ({human})"


def human_size(count: int) -> str:
    """`2 MiB`, `1.5 KiB`, `900 bytes`."""
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count} bytes"


def too_large(
    what: str, limit: int, setting: str, instead: str, *, title: str, kind: str
) -> Problem:
    """413 naming the limit, the setting that sets it, and what to send instead; the limit and
    the setting are members of their own too (`limit_bytes`, `setting`)."""
    return Problem(
        413,
        title,
        f"{what} is over {size_text(limit)}, the limit {setting} sets. {instead}",
        kind=kind,
        extra={"limit_bytes": limit, "setting": setting},
    )


def body_too_large(max_body_bytes: int, max_asset_bytes: int, max_upload_bytes: int) -> Problem:
    """A JSON body over PRESSROOM_MAX_BODY_BYTES: files belong in assets or a multipart job."""
    return too_large(
        "The JSON body",
        max_body_bytes,
        "PRESSROOM_MAX_BODY_BYTES",
        f"Upload large files once as assets (POST /v1/assets, up to {human_size(max_asset_bytes)}"
        " each) and name them in `assets`, or send a job as multipart/form-data with its files "
        f"as parts (up to {human_size(max_upload_bytes)} in all).",
        title="Body too large",
        kind="body-too-large",
    )


def undecodable(coding: str | None = None) -> Problem:
    """400 for a body that is not in a Content-Encoding this server reads (`coding`, when it
    is known), or does not decode as its Content-Encoding says."""
    readable = " or ".join(CONTENT_CODINGS)
    if coding is None:
        what = "The body cannot be decoded as its Content-Encoding says"
    elif coding.lower() in CONTENT_CODINGS:
        what = f"The body is not valid {coding.lower()} data, as its Content-Encoding says it is"
    elif coding.isascii() and coding.isprintable() and len(coding) <= _SHOWN_CODING_CHARS:
        what = f"The Content-Encoding {coding!r} is not one this server decodes"
    else:
        what = "The Content-Encoding is not one this server decodes"
    return Problem(
        400,
        "Unreadable Content-Encoding",
        f"{what}: send the body compressed with {readable}, or send it without Content-Encoding.",
        kind="content-encoding",
        headers={"Accept-Encoding": ", ".join(CONTENT_CODINGS)},
    )


def _unreadable_body(request: web.Request, exc: RequestPayloadError) -> Problem:
    if isinstance(exc.__cause__, ContentEncodingError):
        return undecodable(request.headers.get("Content-Encoding"))
    # What else the parser stops a body for: it ended before its Content-Length (the client
    # went away, or the length was wrong), or its chunked framing broke.
    return Problem(
        400,
        "Bad request",
        "The body could not be read: it ended before its Content-Length, or its chunked "
        "framing is not valid.",
        kind="malformed-request",
    )


def not_found(what: str = "job") -> Problem:
    return Problem(404, "Not found", f"No such {what}.", kind="not-found")


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into problem+json; never a stack trace, never a 500 for bad input."""
    try:
        return await handler(request)
    except Problem as problem:
        return problem.response(request.path)
    except RequestPayloadError as exc:  # the connection closes after it (server.web.protocol)
        return _unreadable_body(request, exc).response(request.path)
    except web.HTTPRequestEntityTooLarge:  # aiohttp's client_max_size, should a reader use it
        settings = request.app[SETTINGS]
        return body_too_large(
            request.client_max_size, settings.max_asset_bytes, settings.max_upload_bytes
        ).response(request.path)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after")}
        return Problem(
            exc.status, exc.reason, kind=exc.reason.lower().replace(" ", "-"), headers=headers
        ).response(request.path)
    except DB_ERRORS as exc:
        log.warning("database unavailable during %s %s: %s", request.method, request.path, exc)
        return Problem(
            503,
            "Service unavailable",
            "The database is not reachable right now; try again shortly.",
            kind="unavailable",
            headers={"Retry-After": str(DB_UNAVAILABLE_RETRY_S)},
        ).response(request.path)
    except Exception:
        log.exception("unhandled error in %s %s", request.method, request.path)
        return Problem(
            500, "Internal error", "The server failed; the error was logged.", kind="internal"
        ).response(request.path)
