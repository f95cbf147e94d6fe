"""A job's links and signed download URLs, as every route, stream and webhook shows them: the
document (`url`, links.pdf) and, when the job asked for one, its thumbnail (`thumbnail_url`,
links.thumbnail); and a batch's combined PDF (`combined.url`) the same way."""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from server.access import signing
from server.files.storage import Storage
from server.options import outputs
from server.queue import combine, jobs
from server.queue.jobs import JobState
from server.settings import Settings

#: The job field that carries each file's signed URL once the job is done.
URL_FIELDS = {signing.DOCUMENT: "url", signing.THUMBNAIL: "thumbnail_url"}


def links(job_id: str, options: dict[str, Any]) -> dict[str, str]:
    """What can be done with a job, its files' routes included."""
    shown = {
        "self": f"/v1/jobs/{job_id}",
        "events": f"/v1/jobs/{job_id}/events",
        "pdf": f"/v1/jobs/{job_id}/{signing.DOCUMENT}",
    }
    if outputs.wants_thumbnail(options):
        shown["thumbnail"] = f"/v1/jobs/{job_id}/{signing.THUMBNAIL}"
    return shown


async def present(
    job: dict[str, Any], tenant: str, *, storage: Storage, settings: Settings, minted_by: int
) -> dict[str, Any]:
    """The job with its links and, once it is done, a signed URL for each of its files. A local
    download URL is made absolute with PRESSROOM_PUBLIC_URL, never with a request's Host, which
    the client chooses, and names the key `minted_by` (it stops working when that key is
    revoked; signing.NO_KEY for none)."""
    shown = dict(job)
    options = job.get("options") or {}
    shown["links"] = links(job["id"], options)
    if job["status"] != JobState.DONE:
        return shown
    for file in jobs.job_files(tenant, job["id"], job["attempts"], options):
        url = await file_url(
            storage,
            settings,
            file.key,
            subject_id=job["id"],
            filename=file.filename,
            content_type=file.output.content_type,
            route=file.route,
            minted_by=minted_by,
        )
        shown[URL_FIELDS[file.route]] = _absolute(url, settings)
    return shown


async def present_batch(
    batch: dict[str, Any], tenant: str, *, storage: Storage, settings: Settings, minted_by: int
) -> dict[str, Any]:
    """The batch with a signed URL for its combined PDF once that is done, made as a job's."""
    combined = batch.get("combined")
    if not isinstance(combined, dict) or combined.get("status") != "done":
        return batch
    url = await file_url(
        storage,
        settings,
        combine.object_key(tenant, batch["id"], combined["attempts"]),
        subject_id=batch["id"],
        filename=combine.filename(batch["id"]),
        content_type=outputs.PDF.content_type,
        route=signing.COMBINED,
        minted_by=minted_by,
    )
    return {**batch, "combined": {**combined, "url": _absolute(url, settings)}}


async def file_url(
    storage: Storage,
    settings: Settings,
    key: str,
    *,
    subject_id: str,
    filename: str,
    content_type: str,
    route: str,
    minted_by: int,
) -> str:
    """A download URL valid for PRESSROOM_URL_TTL_S: the store's own (a bucket's presigned
    GET), or else the API's `route` for the subject (a job's /pdf or /thumbnail, a batch's
    combined PDF) signed for the API key `minted_by` (signing.NO_KEY for none), relative to
    the API, which stops honouring it when that key is revoked."""
    ttl_s = settings.url_ttl_s
    presigned = await storage.presign(
        key, filename=filename, content_type=content_type, ttl_s=ttl_s
    )
    if presigned is not None:
        return presigned
    expires = int(time.time()) + ttl_s
    signature = signing.sign_download(settings.secret, subject_id, expires, minted_by, route=route)
    query = {"expires": expires, "key": minted_by, "sig": signature}
    return signing.download_path(subject_id, route) + "?" + urlencode(query)


def _absolute(url: str, settings: Settings) -> str:
    return settings.public_base_url + url if url.startswith("/") else url
