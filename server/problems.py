"""RFC 9457 problem+json: every error the API returns is built here."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from pydantic import ValidationError

from server.errors import DB_ERRORS

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


Loc = tuple[int | str, ...]


def field_errors(exc: ValidationError, prefix: Loc = ()) -> list[tuple[str, str]]:
    """pydantic's errors as (field, message): fields written `items[3].options.scale` (the
    body itself is ""), unknown fields first at each level, then the rest in field order."""
    listed = [((*prefix, *error["loc"]), error) for error in exc.errors(include_url=False)]
    first: dict[Loc, int] = {}
    for index, (loc, _) in enumerate(listed):
        for depth in range(len(loc) + 1):
            first.setdefault(loc[:depth], index)

    def order(item: tuple[int, tuple[Loc, Any]]) -> list[tuple[int, int]]:
        index, (loc, error) = item
        extra = error["type"] == "extra_forbidden"
        steps = [(1, first[loc[: depth + 1]]) for depth in range(len(loc))]
        if extra and steps:
            steps[-1] = (0, index)
        return steps

    return [
        (_path(loc), _message(error, loc))
        for _, (loc, error) in sorted(enumerate(listed), key=order)
    ]


def _path(loc: Loc) -> str:
    path = ""
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _message(error: Any, loc: Loc) -> str:
    kind = error["type"]
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "the body must be a JSON object" if not loc else "must be an object"
    message: str = error["msg"]  # "Input should be a valid integer": the field is the input
    return message.removeprefix("Input ") if message.startswith("Input ") else message


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
