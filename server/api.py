"""REST routes and Server-Sent Events."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import re
import uuid
from collections.abc import Mapping
from typing import Any, TypeVar

import asyncpg
from aiohttp import web
from aiohttp_sse import EventSourceResponse, sse_response
from pydantic import BaseModel, ValidationError

from server import (
    admission,
    auth,
    events,
    jobs,
    jsontext,
    library,
    options,
    templates,
    webhooks,
)
from server.events import JobEvent, Position
from server.hub import SubscriberDropped, Subscription, etag, etag_matches
from server.jobs import JobState, NewJob, StoredJob
from server.keys import AUTH, GROUP_COMMIT, HUB, IN_FLIGHT, POLICY, POOL, SETTINGS, STORAGE
from server.models import (
    MAX_EVENT_ID,
    Checks,
    JobListQuery,
    JobRequest,
    JobWaitQuery,
    Ref,
    TokenRequest,
    encode_cursor,
    event_id,
    parse_template_id,
)
from server.problems import DB_ERRORS, Problem, invalid, invalid_input, not_found

__all__ = ["MAX_EVENT_ID", "event_id"]  # the streams read cursors as the models do
M = TypeVar("M", bound=BaseModel)

log = logging.getLogger(__name__)

routes = web.RouteTableDef()


def tenant_of(request: web.Request) -> str:
    """The tenant every query of this request is scoped to."""
    tenant: str = request.get(auth.TENANT, auth.DEV_TENANT)
    return tenant


def parse_job_id(request: web.Request) -> uuid.UUID:
    try:
        return uuid.UUID(request.match_info["job_id"])
    except ValueError:
        raise not_found() from None


async def read_json(request: web.Request) -> Any:
    if request.content_type not in ("application/json", "") and not request.content_type.endswith(
        "+json"
    ):
        raise Problem(415, "Unsupported media type", "Send the body as application/json.")
    raw = await request.read()
    try:
        body = jsontext.loads(raw.decode("utf-8"), parse_constant=_no_constant, parse_float=_finite)
        # NUL and lone surrogates can only arrive as \u escapes: most bodies have none.
        if _SUSPECT_ESCAPE.search(raw):
            _check_text(body)
        return body
    except UnicodeDecodeError:
        raise Problem(
            400, "Malformed body", "The body is not valid UTF-8.", kind="malformed-body"
        ) from None
    except RecursionError:
        raise Problem(
            400, "Malformed body", "The JSON is nested too deeply.", kind="malformed-body"
        ) from None
    except ValueError as exc:
        raise Problem(
            400, "Malformed body", f"The body is not valid JSON: {exc}", kind="malformed-body"
        ) from None


async def optional_body(request: web.Request) -> Any:
    """The JSON body, or {} when there is none."""
    return await read_json(request) if request.can_read_body else {}


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range for a number")
    return value


# \u0000 or \uD800-\uDFFF (an escaped backslash before "u" also matches: then the walk decides).
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")


def _check_text(body: Any) -> None:
    """PostgreSQL stores neither NUL characters nor unpaired surrogates (valid JSON escapes)."""
    pending = [body]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
        elif isinstance(value, str) and ("\x00" in value or not _encodable(value)):
            raise Problem(
                400,
                "Malformed body",
                "Strings must not contain NUL (\\u0000) or unpaired surrogate characters.",
                kind="malformed-body",
            )


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def json_response(body: Any, **kwargs: Any) -> web.Response:
    return web.json_response(body, dumps=jsontext.dumps, **kwargs)


def checks(request: web.Request, stored: Mapping[Ref, Any] | None = None) -> Checks:
    """What the models' validators read from this app (and the stored templates named)."""
    return Checks(request.app[SETTINGS], request.app[POLICY], stored or {})


def validated(model: type[M], body: Any, checks: Checks, detail: str | None = None) -> M:
    """`body` as `model`, or a 422 naming every field it refuses."""
    try:
        return model.model_validate(body, context=checks.context())
    except ValidationError as exc:
        raise invalid_input(exc, *(detail,) if detail else ()) from None


def query_of(request: web.Request, model: type[M]) -> M:
    """The query parameters (the first of each name) as `model`."""
    query = request.query
    params = {name: query[name] for name in query}
    return validated(model, params, checks(request), "The query parameters are not valid.")


