"""Server-Sent Events: GET /v1/jobs/{id}/events and GET /v1/events, over server/events/streams.py;
and GET /v1/events?wait=, the same events as one JSON answer for clients that cannot stream.

An idle stream holds its socket, its request and its handler's waiting frames, and nothing that
ticks: one pass for the process (`Streams.keep_alive`) writes the keep-alive comment to every
stream every PING_S and ends those whose client has gone, and live events are
written to each connection in the hub's pass (`_Connection.send_now`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import socket
import sys
from typing import Any

from aiohttp import HttpVersion11, hdrs, web
from multidict import istr

from server import events, jsontext
from server.channels import check_channel
from server.errors import DB_ERRORS
from server.events import JobEvent, streams
from server.events.hub import Subscription
from server.keys import AUTH, HUB, POOL, SSE_STREAMS
from server.problems import invalid, not_found
from server.queue import jobs
from server.schemas.common import event_id
from server.schemas.streams import EventPollQuery
from server.web import auth, present
from server.web.common import json_response, parse_job_id, query_of, tenant_of

log = logging.getLogger(__name__)

routes = web.RouteTableDef()

# Bytes waiting in a connection's buffer past which an event is not written in the hub's pass:
# the stream's task sends it, waiting for the connection to drain (as aiohttp's writer does).
SEND_HIGH_WATER = 64 * 1024
# Named by istr, as aiohttp names its own: multidict keeps a lowercased copy of every str name
# in each response that has one (for as long as the stream lasts), an istr carries its own.
SSE_HEADERS = {
    hdrs.CONTENT_TYPE: "text/event-stream",
    hdrs.CACHE_CONTROL: "no-cache",
    hdrs.CONNECTION: "keep-alive",
    istr("X-Accel-Buffering"): "no",  # nginx: pass every event on at once
}
KEEP_ALIVE = b": ping\r\n\r\n"
#: Seconds between keep-alive comments: under the idle timeouts proxies and load balancers
#: commonly apply (30 to 60 s), so they keep an idle stream open.
PING_S = 15.0
KEEP_ALIVE_CHUNKED = b"%x\r\n%s\r\n" % (len(KEEP_ALIVE), KEEP_ALIVE)
# Streams kept alive between two turns of the loop: a pass over tens of thousands of streams
# must not hold events up for its whole length.
KEEP_ALIVE_SLICE = 1000
# As aiohttp-sse did for its own writes: a client that takes nothing for this long is dropped.
SEND_TIMEOUT_S = 120
CLIENT_GONE = "the client went away"


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


async def frame(app: web.Application, event: JobEvent, key_id: int) -> bytes:
    """The event's SSE frame for streams whose download links name key `key_id`: built once
    per process (JobEvent.encoded), with its chunked form, and written as it is by every
    stream."""
    cached = f"sse {key_id}"
    encoded = event.encoded.get(cached)
    if encoded is None:
        data = jsontext.dumps(await present.event_wire(app, event, key_id))
        encoded = f"id: {event.id}\r\nevent: {event.type}\r\ndata: {data}\r\n\r\n".encode()
        event.encoded[cached] = encoded
        event.encoded[f"{cached} chunked"] = b"%x\r\n%s\r\n" % (len(encoded), encoded)
    return encoded


class _Connection:
    """One open stream as the hub's pass and the keep-alive pass see it (see streams.Sink):
    its socket, its framing (HTTP/1.1 streams are chunked, as aiohttp decides for a stream),
    and its subscription, which the keep-alive pass drops once the client has gone."""

    __slots__ = ("_cached", "_ping", "_transport", "sub")

    def __init__(self, request: web.Request, sub: Subscription, key_id: int) -> None:
        self._transport = request.transport
        chunked = request.version >= HttpVersion11
        # Interned: every stream of a key names the same string, not a copy of its own.
        self._cached = sys.intern(f"sse {key_id}" + (" chunked" if chunked else ""))
        self._ping = KEEP_ALIVE_CHUNKED if chunked else KEEP_ALIVE
        self.sub = sub

    def send_now(self, event: JobEvent) -> bool:
        encoded = event.encoded.get(self._cached)
        transport = self._transport
        if (
            encoded is None
            or transport is None
            or transport.is_closing()
            or transport.get_write_buffer_size() >= SEND_HIGH_WATER
        ):
            return False  # the stream's task sends it, waiting for the connection to drain
        transport.write(encoded)
        return True

    def keep_alive(self) -> None:
        """The keep-alive comment, unless bytes are waiting to go out already; a stream whose
        client has gone is ended (its handler waits without a timer of its own)."""
        transport = self._transport
        if transport is None or transport.is_closing():
            self.sub.drop(CLIENT_GONE)
        elif transport.get_write_buffer_size() < SEND_HIGH_WATER:
            transport.write(self._ping)


class Streams:
    """This process's SSE streams: kept alive and ended at shutdown; and the download-link keys
    they show, by tenant, so that the hub's pass encodes each event once per key in use."""

    def __init__(self, app: web.Application) -> None:
        self._app = app
        self.open: set[_Connection] = set()
        self._keys: dict[str, collections.Counter[int]] = {}

    def hold(self, conn: _Connection, tenant: str, key_id: int) -> None:
        self.open.add(conn)
        self._keys.setdefault(tenant, collections.Counter())[key_id] += 1

    def release(self, conn: _Connection, tenant: str, key_id: int) -> None:
        self.open.discard(conn)
        keys = self._keys.get(tenant)
        if keys is not None:
            keys[key_id] -= 1
            if keys[key_id] <= 0:
                del keys[key_id]
                if not keys:
                    del self._keys[tenant]

    async def encode(self, event: JobEvent) -> None:
        """Hub encoder: the event's frame for every key its tenant's streams show."""
        for key_id in list(self._keys.get(event.tenant, ())):
            await frame(self._app, event, key_id)

    async def keep_alive(self) -> None:
        """Every PING_S, the same keep-alive bytes to every open stream, in one pass for
        the process where each stream had a task and a timer of its own; a turn of the loop
        every KEEP_ALIVE_SLICE streams lets events through meanwhile."""
        while True:
            await asyncio.sleep(PING_S)
            for n, conn in enumerate(list(self.open), 1):
                if conn in self.open:  # not ended during the pass: its response is still open
                    conn.keep_alive()
                if n % KEEP_ALIVE_SLICE == 0:
                    await asyncio.sleep(0)


