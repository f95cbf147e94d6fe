"""The asset routes: POST and GET /v1/assets, GET and DELETE /v1/assets/{id}, GET …/content,
GET …/fields (a PDF's form)."""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
from aiohttp import web

from server.errors import StorageError
from server.files import assets
from server.files.assets import Asset, Upload
from server.keys import ASSET_CACHE, POOL, SETTINGS, STORAGE
from server.options.finishing import PDF_TYPES
from server.problems import Problem, not_found
from server.schemas.assets import MAX_USERS_SHOWN, AssetListQuery
from server.sql import query
from server.web import uploads
from server.web.common import json_response, query_of, read_body, tenant_of

routes = web.RouteTableDef()


# --- routes ----------------------------------------------------------------------------------


def parse_asset_id(request: web.Request) -> str:
    asset_id = request.match_info["asset_id"]
    if not assets.is_id(asset_id):
        raise not_found("asset")
    return asset_id


async def _stored(request: web.Request) -> Asset:
    asset_id = parse_asset_id(request)
    found = await assets.find(request.app[POOL], tenant_of(request), [asset_id])
    if asset_id not in found:
        raise not_found("asset")
    return found[asset_id]


async def used_by(
    conn: asyncpg.Pool | asyncpg.Connection, tenant: str, ids: list[str]
) -> dict[str, dict[str, Any]]:
    """What uses each of these assets (the tenant's): template versions and jobs in flight."""
    usage: dict[str, dict[str, Any]] = {
        asset_id: {"templates": [], "template_versions": 0, "jobs": [], "jobs_in_flight": 0}
        for asset_id in ids
    }
    for row in await conn.fetch(query("template_asset_users"), tenant, ids):
        shown = usage[row["asset_id"]]
        shown["template_versions"] += 1
        if len(shown["templates"]) < MAX_USERS_SHOWN:
            template_id = f"{row['name']}@{row['version']}"
            link = f"/v1/templates/{template_id}"
            shown["templates"].append(
                {"name": row["name"], "version": row["version"], "path": row["path"], "link": link}
            )
    for row in await conn.fetch(query("asset_users"), tenant, ids):
        shown = usage[row["asset_id"]]
        shown["jobs_in_flight"] = row["n"]
        shown["jobs"] = [{"id": str(job), "link": f"/v1/jobs/{job}"} for job in row["jobs"]]
    return usage


@routes.post("/v1/assets")
async def upload(request: web.Request) -> web.Response:
    """Store the body as an asset of its Content-Type: 201, or 200 when it is there already."""
    settings = request.app[SETTINGS]
    kind = assets.content_type(request.headers.get("Content-Type", ""))
    if kind is None:
        raise uploads.unsupported("The body", request.content_type)
    refuse = uploads.asset_too_large("The asset", settings)
    data = await read_body(request, settings.max_asset_bytes, refuse)
    if not data:
        raise uploads.empty(
            "",
            "The asset is empty: send the file's bytes as the body, with its Content-Type "
            "(curl: --data-binary @FILE).",
        )
    [(asset, created)] = await uploads.store(
        request.app[POOL],
        request.app[STORAGE],
        tenant_of(request),
        [await Upload.of(data, kind)],
        max_total_bytes=settings.tenant_max_asset_bytes,
    )
    shown = asset.public()
    usage = await used_by(request.app[POOL], tenant_of(request), [asset.id])
    return json_response(
        {**shown, "used_by": usage[asset.id]},
        status=201 if created else 200,
        headers={"Location": shown["links"]["self"]},
    )


