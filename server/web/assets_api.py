"""The asset routes (POST and GET /v1/assets, GET and DELETE /v1/assets/{id}, GET …/content), the
lookup of the assets a body names before it is validated, and multipart/form-data jobs (an
index.html or index.md part, files by their names, an optional `job` part of JSON), read into
the JSON body they stand for."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any, Protocol
from urllib.parse import unquote

from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from server.errors import StorageError
from server.files import assets
from server.files.assets import Asset, QuotaExceeded, Upload
from server.keys import POOL, SETTINGS, STORAGE
from server.options import finishing
from server.problems import Problem, invalid, not_found
from server.schemas.assets import MAX_JOB_ASSETS, AssetListQuery, asset_path_problem
from server.sql import query
from server.web.common import json_response, parse_json, query_of, tenant_of

READ_CHUNK_BYTES = 64 * 1024
JOB_PART = "job"
#: The index part's file name → the field of the job body it becomes.
INDEX_PARTS = {"index.html": "template", "index.md": "markdown"}
SOURCE_FIELDS = ("template", "template_id", "markdown", "page_url")
#: Files plus the index and the job part.
MAX_PARTS = MAX_JOB_ASSETS + 2
STORAGE_RETRY_S = 2

routes = web.RouteTableDef()


# --- limits and refusals -----------------------------------------------------------------


def too_large(what: str, limit: int, setting: str) -> Problem:
    return Problem(
        413,
        "Asset too large",
        f"{what} is over {limit} bytes ({setting}).",
        kind="asset-too-large",
    )


def unsupported(what: str, given: str) -> Problem:
    return Problem(
        415,
        "Unsupported asset type",
        f"{what} has the content type {given or 'none'!r}; assets may be {assets.accepted()}.",
        kind="unsupported-asset-type",
    )


def over_quota(exc: QuotaExceeded) -> Problem:
    return Problem(
        413,
        "Asset quota exceeded",
        f"The tenant's assets take {exc.used} bytes; {exc.adding} more would pass its quota of "
        f"{exc.limit} bytes (PRESSROOM_TENANT_MAX_ASSET_BYTES). Delete assets it no longer "
        "needs.",
        kind="asset-quota",
    )


def storage_unavailable(exc: StorageError) -> Problem:
    return Problem(
        503,
        "Storage unavailable",
        f"The file storage failed: {exc}. Try again shortly.",
        kind="storage-unavailable",
        headers={"Retry-After": str(STORAGE_RETRY_S)},
    )


async def store(request: web.Request, uploads: list[Upload]) -> list[tuple[Asset, bool]]:
    """Store the uploads for the request's tenant; the quota and storage failures answered."""
    for upload in uploads:
        if (why := upload.problem()) is not None:
            raise invalid([("", f"the {upload.content_type} asset {why}")])
    try:
        return await assets.store(
            request.app[POOL],
            request.app[STORAGE],
            tenant_of(request),
            uploads,
            max_total_bytes=request.app[SETTINGS].tenant_max_asset_bytes,
        )
    except QuotaExceeded as exc:
        raise over_quota(exc) from None
    except StorageError as exc:
        raise storage_unavailable(exc) from None


async def _read_limited(chunks: AsyncIterator[bytes], limit: int, refuse: Problem) -> bytes:
    """A body or part read whole, refused as soon as it passes `limit` bytes."""
    kept: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise refuse
        kept.append(chunk)
    return b"".join(kept)


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(READ_CHUNK_BYTES):
        yield chunk


# --- the assets a body names ---------------------------------------------------------------


class _Stored(Protocol):
    """What the lookup reads of a stored template (library.StoredTemplate)."""

    @property
    def assets(self) -> Mapping[str, str]: ...

    @property
    def options(self) -> Mapping[str, Any]: ...


def _ids(body: Any) -> list[str]:
    """The asset ids a body (or a stored template) names: in its asset map and in the
    finishing options (attachments, an image stamp, a Factur-X XML)."""
    if not isinstance(body, dict):
        return []
    mapped = body.get("assets")
    ids = list(mapped.values()) if isinstance(mapped, dict) else []
    ids += finishing.asset_ids(body.get("options"))
    return [value for value in ids if isinstance(value, str)]


