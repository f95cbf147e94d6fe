"""Stored templates: named, immutable versions that jobs name as `template_id` (`name` for the
latest published, `name@version` for any, a draft included), Jinja2 HTML or Word templates; a
preview that renders one to PDF synchronously; publishing a draft (server/web/publishing.py)
and the diff it kept."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
from typing import Any

from aiohttp import web

from server import options
from server.errors import PageLimitError, PermanentError, RenderError
from server.files import assets, library
from server.keys import ASSET_CACHE, POOL, RENDERER, SETTINGS, WORKERS
from server.options import outputs
from server.problems import Problem, invalid, not_found
from server.render import docx, sources, templates
from server.schemas.common import MAX_TEMPLATE_BYTES, parse_template_id
from server.schemas.templates import (
    InlinePreviewRequest,
    PreviewRequest,
    PublishRequest,
    TemplateListQuery,
    TemplateRequest,
    TemplateVersionListQuery,
)
from server.sql import query
from server.web import publishing, submission
from server.web.common import (
    checks,
    json_response,
    optional_body,
    query_of,
    read_json,
    tenant_of,
    validated,
)

PREVIEW_RETRY_S = 2

# Previews share the browser with the render slots; this bounds how many run at once.
PREVIEWS = web.AppKey("template_previews", asyncio.Semaphore)

routes = web.RouteTableDef()


def setup(app: web.Application) -> None:
    """Add the template routes and the preview limit to the app."""
    app[PREVIEWS] = asyncio.Semaphore(max(app[SETTINGS].render_slots, 1))
    app.add_routes(routes)


@routes.post("/v1/templates")
async def create_template(request: web.Request) -> web.Response:
    """Store a new version of a template (the first one is version 1), a draft unless the body
    says `publish` (then published as POST …/publish would, or kept a draft with its 409)."""
    body = await read_json(request)
    if isinstance(body, dict):
        await templates.warm([body.get("html")], max_bytes=MAX_TEMPLATE_BYTES)
    new = validated(
        TemplateRequest, body, checks(request, {}, known := await _named(request, body))
    )
    tenant = tenant_of(request)
    if new.docx is not None:
        await _check_word(request, new.name, new.docx, new.sample_data, new.assets, known)
    async with request.app[POOL].acquire() as conn, conn.transaction():
        await conn.execute(query("template_lock"), tenant, new.name)
        row = await conn.fetchrow(
            query("template_insert"),
            tenant,
            new.name,
            new.html,
            options.to_json(new.options) if new.options else {},
            new.sample_data,
            new.assets,
            new.docx,
            new.data_schema,
            new.samples,
        )
    stored = library.StoredTemplate.from_row(row)
    location = {"Location": stored.public()["links"]["self"]}
    if new.publish:
        return await _publish(
            request, stored, PublishRequest.model_validate({}), status=201, headers=location
        )
    return json_response(stored.public(), status=201, headers=location)


@routes.get("/v1/templates")
async def list_templates(request: web.Request) -> web.Response:
    """The latest version of each template, by name; `cursor` is the last name of a page."""
    page = query_of(request, TemplateListQuery)
    limit = page.limit
    rows = await request.app[POOL].fetch(
        query("template_list"), tenant_of(request), page.cursor, limit + 1
    )
    items = [
        {
            "name": row["name"],
            "version": row["version"],
            "published": row["published"],
            "versions": row["versions"],
            "created_at": row["created_at"].isoformat(),
            "links": {"self": f"/v1/templates/{row['name']}"},
        }
        for row in rows[:limit]
    ]
    next_cursor = rows[limit - 1]["name"] if len(rows) > limit else None
    return json_response({"items": items, "next_cursor": next_cursor})


async def _stored(request: web.Request, template_id: str) -> library.StoredTemplate:
    ref = parse_template_id(template_id)
    if ref is None:
        raise not_found("template")
    found = await library.find(request.app[POOL], tenant_of(request), [ref], drafts=True)
    if ref not in found:
        raise not_found("template")
    return found[ref]


@routes.get("/v1/templates/{template_id}")
async def get_template(request: web.Request) -> web.Response:
    """A template's latest published version (its latest draft where none is published), or
    `name@version`, with the list of its versions."""
    stored = await _stored(request, request.match_info["template_id"])
    rows = await request.app[POOL].fetch(
        query("template_versions"), tenant_of(request), stored.name
    )
    shown = stored.public()
    shown["versions"] = [
        {
            "version": row["version"],
            "status": library.DRAFT if row["published_at"] is None else library.PUBLISHED,
            "created_at": row["created_at"].isoformat(),
        }
        for row in rows
    ]
    return json_response(shown)


@routes.get("/v1/templates/{name}/versions")
async def list_versions(request: web.Request) -> web.Response:
    """A page of a template's versions, newest first; `cursor` is the last version of a page."""
    name = request.match_info["name"]
    if parse_template_id(name) != (name, None):
        raise not_found("template")
    page = query_of(request, TemplateVersionListQuery)
    pool, tenant = request.app[POOL], tenant_of(request)
    before = int(page.cursor) if page.cursor is not None else None
    rows = await pool.fetch(query("template_version_list"), tenant, name, before, page.limit + 1)
    if not rows and not await library.find(pool, tenant, [(name, None)], drafts=True):
        raise not_found("template")
    items = [
        {
            "version": row["version"],
            "template_id": f"{name}@{row['version']}",
            "kind": row["kind"],
            "status": library.DRAFT if row["published_at"] is None else library.PUBLISHED,
            "created_at": row["created_at"].isoformat(),
            "links": {"self": f"/v1/templates/{name}@{row['version']}"},
        }
        for row in rows[: page.limit]
    ]
    next_cursor = str(items[-1]["version"]) if len(rows) > page.limit else None
    return json_response({"name": name, "items": items, "next_cursor": next_cursor})