@routes.get("/v1/assets")
async def list_assets(request: web.Request) -> web.Response:
    """A page of the tenant's assets by id, with what all of them take of its quota."""
    page = query_of(request, AssetListQuery)
    tenant = tenant_of(request)
    pool = request.app[POOL]
    async with pool.acquire() as conn, conn.transaction(isolation="repeatable_read", readonly=True):
        rows = await conn.fetch(query("asset_list"), tenant, page.cursor, page.limit + 1)
        total = await conn.fetchval(query("asset_total"), tenant)
        items = [Asset.from_row(row).public() for row in rows[: page.limit]]
        usage = await used_by(conn, tenant, [item["id"] for item in items])
    for item in items:
        item["used_by"] = usage[item["id"]]
    next_cursor = items[-1]["id"] if len(rows) > page.limit else None
    return json_response(
        {
            "items": items,
            "next_cursor": next_cursor,
            "total_bytes": total,
            "quota_bytes": request.app[SETTINGS].tenant_max_asset_bytes,
        }
    )


@routes.get("/v1/assets/{asset_id}")
async def get_asset(request: web.Request) -> web.Response:
    """The asset's id, size, content type, links, and what uses it."""
    shown = (await _stored(request)).public()
    usage = await used_by(request.app[POOL], tenant_of(request), [shown["id"]])
    return json_response({**shown, "used_by": usage[shown["id"]]})


@routes.get("/v1/assets/{asset_id}/content")
async def get_content(request: web.Request) -> web.Response:
    """The asset's bytes, as a download: never shown as a page of this origin."""
    asset = await _stored(request)
    try:
        data = await request.app[STORAGE].get(assets.storage_key(tenant_of(request), asset.id))
    except FileNotFoundError:
        raise Problem(410, "Gone", "The asset's bytes are no longer stored.") from None
    except StorageError as exc:
        raise uploads.storage_unavailable(exc) from None
    hex_id = asset.id.removeprefix(assets.ID_PREFIX)
    return web.Response(
        body=data,
        content_type=asset.content_type,
        headers={
            "Content-Disposition": f'attachment; filename="{hex_id}"',
            "Content-Security-Policy": "sandbox",
            "X-Content-Type-Options": "nosniff",
            "ETag": f'"{hex_id}"',
            "Cache-Control": "private, max-age=31536000, immutable",
        },
    )


@routes.get("/v1/assets/{asset_id}/fields")
async def get_fields(request: web.Request) -> web.Response:
    """A PDF asset's form fields (name, type, current value, options), and its page count:
    the names `fill_form` takes."""
    asset = await _stored(request)
    if asset.content_type not in PDF_TYPES:
        raise Problem(
            409,
            "Not a PDF",
            f"This asset is {asset.content_type}; only a PDF (application/pdf) has form fields.",
        )
    try:
        data = await request.app[ASSET_CACHE].get(tenant_of(request), asset.id)
    except FileNotFoundError:
        raise Problem(410, "Gone", "The asset's bytes are no longer stored.") from None
    except StorageError as exc:
        raise uploads.storage_unavailable(exc) from None
    from server.pdf import forms  # pikepdf loads with the first form asked for, not the API

    try:
        inspected = await asyncio.to_thread(forms.inspect, data)
    except forms.UnusablePdf as exc:
        raise Problem(409, "Unusable PDF", f"The PDF {asset.id} {exc}.") from None
    return json_response(
        {
            "id": asset.id,
            "pages": inspected.pages,
            "title": inspected.title,
            "fields": [field.public() for field in inspected.fields],
        }
    )


@routes.delete("/v1/assets/{asset_id}")
async def delete_asset(request: web.Request) -> web.Response:
    """Delete an asset no queued or running job uses (409 naming a few that do)."""
    asset_id = parse_asset_id(request)
    try:
        removal = await assets.remove(
            request.app[POOL], request.app[STORAGE], tenant_of(request), asset_id
        )
    except StorageError as exc:
        raise uploads.storage_unavailable(exc) from None
    if not removal.found:
        raise not_found("asset")
    if removal.users:
        raise Problem(
            409,
            "Asset in use",
            "Queued or running jobs use this asset; delete it once they have finished.",
            kind="asset-in-use",
            extra={"jobs": [str(job_id) for job_id in removal.users]},
        )
    return web.Response(status=204)
