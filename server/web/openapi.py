"""The OpenAPI 3.1 description of the HTTP API, served at /v1/openapi.json: the operations
are a table (server/web/openapi_operations.py), every body and query schema comes from the
models of server/schemas/."""

from __future__ import annotations

import functools
from typing import Any

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from server.access.signing import NO_KEY
from server.keys import AUTH
from server.options import RenderOptions
from server.schemas.common import Problem
from server.schemas.streams import EXTRA_SCHEMAS
from server.web import openapi_push
from server.web.openapi_operations import (
    COMMON_ERRORS,
    HEADERS,
    KEY,
    LINKS,
    OPERATIONS,
    PATH_PARAMETERS,
    PROBLEM,
    SECURITY_SCHEMES,
    TAGS,
    Body,
    Op,
    Part,
)
from server.web.openapi_push import REF, Stream, stream_schema

JsonSchema = dict[str, Any]


@functools.cache
def schemas() -> dict[str, JsonSchema]:
    """components.schemas: every model the table names, with the models they use."""
    named: set[type[BaseModel]] = {RenderOptions, Problem, *EXTRA_SCHEMAS, *openapi_push.MODELS}
    for op in OPERATIONS:
        named.update(x for x in (op.body, op.query) if x is not None)
        for _, body in op.ok.values():
            for part in body if isinstance(body, tuple) else (body,):
                named.update((part,) if isinstance(part, type) else ())
                named.update((part.reset,) if isinstance(part, Stream) else ())
    _, document = models_json_schema(
        [(model, "validation") for model in sorted(named, key=lambda model: model.__name__)],
        ref_template=REF,
    )
    found: dict[str, JsonSchema] = document["$defs"]
    return found


def _ref(model: type[BaseModel]) -> JsonSchema:
    return {"$ref": REF.format(model=model.__name__)}


def _content(media: str, schema: JsonSchema) -> JsonSchema:
    return {media: {"schema": schema}}


def _part(part: Part, alone: bool) -> tuple[str, JsonSchema]:
    """A response body's media type and schema; a media type `alone` is of its kind (JSON, text),
    one of several is any bytes of it."""
    if isinstance(part, Stream):
        return "text/event-stream", stream_schema(part)
    if isinstance(part, type):
        return "application/json", _ref(part)
    if not alone:
        return part, {}
    return part, {"type": "object"} if part == "application/json" else {"type": "string"}


def _response(description: str, body: Body, headers: tuple[str, ...]) -> JsonSchema:
    response: JsonSchema = {"description": description or "OK."}
    if body is not None:
        parts = body if isinstance(body, tuple) else (body,)
        media = [_part(part, alone=len(parts) == 1) for part in parts]
        response["content"] = {kind: {"schema": schema} for kind, schema in media}
    if headers:
        response["headers"] = {name: {"$ref": f"#/components/headers/{name}"} for name in headers}
    return response


def _problem(description: str, headers: tuple[str, ...] = ()) -> JsonSchema:
    return {
        **_response(description, None, headers),
        "content": _content(PROBLEM, _ref(Problem)),
    }


def _parameters(op: Op) -> list[JsonSchema]:
    found = [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": schema,
            "description": description,
        }
        for name, (schema, description) in PATH_PARAMETERS.items()
        if f"{{{name}}}" in op.path
    ]
    if op.query is not None:
        query = schemas()[op.query.__name__]
        for name, shown in query["properties"].items():
            prop = dict(shown)  # the cached schema stays as it is
            branches = [s for s in prop.get("anyOf", ()) if s != {"type": "null"}]
            if len(branches) == 1:  # a parameter left out is None; it cannot be null
                del prop["anyOf"]
                prop.pop("default", None)
                prop = {**branches[0], **prop}
            described = {"description": prop.pop("description")} if "description" in prop else {}
            found.append(
                {
                    "name": name,
                    "in": "query",
                    "required": name in query.get("required", ()),
                    "schema": prop,
                    **described,
                }
            )
    return [*found, *op.parameters]


def operation_id(op: Op) -> str:
    words = [w.strip("{}") for w in op.path.removeprefix("/v1").split("/") if w]
    name = op.method + "".join(w.replace("_", " ").title().replace(" ", "") for w in words)
    return name.replace(".", "")


def _security(schemes: tuple[str, ...], dev_mode: bool) -> list[JsonSchema]:
    """Security requirements, any one of which will do; in dev mode, no credentials (`{}`)."""
    return [{name: []} for name in schemes] + ([{}] if dev_mode and schemes else [])


def _operation(op: Op, dev_mode: bool) -> JsonSchema:
    if op.path.startswith("/v1/") and op.path != "/v1/openapi.json":
        errors = {**COMMON_ERRORS, **op.errors}
    else:
        errors = dict(op.errors)
    responses: JsonSchema = {
        status: _response(description, body, op.headers.get(status, ()))
        for status, (description, body) in op.ok.items()
    }
    for status, description in errors.items():
        headers = op.headers.get(status, ("Retry-After",) if status in ("429", "503") else ())
        if status == "401":
            headers = ("WWW-Authenticate",)
        responses.setdefault(status, _problem(description, headers))
    operation: JsonSchema = {
        "summary": op.summary,
        "tags": [op.tag],
        "operationId": operation_id(op),
        "responses": responses,
        "security": _security(op.security, dev_mode),
    }
    if parameters := _parameters(op):
        operation["parameters"] = parameters
    content = _content("application/json", _ref(op.body)) if op.body is not None else {}
    content.update(op.media)
    if content:
        operation["requestBody"] = {"required": op.body_required, "content": content}
    if (op.path, op.method) in LINKS:
        parameter, targets = LINKS[(op.path, op.method)]
        links = {
            target: {"operationId": target, "parameters": {parameter: "$response.body#/id"}}
            for target in targets
        }
        for status in op.ok:
            responses[status]["links"] = links
    return operation


def build(served: set[str] | None = None, *, dev_mode: bool = False) -> JsonSchema:
    """The whole document; with `served`, only those paths (a trimmed app serves fewer). In
    `dev_mode` (no API key exists, loopback only) every operation takes requests without
    credentials, as the server does then."""
    paths: dict[str, JsonSchema] = {}
    for op in OPERATIONS:
        if served is None or op.path in served:
            paths.setdefault(op.path, {})[op.method] = _operation(op, dev_mode)
    mode = (
        " This server runs in dev mode: no API key exists, so requests need no credentials "
        "(tenant default) until the first key is created."
        if dev_mode
        else ""
    )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Pressroom",
            "version": "1",
            "description": "HTML templates + JSON data in, PDFs out, every state change pushed "
            "(SSE, Socket.IO at /socket.io/, webhooks). Errors are RFC 9457 problem+json."
            + mode
            + "\n\n## Live updates\n\n"
            + openapi_push.LIVE_UPDATES,
        },
        "security": _security(KEY, dev_mode),
        "tags": TAGS,
        "paths": paths,
        "webhooks": openapi_push.webhooks_section(schemas()),
        "components": {
            "schemas": schemas(),
            "securitySchemes": SECURITY_SCHEMES,
            "headers": {name: {"schema": {"type": "string"}} for name in sorted(HEADERS)},
        },
    }


async def handler(request: web.Request) -> web.Response:
    """GET /v1/openapi.json: the routes this app serves (a worker-only or trimmed app has fewer),
    and whether it asks for credentials now (no key exists: dev mode)."""
    served = {route.resource.canonical for route in request.app.router.routes() if route.resource}
    dev_mode = await request.app[AUTH].key_active(NO_KEY)
    return web.json_response(build(served, dev_mode=dev_mode))