@routes.post("/v1/templates/{template_id}/preview")
async def preview_stored(request: web.Request) -> web.Response:
    """Render a stored template with its sample data (or the `data` given) to PDF, now."""
    stored = await _stored(request, request.match_info["template_id"])
    body = await optional_body(request)
    asked = validated(PreviewRequest, body, checks(request, {}, await _named(request, body)))
    if asked.version is not None and asked.version != stored.version:
        stored = await _stored(request, f"{stored.name}@{asked.version}")
    data = stored.sample_data if asked.data is None else asked.data
    if asked.sample is not None:
        if asked.sample not in stored.samples:
            known = ", ".join(stored.samples) or "none"
            raise invalid(
                [
                    (
                        "sample",
                        f"{stored.template_id} has no sample {asked.sample!r}; it has: {known}",
                    )
                ]
            )
        data = stored.samples[asked.sample]
    render_options = options.parse(stored.options)
    if asked.options is not None:  # the body's own options on top of the template's
        try:
            render_options = options.parse(
                options.layered(stored.options, asked.options.model_dump(exclude_unset=True))
            )
        except options.OptionsError as exc:
            raise invalid(exc.errors) from None
    name = f"{stored.name}-v{stored.version}-preview"
    if stored.docx is not None:
        return await _preview_word(request, stored, stored.docx, data, render_options, name)
    assert stored.html is not None  # a version is HTML or a Word template
    return await _preview(request, stored.html, data, render_options, name, stored.assets)


@routes.post("/v1/templates/{template_id}/publish")
async def publish(request: web.Request) -> web.Response:
    """Publish a draft (name@version): its samples rendered with it and with the published
    version and compared; refused with 409 naming what changed, unless forced."""
    stored = await _stored(request, _versioned(request))
    asked = validated(PublishRequest, await optional_body(request) or {}, checks(request))
    return await _publish(request, stored, asked)


@routes.get("/v1/templates/{template_id}/diff")
async def get_diff(request: web.Request) -> web.Response:
    """What the last publishing of a version found (404 before any)."""
    stored = await _stored(request, _versioned(request))
    row = await request.app[POOL].fetchrow(
        query("template_diff"), tenant_of(request), stored.name, stored.version
    )
    if row is None:
        raise not_found("diff")
    return json_response(_diff_shown(stored, row))