async def named(
    request: web.Request,
    bodies: Iterable[Any],
    stored: Iterable[_Stored] = (),
    pending: Iterable[Upload] = (),
) -> dict[str, Asset]:
    """The tenant's assets the bodies and the `stored` templates (their assets and options)
    name, in one query, with `pending` uploads counted as stored; unknown ids are missing, and
    validation reports them."""
    ids = [i for body in bodies for i in _ids(body)]
    ids += [i for t in stored for i in _ids({"assets": t.assets, "options": t.options})]
    found = await assets.find(request.app[POOL], tenant_of(request), ids) if ids else {}
    for upload in pending:
        found.setdefault(
            upload.id, Asset(upload.id, upload.size, upload.content_type, dt.datetime.now(dt.UTC))
        )
    return found


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


@routes.post("/v1/assets")
async def upload(request: web.Request) -> web.Response:
    """Store the body as an asset of its Content-Type: 201, or 200 when it is there already."""
    settings = request.app[SETTINGS]
    kind = assets.content_type(request.headers.get("Content-Type", ""))
    if kind is None:
        raise unsupported("The body", request.content_type)
    limit = settings.max_asset_bytes
    refuse = too_large("The asset", limit, "PRESSROOM_MAX_ASSET_BYTES")
    if request.content_length is not None and request.content_length > limit:
        raise refuse
    data = await _read_limited(request.content.iter_chunked(READ_CHUNK_BYTES), limit, refuse)
    [(asset, created)] = await store(request, [await Upload.of(data, kind)])
    shown = asset.public()
    return json_response(
        shown, status=201 if created else 200, headers={"Location": shown["links"]["self"]}
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
    """The asset's id, size, content type and links."""
    return json_response((await _stored(request)).public())


@routes.get("/v1/assets/{asset_id}/content")
async def get_content(request: web.Request) -> web.Response:
    """The asset's bytes, as a download: never shown as a page of this origin."""
    asset = await _stored(request)
    try:
        data = await request.app[STORAGE].get(assets.storage_key(tenant_of(request), asset.id))
    except FileNotFoundError:
        raise Problem(410, "Gone", "The asset's bytes are no longer stored.") from None
    except StorageError as exc:
        raise storage_unavailable(exc) from None
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


@routes.delete("/v1/assets/{asset_id}")
async def delete_asset(request: web.Request) -> web.Response:
    """Delete an asset no queued or running job uses (409 naming a few that do)."""
    asset_id = parse_asset_id(request)
    try:
        removal = await assets.remove(
            request.app[POOL], request.app[STORAGE], tenant_of(request), asset_id
        )
    except StorageError as exc:
        raise storage_unavailable(exc) from None
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


# --- multipart/form-data jobs --------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class MultipartJob:
    """A multipart job read whole: the JSON body it stands for, and its files to store."""

    body: dict[str, Any]
    uploads: list[Upload]


def _part_problem(field: str, message: str) -> Problem:
    return invalid([(field, message)], "The multipart body is not a job.")


async def read_multipart(request: web.Request) -> MultipartJob:
    """The job a multipart/form-data body stands for: nothing is stored until it is valid."""
    settings = request.app[SETTINGS]
    total = settings.max_upload_bytes
    if request.content_length is not None and request.content_length > total:
        raise too_large("The multipart body", total, "PRESSROOM_MAX_UPLOAD_BYTES")
    try:
        reader = await request.multipart()
        parts = await _parts(reader, settings.max_body_bytes, total)
    except (ValueError, AssertionError, RuntimeError, HttpProcessingError) as exc:
        # aiohttp's reader refuses a body without its boundary, one cut short, or a part
        # whose headers are not HTTP headers.
        raise Problem(
            400,
            "Malformed body",
            f"The multipart body cannot be read: {exc}",
            kind="malformed-body",
        ) from None
    job: dict[str, Any] = {}
    index: tuple[str, bytes] | None = None
    files: dict[str, tuple[bytes, str]] = {}
    for name, filename, kind, data in parts:
        if name == JOB_PART:  # with a file name too: curl -F job=@job.json
            if job:
                raise _part_problem(JOB_PART, "is given twice")
            job = _job_part(data)
        elif index_name := _index_name(name, filename):
            if index is not None:
                raise _part_problem(index_name, f"a job has one index part; {index[0]} came first")
            index = (index_name, data)
        elif filename is None:
            raise _part_problem(
                name or "",
                "is not a part a job has: send files with a file name, and the job's fields "
                f"as JSON in the part named {JOB_PART!r}",
            )
        else:
            if filename in files:
                raise _part_problem(filename, "is given twice")
            if (why := asset_path_problem(filename)) is not None:
                raise _part_problem(filename, f"the file name {why}")
            files[filename] = (data, _file_type(filename, kind, data, settings.max_asset_bytes))
    if index is None:
        raise _part_problem(
            "index.html", "is required: a part with the file name index.html (or index.md)"
        )
    uploads = {name: await Upload.of(data, kind) for name, (data, kind) in files.items()}
    mapped = {name: upload.id for name, upload in uploads.items()}
    return MultipartJob(body=_body(job, index, mapped), uploads=list(uploads.values()))


def _body(job: dict[str, Any], index: tuple[str, bytes], files: dict[str, str]) -> dict[str, Any]:
    filename, data = index
    for name in SOURCE_FIELDS:
        if name in job:
            raise _part_problem(
                f"{JOB_PART}.{name}", f"the {filename} part is the page: leave it out"
            )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _part_problem(filename, "must be UTF-8 text") from None
    body = {**job, INDEX_PARTS[filename]: text}
    if files:
        given = job.get("assets")
        # The files lie over the job part's own map (which validation checks as sent).
        body["assets"] = {**given, **files} if isinstance(given, dict) else files
    return body


def _index_name(name: str | None, filename: str | None) -> str | None:
    """index.html or index.md when the part is the page: by its file name, or by its name."""
    if filename in INDEX_PARTS:
        return filename
    return name if name in INDEX_PARTS else None


def _job_part(data: bytes) -> dict[str, Any]:
    try:
        body = parse_json(data)
    except Problem as problem:
        raise _part_problem(JOB_PART, problem.detail or "is not JSON") from None
    if not isinstance(body, dict):
        raise _part_problem(JOB_PART, "must be a JSON object of the job's fields")
    return body


def _file_type(filename: str, given: str, data: bytes, limit: int) -> str:
    if len(data) > limit:
        raise too_large(f"The file {filename}", limit, "PRESSROOM_MAX_ASSET_BYTES")
    kind = assets.content_type(given) or assets.type_of_name(filename)
    if kind is None:
        raise unsupported(f"The file {filename}", given)
    return kind


async def _parts(
    reader: MultipartReader, max_json_bytes: int, max_total_bytes: int
) -> list[tuple[str | None, str | None, str, bytes]]:
    """Every part as (name, file name, content type, bytes), each read within its limit."""
    found: list[tuple[str | None, str | None, str, bytes]] = []
    total = 0
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise _part_problem("", "nested multipart bodies are not read")
        if len(found) == MAX_PARTS:
            raise _part_problem("", f"a job has at most {MAX_PARTS} parts")
        encoding = part.headers.get("Content-Transfer-Encoding", "binary").lower()
        if encoding not in ("binary", "8bit", "7bit"):
            raise _part_problem(part.filename or part.name or "", "send the file as binary")
        limit = max_total_bytes - total
        refuse = too_large("The multipart body", max_total_bytes, "PRESSROOM_MAX_UPLOAD_BYTES")
        data = await _read_limited(_chunks(part), limit, refuse)
        if part.filename is None and len(data) > max_json_bytes:
            raise too_large(f"The part {part.name}", max_json_bytes, "PRESSROOM_MAX_BODY_BYTES")
        total += len(data)
        # Some clients percent-encode file names (a path's "/" too); asset paths have no "%".
        filename = unquote(part.filename) if part.filename is not None else None
        found.append((part.name, filename, part.headers.get("Content-Type", ""), data))
    return found
