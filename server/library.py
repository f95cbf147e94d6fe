"""Stored templates: named, immutable versions that jobs name as `template_id` (`name` for the
latest, `name@version` for one), and a preview that renders one to PDF synchronously."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import re
from collections.abc import Iterable
from typing import Any

import asyncpg
from aiohttp import web

from server import jsontext, options, templates
from server.errors import PermanentError, RenderError
from server.http_common import json_response, read_json, tenant_of
from server.keys import POOL, RENDERER, SETTINGS
from server.problems import Problem, invalid, not_found
from server.sql import query

_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"  # as the templates_name_format CHECK
NAME = re.compile(_NAME)
TEMPLATE_ID = re.compile(rf"(?P<name>{_NAME})(?:@(?P<version>[1-9]\d{{0,8}}))?")
TEMPLATE_FIELDS = {"name", "html", "options", "sample_data"}
PREVIEW_FIELDS = {"data", "options", "version"}
INLINE_PREVIEW_FIELDS = {"html", "data", "options"}
MAX_LIST_LIMIT = 200
PREVIEW_RETRY_S = 2

# Previews share the browser with the render slots; this bounds how many run at once.
PREVIEWS = web.AppKey("template_previews", asyncio.Semaphore)

routes = web.RouteTableDef()

Ref = tuple[str, int | None]


@dataclasses.dataclass(frozen=True, slots=True)
class StoredTemplate:
    name: str
    version: int
    html: str
    options: dict[str, Any]
    sample_data: dict[str, Any]
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> StoredTemplate:
        return cls(
            name=row["name"],
            version=row["version"],
            html=row["html"],
            options=row["options"],
            sample_data=row["sample_data"],
            created_at=row["created_at"],
        )

    def public(self) -> dict[str, Any]:
        """The version as the API shows it."""
        return {
            "name": self.name,
            "version": self.version,
            "template_id": f"{self.name}@{self.version}",
            "html": self.html,
            "options": self.options,
            "sample_data": self.sample_data,
            "created_at": self.created_at.isoformat(),
            "links": {
                "self": f"/v1/templates/{self.name}@{self.version}",
                "latest": f"/v1/templates/{self.name}",
                "preview": f"/v1/templates/{self.name}/preview",
            },
        }


def parse_template_id(raw: Any) -> Ref | None:
    """(name, version or None for the latest) from `name` or `name@version`; None if malformed."""
    if not isinstance(raw, str) or (match := TEMPLATE_ID.fullmatch(raw)) is None:
        return None
    version = match["version"]
    return match["name"], int(version) if version else None


async def find(
    conn: asyncpg.Pool | asyncpg.Connection, tenant: str, refs: Iterable[Ref]
) -> dict[Ref, StoredTemplate]:
    """The stored versions these references name, in one query; unknown ones are missing."""
    wanted = sorted(set(refs), key=lambda ref: (ref[0], ref[1] or 0))
    if not wanted:
        return {}
    rows = await conn.fetch(
        query("template_find"), tenant, [name for name, _ in wanted], [v for _, v in wanted]
    )
    return {
        (row["wanted_name"], row["wanted_version"]): StoredTemplate.from_row(row) for row in rows
    }


async def lookup(request: web.Request, body: Any) -> StoredTemplate | None:
    """The template a job body names with template_id (None when it names none or an unknown
    one: validate_job reports that with the body's other problems)."""
    ref = parse_template_id(body.get("template_id")) if isinstance(body, dict) else None
    if ref is None:
        return None
    found = await find(request.app[POOL], tenant_of(request), [ref])
    return found.get(ref)


def resolve(
    body: dict[str, Any], stored: StoredTemplate | None, errors: list[tuple[str, str]]
) -> tuple[Any, Any]:
    """(template, options) of a job body naming template_id: the stored html, and the stored
    options with the body's own on top. Problems are added to `errors`."""
    given = body.get("options")
    if body.get("template") is not None:
        errors.append(("template_id", "give either template or template_id, not both"))
    elif parse_template_id(body["template_id"]) is None:
        errors.append(("template_id", "must be a template name, or name@version"))
    elif stored is None:
        errors.append(("template_id", f"no template {body['template_id']!r}"))
    else:
        merged = {**stored.options, **given} if isinstance(given, dict) else given
        return stored.html, stored.options if given is None else merged
    return None, given


def setup(app: web.Application) -> None:
    """Add the template routes and the preview limit to the app."""
    app[PREVIEWS] = asyncio.Semaphore(max(app[SETTINGS].render_slots, 1))
    app.add_routes(routes)


def _check_object(value: Any, field: str, limit: int, errors: list[tuple[str, str]]) -> None:
    if not isinstance(value, dict):
        errors.append((field, "must be an object"))
    elif jsontext.size(value) > limit:
        errors.append((field, f"must be at most {limit} bytes as JSON"))


def _check_html(value: Any, limit: int, errors: list[tuple[str, str]]) -> None:
    if not isinstance(value, str):
        errors.append(("html", "is required" if value is None else "must be a string"))
    elif len(value.encode()) > limit:
        errors.append(("html", f"must be at most {limit} bytes"))
    elif (syntax := templates.check(value)) is not None:
        errors.append(("html", syntax))


def _parse_options(raw: Any, errors: list[tuple[str, str]]) -> dict[str, Any]:
    try:
        return options.to_json(options.parse(raw))
    except options.OptionsError as exc:
        errors.extend(exc.errors)
        return {}


@routes.post("/v1/templates")
async def create_template(request: web.Request) -> web.Response:
    """Store a new version of a template (the first one is version 1)."""
    settings = request.app[SETTINGS]
    body = await read_json(request)
    if not isinstance(body, dict):
        raise invalid([("", "the body must be a JSON object")])
    errors = [(key, "is not a known field") for key in body if key not in TEMPLATE_FIELDS]
    name = body.get("name")
    if not isinstance(name, str) or not NAME.fullmatch(name):
        errors.append(
            (
                "name",
                "must be 1 to 100 letters, digits, '.', '_' or '-', not starting with a symbol",
            )
        )
    await templates.warm([body.get("html")], max_bytes=settings.max_template_bytes)
    _check_html(body.get("html"), settings.max_template_bytes, errors)
    stored_options = _parse_options(body.get("options"), errors)
    sample_data = body.get("sample_data", {})
    _check_object(sample_data, "sample_data", settings.max_data_bytes, errors)
    if errors:
        raise invalid(errors)
    tenant = tenant_of(request)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        await conn.execute(query("template_lock"), tenant, name)
        row = await conn.fetchrow(
            query("template_insert"), tenant, name, body["html"], stored_options, sample_data
        )
    stored = StoredTemplate.from_row(row)
    shown = stored.public()
    return json_response(shown, status=201, headers={"Location": shown["links"]["self"]})


@routes.get("/v1/templates")
async def list_templates(request: web.Request) -> web.Response:
    """The latest version of each template, by name; `cursor` is the last name of a page."""
    limit = 50
    raw_limit = request.query.get("limit")
    if raw_limit is not None:
        if (
            not (raw_limit.isascii() and raw_limit.isdigit())
            or not 1 <= int(raw_limit) <= MAX_LIST_LIMIT
        ):
            raise invalid(
                [("limit", f"must be an integer from 1 to {MAX_LIST_LIMIT}")],
                "The query parameters are not valid.",
            )
        limit = int(raw_limit)
    rows = await request.app[POOL].fetch(
        query("template_list"),
        tenant_of(request),
        request.query.get("cursor"),
        limit + 1,
    )
    items = [
        {
            "name": row["name"],
            "version": row["version"],
            "versions": row["versions"],
            "created_at": row["created_at"].isoformat(),
            "links": {"self": f"/v1/templates/{row['name']}"},
        }
        for row in rows[:limit]
    ]
    next_cursor = rows[limit - 1]["name"] if len(rows) > limit else None
    return json_response({"items": items, "next_cursor": next_cursor})


async def _stored(request: web.Request, template_id: str) -> StoredTemplate:
    ref = parse_template_id(template_id)
    if ref is None:
        raise not_found("template")
    found = await find(request.app[POOL], tenant_of(request), [ref])
    if ref not in found:
        raise not_found("template")
    return found[ref]


@routes.get("/v1/templates/{template_id}")
async def get_template(request: web.Request) -> web.Response:
    """A template's latest version (or `name@version`), with the list of its versions."""
    stored = await _stored(request, request.match_info["template_id"])
    rows = await request.app[POOL].fetch(
        query("template_versions"), tenant_of(request), stored.name
    )
    shown = stored.public()
    shown["versions"] = [
        {"version": row["version"], "created_at": row["created_at"].isoformat()} for row in rows
    ]
    return json_response(shown)


@routes.post("/v1/templates/{template_id}/preview")
async def preview_stored(request: web.Request) -> web.Response:
    """Render a stored template with its sample data (or the `data` given) to PDF, now."""
    stored = await _stored(request, request.match_info["template_id"])
    body = await _optional_body(request)
    errors = [(key, "is not a known field") for key in body if key not in PREVIEW_FIELDS]
    if "version" in body:
        version = body["version"]
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            errors.append(("version", "must be a version number"))
        elif version != stored.version:
            stored = await _stored(request, f"{stored.name}@{version}")
    data = body.get("data", stored.sample_data)
    _check_object(data, "data", request.app[SETTINGS].max_data_bytes, errors)
    given = body.get("options")
    raw_options = {**stored.options, **given} if isinstance(given, dict) else given
    render_options = _options_for_preview(stored.options if given is None else raw_options, errors)
    if errors:
        raise invalid(errors)
    filename = f"{stored.name}-v{stored.version}-preview.pdf"
    return await _preview(request, stored.html, data, render_options, filename)


@routes.post("/v1/templates/preview")
async def preview_inline(request: web.Request) -> web.Response:
    """Render template html sent in the body to PDF, now (for editors, before storing it)."""
    body = await _optional_body(request)
    errors = [(key, "is not a known field") for key in body if key not in INLINE_PREVIEW_FIELDS]
    max_bytes = request.app[SETTINGS].max_template_bytes
    await templates.warm([body.get("html")], max_bytes=max_bytes)
    _check_html(body.get("html"), max_bytes, errors)
    data = body.get("data", {})
    _check_object(data, "data", request.app[SETTINGS].max_data_bytes, errors)
    render_options = _options_for_preview(body.get("options"), errors)
    if errors:
        raise invalid(errors)
    return await _preview(request, body["html"], data, render_options, "preview.pdf")


async def _optional_body(request: web.Request) -> dict[str, Any]:
    body = await read_json(request) if request.can_read_body else {}
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise invalid([("", "the body must be a JSON object")])
    return body


def _options_for_preview(raw: Any, errors: list[tuple[str, str]]) -> options.RenderOptions:
    try:
        return options.parse(raw)
    except options.OptionsError as exc:
        errors.extend(exc.errors)
        return options.RenderOptions()


async def _preview(
    request: web.Request,
    html: str,
    data: dict[str, Any],
    render_options: options.RenderOptions,
    filename: str,
) -> web.Response:
    """Template + data → PDF through this process's renderer, within the render time limit."""
    app = request.app
    settings = app[SETTINGS]
    if RENDERER not in app:
        raise Problem(
            503,
            "No renderer",
            "This process renders nothing (PRESSROOM_RENDER_SLOTS=0); preview on one that does.",
            kind="no-renderer",
        )
    timeout_s = settings.render_timeout_s
    previews = app[PREVIEWS]
    try:
        async with asyncio.timeout(timeout_s):
            await previews.acquire()
    except TimeoutError:
        raise _try_again(f"no render slot came free within {timeout_s:g} s") from None
    try:
        # The template meets its own deadline (its sandbox's): a template that runs too long
        # is then the template limit its job would fail with, not a timeout worth retrying.
        page = await templates.render_async(html, data, timeout_s=timeout_s)
        async with asyncio.timeout(timeout_s):
            result = await app[RENDERER].render(page, render_options, timeout_s=timeout_s)
    except PermanentError as exc:
        raise Problem(422, "Cannot render", str(exc), kind="render-failed") from None
    except (RenderError, TimeoutError) as exc:
        raise _try_again(str(exc) or f"the preview took longer than {timeout_s:g} s") from None
    finally:
        previews.release()
    if result.pages > settings.max_pages:
        raise Problem(
            422,
            "Cannot render",
            f"the PDF has more than {settings.max_pages} pages, the limit",
            kind="render-failed",
        )
    return web.Response(
        body=result.pdf,
        content_type="application/pdf",
        headers={
            "Content-Disposition": f'inline; filename="{filename}"',
            "Cache-Control": "no-store",
            "Pressroom-Pages": str(result.pages),
        },
    )


def _try_again(detail: str) -> Problem:
    """503 for a preview that may well work next time (a busy or failing browser)."""
    return Problem(
        503,
        "Preview failed",
        f"{detail}; try again.",
        kind="preview-failed",
        headers={"Retry-After": str(PREVIEW_RETRY_S)},
    )