def new_job(job: JobRequest, tenant: str, checks: Checks) -> NewJob:
    """The job to insert for a validated request."""
    ref = parse_template_id(job.template_id)
    template = checks.templates[ref].html if ref else job.template
    assert template is not None  # JobRequest requires one of the two
    return NewJob(
        tenant=tenant,
        template=template,
        data=job.data,
        options=options.to_json(job.options) if job.options else {},
        metadata=job.metadata,
        max_attempts=job.max_attempts or checks.settings.max_attempts,
        priority=job.priority,
        webhook_url=job.webhook_url,
        run_at=job.run_at,
    )


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
    named = checks(request, await library.named(request, [raw]))
    new = new_job(validated(JobRequest, raw, named), tenant_of(request), named)
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
        token, _ = auth.make_token(
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
    job_id = validated(TokenRequest, await optional_body(request), checks(request)).job_id
    if job_id is not None and await jobs.get(request.app[POOL], job_id, tenant) is None:
        raise not_found()
    token, expires_at = auth.make_token(
        settings.secret,
        tenant,
        job_id=job_id,
        key_id=auth.key_id_of(request),
        ttl_s=settings.token_ttl_s,
    )
    return json_response(auth.token_response(token, expires_at))


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
    query = query_of(request, JobWaitQuery)
    return query.wait, query.since


async def _wait_for_change(
    request: web.Request,
    stored: StoredJob,
    changes: Subscription,
    wait_s: float,
    since: int | None,
    if_none_match: str | None,
) -> StoredJob:
    """The job once it differs from the client's ETag (or has events after `since`; with
    neither, once it next changes), else as it is after wait_s. Woken by the hub only."""
    pool, tenant, job_id = request.app[POOL], tenant_of(request), parse_job_id(request)
    after: Position | None = None
    if if_none_match is not None:
        if await _differs(pool, stored, job_id, tenant, if_none_match):
            return stored
    elif since is not None:
        cursor = await events.locate(pool, since) if since else None
        if cursor is None or cursor.tenant != tenant:
            return stored  # from the start, or a cursor no longer kept: the job is news
        newer, _held = await events.after(
            pool, cursor.position, limit=1, tenant=tenant, job_id=job_id
        )
        if newer:
            return stored
        after = cursor.position
    elif stored.status.final:
        return stored  # nothing is on its way; do not hold the client for nothing
    deadline = asyncio.get_running_loop().time() + wait_s
    while (remaining_s := deadline - asyncio.get_running_loop().time()) > 0:
        try:
            event = await changes.get(remaining_s)
        except SubscriberDropped:
            break  # shutting down: answer with what is known
        if event is None:
            break
        if after is not None and event.position <= after:
            continue
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
    query = query_of(request, JobListQuery)
    page = await jobs.list_page(
        request.app[POOL],
        tenant,
        status=query.status,
        created_from=query.created_from,
        created_to=query.created_to,
        after=query.cursor,
        limit=query.limit,
    )
    items = [await present(request, item.job, tenant) for item in page.items]
    cursor = encode_cursor(*page.next_cursor) if page.next_cursor else None
    return json_response({"items": items, "next_cursor": cursor})


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
        minted_by = auth.check_download(
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
        if minted_by != auth.NO_KEY and not await request.app[AUTH].key_active(minted_by):
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


# --- Server-Sent Events -------------------------------------------------------------------


def _requested_cursor(request: web.Request) -> int | None:
    raw = request.headers.get("Last-Event-ID") or request.query.get("last_event_id")
    if raw is None or raw == "":
        return None
    parsed = event_id(raw)
    if parsed is None:
        # Refused as the long-poll's `since` and Socket.IO's are: 422, naming the field.
        field = "Last-Event-ID" if request.headers.get("Last-Event-ID") else "last_event_id"
        raise invalid([(field, "must be an event id")], "The event cursor is not valid.")
    return parsed


def _requested_types(request: web.Request) -> frozenset[str] | None:
    """`?type=job.done&type=job.failed` (or `?type=job.done,job.failed`): only events of these
    types; None for all."""
    asked = [
        part.strip() for value in request.query.getall("type", []) for part in value.split(",")
    ]
    if not asked:
        return None
    errors = events.type_errors("type", asked)
    if errors:
        raise invalid(errors, "The query parameters are not valid.")
    return frozenset(asked)


async def event_wire(app: web.Application, event: JobEvent, minted_by: int) -> dict[str, Any]:
    """What every transport sends for an event: a job event carries the job as presented
    (links, signed URL); a batch event (batch.progress, batch.done) carries the batch."""
    wire = event.wire()
    if event.type.startswith("batch."):
        wire["batch"] = wire.pop("job")
    else:
        wire["job"] = await present_job(app, event.job, event.tenant, minted_by)
    return wire


async def _send(resp: EventSourceResponse, request: web.Request, event: JobEvent) -> None:
    # The whole SSE frame is built once per event and key (download links name the key) and
    # shared by every subscriber of this process: fan-out to thousands of streams is then one
    # write each.
    key_id = auth.key_id_of(request)
    cached = f"sse {key_id}"  # JobEvent.encoded key
    frame = event.encoded.get(cached)
    if frame is None:
        data = jsontext.dumps(await event_wire(request.app, event, key_id))
        frame = f"id: {event.id}\r\nevent: {event.type}\r\ndata: {data}\r\n\r\n"
        event.encoded[cached] = frame
    await resp.write(frame.encode())


async def _send_reset(
    resp: EventSourceResponse, request: web.Request, job: dict[str, Any] | None, tenant: str
) -> None:
    body: dict[str, Any] = {
        "type": "reset",
        "reason": "the requested event is no longer kept; reload state",
    }
    if job is not None:
        body["job"] = await present(request, job, tenant)
    await resp.send(json.dumps(body), event="reset")


async def stream_events(request: web.Request, *, job_id: uuid.UUID | None) -> web.StreamResponse:
    """Replay what the client missed, then go live; no gap, no duplicate (log order)."""
    app = request.app
    pool, hub, settings = app[POOL], app[HUB], app[SETTINGS]
    tenant = tenant_of(request)
    current = None
    if job_id is not None:
        current = await jobs.get(pool, job_id, tenant)
        if current is None:
            raise not_found()
    requested = _requested_cursor(request)
    types = _requested_types(request)
    position: Position | None = None
    reset = False
    if requested == 0:
        position = events.START  # "from the beginning of what is kept"
    elif requested is not None:
        cursor = await events.locate(pool, requested)
        if cursor is None or cursor.tenant != tenant:
            reset = True
        else:
            position = cursor.position
    if job_id is not None and position is None:
        position = events.START  # a job stream without a cursor begins with the job's history

    # The log is filtered by type for the all-jobs stream; a job's stream reads all of its few
    # events, since its final one ends the stream whether it is sent or not.
    log_types = types if job_id is None else None
    # A revoked key ends its streams as a slow consumer's end: with a `closed` event.
    with (
        hub.subscription(tenant=tenant, job_id=job_id) as sub,
        app[AUTH].watch(auth.key_id_of(request), sub.drop),
    ):
        async with sse_response(request, ping_interval=settings.sse_ping_s) as resp:
            app[STREAMS_KEY].add(resp)
            try:
                if reset:
                    await _send_reset(resp, request, current.job if current else None, tenant)
                    if job_id is not None:
                        position = events.START
                if position is not None:
                    last_type = None
                    while True:
                        batch, _held = await events.after(
                            pool, position, tenant=tenant, job_id=job_id, types=log_types
                        )
                        for event in batch:
                            if types is None or event.type in types:
                                await _send(resp, request, event)
                            position, last_type = event.position, event.type
                        if len(batch) < events.REPLAY_PAGE:
                            break
                    # A failed job may have been retried since; only the latest event ends it.
                    if job_id is not None and last_type in jobs.TERMINAL_EVENTS:
                        return resp
                while resp.is_connected():
                    try:
                        live = await sub.get(settings.sse_ping_s)
                    except SubscriberDropped as exc:
                        await resp.send(
                            json.dumps({"type": "closed", "reason": str(exc)}), event="closed"
                        )
                        return resp
                    if live is None or (position is not None and live.position <= position):
                        continue
                    if types is None or live.type in types:
                        await _send(resp, request, live)
                    position = live.position
                    if job_id is not None and live.type in jobs.TERMINAL_EVENTS:
                        return resp
            except ConnectionError:
                pass  # the client went away
            except DB_ERRORS as exc:
                # The headers are sent; end the stream and let the client resume by event id.
                log.warning("event stream ended, database unavailable: %s", exc)
            finally:
                app[STREAMS_KEY].discard(resp)
    return resp


STREAMS_KEY = web.AppKey("sse_streams", set[EventSourceResponse])


@routes.get("/v1/jobs/{job_id}/events")
async def job_events(request: web.Request) -> web.StreamResponse:
    return await stream_events(request, job_id=parse_job_id(request))


@routes.get("/v1/events")
async def all_events(request: web.Request) -> web.StreamResponse:
    return await stream_events(request, job_id=None)
