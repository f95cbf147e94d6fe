"""REST routes and Server-Sent Events."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as dt
import logging
import math
import uuid
from typing import Any

import asyncpg
from aiohttp import web

from server import (
    admission,
    auth,
    jobs,
    jsontext,
    library,
    options,
    signing,
    streams,
    templates,
    webhooks,
)
from server.events import JobEvent
from server.http_common import json_response, read_json, tenant_of
from server.hub import Subscription, etag, etag_matches
from server.jobs import JobState, NewJob, StoredJob
from server.keys import AUTH, GROUP_COMMIT, HUB, IN_FLIGHT, POLICY, POOL, SETTINGS, STORAGE
from server.problems import Problem, invalid, not_found

log = logging.getLogger(__name__)

JOB_FIELDS = {
    "template",
    "template_id",
    "data",
    "options",
    "webhook_url",
    "priority",
    "run_at",
    "metadata",
    "max_attempts",
}
MAX_METADATA_BYTES = 16 * 1024
MAX_LIST_LIMIT = 200
MAX_WAIT_S = 60

routes = web.RouteTableDef()


def parse_job_id(request: web.Request) -> uuid.UUID:
    try:
        return uuid.UUID(request.match_info["job_id"])
    except ValueError:
        raise not_found() from None


def validate_job(
    body: Any, request: web.Request, stored: library.StoredTemplate | None = None
) -> NewJob:
    """Check a submission field by field; every problem found is reported at once.
    `stored` is the template its template_id names (library.lookup), if any."""
    settings = request.app[SETTINGS]
    if not isinstance(body, dict):
        raise invalid([("", "the body must be a JSON object")])
    errors: list[tuple[str, str]] = [
        (key, "is not a known field") for key in body if key not in JOB_FIELDS
    ]

    template: Any = body.get("template")
    raw_options: Any = body.get("options")
    if "template_id" in body:
        template, raw_options = library.resolve(body, stored, errors)
    if template is None:
        if "template_id" not in body:
            errors.append(("template", "is required"))
    elif not isinstance(template, str):
        errors.append(("template", "must be a string"))
    elif len(template.encode()) > settings.max_template_bytes:
        errors.append(("template", f"must be at most {settings.max_template_bytes} bytes"))
    elif (syntax := templates.check(template)) is not None:
        errors.append(("template", syntax))

    data = body.get("data", {})
    if not isinstance(data, dict):
        errors.append(("data", "must be an object"))
    elif jsontext.size(data) > settings.max_data_bytes:
        errors.append(("data", f"must be at most {settings.max_data_bytes} bytes as JSON"))

    metadata = body.get("metadata", {})
    if not isinstance(metadata, dict):
        errors.append(("metadata", "must be an object"))
    elif jsontext.size(metadata) > MAX_METADATA_BYTES:
        errors.append(("metadata", f"must be at most {MAX_METADATA_BYTES} bytes as JSON"))

    render_options = options.RenderOptions()
    try:
        render_options = options.parse(raw_options)
    except options.OptionsError as exc:
        errors.extend(exc.errors)

    webhook_url = body.get("webhook_url")
    if webhook_url is not None:
        if not isinstance(webhook_url, str):
            errors.append(("webhook_url", "must be a string"))
        elif (why := request.app[POLICY].validate_webhook_url(webhook_url)) is not None:
            errors.append(("webhook_url", why))

    priority = body.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int) or not -1000 <= priority <= 1000:
        errors.append(("priority", "must be an integer from -1000 to 1000"))

    max_attempts = body.get("max_attempts", settings.max_attempts)
    if (
        isinstance(max_attempts, bool)
        or not isinstance(max_attempts, int)
        or not 1 <= max_attempts <= 25
    ):
        errors.append(("max_attempts", "must be an integer from 1 to 25"))

    run_at = None
    if body.get("run_at") is not None:
        run_at = _parse_time(body["run_at"])
        if run_at is None:
            errors.append(("run_at", "must be an ISO 8601 time with a time zone"))

    if errors:
        raise invalid(errors)
    return NewJob(
        tenant=tenant_of(request),
        template=template,
        data=data,
        options=options.to_json(render_options),
        metadata=metadata,
        max_attempts=max_attempts,
        priority=priority,
        webhook_url=webhook_url,
        run_at=run_at,
    )


def _parse_time(value: Any) -> dt.datetime | None:
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def links(request: web.Request | None, job_id: str) -> dict[str, str]:
    return {
        "self": f"/v1/jobs/{job_id}",
        "events": f"/v1/jobs/{job_id}/events",
        "pdf": f"/v1/jobs/{job_id}/pdf",
    }


async def present(request: web.Request, job: dict[str, Any], tenant: str) -> dict[str, Any]:
    """The job as clients see it: links, and a signed download URL once it is done."""
    return await present_job(request.app, job, tenant, auth.key_id_of(request))


async def present_job(
    app: web.Application, job: dict[str, Any], tenant: str, minted_by: int
) -> dict[str, Any]:
    """`present` without a request (Socket.IO). A local download URL is made absolute with
    PRESSROOM_PUBLIC_URL, never with the request's Host, which the client chooses, and names
    the key `minted_by` (it stops working when that key is revoked)."""
    shown = dict(job)
    shown["links"] = links(None, job["id"])
    if job["status"] == JobState.DONE:
        settings = app[SETTINGS]
        key = jobs.object_key(tenant, job["id"], job["attempts"])
        url = await app[STORAGE].url(
            key,
            job_id=job["id"],
            filename=f"{job['id']}.pdf",
            ttl_s=settings.url_ttl_s,
            minted_by=minted_by,
        )
        shown["url"] = settings.public_base_url + url if url.startswith("/") else url
    return shown


@routes.post("/v1/jobs")
async def submit(request: web.Request) -> web.Response:
    settings = request.app[SETTINGS]
    raw = await read_json(request)
    key = admission.idempotency_key(request.headers.get("Idempotency-Key"))
    if isinstance(raw, dict):
        await templates.warm([raw.get("template")], max_bytes=settings.max_template_bytes)
    new = validate_job(raw, request, await library.lookup(request, raw))
    if key is not None:
        fingerprint = admission.request_hash(raw)
        new = dataclasses.replace(new, idempotency_key=key, request_hash=fingerprint)
    admitted = await admission.submit(
        request.app[POOL],
        new,
        max_in_flight=settings.tenant_max_inflight,
        key_ttl_s=settings.idempotency_ttl_s,
        insert=request.app[GROUP_COMMIT].create,
        in_flight=request.app[IN_FLIGHT],
    )
    job = admitted.job
    if not admitted.replayed:
        log.info("job queued", extra={"job_id": job["id"], "tenant": new.tenant})
    body = await present(request, job, new.tenant)
    if request.get(auth.VIA) == auth.VIA_KEY:
        # Browsers must not hold the API key; this token opens this job's stream only.
        token, _ = signing.make_token(
            settings.secret,
            new.tenant,
            job_id=job["id"],
            key_id=auth.key_id_of(request),
            ttl_s=settings.token_ttl_s,
        )
        body["links"]["events"] += f"?token={token}"
    headers = {"Location": body["links"]["self"]}
    if admitted.replayed:
        headers["Idempotent-Replayed"] = "true"
    return json_response(body, status=200 if admitted.replayed else 202, headers=headers)


@routes.post("/v1/tokens")
async def issue_token(request: web.Request) -> web.Response:
    """A short-lived subscription token for EventSource and Socket.IO (no API key in browsers)."""
    settings = request.app[SETTINGS]
    tenant = tenant_of(request)
    body = await read_json(request) if request.can_read_body else {}
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise invalid([("", "the body must be a JSON object")])
    errors = [(key, "is not a known field") for key in body if key != "job_id"]
    job_id = body.get("job_id")
    if job_id is not None:
        try:
            job_id = uuid.UUID(job_id) if isinstance(job_id, str) else None
        except ValueError:
            job_id = None
        if job_id is None:
            errors.append(("job_id", "must be a job id (UUID)"))
    if errors:
        raise invalid(errors)
    if job_id is not None and await jobs.get(request.app[POOL], job_id, tenant) is None:
        raise not_found()
    token, expires_at = signing.make_token(
        settings.secret,
        tenant,
        job_id=job_id,
        key_id=auth.key_id_of(request),
        ttl_s=settings.token_ttl_s,
    )
    return json_response(signing.token_response(token, expires_at))


@routes.get("/v1/jobs/{job_id}")
async def get_job(request: web.Request) -> web.Response:
    """The job, with an ETag; `?wait=S` holds the answer until it changes (long-poll)."""
    tenant = tenant_of(request)
    job_id = parse_job_id(request)
    wait_s, since = _long_poll_params(request)
    if_none_match = request.headers.get("If-None-Match")
    # Subscribe before reading, so a change committed in between still wakes the poll.
    # A revoked key ends the wait, answered with 401.
    hub, authenticator = request.app[HUB], request.app[AUTH]
    with (
        hub.subscription(tenant=tenant, job_id=job_id, transport="longpoll") as changes,
        authenticator.watch(auth.key_id_of(request), changes.drop) as key,
    ):
        stored = await jobs.get(request.app[POOL], job_id, tenant)
        if stored is None:
            raise not_found()
        if wait_s:
            stored = await _wait_for_change(request, stored, changes, wait_s, since, if_none_match)
            if key.revoked:
                raise auth.revoked()
    deliveries = await webhooks.summary(request.app[POOL], job_id, tenant)
    tag = _job_etag(stored, deliveries)
    headers = {"ETag": tag, "Cache-Control": "private, no-cache"}
    if if_none_match is not None and etag_matches(if_none_match, tag):
        return web.Response(status=304, headers=headers)
    body = await present(request, stored.job, tenant)
    body["webhooks"] = deliveries
    return json_response(body, headers=headers)


def _job_etag(stored: StoredJob, deliveries: list[dict[str, Any]]) -> str:
    """The validator of what GET /v1/jobs/{id} shows: the job and its webhook deliveries."""
    return etag({**stored.job, "webhooks": deliveries})


async def _differs(
    pool: asyncpg.Pool, stored: StoredJob, job_id: uuid.UUID, tenant: str, if_none_match: str
) -> bool:
    """Whether what GET shows now differs from what the client's ETag stands for."""
    deliveries = await webhooks.summary(pool, job_id, tenant)
    return not etag_matches(if_none_match, _job_etag(stored, deliveries))