@routes.get("/v1/templates/{template_id}/diff/{sample}/{page}")
async def get_diff_image(request: web.Request) -> web.Response:
    """One changed page of a version's diff: the published page beside the new one (PNG)."""
    stored = await _stored(request, _versioned(request))
    key = f"{request.match_info['sample']}/{request.match_info['page']}"
    image = await request.app[POOL].fetchval(
        query("template_diff_image"), tenant_of(request), stored.name, stored.version, key
    )
    if image is None:
        raise not_found("diff image")
    headers = {"Cache-Control": "private, max-age=3600"}
    return web.Response(body=base64.b64decode(image), content_type="image/png", headers=headers)


def _versioned(request: web.Request) -> str:
    """The path's name@version (a name alone is no version to publish or compare: 404)."""
    template_id = request.match_info["template_id"]
    ref = parse_template_id(template_id)
    if ref is None or ref[1] is None:
        raise Problem(
            404,
            "Not found",
            f"name the version: {template_id}@VERSION (GET /v1/templates/{template_id} lists them)",
            kind="not-found",
        )
    return template_id


def _announced(
    stored: library.StoredTemplate, replaced: library.StoredTemplate | None
) -> dict[str, Any]:
    """What template.published carries: the version published, and the one it replaced."""
    shown = stored.public()
    return {
        "name": stored.name,
        "version": stored.version,
        "template_id": stored.template_id,
        "kind": stored.kind,
        "published_at": shown["published_at"],
        "replaces": replaced.version if replaced else None,
        "links": {"self": shown["links"]["self"], "diff": shown["links"]["diff"]},
    }


def _diff_shown(stored: library.StoredTemplate, row: Any) -> dict[str, Any]:
    return {
        "template_id": stored.template_id,
        "against": row["against"],
        "published": row["published"],
        "forced": row["forced"],
        "threshold": row["threshold"],
        "refused": publishing.refusals(row["diff"], row["threshold"]),
        "samples": row["diff"],
        "created_at": row["created_at"].isoformat(),
    }


async def _publish(
    request: web.Request,
    stored: library.StoredTemplate,
    asked: PublishRequest,
    *,
    status: int = 200,
    headers: dict[str, str] | None = None,
) -> web.Response:
    """Check and publish `stored`; 409 when its checks refuse it and it is not forced."""
    pool, tenant = request.app[POOL], tenant_of(request)
    if stored.published_at is not None:  # already: as it was published
        return json_response(stored.public(), status=status, headers=headers)
    current = (await library.find(pool, tenant, [(stored.name, None)])).get((stored.name, None))

    async def render(version: library.StoredTemplate, data: dict[str, Any]) -> bytes:
        return await render_version(request, version, data)

    checked = await publishing.check(stored, current, render, asked.threshold)
    publish_it = asked.force or not checked.refused
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(query("template_lock"), tenant, stored.name)
        published_at = await conn.fetchval(
            query("template_publish"),
            tenant,
            stored.name,
            stored.version,
            current.version if current else None,
            publish_it,
            asked.force,
            asked.threshold,
            checked.diff,
            checked.images,
        )
        if published_at is not None:
            stored = dataclasses.replace(stored, published_at=published_at)
            await conn.execute(query("template_announce"), tenant, _announced(stored, current))
        row = await conn.fetchrow(query("template_diff"), tenant, stored.name, stored.version)
    shown_diff = _diff_shown(stored, row)
    if not publish_it:
        raise Problem(
            409,
            "Publishing refused",
            f"{stored.template_id} stays a draft: " + "; ".join(checked.refused) + ". Fix the "
            'version, or publish it with {"force": true}.',
            kind="publish-refused",
            extra={"refused": checked.refused, "diff": shown_diff},
        )
    shown = stored.public()
    shown["diff"] = shown_diff
    return json_response(shown, status=status, headers=headers)


