"""Server-Sent Events: GET /v1/jobs/{id}/events and GET /v1/events, over server/streams.py."""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from aiohttp import web
from aiohttp_sse import EventSourceResponse, sse_response

from server import api, auth, events, jobs, jsontext, streams
from server.channels import check_channel
from server.errors import DB_ERRORS
from server.events import JobEvent
from server.http_common import tenant_of
from server.keys import AUTH, HUB, POOL, SETTINGS, SSE_STREAMS
from server.models import event_id
from server.problems import invalid, not_found

log = logging.getLogger(__name__)

routes = web.RouteTableDef()


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


def _requested_channel(request: web.Request) -> str | None:
    """`?channel=user-42`: only that channel's job and batch events; None for all."""
    channel = request.query.get("channel")
    if channel is None:
        return None
    if (why := check_channel(channel)) is not None:
        raise invalid([("channel", why)], "The query parameters are not valid.")
    return channel


async def _send(resp: EventSourceResponse, request: web.Request, event: JobEvent) -> None:
    # The whole SSE frame is built once per event and key (download links name the key) and
    # shared by every subscriber of this process: fan-out to thousands of streams is then one
    # write each.
    key_id = auth.key_id_of(request)
    cached = f"sse {key_id}"  # JobEvent.encoded key
    frame = event.encoded.get(cached)
    if frame is None:
        data = jsontext.dumps(await api.event_wire(request.app, event, key_id))
        frame = f"id: {event.id}\r\nevent: {event.type}\r\ndata: {data}\r\n\r\n"
        event.encoded[cached] = frame
    await resp.write(frame.encode())


async def _send_reset(
    resp: EventSourceResponse, request: web.Request, job: dict[str, Any] | None, tenant: str
) -> None:
    body: dict[str, Any] = {"type": "reset", "reason": streams.RESET_REASON}
    if job is not None:
        body["job"] = await api.present(request, job, tenant)
    await resp.send(json.dumps(body), event="reset")


async def stream_events(
    request: web.Request, *, job_id: uuid.UUID | None, channel: str | None = None
) -> web.StreamResponse:
    """Replay what the client missed, then go live; no gap, no duplicate (log order)."""
    app = request.app
    pool, hub, settings = app[POOL], app[HUB], app[SETTINGS]
    tenant = tenant_of(request)
    current = None
    if job_id is not None:
        current = await jobs.get(pool, job_id, tenant)
        in_channel = current.job["channel"] if current else None
        auth.check_scope(request, job_id=job_id, channel=in_channel)
        if current is None:
            raise not_found()
    else:
        auth.check_scope(request, job_id=None, channel=channel)
    cursor = _requested_cursor(request)
    types = _requested_types(request)
    begin = await streams.start(pool, tenant=tenant, job_id=job_id, cursor=cursor)
    # A revoked key ends its streams as a slow consumer's end: with a `closed` event.
    with (
        hub.subscription(tenant=tenant, job_id=job_id, channel=channel) as sub,
        app[AUTH].watch(auth.credential_of(request), sub.drop),
    ):
        stream = streams.Stream(pool, sub, begin, types=types, job=current.job if current else None)
        async with sse_response(request, ping_interval=settings.sse_ping_s) as resp:
            app[SSE_STREAMS].add(resp)
            try:
                while resp.is_connected():
                    item = await stream.next(settings.sse_ping_s)
                    if isinstance(item, JobEvent):
                        await _send(resp, request, item)
                    elif isinstance(item, streams.Reset):
                        await _send_reset(resp, request, item.job, tenant)
                    elif isinstance(item, streams.Closed):
                        body = json.dumps({"type": "closed", "reason": item.reason})
                        await resp.send(body, event="closed")
                        break
                    elif isinstance(item, streams.End):
                        break
            except ConnectionError:
                pass  # the client went away
            except DB_ERRORS as exc:
                # The headers are sent; end the stream and let the client resume by event id.
                log.warning("event stream ended, database unavailable: %s", exc)
            finally:
                app[SSE_STREAMS].discard(resp)
    return resp


@routes.get("/v1/jobs/{job_id}/events")
async def job_events(request: web.Request) -> web.StreamResponse:
    return await stream_events(request, job_id=api.parse_job_id(request))


@routes.get("/v1/events")
async def all_events(request: web.Request) -> web.StreamResponse:
    return await stream_events(request, job_id=None, channel=_requested_channel(request))
