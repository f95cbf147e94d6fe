"""RFC 9457 problem+json: every error the API returns is built here."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from server.errors import DB_ERRORS
from server.fields import field_errors

log = logging.getLogger(__name__)

CONTENT_TYPE = "application/problem+json"
TYPE_BASE = "https://pressroom.dev/problems/"
DB_UNAVAILABLE_RETRY_S = 2

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


def invalid_input(exc: ValidationError, detail: str = "The request body is not valid.") -> Problem:
    """422 naming every field pydantic refused."""
    return invalid(field_errors(exc), detail)


def not_found(what: str = "job") -> Problem:
    return Problem(404, "Not found", f"No such {what}.", kind="not-found")


@web.middleware
async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Turn every failure into problem+json; never a stack trace, never a 500 for bad input."""
    try:
        return await handler(request)
    except Problem as problem:
        return problem.response(request.path)
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