@routes.post("/v1/templates/preview")
async def preview_inline(request: web.Request) -> web.Response:
    """Render template html sent in the body to PDF, now (for editors, before storing it)."""
    body = await optional_body(request)
    if isinstance(body, dict):
        await templates.warm([body.get("html")], max_bytes=MAX_TEMPLATE_BYTES)
    asked = validated(InlinePreviewRequest, body, checks(request, {}, await _named(request, body)))
    render_options = asked.options or options.parse(None)
    mapped = asked.assets or None
    return await _preview(request, asked.html, asked.data, render_options, "preview", mapped)


async def _named(request: web.Request, body: Any) -> dict[str, assets.Asset]:
    """The assets a body names: a new version's (its Word template, and the images its sample
    data places), a preview's finishing options (a preview shows Chromium's print: its
    finishing steps are a job's), so that its options validate as a job's do."""
    bodies = [body]
    if isinstance(body, dict) and body.get("docx") is not None:
        bodies.append({"docx": body["docx"], "data": body.get("sample_data")})
    return await submission.assets_named(request.app[POOL], tenant_of(request), bodies)


async def _check_word(
    request: web.Request,
    name: str,
    asset_id: str,
    sample: dict[str, Any],
    mapped: dict[str, str],
    known: dict[str, assets.Asset],
) -> None:
    """422 for a Word template that does not compile, or sample data whose images are wrong."""
    problems = docx.image_problems(sample, mapped, known, root="sample_data")
    try:
        data = await request.app[ASSET_CACHE].get(tenant_of(request), asset_id)
    except FileNotFoundError:
        problems.append(("docx", f"the bytes of {asset_id} are gone: upload it again"))
    else:
        if (problem := await docx.check(data, f"{name}.docx", asset_id)) is not None:
            problems.append(("docx", problem))
    if problems:
        raise invalid(problems, "The Word template cannot be filled.")


async def _preview(
    request: web.Request,
    html: str,
    data: dict[str, Any],
    render_options: options.RenderOptions,
    name: str,
    mapped: dict[str, str] | None = None,
) -> web.Response:
    """Template + data → PDF (or the image options.output asks for) through this process's
    renderer, within the render time limit; the file is called `name` and its extension.
    `mapped` are the template's assets (a stored one's, or the body's), path → id."""
    body, pages = await _render_html(request, html, data, render_options, mapped)
    output = outputs.OUTPUTS[render_options.output]
    headers = {
        "Content-Disposition": f'inline; filename="{name}.{output.extension}"',
        "Cache-Control": "no-store",
    }
    if pages is not None:
        headers["Pressroom-Pages"] = str(pages)
    return web.Response(body=body, content_type=output.content_type, headers=headers)


async def _render_html(
    request: web.Request,
    html: str,
    data: dict[str, Any],
    render_options: options.RenderOptions,
    mapped: dict[str, str] | None = None,
) -> tuple[bytes, int | None]:
    """Template + data → the file and its page count (None for an image), as a preview."""
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
    previews = await _slot(app)
    try:
        # The template meets its own deadline (its sandbox's): a template that runs too long
        # is then the template limit its job would fail with, not a timeout worth retrying.
        page = await sources.load(sources.TEMPLATE, html, data, render_options, timeout_s=timeout_s)
        files = await _files(request, mapped) if mapped else None
        async with asyncio.timeout(timeout_s):
            result = await app[RENDERER].render(
                page, render_options, timeout_s=timeout_s, assets=files
            )
    except PermanentError as exc:
        raise Problem(422, "Cannot render", str(exc), kind="render-failed") from None
    except (RenderError, TimeoutError) as exc:
        raise _try_again(str(exc) or f"the preview took longer than {timeout_s:g} s") from None
    finally:
        previews.release()
    if result.pages is not None and result.pages > settings.max_pages:
        detail = str(PageLimitError(settings.max_pages))
        raise Problem(422, "Cannot render", detail, kind="render-failed")
    return result.data, result.pages