def _long_poll_params(request: web.Request) -> tuple[float | None, int | None]:
    errors: list[tuple[str, str]] = []
    wait_s = None
    if "wait" in request.query:
        try:
            wait_s = float(request.query["wait"])
        except ValueError:
            wait_s = math.nan
        if not 0 <= wait_s <= MAX_WAIT_S:  # NaN fails too
            errors.append(("wait", f"must be a number of seconds from 0 to {MAX_WAIT_S}"))
    since = None
    if "since" in request.query:
        if (parsed := event_id(request.query["since"])) is not None:
            since = parsed
        else:
            errors.append(("since", "must be an event id"))
    if errors:
        raise invalid(errors, "The query parameters are not valid.")
    return wait_s, since


async def _wait_for_change(
    request: web.Request,
    stored: StoredJob,
    changes: Subscription,
    wait_s: float,
    since: int | None,
    if_none_match: str | None,
) -> StoredJob:
    """The job once it differs from the client's ETag (or has events after `since`; with
    neither, once it next changes), else as it is after wait_s. Woken by the hub only; a job
    whose stream has ended (it is final) answers at once: nothing more is on its way."""
    pool, tenant, job_id = request.app[POOL], tenant_of(request), parse_job_id(request)
    if if_none_match is not None:
        if await _differs(pool, stored, job_id, tenant, if_none_match):
            return stored
        since = None  # the ETag is the client's baseline
    elif since == 0:
        return stored  # from the start: the job is news
    begin = await streams.start(pool, tenant=tenant, job_id=job_id, cursor=since, history=False)
    stream = streams.Stream(pool, changes, begin, job=stored.job)
    deadline = asyncio.get_running_loop().time() + wait_s
    while (remaining_s := deadline - asyncio.get_running_loop().time()) > 0:
        item = await stream.next(remaining_s)
        if item is None or isinstance(item, streams.Closed):
            break  # timed out, or shutting down: answer with what is known
        if not isinstance(item, JobEvent):
            return stored  # a cursor no longer kept (reset), or the job's stream has ended
        current = await jobs.get(pool, job_id, tenant)
        if current is None:
            raise not_found()
        if if_none_match is not None and not await _differs(
            pool, current, job_id, tenant, if_none_match
        ):
            continue  # an event this client has already seen the result of
        return current
    return stored


