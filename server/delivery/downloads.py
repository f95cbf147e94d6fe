"""A job's links and signed download URLs, as every route, stream and webhook shows them: the
document (`url`, links.pdf) and, when the job asked for one, its thumbnail (`thumbnail_url`,
links.thumbnail); and a batch's combined PDF (`combined.url`) the same way."""

from __future__ import annotations

from typing import Any

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
        url = await storage.url(
            file.key,
            job_id=job["id"],
            filename=file.filename,
            ttl_s=settings.url_ttl_s,
            minted_by=minted_by,
            content_type=file.output.content_type,
            route=file.route,
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
    url = await storage.url(
        combine.object_key(tenant, batch["id"], combined["attempts"]),
        job_id=batch["id"],
        filename=combine.filename(batch["id"]),
        ttl_s=settings.url_ttl_s,
        minted_by=minted_by,
        route=signing.COMBINED,
    )
    return {**batch, "combined": {**combined, "url": _absolute(url, settings)}}


def _absolute(url: str, settings: Settings) -> str:
    return settings.public_base_url + url if url.startswith("/") else url