def _message(event: str, data: str) -> bytes:
    """An SSE message other than a job event (a reset, closed): `data` is one line of JSON."""
    return f"event: {event}\r\ndata: {data}\r\n\r\n".encode()


def _set_send_timeout(request: web.Request) -> None:
    """Have the kernel drop the connection when bytes sent stay unacknowledged SEND_TIMEOUT_S
    (a client gone, or one that stopped reading with its window shut): found without a task
    waiting on a write, as the hub writes while a stream is idle."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, SEND_TIMEOUT_S * 1000)


async def _send(resp: web.StreamResponse, request: web.Request, event: JobEvent) -> None:
    await resp.write(await frame(request.app, event, auth.key_id_of(request)))


async def _send_reset(
    resp: web.StreamResponse, request: web.Request, reset: streams.Reset, tenant: str
) -> None:
    body = reset.body()
    if reset.job is not None:
        body["job"] = await present.present(request, reset.job, tenant)
    await resp.write(_message("reset", json.dumps(body)))


# Events one long-poll answers with at most; the next poll continues from the last.
POLL_MAX_EVENTS = 100


async def _poll(request: web.Request, channel: str | None) -> web.Response:
    """The long-poll of the tenant's (or a channel's) events: what the stream would send after
    the cursor (after now without one), once there is something, or nothing after `wait`."""
    wait_s = query_of(request, EventPollQuery).wait or 0.0
    auth.check_scope(request, job_id=None, channel=channel)
    cursor, types = _requested_cursor(request), _requested_types(request)
    app = request.app
    pool, hub, tenant = app[POOL], app[HUB], tenant_of(request)
    key_id = auth.key_id_of(request)
    # Subscribed before the log is read, so nothing committed in between is missed.
    with (
        hub.subscription(tenant=tenant, channel=channel, transport="longpoll") as sub,
        app[AUTH].watch(auth.credential_of(request), sub.drop) as key,
    ):
        begin = await streams.start(pool, tenant=tenant, job_id=None, cursor=cursor)
        if begin.position is None:
            # From the log's head rather than "live": the answer's cursor then covers the time
            # until the next poll, which a live-only wait would lose.
            begin = streams.Start(await events.head(pool), begin.reset, begin.history)
        stream = streams.Stream(pool, sub, begin, types=types)
        found: list[dict[str, Any]] = []
        timeout_s = wait_s
        while len(found) < POLL_MAX_EVENTS:
            item = await stream.next(timeout_s)
            if isinstance(item, JobEvent):
                found.append(await present.event_wire(app, item, key_id))
            elif isinstance(item, streams.Reset):
                found.append(item.body())
            else:
                break  # the wait is over, or the stream was closed (shutdown, revoked)
            timeout_s = 0  # something came: answer with what is ready now
        if key.reason is not None:
            raise auth.revoked(f"The wait ended: {key.reason}.")
    position = stream.position
    last_event_id = position.id if position is not None else 0
    return json_response({"events": found, "last_event_id": last_event_id})


@routes.get("/v1/jobs/{job_id}/events")
@routes.get("/v1/events")
async def stream_events(request: web.Request) -> web.StreamResponse:
    """A job's stream, a channel's (`?channel=`) or the tenant's: replay what the client
    missed, then go live; no gap, no duplicate (log order). A final job's stream reopened at
    or after its final event answers 204, which stops EventSource's reconnects. The route's
    handler itself, so that an idle stream holds one coroutine frame of its own, not two."""
    job_id = parse_job_id(request) if "job_id" in request.match_info else None
    channel = _requested_channel(request) if job_id is None else None
    if job_id is None and "wait" in request.query:
        return await _poll(request, channel)
    app = request.app
    pool, hub = app[POOL], app[HUB]
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
    key_id = auth.key_id_of(request)
    # Held without context managers: each would keep a generator frame alive for as long as
    # the stream lasts, and an idle stream is to cost as little as it can (bench.push).
    sub = hub.subscribe(tenant=tenant, job_id=job_id, channel=channel)
    # A revoked key ends its streams as a slow consumer's end: with a `closed` event.
    watch = app[AUTH].watch(auth.credential_of(request), sub.drop)
    try:
        stream = streams.Stream(pool, sub, begin, types=types, job=current.job if current else None)
        first: streams.Item | None = None
        if current is not None and current.status.final:
            # Nothing waited for: what the log holds after the cursor, or the end already.
            first = await stream.next(0)
            if isinstance(first, streams.End):
                return web.Response(status=204, headers={hdrs.CACHE_CONTROL: "no-cache"})
        resp = web.StreamResponse(headers=SSE_HEADERS)
        _set_send_timeout(request)
        await resp.prepare(request)
        # Encoded for and kept alive from now: events up to here come through its own sends.
        conn = _Connection(request, sub, key_id)
        stream.attach(conn)
        app[SSE_STREAMS].hold(conn, tenant, key_id)
        try:
            while True:
                # No timeout: the keep-alive pass ends the stream when its client has gone.
                item = first if first is not None else await stream.next(None)
                first = None
                if isinstance(item, JobEvent):
                    await _send(resp, request, item)
                elif isinstance(item, streams.Reset):
                    await _send_reset(resp, request, item, tenant)
                elif isinstance(item, streams.Closed):
                    if item.reason != CLIENT_GONE:
                        await resp.write(_message("closed", json.dumps(item.body())))
                    break
                elif isinstance(item, streams.End):
                    break
        except ConnectionError:
            pass  # the client went away
        except DB_ERRORS as exc:
            # The headers are sent; end the stream and let the client resume by event id.
            log.warning("event stream ended, database unavailable: %s", exc)
        finally:
            app[SSE_STREAMS].release(conn, tenant, key_id)
    finally:
        watch.close()
        hub.unsubscribe(sub)
    return resp
