"""Files out: whose file a download opens (a link signed for it, or the caller's credentials),
and its bytes, or a redirect to the bucket's own presigned URL."""

from __future__ import annotations

import uuid

from aiohttp import web

from server.access import signing
from server.keys import AUTH, POOL, SETTINGS, STORAGE
from server.options import outputs
from server.problems import Problem, not_found
from server.web import auth
from server.web.common import tenant_of


async def download_tenant(
    request: web.Request, subject_id: uuid.UUID, route: str, owner_sql: str, what: str = "job"
) -> str:
    """Whose file a download opens: the tenant `owner_sql` names for the subject (a job, a
    batch: `what`) when the request holds a link signed for this route of it (no credentials
    needed), else the caller's."""
    if request.get(auth.VIA) != auth.VIA_SIGNATURE:
        return tenant_of(request)
    minted_by = signing.check_download(
        request.app[SETTINGS].secret,
        str(subject_id),
        request.query.get("expires", ""),
        request.query.get("key", ""),
        request.query.get("sig", ""),
        route=route,
    )
    if minted_by is None:
        raise Problem(
            403,
            "Forbidden",
            "The download link is invalid or has expired.",
            kind="bad-signature",
        )
    if minted_by != signing.NO_KEY and not await request.app[AUTH].key_active(minted_by):
        raise auth.revoked("The download link was made with an API key that has been revoked.")
    tenant: str | None = await request.app[POOL].fetchval(owner_sql, subject_id)
    if tenant is None:
        raise not_found(what)
    return tenant


async def serve_file(
    request: web.Request,
    key: str,
    *,
    subject_id: str,
    filename: str,
    route: str,
    content_type: str = outputs.PDF.content_type,
) -> web.StreamResponse:
    """A stored file: its bytes (local storage) or a redirect to a fresh signed URL (S3)."""
    settings = request.app[SETTINGS]
    storage = request.app[STORAGE]
    presigned = await storage.presign(
        key, filename=filename, content_type=content_type, ttl_s=settings.url_ttl_s
    )
    if presigned is not None:
        raise web.HTTPFound(presigned)
    try:
        data = await storage.get(key)
    except FileNotFoundError:
        raise Problem(410, "Gone", "The file has been deleted (retention).") from None
    return web.Response(
        body=data,
        content_type=content_type,
        headers={
            "Content-Disposition": f'inline; filename="{filename}"',
            "Cache-Control": "private, max-age=60",
        },
    )
