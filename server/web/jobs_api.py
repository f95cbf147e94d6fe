"""The jobs API: submit, get (with long-poll), list, cancel, retry, download, and tokens."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from typing import Any
from urllib.parse import urlsplit

import asyncpg
from aiohttp import web

from server import tracing
from server.access import signing
from server.delivery import webhooks
from server.events import JobEvent, streams
from server.events.hub import Subscription, etag, etag_matches
from server.keys import (
    ASSET_CACHE,
    AUTH,
    GROUP_COMMIT,
    HUB,
    IN_FLIGHT,
    METRICS,
    POOL,
    SETTINGS,
    STORAGE,
    TENANT_DEFAULTS,
)
from server.pipeline import vault
from server.problems import Problem, not_found
from server.queue import admission, jobs, listing
from server.queue.jobs import JobState, StoredJob
from server.render import sources, templates
from server.schemas.common import MAX_TEMPLATE_BYTES
from server.schemas.jobs import JobRequest, JobWaitQuery
from server.schemas.listing import JobBulkRequest, JobCountsQuery, JobListQuery, encode_cursor
from server.schemas.streams import TokenRequest
from server.web import auth, files, present, submission, uploads
from server.web.common import (
    checks,
    json_response,
    optional_body,
    parse_job_id,
    query_of,
    read_json,
    tenant_of,
    validated,
)

log = logging.getLogger(__name__)

routes = web.RouteTableDef()


@routes.post("/v1/jobs")
@tracing.traced
async def submit(request: web.Request) -> web.Response:
    """A job from its JSON body, or from a multipart/form-data body whose files become assets
    (stored once the job is valid, before it is inserted: its render may start at once)."""
    settings = request.app[SETTINGS]
    multipart = None
    if request.content_type == "multipart/form-data":
        multipart = await uploads.read_multipart(request)
        raw: Any = multipart.body
    else:
        raw = await read_json(request)
    key = admission.idempotency_key(request.headers.get("Idempotency-Key"))
    if isinstance(raw, dict):
        await templates.warm([raw.get("template")], max_bytes=MAX_TEMPLATE_BYTES)
    pool, tenant = request.app[POOL], tenant_of(request)
    stored = await submission.templates_named(pool, tenant, [raw])
    pending = multipart.uploads if multipart else ()
    found = await submission.assets_named(pool, tenant, [raw], stored.values(), pending)
    named = checks(request, stored, found)
    valid = validated(JobRequest, raw, named)
    await submission.check_invoices(request.app[ASSET_CACHE], tenant, [valid], pending)
    await submission.check_pdfs(request.app[ASSET_CACHE], tenant, [valid], pending)
    await submission.check_docx(request.app[ASSET_CACHE], tenant, [valid], named, pending)
    cache_default = request.app[TENANT_DEFAULTS].render_cache(tenant)
    new = submission.new_job(valid, tenant, named, cache_default=cache_default)
    if multipart is not None and multipart.uploads:
        await uploads.store(
            pool,
            request.app[STORAGE],
            tenant,
            multipart.uploads,
            max_total_bytes=settings.tenant_max_asset_bytes,
        )
    if key is not None:
        fingerprint = admission.request_hash(vault.fingerprinted(raw, secret=settings.secret))
        new = dataclasses.replace(new, idempotency_key=key, request_hash=fingerprint)
    admitted = await admission.submit(
        request.app[POOL],
        new,
        max_in_flight=settings.tenant_max_inflight,
        insert=request.app[GROUP_COMMIT].create,
        in_flight=request.app[IN_FLIGHT],
    )
    job = admitted.job
    tracing.annotate(
        {
            tracing.JOB_ID: str(job["id"]),
            tracing.TENANT: new.tenant,
            tracing.TEMPLATE: valid.template_id or new.source,
        }
    )
    if not admitted.replayed:
        cached = job.get("cached_from") is not None
        if new.cache_key is not None:
            request.app[METRICS].render_cache.labels(result="hit" if cached else "miss").inc()
        message = "job served from the render cache" if cached else "job queued"
        log.info(message, extra={"job_id": job["id"], "tenant": new.tenant})
    body = await present.present(request, job, new.tenant)
    if request.get(auth.VIA) == auth.VIA_KEY:
        # Browsers must not hold the API key; this token opens this job's stream only.
        token, _ = signing.make_token(
            await request.app[AUTH].signing_secret(new.tenant),
            new.tenant,
            signing.Scope(job_id=str(job["id"])),
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
    """A short-lived subscription token for EventSource and Socket.IO (no API key in browsers):
    for the tenant's streams, one job's or those of 1-20 channels, signed with the tenant's
    secret."""
    settings = request.app[SETTINGS]
    tenant = tenant_of(request)
    asked = validated(TokenRequest, await optional_body(request), checks(request))
    if asked.scope == signing.DASHBOARD:
        return await _dashboard_token(request, asked)
    if asked.job_id is not None and await jobs.get(request.app[POOL], asked.job_id, tenant) is None:
        raise not_found()
    scope = signing.Scope(
        job_id=None if asked.job_id is None else str(asked.job_id), channels=asked.scope_channels
    )
    ttl_s = asked.lifetime_s(settings.token_ttl_s)
    dashboard = request.get(auth.CLAIMS)
    if dashboard is not None:
        # Asked with a dashboard token: it outlives the token it was asked with by nothing.
        ttl_s = max(1, min(ttl_s, dashboard.expires_at - int(time.time())))
    token, expires_at = signing.make_token(
        await request.app[AUTH].signing_secret(tenant),
        tenant,
        scope,
        key_id=auth.key_id_of(request),
        ttl_s=ttl_s,
    )
    return json_response(signing.token_response(token, expires_at))


async def _dashboard_token(request: web.Request, asked: TokenRequest) -> web.Response:
    """A dashboard token for an API key (its session starts now) or, renewed, for a dashboard
    token still valid (the session it started goes on, up to PRESSROOM_DASHBOARD_SESSION_S); in
    dev mode, one that lasts while the server runs open."""
    settings, now = request.app[SETTINGS], int(time.time())
    tenant, renewed = tenant_of(request), request.get(auth.CLAIMS)
    # Renewed: the session goes on; else it starts now (for a key, or in dev mode for none).
    since = now if renewed is None or renewed.since is None else renewed.since
    ends_at = since + settings.dashboard_session_s
    ttl_s = min(asked.lifetime_s(settings.dashboard_token_ttl_s), ends_at - now)
    if ttl_s <= 0:
        raise auth.session_ended()
    secret = signing.dashboard_secret(
        settings.secret, await request.app[AUTH].signing_secret(tenant)
    )
    key_id = auth.key_id_of(request)
    scope = signing.DASHBOARD_SCOPE
    token, expires_at = signing.make_token(
        secret, tenant, scope, key_id=key_id, ttl_s=ttl_s, since=since
    )
    body = signing.token_response(token, expires_at)
    body["renewable_until"] = signing.expiry_text(ends_at)
    return json_response(body)


# Before /v1/jobs/{job_id}: "counts" is not a job id.
@routes.get("/v1/jobs/counts")
async def count_jobs(request: web.Request) -> web.Response:
    """How many of the tenant's jobs match the list's filters (but the state), by state."""
    query = query_of(request, JobCountsQuery)
    counts = await listing.count(request.app[POOL], tenant_of(request), query.matching())
    body: dict[str, int] = {state.value: n for state, n in counts.items()}
    return json_response({**body, "total": sum(counts.values())})


@routes.get("/v1/jobs")
async def list_jobs(request: web.Request) -> web.Response:
    tenant = tenant_of(request)
    query = query_of(request, JobListQuery)
    page = await listing.list_page(
        request.app[POOL],
        tenant,
        query.matching(query.status),
        after=query.cursor,
        limit=query.limit,
    )
    items = []
    for item in page.items:
        shown = await present.present(request, item.stored.job, tenant)
        shown["source"] = _source_label(item)
        items.append(shown)
    cursor = encode_cursor(*page.next_cursor) if page.next_cursor else None
    return json_response({"items": items, "next_cursor": cursor})


#: How the list names a job's source (a stored template's job: name@version; page_url: the
#: page's host instead).
SOURCE_LABELS = {
    sources.TEMPLATE: "Template",
    sources.MARKDOWN: "Markdown",
    sources.OFFICE: "Office",
    sources.DOCX: "Word template",
    sources.PDFS: "PDFs",
}


def _source_label(item: listing.Listed) -> str:
    if item.template is not None:
        return item.template
    if item.page_url is not None:
        return urlsplit(item.page_url).hostname or item.page_url
    return SOURCE_LABELS.get(item.source, item.source)


#: What each bulk action did to a job, as a 503's detail says it.
BULK_DONE = {"retry": "retried", "cancel": "cancelled"}
#: Seconds a client waits before sending an interrupted bulk action again.
BULK_INTERRUPTED_RETRY_S = 1


@routes.post("/v1/jobs/retry")
async def retry_matching(request: web.Request) -> web.Response:
    """Re-queue every failed job that matches the filter in the body (dry_run: count them)."""
    return await _act_on_matching(request, "retry")


@routes.post("/v1/jobs/cancel")
async def cancel_matching(request: web.Request) -> web.Response:
    """Cancel every queued or running job that matches the filter (dry_run: count them)."""
    return await _act_on_matching(request, "cancel")


async def _act_on_matching(request: web.Request, action: str) -> web.Response:
    tenant = tenant_of(request)
    asked = validated(JobBulkRequest, await optional_body(request), checks(request))
    try:
        result = await listing.act_on_matching(
            request.app[POOL], tenant, asked.matching(asked.status), action, dry_run=asked.dry_run
        )
    except listing.BulkInterrupted as stopped:
        log.warning(
            "bulk %s interrupted after %d jobs: %s",
            action,
            stopped.applied,
            type(stopped.__cause__).__name__,
            extra={"tenant": tenant},
        )
        done, n = BULK_DONE[action], stopped.applied
        raise Problem(
            503,
            "Bulk action interrupted",
            f"The bulk {action} was interrupted after {n} {'job' if n == 1 else 'jobs'} {done}: "
            "the database kept aborting a batch for conflicting writes. Send the same request "
            f"again: the jobs already {done} no longer match, so it acts on the others only.",
            kind="bulk-interrupted",
            headers={"Retry-After": str(BULK_INTERRUPTED_RETRY_S)},
        ) from stopped
    if not asked.dry_run:
        log.info(
            "bulk %s: %d of %d matched jobs",
            action,
            result.applied,
            result.matched,
            extra={"tenant": tenant},
        )
    body = {"action": action, "dry_run": asked.dry_run, **dataclasses.asdict(result)}
    return json_response(body)


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
        authenticator.watch(auth.credential_of(request), changes.drop) as key,
    ):
        stored = await jobs.get(request.app[POOL], job_id, tenant)
        auth.check_scope(request, job_id=job_id, channel=stored.job["channel"] if stored else None)
        if stored is None:
            raise not_found()
        reset = None
        if wait_s:
            stored, reset = await _wait_for_change(
                request, stored, changes, wait_s, since, if_none_match
            )
            if key.reason is not None:
                raise auth.revoked(f"The wait ended: {key.reason}.")
    deliveries = await webhooks.summary(request.app[POOL], job_id, tenant)
    tag = _job_etag(stored, deliveries)
    headers = {"ETag": tag, "Cache-Control": "private, no-cache"}
    if if_none_match is not None and etag_matches(if_none_match, tag):
        return web.Response(status=304, headers=headers)
    body = await present.present(request, stored.job, tenant)
    body["webhooks"] = deliveries
    if reset is not None:
        body["reset"] = reset.body()  # `since` could not be resumed from: this is the state
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
    query = query_of(request, JobWaitQuery)
    return query.wait, query.since


async def _wait_for_change(
    request: web.Request,
    stored: StoredJob,
    changes: Subscription,
    wait_s: float,
    since: int | None,
    if_none_match: str | None,
) -> tuple[StoredJob, streams.Reset | None]:
    """The job once it differs from the client's ETag (or has events after `since`; with
    neither, once it next changes), else as it is after wait_s; and the reset when `since`
    cannot be resumed from. Woken by the hub only; a job whose stream has ended (it is final)
    answers at once: nothing more is on its way."""
    pool, tenant, job_id = request.app[POOL], tenant_of(request), parse_job_id(request)
    if if_none_match is not None:
        if await _differs(pool, stored, job_id, tenant, if_none_match):
            return stored, None
        since = None  # the ETag is the client's baseline
    elif since == 0:
        return stored, None  # from the start: the job is news
    begin = await streams.start(pool, tenant=tenant, job_id=job_id, cursor=since, history=False)
    stream = streams.Stream(pool, changes, begin, job=stored.job)
    deadline = asyncio.get_running_loop().time() + wait_s
    while (remaining_s := deadline - asyncio.get_running_loop().time()) > 0:
        item = await stream.next(remaining_s)
        if item is None or isinstance(item, streams.Closed):
            break  # timed out, or shutting down: answer with what is known
        if isinstance(item, streams.Reset):
            return stored, item
        if not isinstance(item, JobEvent):
            return stored, None  # the job's stream has ended
        current = await jobs.get(pool, job_id, tenant)
        if current is None:
            raise not_found()
        if if_none_match is not None and not await _differs(
            pool, current, job_id, tenant, if_none_match
        ):
            continue  # an event this client has already seen the result of
        return current, None
    return stored, None


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
    return json_response(await present.present(request, job, tenant))


@routes.post("/v1/jobs/{job_id}/retry")
async def retry(request: web.Request) -> web.Response:
    tenant = tenant_of(request)
    job_id = parse_job_id(request)
    job = await jobs.retry(request.app[POOL], job_id, tenant)
    if job is None:
        current = await jobs.get(request.app[POOL], job_id, tenant)
        if current is None:
            raise not_found()
        if current.status is JobState.FAILED:
            raise Problem(
                409,
                "Conflict",
                "The job's secrets (cookie and header values, PDF passwords) were erased when "
                "it failed; submit it again.",
            )
        raise Problem(
            409, "Conflict", f"The job is {current.status}; only failed jobs can be retried."
        )
    log.info("job re-queued by request", extra={"job_id": str(job_id), "tenant": tenant})
    return json_response(await present.present(request, job, tenant), status=202)


@routes.get("/v1/jobs/{job_id}/pdf")
async def download(request: web.Request) -> web.StreamResponse:
    """The job's document (its PDF or image): with a signed link or as the job's tenant."""
    return await _serve(request, signing.DOCUMENT)


@routes.get("/v1/jobs/{job_id}/thumbnail")
async def download_thumbnail(request: web.Request) -> web.StreamResponse:
    """The PNG of the PDF's first page, for a job that asked for one (options.thumbnail)."""
    return await _serve(request, signing.THUMBNAIL)


async def _serve(request: web.Request, route: str) -> web.StreamResponse:
    """One file of a job, by its route: with a link signed for that route (no credentials
    needed) or as the job's tenant."""
    job_id = parse_job_id(request)
    tenant = await files.download_tenant(
        request, job_id, route, "SELECT tenant FROM jobs WHERE id = $1"
    )
    stored = await jobs.get(request.app[POOL], job_id, tenant)
    if stored is None:
        raise not_found()
    job = stored.job
    kept = jobs.job_files(tenant, job["id"], job["attempts"], job["options"])
    file = next((file for file in kept if file.route == route), None)
    if file is None:
        raise Problem(
            404, "Not Found", "The job has no thumbnail: it asked for none (options.thumbnail)."
        )
    if stored.status != JobState.DONE or stored.object_key is None:
        raise Problem(
            409, "Conflict", f"The job is {stored.status}; its files exist once it is done."
        )
    # The row names the document it recorded done; a thumbnail lies beside it.
    return await files.serve_file(
        request,
        stored.object_key if route == signing.DOCUMENT else file.key,
        subject_id=str(job_id),
        filename=file.filename,
        route=route,
        content_type=file.output.content_type,
    )
