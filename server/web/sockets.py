"""Socket.IO at /socket.io/: the same job events, payloads and ids as SSE, over python-socketio.

Each subscription of a client is its own bounded hub subscription drained by one task over
server/events/streams.py, so every stream is in log order, replay then live, without gap or
duplicate, and a job's ends after its final event, as on SSE; a client that stops
reading is cut off with a reason and resumes by event id. Every process reads the event log
itself (server/events/hub.py), so no Socket.IO message travels between processes.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import socketio
from aiohttp import WSCloseCode, hdrs, web
from engineio import packet as eio_packet
from pydantic import ValidationError

from server import jsontext
from server.access import signing
from server.errors import DB_ERRORS
from server.events import JobEvent, streams
from server.events.hub import (
    INTERNAL,
    SHUTDOWN_REASON,
    UNAVAILABLE,
    Reason,
    SubscriberDropped,
    Subscription,
)
from server.keys import AUTH, CORS, HUB, POOL
from server.problems import Problem, invalid_input, not_found
from server.queue import jobs
from server.schemas.streams import RefreshRequest, SubscribeRequest
from server.web import auth, credentials, present, socket_wire

log = logging.getLogger(__name__)

NAMESPACE = "/"
MAX_SUBSCRIPTIONS = 100
# Packets waiting for a client's transport before its streams stop taking events: past this,
# the hub buffer fills instead, and overflowing it cuts the client off (memory stays bounded).
SEND_HIGH_WATER = 64
# Bytes waiting in a websocket's buffer past which an event is not written in the hub's pass
# (and the stream's own send waits for the connection to drain).
WEBSOCKET_HIGH_WATER = 64 * 1024
BACKPRESSURE_CHECK_S = 1.0
# A client gets this long to take what is queued for it (its `closed` event last) before its
# connection is cut; at shutdown aiohttp no longer reads from clients, so waiting longer is moot.
CLOSE_TIMEOUT_S = 2.0
# Once shutting down, aiohttp reads nothing more, so the client's answer to a close frame
# never arrives: wait only for the frame to go out.
SHUTDOWN_CLOSE_S = 0.5
DB_LOST_REASON = Reason("database unavailable; reconnect and resume by event id", UNAVAILABLE)
INTERNAL_REASON = Reason("internal error; reconnect and resume by event id", INTERNAL)


@dataclasses.dataclass(eq=False, slots=True)
class _Stream:
    key: str
    sub: Subscription
    items: streams.Stream
    # Its pump while it has items to emit; None while parked (see _pump).
    task: asyncio.Task[None] | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class _Websocket:
    handler: asyncio.Task[Any]
    request: web.Request
    ws: web.WebSocketResponse


@dataclasses.dataclass(eq=False, slots=True)
class _Client:
    sid: str
    eio_sid: str
    grant: socket_wire.Grant
    streams: dict[str, _Stream] = dataclasses.field(default_factory=dict)
    closing: bool = False
    key: credentials.Watch | None = None
    # The encoding its events are written in (by the download-link key it shows).
    frame_key: str = ""
    # Its websocket request, when it connected with one (see websocket_transport).
    websocket: web.Request | None = None


class _Sink:
    """Writes a live event's websocket frame straight to the client's connection, in the
    hub's pass (see streams.Sink); a polling client, or one whose connection is backed up, is
    left to the stream's own send."""

    __slots__ = ("_client", "_push")

    def __init__(self, push: PushServer, client: _Client) -> None:
        self._push = push
        self._client = client

    def send_now(self, event: JobEvent) -> bool:
        frame = event.encoded.get(self._client.frame_key)
        if frame is None or self._client.closing:
            return False
        transport = self._push.websocket_transport(self._client)
        if transport is None or transport.get_write_buffer_size() >= WEBSOCKET_HIGH_WATER:
            return False
        transport.write(frame)
        return True


