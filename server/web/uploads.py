"""What every upload shares, as a file of POST /v1/assets or of a multipart job: its limits and
refusals, its storing under the tenant's quota, and multipart/form-data jobs (an index.html or
index.md part, an Office file in a part named office or a Word template in one named docx;
files by their names, an optional `job` part of JSON) read into the JSON body they stand for;
nothing is stored until that body is valid."""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import unquote

import asyncpg
from aiohttp import BodyPartReader, MultipartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from server.errors import StorageError
from server.files import assets, office_formats
from server.files.assets import Asset, QuotaExceeded, Upload
from server.files.storage import Storage
from server.keys import SETTINGS
from server.problems import Problem, human_size, invalid, size_text, too_large
from server.schemas.assets import MAX_JOB_ASSETS, asset_path_problem
from server.settings import Settings
from server.web.common import READ_CHUNK_BYTES, check_encoding, parse_json, read_limited

JOB_PART = "job"
#: The part holding an Office file to convert (with its file name: curl -F office=@report.docx).
OFFICE_PART = "office"
#: The part holding a Word template to fill (curl -F docx=@letter.docx).
DOCX_PART = "docx"
#: A job part naming file parts as its uploaded PDFs (a `pdfs` job) needs no index part.
PDFS_FIELD = "pdfs"
#: The index part's file name → the field of the job body it becomes.
INDEX_PARTS = {"index.html": "template", "index.md": "markdown"}
SOURCE_FIELDS = ("template", "template_id", "markdown", "page_url", "office", "docx", "pdfs")
#: Files plus the index and the job part.
MAX_PARTS = MAX_JOB_ASSETS + 2
STORAGE_RETRY_S = 2


# --- limits and refusals -----------------------------------------------------------------


def asset_too_large(what: str, settings: Settings) -> Problem:
    """One file over PRESSROOM_MAX_ASSET_BYTES (POST /v1/assets, or a file of a multipart job)."""
    return too_large(
        what,
        settings.max_asset_bytes,
        "PRESSROOM_MAX_ASSET_BYTES",
        "Send a smaller file (compress or scale down images, subset fonts), or ask the "
        "operator to raise the limit.",
        title="Asset too large",
        kind="asset-too-large",
    )


def upload_too_large(settings: Settings) -> Problem:
    """A multipart job over PRESSROOM_MAX_UPLOAD_BYTES, all its parts together."""
    return too_large(
        "The multipart body",
        settings.max_upload_bytes,
        "PRESSROOM_MAX_UPLOAD_BYTES",
        "Upload large files once as assets (POST /v1/assets), then send the job with their "
        "ids in `assets` (in its job part, or as JSON): each is stored once, for every job "
        "that names it.",
        title="Body too large",
        kind="body-too-large",
    )


def part_too_large(name: str | None, settings: Settings) -> Problem:
    """A part without a file name (the job's JSON, or the page by its name) over
    PRESSROOM_MAX_BODY_BYTES, the limit of a JSON body."""
    return too_large(
        f"The part {name or '(unnamed)'}",
        settings.max_body_bytes,
        "PRESSROOM_MAX_BODY_BYTES",
        "Send files as parts with a file name, each up to "
        f"{human_size(settings.max_asset_bytes)} (PRESSROOM_MAX_ASSET_BYTES).",
        title="Body too large",
        kind="body-too-large",
    )


def empty(field: str, detail: str) -> Problem:
    """422 for a file of no bytes: stored, it would be an asset that any page reads as
    broken."""
    return invalid([(field, "is empty: a file must have at least one byte")], detail)


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
        f"The tenant's assets take {size_text(exc.used)}; {size_text(exc.adding)} more would "
        f"pass its quota of {size_text(exc.limit)}, the limit PRESSROOM_TENANT_MAX_ASSET_BYTES "
        "sets. Delete assets it no longer needs (DELETE /v1/assets/{id}).",
        kind="asset-quota",
        extra={"limit_bytes": exc.limit, "setting": "PRESSROOM_TENANT_MAX_ASSET_BYTES"},
    )


def storage_unavailable(exc: StorageError) -> Problem:
    return Problem(
        503,
        "Storage unavailable",
        f"The file storage failed: {exc}. Try again shortly.",
        kind="storage-unavailable",
        headers={"Retry-After": str(STORAGE_RETRY_S)},
    )


async def store(
    pool: asyncpg.Pool,
    storage: Storage,
    tenant: str,
    uploads: list[Upload],
    *,
    max_total_bytes: int,
) -> list[tuple[Asset, bool]]:
    """Store the uploads for the tenant; the quota and storage failures answered."""
    for upload in uploads:
        if (why := upload.problem()) is not None:
            raise invalid([("", f"the {upload.content_type} asset {why}")])
    try:
        return await assets.store(pool, storage, tenant, uploads, max_total_bytes=max_total_bytes)
    except QuotaExceeded as exc:
        raise over_quota(exc) from None
    except StorageError as exc:
        raise storage_unavailable(exc) from None


