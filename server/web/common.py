"""What every HTTP handler shares: the tenant of a request, its body read within its limit, its
JSON body validated through the models, a JSON response, a job id from the path."""

from __future__ import annotations

import math
import re
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any, TypeVar

from aiohttp import hdrs, web
from pydantic import BaseModel, ValidationError

from server import jsontext
from server.files.library import Ref
from server.keys import POLICY, SETTINGS
from server.problems import (
    CONTENT_CODINGS,
    Problem,
    body_too_large,
    invalid_input,
    not_found,
    undecodable,
)
from server.schemas.common import Checks
from server.web import auth

M = TypeVar("M", bound=BaseModel)

READ_CHUNK_BYTES = 64 * 1024
#: Arrays and objects within each other a JSON body may nest: far more than any document's
#: data needs, and well within the levels orjson writes (jsontext.ORJSON_MAX_DEPTH), so every
#: copy of a job's data (its row, what shows it) keeps to the fast writer.
MAX_JSON_DEPTH = 128


def tenant_of(request: web.Request) -> str:
    """The tenant every query of this request is scoped to."""
    tenant: str = request.get(auth.TENANT, auth.DEV_TENANT)
    return tenant


async def read_json(request: web.Request) -> Any:
    if request.content_type not in ("application/json", "") and not request.content_type.endswith(
        "+json"
    ):
        raise Problem(415, "Unsupported media type", "Send the body as application/json.")
    settings = request.app[SETTINGS]
    limit = settings.max_body_bytes
    refuse = body_too_large(limit, settings.max_asset_bytes, settings.max_upload_bytes)
    return parse_json(await read_body(request, limit, refuse))


async def read_body(request: web.Request, limit: int, refuse: Problem) -> bytes:
    """The body read whole, decoded; `refuse` (a 413) as soon as it passes `limit` bytes."""
    check_encoding(request)
    if request.content_length is not None and request.content_length > limit:
        raise refuse
    return await read_limited(request.content.iter_chunked(READ_CHUNK_BYTES), limit, refuse)


def check_encoding(request: web.Request) -> None:
    """400 for a Content-Encoding aiohttp would pass on undecoded (it decodes only the
    CONTENT_CODINGS, one at a time), before the body is read as if it had none."""
    given = ", ".join(request.headers.getall(hdrs.CONTENT_ENCODING, ())).strip()
    if given and given.lower() != "identity" and given.lower() not in CONTENT_CODINGS:
        raise undecodable(given)


async def read_limited(chunks: AsyncIterator[bytes], limit: int, refuse: Problem) -> bytes:
    """A body or part read whole, refused as soon as it passes `limit` bytes."""
    kept: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise refuse
        kept.append(chunk)
    return b"".join(kept)


def parse_json(raw: bytes) -> Any:
    """A JSON body (or a multipart job's JSON part); 400 problem+json when it is not JSON."""
    try:
        body = jsontext.loads(
            raw.decode("utf-8"),
            max_depth=MAX_JSON_DEPTH,
            parse_constant=_no_constant,
            parse_float=_finite,
        )
        # NUL and lone surrogates can only arrive as \u escapes: most bodies have none.
        if _SUSPECT_ESCAPE.search(raw):
            _check_text(body)
        return body
    except UnicodeDecodeError:
        raise Problem(
            400, "Malformed body", "The body is not valid UTF-8.", kind="malformed-body"
        ) from None
    except jsontext.TooDeep:
        raise Problem(
            400,
            "Malformed body",
            f"The JSON is nested too deeply: arrays and objects may be nested at most "
            f"{MAX_JSON_DEPTH} levels deep. Send flatter data.",
            kind="malformed-body",
        ) from None
    except ValueError as exc:
        raise Problem(
            400, "Malformed body", f"The body is not valid JSON: {exc}", kind="malformed-body"
        ) from None


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


# \u0000 or \uD800-\uDFFF (an escaped backslash before "u" also matches: then the walk decides).
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def _check_text(body: Any) -> None:
    """PostgreSQL stores neither NUL characters nor unpaired surrogates (valid JSON escapes)."""
    pending = [body]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str) and ("\x00" in value or not _encodable(value)):
            raise Problem(
                400,
                "Malformed body",
                "Strings must not contain NUL (\\u0000) or unpaired surrogate characters.",
                kind="malformed-body",
            )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_response(body: Any, **kwargs: Any) -> web.Response:
    return web.json_response(body, dumps=jsontext.dumps, **kwargs)


async def optional_body(request: web.Request) -> Any:
    """The JSON body, or {} when there is none."""
    return await read_json(request) if request.can_read_body else {}


def checks(
    request: web.Request,
    stored: Mapping[Ref, Any] | None = None,
    assets: Mapping[str, Any] | None = None,
) -> Checks:
    """What the models' validators read from this app (and the stored templates and assets
    the body names)."""
    return Checks(request.app[SETTINGS], request.app[POLICY], stored or {}, assets or {})


def validated(model: type[M], body: Any, checks: Checks, detail: str | None = None) -> M:
    """`body` as `model`, or a 422 naming every field it refuses."""
    try:
        return model.model_validate(body, context=checks.context())
    except ValidationError as exc:
        raise invalid_input(exc, *(detail,) if detail else (), model=model) from None


def query_of(request: web.Request, model: type[M]) -> M:
    """The query parameters (the first of each name) as `model`."""
    query = request.query
    params = {name: query[name] for name in query}
    return validated(model, params, checks(request), "The query parameters are not valid.")


def parse_job_id(request: web.Request) -> uuid.UUID:
    try:
        return uuid.UUID(request.match_info["job_id"])
    except ValueError:
        raise not_found() from None
