"""The client side of the fan-out benchmark (bench/push.py): many idle subscribers on bare
sockets, in a process of their own, so that the server's figures are the server's.

    python -m bench.fanout --url http://127.0.0.1:8080 --transport sse --count 10000

Each subscriber is an asyncio.Protocol, as light as a client can be: an SSE stream
(`GET /v1/events`) or a Socket.IO session over a websocket (engine.io 4, `subscribe
{"all": true}`, pings answered), framed here by hand. The process talks to the benchmark over
its standard streams, one line each way:

    → ready <connect_s>        every subscriber is connected and subscribed
    ← arm                      the next event is on its way: watch for it
    → armed
    → arrived <monotonic_s> <count>   when every subscriber has it (the last one's time)
    ← quit

Times are time.monotonic(), the same clock in every process of the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import functools
import os
import resource
import struct
import sys
import time
from urllib.parse import urlsplit

CONNECT_BATCH = 200
CONNECT_TIMEOUT_S = 120.0


class Subscriber(asyncio.Protocol):
    """One subscriber: notes when it is ready and when an event arrives."""

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.event: asyncio.Future[float] | None = None
        self.transport: asyncio.Transport | None = None

    def arrived(self) -> None:
        if self.event is not None and not self.event.done():
            self.event.set_result(time.monotonic())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.ready, self.event):
            if future is not None and not future.done():
                future.set_exception(ConnectionError("the subscriber's connection ended"))


class SseSubscriber(Subscriber):
    """An SSE stream: ready on the response headers; an event is an `id:` line."""

    def __init__(self, request: bytes) -> None:
        super().__init__()
        self._request = request
        self._tail = b""  # the end of the last read: `id:` may be split across two

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        if not self.ready.done():
            if not data.startswith(b"HTTP/1.1 200"):
                self.ready.set_exception(ConnectionError(data[:200].decode(errors="replace")))
                return
            self.ready.set_result(None)
        seen = self._tail + data
        self._tail = data[-2:]
        if b"\nid:" in seen:
            self.arrived()


def _masked_text(payload: str) -> bytes:
    """A client's websocket text frame (clients must mask theirs; short payloads only)."""
    data = payload.encode()
    assert len(data) < 126
    mask = os.urandom(4)
    return (
        bytes([0x81, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    )


class SocketIoSubscriber(Subscriber):
    """A Socket.IO session over a websocket: upgrade, engine.io open, namespace connect,
    `subscribe {"all": true}`; then every `job` event counts, and pings are answered."""

    def __init__(self, request: bytes) -> None:
        super().__init__()
        self._request = request
        self._buffer = b""
        self._upgraded = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        assert self.transport is not None
        self.transport.write(self._request)

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        if not self._upgraded:
            head, sep, rest = self._buffer.partition(b"\r\n\r\n")
            if not sep:
                return
            if not head.startswith(b"HTTP/1.1 101"):
                self.ready.set_exception(ConnectionError(head[:200].decode(errors="replace")))
                return
            self._upgraded, self._buffer = True, rest
        while (frame := self._next_frame()) is not None:
            self._handle(frame)

    def _next_frame(self) -> bytes | None:
        buffer = self._buffer
        if len(buffer) < 2:
            return None
        length, start = buffer[1] & 0x7F, 2
        if length == 126:
            if len(buffer) < 4:
                return None
            (length,), start = struct.unpack("!H", buffer[2:4]), 4
        elif length == 127:
            if len(buffer) < 10:
                return None
            (length,), start = struct.unpack("!Q", buffer[2:10]), 10
        if len(buffer) < start + length:
            return None
        self._buffer = buffer[start + length :]
        return buffer[start : start + length]

    def _handle(self, message: bytes) -> None:
        assert self.transport is not None
        if message.startswith(b'42["job"'):
            self.arrived()
        elif message == b"2":  # engine.io ping
            self.transport.write(_masked_text("3"))
        elif message.startswith(b"0{"):  # engine.io open: connect to the namespace
            self.transport.write(_masked_text("40"))
        elif message.startswith(b"40"):  # connected: follow every job of the tenant
            self.transport.write(_masked_text('421["subscribe",{"all":true}]'))
        elif message.startswith(b"431"):
            if message != b'431[{"ok":true}]':
                self.ready.set_exception(ConnectionError(message.decode(errors="replace")))
            elif not self.ready.done():
                self.ready.set_result(None)
        elif message.startswith(b"44"):  # connect refused
            self.ready.set_exception(ConnectionError(message.decode(errors="replace")))


def _request(transport: str, host: str, port: int) -> bytes:
    if transport == "sse":
        return (
            f"GET /v1/events HTTP/1.1\r\nHost: {host}:{port}\r\nAccept: text/event-stream\r\n\r\n"
        ).encode()
    key = base64.b64encode(os.urandom(16)).decode()
    return (
        f"GET /socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
        f"Sec-WebSocket-Version: 13\r\n\r\n"
    ).encode()


async def _connect(args: argparse.Namespace) -> tuple[list[Subscriber], float]:
    loop = asyncio.get_running_loop()
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    kind = SseSubscriber if args.transport == "sse" else SocketIoSubscriber
    subscribers: list[Subscriber] = []
    started = time.monotonic()
    for first in range(0, args.count, CONNECT_BATCH):
        batch = [
            kind(_request(args.transport, host, port))
            for _ in range(first, min(args.count, first + CONNECT_BATCH))
        ]
        await asyncio.gather(
            *(
                loop.create_connection(
                    functools.partial(lambda s: s, s), host, port, local_addr=(args.local, 0)
                )
                for s in batch
            )
        )
        await asyncio.wait_for(asyncio.gather(*(s.ready for s in batch)), CONNECT_TIMEOUT_S)
        subscribers += batch
    return subscribers, time.monotonic() - started


async def _serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    subscribers, connect_s = await _connect(args)
    print(f"ready {connect_s:.3f}", flush=True)
    while (line := (await reader.readline()).decode().strip()) not in ("quit", ""):
        if line != "arm":
            raise SystemExit(f"unknown command {line!r}")
        for subscriber in subscribers:
            subscriber.event = loop.create_future()
        print("armed", flush=True)
        arrivals = await asyncio.gather(*(s.event for s in subscribers if s.event is not None))
        print(f"arrived {max(arrivals):.6f} {len(arrivals)}", flush=True)
    for subscriber in subscribers:
        if subscriber.transport is not None:
            subscriber.transport.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the server, http://host:port")
    parser.add_argument("--transport", choices=("sse", "socketio"), default="sse")
    parser.add_argument("--count", type=int, required=True, help="subscribers")
    parser.add_argument("--local", default="127.0.0.1", help="the address to connect from")
    args = parser.parse_args()
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(_serve(args))


if __name__ == "__main__":
    main()