async def _chunks(part: BodyPartReader) -> AsyncIterator[bytes]:
    while chunk := await part.read_chunk(READ_CHUNK_BYTES):
        yield chunk


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
    check_encoding(request)
    if request.content_length is not None and request.content_length > settings.max_upload_bytes:
        raise upload_too_large(settings)
    try:
        reader = await request.multipart()
        parts = await _parts(reader, settings)
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
    # The Office file or Word template: its part's name and its file name.
    office: tuple[str, str] | None = None
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
            if not data:
                raise empty(
                    filename,
                    f"The file {filename} is empty: send its bytes in its part, or leave the "
                    "part out.",
                )
            if name in (OFFICE_PART, DOCX_PART):
                if office is not None:
                    twice = "is given twice" if name == office[0] else "a job has one source"
                    raise _part_problem(name, f"{twice}; {office[1]} came first")
                office = (name, filename)
                files[filename] = (data, _office_type(name, filename, data, settings))
            else:
                files[filename] = (data, _file_type(filename, kind, data, settings))
    if index is not None and office is not None:
        raise _part_problem(office[0], f"a job has one source; {index[0]} is given too")
    if index is None and office is None and PDFS_FIELD not in job:
        raise _part_problem(
            "index.html",
            "is required: a part with the file name index.html (or index.md), an Office "
            f"file in a part named {OFFICE_PART}, a Word template in a part named {DOCX_PART}, "
            f"or the job part's {PDFS_FIELD} naming PDF parts by their file names",
        )
    uploads = {name: await Upload.of(data, kind) for name, (data, kind) in files.items()}
    mapped = {name: upload.id for name, upload in uploads.items()}
    return MultipartJob(body=_body(job, index, office, mapped), uploads=list(uploads.values()))


def _body(
    job: dict[str, Any],
    index: tuple[str, bytes] | None,
    office: tuple[str, str] | None,
    files: dict[str, str],
) -> dict[str, Any]:
    if index is not None:
        what = f"the {index[0]} part is the page"
    else:
        what = f"the {office[1] if office else ''} part is the document"
    for name in SOURCE_FIELDS if index is not None or office is not None else ():
        if name in job:
            raise _part_problem(f"{JOB_PART}.{name}", f"{what}: leave it out")
    if index is None and office is None:
        body = dict(job)  # uploaded PDFs: the job part's pdfs names the file parts
    elif index is None:
        assert office is not None
        body = {**job, office[0]: office[1]}
    else:
        filename, data = index
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


def _office_type(part: str, filename: str, data: bytes, settings: Settings) -> str:
    """An Office file's type (a Word template's: .docx), by its content whatever its name or
    part say."""
    if len(data) > settings.max_asset_bytes:
        raise asset_too_large(f"The file {filename}", settings)
    kind = office_formats.detect(data)
    if part == DOCX_PART and kind is not office_formats.DOCX:
        what = "not an Office file" if kind is None else kind.label
        raise _part_problem(
            DOCX_PART,
            f"the file {filename} is {what} by its content; a Word template is a Word "
            "document (.docx) whose text carries Jinja2",
        )
    if kind is None:
        raise _part_problem(
            OFFICE_PART,
            f"the file {filename} is not an Office file by its content; Office files may be "
            f"{office_formats.accepted()}",
        )
    return kind.content_type


def _file_type(filename: str, given: str, data: bytes, settings: Settings) -> str:
    if len(data) > settings.max_asset_bytes:
        raise asset_too_large(f"The file {filename}", settings)
    kind = assets.content_type(given) or assets.type_of_name(filename)
    if kind is None:
        raise unsupported(f"The file {filename}", given)
    return kind


async def _parts(
    reader: MultipartReader, settings: Settings
) -> list[tuple[str | None, str | None, str, bytes]]:
    """Every part as (name, file name, content type, bytes), each read within its limit."""
    found: list[tuple[str | None, str | None, str, bytes]] = []
    total = 0
    refuse = upload_too_large(settings)
    while (part := await reader.next()) is not None:
        if not isinstance(part, BodyPartReader):
            raise _part_problem("", "nested multipart bodies are not read")
        if len(found) == MAX_PARTS:
            raise _part_problem("", f"a job has at most {MAX_PARTS} parts")
        encoding = part.headers.get("Content-Transfer-Encoding", "binary").lower()
        if encoding not in ("binary", "8bit", "7bit"):
            raise _part_problem(part.filename or part.name or "", "send the file as binary")
        data = await read_limited(_chunks(part), settings.max_upload_bytes - total, refuse)
        if part.filename is None and len(data) > settings.max_body_bytes:
            raise part_too_large(part.name, settings)
        total += len(data)
        # Some clients percent-encode file names (a path's "/" too); asset paths have no "%".
        filename = unquote(part.filename) if part.filename is not None else None
        found.append((part.name, filename, part.headers.get("Content-Type", ""), data))
    return found