@routes.get("/v1/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    tenant = tenant_of(request)
    query = request.query
    errors: list[tuple[str, str]] = []
    status = None
    if "status" in query:
        try:
            status = JobState(query["status"])
        except ValueError:
            errors.append(("status", f"must be one of {', '.join(s.value for s in JobState)}"))
    limit = 50
    if "limit" in query:
        if not _ascii_digits(query["limit"]) or not 1 <= int(query["limit"]) <= MAX_LIST_LIMIT:
            errors.append(("limit", f"must be an integer from 1 to {MAX_LIST_LIMIT}"))
        else:
            limit = int(query["limit"])
    bounds: dict[str, dt.datetime | None] = {}
    for name in ("created_from", "created_to"):
        bounds[name] = _parse_time(query[name]) if name in query else None
        if name in query and bounds[name] is None:
            errors.append((name, "must be an ISO 8601 time with a time zone"))
    after = None
    if "cursor" in query:
        after = _decode_cursor(query["cursor"])
        if after is None:
            errors.append(("cursor", "is not a cursor this server gave out"))
    if errors:
        raise invalid(errors, "The query parameters are not valid.")
    page = await jobs.list_page(
        request.app[POOL],
        tenant,
        status=status,
        created_from=bounds["created_from"],
        created_to=bounds["created_to"],
        after=after,
        limit=limit,
    )
    items = [await present(request, item.job, tenant) for item in page.items]
    cursor = _encode_cursor(*page.next_cursor) if page.next_cursor else None
    return json_response({"items": items, "next_cursor": cursor})


def _encode_cursor(created_at: dt.datetime, job_id: uuid.UUID) -> str:
    return f"{created_at.isoformat()}~{job_id}"


def _decode_cursor(raw: str) -> tuple[dt.datetime, uuid.UUID] | None:
    created, _, job_id = raw.partition("~")
    parsed = _parse_time(created)
    try:
        return (parsed, uuid.UUID(job_id)) if parsed else None
    except ValueError:
        return None


@routes.post("/v1/jobs/{job_id}/cancel")
async def cancel(request: web.Request) -> web.Response:
    tenant = tenant_of(request)
    job_id = parse_job_id(request)
    job = await jobs.cancel(request.app[POOL], job_id, tenant)
    if job is None:
        current = await jobs.get(request.app[POOL], job_id, tenant)
        if current is None:
            raise not_found()
        raise Problem(
            409,
            "Conflict",
            f"The job is {current.status}; only queued or running jobs can be cancelled.",
        )
    log.info("job cancelled", extra={"job_id": str(job_id), "tenant": tenant})
    return json_response(await present(request, job, tenant))


@routes.post("/v1/jobs/{job_id}/retry")
async def retry(request: web.Request) -> web.Response:
    tenant = tenant_of(request)
    job_id = parse_job_id(request)
    job = await jobs.retry(request.app[POOL], job_id, tenant)
    if job is None:
        current = await jobs.get(request.app[POOL], job_id, tenant)
        if current is None:
            raise not_found()
        raise Problem(
            409, "Conflict", f"The job is {current.status}; only failed jobs can be retried."
        )
    log.info("job re-queued by request", extra={"job_id": str(job_id), "tenant": tenant})
    return json_response(await present(request, job, tenant), status=202)


@routes.get("/v1/jobs/{job_id}/pdf")
async def download(request: web.Request) -> web.StreamResponse:
    """The PDF: with a signed link (no credentials needed) or as the job's tenant."""
    settings = request.app[SETTINGS]
    storage = request.app[STORAGE]
    job_id = parse_job_id(request)
    if "sig" in request.query or "expires" in request.query:
        minted_by = signing.check_download(
            settings.secret,
            str(job_id),
            request.query.get("expires", ""),
            request.query.get("key", ""),
            request.query.get("sig", ""),
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
        row = await request.app[POOL].fetchrow("SELECT tenant FROM jobs WHERE id = $1", job_id)
        if row is None:
            raise not_found()
        tenant = row["tenant"]
    else:
        tenant = tenant_of(request)
    stored = await jobs.get(request.app[POOL], job_id, tenant)
    if stored is None:
        raise not_found()
    if stored.status != JobState.DONE or stored.object_key is None:
        raise Problem(
            409, "Conflict", f"The job is {stored.status}; the PDF exists once it is done."
        )
    filename = f"{job_id}.pdf"
    if storage.redirects:
        url = await storage.url(
            stored.object_key,
            job_id=str(job_id),
            filename=filename,
            ttl_s=settings.url_ttl_s,
            minted_by=auth.key_id_of(request),
        )
        raise web.HTTPFound(url)
    try:
        data = await storage.get(stored.object_key)
    except FileNotFoundError:
        raise Problem(410, "Gone", "The file has been deleted (retention).") from None
    return web.Response(
        body=data,
        content_type="application/pdf",
        headers={
            "Content-Disposition": f'inline; filename="{filename}"',
            "Cache-Control": "private, max-age=60",
        },
    )


# --- event ids and the payload every stream sends -----------------------------------------


MAX_EVENT_ID = 2**63 - 1  # bigint


def _ascii_digits(raw: str) -> bool:
    # str.isdigit() also accepts "²" and other digits int() refuses.
    return raw.isascii() and raw.isdigit() and len(raw) <= 19


def event_id(raw: str) -> int | None:
    """An event id from a header or query parameter, None when it cannot be one."""
    if not _ascii_digits(raw) or int(raw) > MAX_EVENT_ID:
        return None
    return int(raw)


async def event_wire(app: web.Application, event: JobEvent, minted_by: int) -> dict[str, Any]:
    """What every transport sends for an event: a job event carries the job as presented
    (links, signed URL); a batch event (batch.progress, batch.done) carries the batch."""
    wire = event.wire()
    if event.type.startswith("batch."):
        wire["batch"] = wire.pop("job")
    else:
        wire["job"] = await present_job(app, event.job, event.tenant, minted_by)
    return wire