class PushServer:
    """The Socket.IO server of one process: connect, subscribe, unsubscribe, and the pumps."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        # python-socketio's in-process manager: job events come from each process's own hub.
        self.manager = socketio.AsyncManager()
        self.sio = socketio.AsyncServer(
            async_mode="aiohttp",
            client_manager=self.manager,
            logger=False,
            engineio_logger=False,
            # engine.io's own CORS allows this host's origin only; off, server/web/cors.py answers
            # for every route and _connect checks the Origin, with the tenant known.
            cors_allowed_origins=[],
        )
        self.sio.on("connect", socket_wire.refusing_on_error(self._connect))
        self.sio.on("disconnect", self._disconnect)
        self.sio.on("subscribe", socket_wire.answering_on_error("subscribe", self._subscribe))
        self.sio.on("unsubscribe", socket_wire.answering_on_error("unsubscribe", self._unsubscribe))
        self.sio.on("refresh", socket_wire.answering_on_error("refresh", self._refresh))
        self.sio.on("*", socket_wire.unknown_event)
        self.clients: dict[str, _Client] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        # Open websocket transports by handler task, to cut those whose client stops reading.
        self._websockets: dict[asyncio.Task[Any], _Websocket] = {}
        # How many clients show download links of each key, by tenant: what `encode` encodes.
        self._keys: dict[str, collections.Counter[int]] = {}

    # --- lifecycle --------------------------------------------------------------------------

    async def context(self, app: web.Application) -> AsyncIterator[None]:
        """cleanup_ctx step: the hub encodes each event once for this server's clients."""
        app[HUB].add_encoder(self.encode)
        try:
            yield
        finally:
            for task in [*self._tasks, *self._pumps()]:
                task.cancel()
            for task in [*self._tasks, *self._pumps()]:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self.sio.shutdown()

    def _pumps(self) -> list[asyncio.Task[None]]:
        return [
            stream.task
            for client in self.clients.values()
            for stream in client.streams.values()
            if stream.task is not None
        ]

    async def close_all(self, reason: str) -> None:
        """Shutdown: tell every client why, then close transports so clients reconnect
        (to another process) and resume by event id."""
        for client in list(self.clients.values()):
            client.closing = True
            for stream in client.streams.values():
                if stream.task is not None:
                    stream.task.cancel()
            with contextlib.suppress(Exception):
                await self._emit(client, "closed", streams.closed_body(reason))
        if self.sio.eio.sockets:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await self.sio.eio.disconnect()
        # The engine.io goodbye waits for the client to hang up, which aiohttp no longer reads
        # once shutting down: close the websockets from this side.
        await self._cut(list(self._websockets.values()), grace_s=0, close_s=SHUTDOWN_CLOSE_S)

    async def on_response_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """Remember each Socket.IO websocket while its handler runs."""
        handler = asyncio.current_task()
        if (
            handler is not None
            and isinstance(response, web.WebSocketResponse)
            and request.path.startswith("/socket.io")
        ):
            self._websockets[handler] = _Websocket(handler, request, response)
            handler.add_done_callback(self._websockets.pop)

    async def _cut(
        self, transports: list[_Websocket], *, grace_s: float, close_s: float = CLOSE_TIMEOUT_S
    ) -> None:
        """Give clients grace_s to hang up, then close their websockets with "going away";
        drop the connections that do not take even that."""
        pending = [t.handler for t in transports if not t.handler.done()]
        if pending and grace_s > 0:
            await asyncio.wait(pending, timeout=grace_s)
        closing = [
            asyncio.create_task(t.ws.close(code=WSCloseCode.GOING_AWAY))
            for t in transports
            if not t.handler.done()
        ]
        if closing:
            await asyncio.wait(closing, timeout=close_s)
        for t in transports:
            if not t.handler.done() and t.request.transport is not None:
                t.request.transport.abort()
        for task in closing:
            task.cancel()

    async def handle_request(self, request: web.Request) -> web.StreamResponse:
        """Every request to /socket.io/. Websockets decline permessage-deflate, which every
        browser offers: accepted, it gives each connection zlib state of its own (most of what
        a browser's session would cost: docs/decisions/007-idle-stream-memory.md) to squeeze
        engine.io's pings and acks of a few bytes, while events go out as frames written once,
        uncompressed, for all. The handshake sees the request without the offer."""
        if hdrs.SEC_WEBSOCKET_EXTENSIONS in request.headers:
            headers = request.headers.copy()
            del headers[hdrs.SEC_WEBSOCKET_EXTENSIONS]
            request = request.clone(headers=headers)
        # engine.io's own handler, as sio.attach routes it: python-socketio's adds a frame.
        response: web.StreamResponse = await self.sio.eio.handle_request(request)
        return response

    # --- handlers ---------------------------------------------------------------------------

    async def _connect(self, sid: str, environ: dict[str, Any], credentials: Any = None) -> None:
        try:
            grant = await socket_wire.authenticate(environ, credentials)
        except DB_ERRORS as exc:
            log.warning("Socket.IO connect refused, database unavailable: %s", exc)
            raise socketio.exceptions.ConnectionRefusedError(
                "unavailable", {"status": 503, "detail": "Try again shortly."}
            ) from None
        if grant is None:
            raise socketio.exceptions.ConnectionRefusedError(
                "unauthorized",
                {
                    "status": 401,
                    "detail": 'send a valid {"token": …} or {"api_key": …} as the auth payload',
                },
            )
        refused = self.app[CORS].refuses_socket(environ["aiohttp.request"], grant.tenant)
        if refused is not None:
            raise socketio.exceptions.ConnectionRefusedError(
                "origin not allowed", {"status": 403, "detail": refused}
            )
        eio_sid = self.manager.eio_sid_from_sid(sid, NAMESPACE)
        client = self.clients[sid] = _Client(sid, eio_sid, grant)
        self._grant(client, grant)

    def _grant(self, client: _Client, grant: socket_wire.Grant) -> None:
        """Let the client act on `grant` from now on: watched (revocation, its token's
        expiry), and shown download links signed for its key."""
        if client.key is not None:
            client.key.close()
            self._count_key(client.grant, -1)
        client.grant = grant
        client.frame_key = f"sio {grant.key_id} ws"
        client.key = self.app[AUTH].watch(
            grant.credential, lambda reason: self._revoked(client, reason)
        )
        self._count_key(grant, +1)

    def _count_key(self, grant: socket_wire.Grant, change: int) -> None:
        keys = self._keys.setdefault(grant.tenant, collections.Counter())
        keys[grant.key_id] += change
        if keys[grant.key_id] <= 0:
            del keys[grant.key_id]
            if not keys:
                del self._keys[grant.tenant]

    async def _refresh(self, sid: str, data: Any = None) -> dict[str, Any]:
        """A fresh token for what the connection's token opens: the connection, its
        subscriptions and their cursors go on under it, until it expires in turn."""
        client = self.clients.get(sid)
        if client is None or client.closing:
            return socket_wire.error_ack(Problem(409, "Conflict", "The connection is closing."))
        try:
            asked = RefreshRequest.model_validate(data)
        except ValidationError as exc:
            return socket_wire.error_ack(
                invalid_input(exc, "The refresh is not valid.", model=RefreshRequest)
            )
        verified = await self.app[AUTH].verify_token(asked.token)
        if not isinstance(verified, credentials.Verified):
            return socket_wire.error_ack(
                Problem(401, "Unauthorized", verified, kind="unauthorized")
            )
        claims, grant = verified.claims, client.grant
        if grant.credential.expires_at is None:
            detail = "This connection was not opened with a subscription token; nothing expires."
            return socket_wire.error_ack(Problem(409, "Conflict", detail))
        if claims.tenant != grant.tenant or claims.scope != grant.scope:
            detail = f"A refreshed token must open {grant.scope.describe()}, as the last one did."
            return socket_wire.error_ack(Problem(403, "Forbidden", detail, kind="forbidden"))
        self._grant(client, socket_wire.Grant(claims.tenant, claims.scope, verified.credential))
        return {"ok": True, "expires_at": signing.expiry_text(claims.expires_at)}

    async def _disconnect(self, sid: str, _reason: Any = None) -> None:
        client = self.clients.pop(sid, None)
        if client is None:
            return
        client.closing = True
        if client.key is not None:
            client.key.close()
            self._count_key(client.grant, -1)
        for stream in list(client.streams.values()):
            self._end(client, stream)
        socket = self.sio.eio.sockets.get(client.eio_sid)
        if socket is not None and not socket.upgraded:
            # A polling client that hung up leaves its last GET waiting for a packet that
            # engine.io never sends; answer it now, or it holds a handler (and shutdown).
            socket.queue.put_nowait(eio_packet.Packet(eio_packet.NOOP))

    async def _subscribe(self, sid: str, data: Any = None) -> dict[str, Any]:
        client = self.clients.get(sid)
        if client is None or client.closing:
            return socket_wire.error_ack(Problem(409, "Conflict", "The connection is closing."))
        try:
            return await self._start(client, socket_wire.parse_target(data))
        except Problem as problem:
            return socket_wire.error_ack(problem)
        except DB_ERRORS as exc:
            log.warning("Socket.IO subscribe failed, database unavailable: %s", exc)
            return socket_wire.error_ack(Problem(503, "Service unavailable", "Try again shortly."))

    async def _unsubscribe(self, sid: str, data: Any = None) -> dict[str, Any]:
        client = self.clients.get(sid)
        if client is None:
            return socket_wire.error_ack(Problem(409, "Conflict", "The connection is closing."))
        try:
            target = socket_wire.parse_target(data)
        except Problem as problem:
            return socket_wire.error_ack(problem)
        stream = client.streams.get(socket_wire.stream_key(target))
        if stream is not None:
            self._end(client, stream)
        return {"ok": True}

    # --- streams ----------------------------------------------------------------------------

    async def _start(self, client: _Client, target: SubscribeRequest) -> dict[str, Any]:
        pool, tenant = self.app[POOL], client.grant.tenant
        job_id, channel, since = target.job_id, target.channel, target.since
        types = frozenset(target.types) if target.types else None
        scope = client.grant.scope
        current = None
        if job_id is not None:
            current = await jobs.get(pool, job_id, tenant)
            in_channel = current.job["channel"] if current else None
            if not scope.opens(job_id=job_id, channel=in_channel):
                raise auth.forbidden(scope)
            if current is None:
                raise not_found()
        elif not scope.opens(job_id=None, channel=channel):
            raise auth.forbidden(scope)
        key = socket_wire.stream_key(target)
        if key not in client.streams and len(client.streams) >= MAX_SUBSCRIPTIONS:
            raise Problem(
                429,
                "Too many subscriptions",
                f"A connection holds at most {MAX_SUBSCRIPTIONS}; unsubscribe from some first.",
            )
        begin = await streams.start(pool, tenant=tenant, job_id=job_id, cursor=since)
        if client.closing or self.clients.get(client.sid) is not client:
            raise Problem(409, "Conflict", "The connection is closing.")
        previous = client.streams.get(key)
        if previous is not None:
            self._end(client, previous)
        # Subscribe before the replay reads the log, so nothing falls between the two.
        sub = self.app[HUB].subscribe(
            tenant=tenant, job_id=job_id, channel=channel, transport="socketio"
        )
        items = streams.Stream(
            pool,
            sub,
            begin,
            types=types,
            job=current.job if current else None,
            sink=_Sink(self, client),
        )
        stream = _Stream(key, sub, items)
        client.streams[key] = stream
        self._resume(client, stream)
        return {"ok": True}

    def _resume(self, client: _Client, stream: _Stream) -> None:
        """Pump the stream (again, when it was parked), unless it has ended or its client is
        going: nothing more is sent to a client that is cut off."""
        if client.streams.get(stream.key) is stream and not client.closing:
            stream.task = asyncio.create_task(
                self._pump(client, stream), name=f"sio-pump-{client.sid}-{stream.key}"
            )

    def _end(self, client: _Client, stream: _Stream) -> None:
        if client.streams.get(stream.key) is stream:
            del client.streams[stream.key]
        self.app[HUB].unsubscribe(stream.sub)
        if stream.task is not None and stream.task is not asyncio.current_task():
            stream.task.cancel()

    async def _pump(self, client: _Client, stream: _Stream) -> None:
        """Emit the stream's items (server/events/streams.py) until none is due, then park it: an
        idle stream has no task, its live events are written in the hub's pass, and it is
        pumped again when one is not (or it is dropped). Until the job's stream ends
        (silently: the subscription is gone) or the client is cut off."""
        sub, items = stream.sub, stream.items
        wake = functools.partial(self._resume, client, stream)
        parked = False
        try:
            while not (parked := items.park(wake)):
                # No timer: engine.io pings keep an idle client alive, and _end cancels this.
                item = await items.next(None)
                if isinstance(item, JobEvent):
                    await self._send(client, sub, item)
                elif isinstance(item, streams.Reset):
                    body = item.body()
                    if item.job is not None:
                        body["job"] = await present.present_job(
                            self.app, item.job, client.grant.tenant, client.grant.key_id
                        )
                    await self._send_message(client, sub, "reset", body)
                elif isinstance(item, streams.Closed):
                    raise SubscriberDropped(item.reason)
                elif isinstance(item, streams.End):
                    return
            stream.task = None
        except SubscriberDropped as exc:
            self._cut_off(client, exc.reason)
        except DB_ERRORS as exc:
            log.warning("Socket.IO stream ended, database unavailable: %s", exc)
            self._cut_off(client, DB_LOST_REASON)
        except Exception:
            # Left alone, the task would end unseen and the client wait for events forever.
            log.exception("Socket.IO stream failed", extra={"sid": client.sid})
            self._cut_off(client, INTERNAL_REASON)
        finally:
            if not parked:
                self._end(client, stream)

    async def encode(self, event: JobEvent) -> None:
        """Hub encoder: the event's Socket.IO packet and websocket frame, once per download-link
        key that clients of its tenant show, for every one of them to be sent as they are."""
        for key_id in list(self._keys.get(event.tenant, ())):
            await self._packet(event, key_id)

    async def _packet(self, event: JobEvent, key_id: int) -> bytes:
        """The event as a Socket.IO EVENT packet (`2["job",{…}]`), built once per key."""
        cached = f"sio {key_id}"
        packet = event.encoded.get(cached)
        if packet is None:
            wire = await present.event_wire(self.app, event, key_id)
            name = next((n for n in ("batch", "template") if n in wire), "job")
            packet = b"2" + jsontext.dumps([name, wire]).encode()
            event.encoded[cached] = packet
            event.encoded[f"{cached} ws"] = socket_wire.websocket_frame(
                b"4" + packet
            )  # engine.io message
        return packet

    async def _send(self, client: _Client, sub: Subscription, event: JobEvent) -> None:
        packet = await self._packet(event, client.grant.key_id)
        transport = self.websocket_transport(client)
        if transport is not None:
            # As the hub's pass writes them: a websocket's events go out in one order, whichever
            # way each is sent.
            transport.write(event.encoded[f"sio {client.grant.key_id} ws"])
            await self._drain_websocket(client, sub, transport)
        else:
            await self.sio.eio.send(client.eio_sid, packet.decode())
            await self._drain(client, sub)

    async def _send_message(
        self, client: _Client, sub: Subscription, name: str, data: dict[str, Any]
    ) -> None:
        """A stream's message other than an event (a reset), in the order of its events."""
        transport = self.websocket_transport(client)
        if transport is None:
            await self._emit(client, name, data)
            return
        packet = b"2" + jsontext.dumps([name, data]).encode()
        transport.write(socket_wire.websocket_frame(b"4" + packet))
        await self._drain_websocket(client, sub, transport)

    async def _emit(self, client: _Client, name: str, data: dict[str, Any]) -> None:
        # ignore_queue: this client is on this process; other processes read the log themselves.
        await self.sio.emit(name, data, to=client.sid, namespace=NAMESPACE, ignore_queue=True)

    def websocket_transport(self, client: _Client) -> asyncio.Transport | None:
        """The connection of a client that connected over a websocket, while it is open. A
        session that began polling (and may have upgraded since) has None: its events go
        through engine.io's queue, which packets of its polling days may still be in."""
        request = client.websocket
        if request is None:
            first = self.sio.environ.get(client.eio_sid, {}).get("aiohttp.request")
            if first is None or first.query.get("transport") != "websocket":
                return None
            request = client.websocket = first
        transport = request.transport
        if transport is None or transport.is_closing():
            return None
        assert isinstance(transport, asyncio.Transport)
        return transport

    async def _drain_websocket(
        self, client: _Client, sub: Subscription, transport: asyncio.Transport
    ) -> None:
        """Wait while the websocket's buffer is backed up; events wait in the bounded hub
        buffer meanwhile, and overflowing it cuts the client off."""
        assert client.websocket is not None
        while not transport.is_closing() and (
            transport.get_write_buffer_size() >= WEBSOCKET_HIGH_WATER
        ):
            if sub.dropped is not None:
                raise SubscriberDropped(sub.dropped)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(BACKPRESSURE_CHECK_S):
                    await client.websocket.writer.drain()

    async def _drain(self, client: _Client, sub: Subscription) -> None:
        """Wait while the client's transport holds too many packets; events wait in the
        bounded hub buffer meanwhile, and overflowing it cuts the client off."""
        socket = self._transport(client)
        while socket is not None and not socket.closed and socket.queue.qsize() >= SEND_HIGH_WATER:
            if sub.dropped is not None:
                raise SubscriberDropped(sub.dropped)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(BACKPRESSURE_CHECK_S):
                    await socket.queue.join()

    def _transport(self, client: _Client) -> Any:
        eio_sid = self.manager.eio_sid_from_sid(client.sid, NAMESPACE)
        return self.sio.eio.sockets.get(eio_sid) if eio_sid is not None else None

    def _revoked(self, client: _Client, reason: str) -> None:
        """The key the client connected with was revoked: its streams stop at once (nothing
        more is sent), then it gets `closed` and is disconnected."""
        for stream in list(client.streams.values()):
            if stream.task is not None:
                stream.task.cancel()
        self._cut_off(client, reason)

    def _cut_off(self, client: _Client, reason: str) -> None:
        """End this client's connection with a reason it can act on; it reconnects and
        resumes by event id."""
        if client.closing:
            return
        client.closing = True
        log.info("Socket.IO client cut off: %s", reason, extra={"sid": client.sid})
        task = asyncio.create_task(self._close(client, reason), name=f"sio-close-{client.sid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close(self, client: _Client, reason: str) -> None:
        eio_sid = self.manager.eio_sid_from_sid(client.sid, NAMESPACE)
        with contextlib.suppress(Exception):
            await self._emit(client, "closed", streams.closed_body(reason))
        if eio_sid is None:
            return
        # A websocket is either the first request (in environ) or an upgrade naming the sid.
        first = self.sio.environ.get(eio_sid, {}).get("aiohttp.request")
        transports = [
            t
            for t in self._websockets.values()
            if t.request is first or t.request.query.get("sid") == eio_sid
        ]
        # The goodbye waits for the client to take what is queued for it; a client that
        # reads nothing loses its connection instead.
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await self.sio.eio.disconnect(eio_sid)
        except TimeoutError:
            await self._cut(transports, grace_s=0)
        except KeyError:
            pass  # already gone
        else:
            await self._cut(transports, grace_s=CLOSE_TIMEOUT_S)  # unless it hangs up itself


PUSH = web.AppKey("push", PushServer)


def attach(app: web.Application) -> None:
    """Serve Socket.IO at /socket.io/ on this app; call after the hub's cleanup step."""
    push = PushServer(app)
    app[PUSH] = push
    # The methods engine.io's own routes take (sio.attach), through handle_request.
    # OPTIONS is CORS only, which server/web/cors.py answers for every path (engine.io's is off).
    for method in ("GET", "POST"):
        app.router.add_route(method, "/socket.io/", push.handle_request)
    app.on_response_prepare.append(push.on_response_prepare)
    app.cleanup_ctx.append(push.context)


async def close_all(app: web.Application, reason: str = SHUTDOWN_REASON) -> None:
    """on_shutdown: close every Socket.IO connection of this process."""
    if PUSH in app:
        await app[PUSH].close_all(reason)