async def _slot(app: web.Application) -> asyncio.Semaphore:
    """A preview's turn (release it when done), within the render time limit."""
    timeout_s = app[SETTINGS].render_timeout_s
    previews = app[PREVIEWS]
    try:
        async with asyncio.timeout(timeout_s):
            await previews.acquire()
    except TimeoutError:
        raise _try_again(f"no render slot came free within {timeout_s:g} s") from None
    return previews


async def _preview_word(
    request: web.Request,
    stored: library.StoredTemplate,
    asset_id: str,
    data: dict[str, Any],
    render_options: options.RenderOptions,
    name: str,
) -> web.Response:
    """A stored Word template (its file `asset_id`) filled with `data` and converted by this
    process's LibreOffice, as its jobs are (without their finishing, like an HTML preview)."""
    pdf, pages = await _render_word(request, stored, asset_id, data, render_options)
    headers = {
        "Content-Disposition": f'inline; filename="{name}.pdf"',
        "Cache-Control": "no-store",
        "Pressroom-Pages": str(pages),
    }
    return web.Response(body=pdf, content_type="application/pdf", headers=headers)


async def _render_word(
    request: web.Request,
    stored: library.StoredTemplate,
    asset_id: str,
    data: dict[str, Any],
    render_options: options.RenderOptions,
) -> tuple[bytes, int]:
    """A stored Word template filled with `data` → the PDF and its page count."""
    app = request.app
    settings = app[SETTINGS]
    if WORKERS not in app:
        raise Problem(
            503,
            "No renderer",
            "This process converts nothing (PRESSROOM_RENDER_SLOTS=0); preview on one that does.",
            kind="no-renderer",
        )
    if render_options.image:
        raise invalid([("options.output", "a Word template becomes a PDF: leave it out")])
    word = stored.docx_name
    mapped = {**stored.assets, word: asset_id}
    found, _ = docx.images(data)
    mapped |= {image.ref: image.ref for image in found if assets.is_id(image.ref)}
    known = await assets.find(app[POOL], tenant_of(request), mapped.values())
    if problems := docx.image_problems(data, stored.assets, known):
        raise invalid(problems, "The Word template cannot be filled.")
    timeout_s = settings.render_timeout_s
    previews = await _slot(app)
    try:
        files = await _files(request, mapped)
        filled = await docx.fill(files[word][1], word, data, files, timeout_s=timeout_s)
        converted = await app[WORKERS].office.convert(
            filled, word, render_options, timeout_s=timeout_s
        )
    except PermanentError as exc:
        raise Problem(422, "Cannot render", str(exc), kind="render-failed") from None
    except RenderError as exc:
        raise _try_again(str(exc)) from None
    finally:
        previews.release()
    if converted.pages > settings.max_pages:
        detail = str(PageLimitError(settings.max_pages))
        raise Problem(422, "Cannot render", detail, kind="render-failed")
    return converted.pdf, converted.pages


async def render_version(
    request: web.Request, stored: library.StoredTemplate, data: dict[str, Any]
) -> bytes:
    """A stored version with `data`, as its preview renders it (publishing compares these)."""
    render_options = options.parse(stored.options)
    if stored.docx is not None:
        return (await _render_word(request, stored, stored.docx, data, render_options))[0]
    assert stored.html is not None  # a version is HTML or a Word template
    return (await _render_html(request, stored.html, data, render_options, stored.assets))[0]


async def _files(request: web.Request, mapped: dict[str, str]) -> dict[str, tuple[str, bytes]]:
    """A stored template's assets for its preview; PermanentError names one no longer stored."""
    tenant = tenant_of(request)
    known = await assets.find(request.app[POOL], tenant, mapped.values())
    for path, asset_id in mapped.items():
        if asset_id not in known:
            raise PermanentError(f"the asset {path} ({asset_id}) is no longer stored")
    refs = assets.job_assets(mapped, known) or {}
    return await request.app[ASSET_CACHE].files(tenant, refs)


def _try_again(detail: str) -> Problem:
    """503 for a preview that may well work next time (a busy or failing browser)."""
    return Problem(
        503,
        "Preview failed",
        f"{detail}; try again.",
        kind="preview-failed",
        headers={"Retry-After": str(PREVIEW_RETRY_S)},
    )
