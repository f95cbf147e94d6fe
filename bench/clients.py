"""The benchmarks' clients, each run in a process of its own (bench.common.run_client) so that
its work is not charged to the server's event loop, as a real client's is not. Standard library
and aiohttp only, so each starts in a fraction of a second. Each prints one JSON line, except
the subscribers, which talk to the fan-out benchmark (bench/push.py) line by line.

    python -m bench.clients load URL [URL...] --clients 32 --duration 15 --rate 500
    python -m bench.clients burst URL --docs 150 [--lines 20] [--key KEY]
    python -m bench.clients one-at-a-time URL --docs 100 [--key KEY]
    python -m bench.clients subscribers URL --transport sse|socketio --count N [--local ADDR]

`load` (bench.accept): against each URL in turn, clients in a closed loop (throughput), then
requests on a fixed schedule (latency, from each request's scheduled moment, so that a stall
is not hidden by a client waiting for it). `burst` (bench.render): submits the invoices 32 at
a time and follows the all-jobs stream, opened first and live, until the last is done.
`one-at-a-time` (bench.cost): each invoice POSTed and its `job.done` awaited before the
next. `subscribers`: idle subscribers on bare sockets, as light as a client can be, an SSE
stream (`GET /v1/events`) or a Socket.IO session over a websocket (engine.io 4, `subscribe
{"all": true}`, pings answered), framed here by hand:

    → ready <connect_s>        every subscriber is connected and subscribed
    ← arm                      the next event is on its way: watch for it
    → armed
    → arrived <monotonic_s> <count>   when every subscriber has it (the last one's time)
    ← quit

Times are time.monotonic() or time.perf_counter(), one clock for every process of the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import struct
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import ClientResponse, ClientSession, TCPConnector

#: The all-jobs stream filtered to the events that end a job's attempts.
FINAL_TYPES = "job.done,job.failed"
CONNECT_BATCH = 200
CONNECT_TIMEOUT_S = 120.0
WARMUP_S = 0.2 if os.environ.get("BENCH_QUICK") == "1" else 1.0  # pools, prepared statements

INVOICE = """<!doctype html><html><head><meta charset="utf-8"><style>
  body { font-family: "DejaVu Sans", sans-serif; margin: 24px; color: #222; }
  h1 { font-size: 22px; margin: 0 0 4px; } .muted { color: #777; font-size: 12px; }
  table { width: 100%; border-collapse: collapse; margin-top: 18px; font-size: 12px; }
  th, td { padding: 6px 8px; border-bottom: 1px solid #ddd; text-align: left; }
  td.n { text-align: right; } tfoot td { font-weight: bold; border-top: 2px solid #222; }
</style></head><body>
  <h1>Invoice {{ number }}</h1><div class="muted">{{ customer }} · due {{ due }}</div>
  <table><thead><tr><th>Item</th><th>Qty</th><th>Price</th><th>Total</th></tr></thead><tbody>
  {% for line in lines %}<tr><td>{{ line.item }}</td><td class="n">{{ line.qty }}</td>
  <td class="n">{{ "%.2f"|format(line.price) }}</td>
  <td class="n">{{ "%.2f"|format(line.qty * line.price) }}</td></tr>{% endfor %}
  </tbody><tfoot><tr><td colspan="3">Total</td>
  <td class="n">{{ "%.2f"|format(lines|sum(attribute="total")) }}</td></tr></tfoot></table>
</body></html>"""


def invoice_data(n: int, lines: int = 20) -> dict[str, Any]:
    """Invoice number `n` with `lines` table lines (about 32 fill an A4 page)."""
    rows = []
    for i in range(lines):
        qty, price = i % 5 + 1, 9.5 + i
        rows.append({"item": f"Service {i}", "qty": qty, "price": price, "total": qty * price})
    return {"number": f"INV-{n:05d}", "customer": "Ana Lima", "due": "2026-12-31", "lines": rows}


# --- submitting jobs and following them --------------------------------------------------


async def submit_many(
    session: ClientSession, base: str, bodies: list[dict[str, Any]], concurrency: int
) -> list[str]:
    """POST every body to /v1/jobs, `concurrency` at a time; the jobs' ids."""
    semaphore = asyncio.Semaphore(concurrency)

    async def one(body: dict[str, Any]) -> str:
        async with semaphore, session.post(f"{base}/v1/jobs", json=body) as resp:
            assert resp.status == 202, await resp.text()
            return str((await resp.json())["id"])

    return list(await asyncio.gather(*(one(b) for b in bodies)))


async def until_done(resp: ClientResponse, ids: set[str]) -> None:
    """Read an open event stream until every id in `ids` is done (or failed, which raises)."""
    pending = set(ids)
    event = ""
    async for raw in resp.content:
        line = raw.decode().strip()
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:") and event in ("job.done", "job.failed"):
            job = json.loads(line[5:])["job"]
            if event == "job.failed":
                raise RuntimeError(f"job failed: {job['error']}")
            pending.discard(job["id"])
            if not pending:
                return


def authorized(key: str | None) -> ClientSession:
    """A session that sends the API key `key` (None: none, as in dev mode)."""
    return ClientSession(headers={"Authorization": f"Bearer {key}"} if key else None)


async def burst(
    base: str,
    docs: int,
    lines: int = 20,
    options: dict[str, Any] | None = None,
    key: str | None = None,
) -> float:
    """Submit `docs` invoices (with `options`), 32 at a time, and follow the stream until the
    last is done; seconds from the first submission."""
    extra = {"options": options} if options else {}
    bodies = [{"template": INVOICE, "data": invoice_data(n, lines), **extra} for n in range(docs)]
    async with authorized(key) as session:
        async with session.get(f"{base}/v1/events?type={FINAL_TYPES}") as stream:
            started = time.perf_counter()
            await until_done(stream, set(await submit_many(session, base, bodies, 32)))
            return time.perf_counter() - started


async def one_at_a_time(base: str, docs: int, key: str | None = None) -> list[float]:
    """Milliseconds from each POST to its job.done on the stream, one job at a time."""
    latencies: list[float] = []
    async with authorized(key) as session:
        async with session.get(f"{base}/v1/events?type={FINAL_TYPES}") as stream:
            for n in range(docs):
                body = {"template": INVOICE, "data": invoice_data(n)}
                started = time.perf_counter()
                async with session.post(f"{base}/v1/jobs", json=body) as resp:
                    assert resp.status == 202, await resp.text()
                    job_id = str((await resp.json())["id"])
                await until_done(stream, {job_id})
                latencies.append((time.perf_counter() - started) * 1000)
    return latencies


# --- load on POST /v1/jobs ---------------------------------------------------------------


async def closed_loop(send: Callable[[], Awaitable[None]], clients: int, seconds: float) -> float:
    """Requests per second from `clients` clients, each sending when its last was answered."""
    count = 0
    deadline = time.perf_counter() + seconds

    async def one_client() -> None:
        nonlocal count
        while time.perf_counter() < deadline:
            await send()
            count += 1

    started = time.perf_counter()
    await asyncio.gather(*(one_client() for _ in range(clients)))
    return count / (time.perf_counter() - started)


async def open_loop(
    send: Callable[[], Awaitable[None]], rate: float, seconds: float
) -> list[float]:
    """Milliseconds of each request sent on a fixed schedule, from its scheduled moment."""
    latencies: list[float] = []
    started = time.perf_counter()

    async def one(due: float) -> None:
        await send()
        latencies.append((time.perf_counter() - due) * 1000)

    tasks = []
    for i in range(int(rate * seconds)):
        due = started + i / rate
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        tasks.append(asyncio.create_task(one(due)))
    await asyncio.gather(*tasks)
    return latencies


async def measure(
    session: ClientSession, url: str, clients: int, seconds: float, rate: float
) -> dict[str, Any]:
    """Jobs/s in a closed loop, then the milliseconds of each request on a fixed schedule."""
    body = json.dumps({"template": INVOICE, "data": invoice_data(1)}).encode()
    headers = {"Content-Type": "application/json"}

    async def send() -> None:
        async with session.post(f"{url}/v1/jobs", data=body, headers=headers) as resp:
            await resp.read()
            if resp.status != 202:
                raise RuntimeError(f"POST /v1/jobs answered {resp.status}")

    await closed_loop(send, min(clients, 8), WARMUP_S)
    throughput = await closed_loop(send, clients, seconds)
    return {"jobs_per_s": throughput, "ms": await open_loop(send, rate, seconds)}


async def load(urls: list[str], clients: int, seconds: float, rate: float) -> list[Any]:
    async with ClientSession(connector=TCPConnector(limit=0)) as session:
        return [await measure(session, url, clients, seconds, rate) for url in urls]


# --- idle subscribers --------------------------------------------------------------------


class Subscriber(asyncio.Protocol):
    """One subscriber: sends `request` once connected; notes when it is ready and when an
    event arrives."""

    def __init__(self, request: bytes) -> None:
        loop = asyncio.get_running_loop()
        self.ready: asyncio.Future[None] = loop.create_future()
        self.event: asyncio.Future[float] | None = None
        self.transport: asyncio.Transport | None = None
        self._request = request

    def arrived(self) -> None:
        if self.event is not None and not self.event.done():
            self.event.set_result(time.monotonic())

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.write(self._request)

    def connection_lost(self, exc: Exception | None) -> None:
        for future in (self.ready, self.event):
            if future is not None and not future.done():
                future.set_exception(ConnectionError("the subscriber's connection ended"))


class SseSubscriber(Subscriber):
    """An SSE stream: ready on the response headers; an event is an `id:` line."""

    _tail = b""  # the end of the last read: `id:` may be split across two

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


def masked_text(payload: str) -> bytes:
    """A client's websocket text frame (clients must mask theirs; short payloads only)."""
    data = payload.encode()
    assert len(data) < 126
    mask = os.urandom(4)
    masked = bytes(b ^ mask[i % 4] for i, b in enumerate(data))
    return bytes([0x81, 0x80 | len(data)]) + mask + masked


class SocketIoSubscriber(Subscriber):
    """A Socket.IO session over a websocket: upgrade, engine.io open, namespace connect,
    `subscribe {"all": true}`; then every `job` event counts, and pings are answered."""

    _buffer = b""
    _upgraded = False

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
            self.transport.write(masked_text("3"))
        elif message.startswith(b"0{"):  # engine.io open: connect to the namespace
            self.transport.write(masked_text("40"))
        elif message.startswith(b"40"):  # connected: follow every job of the tenant
            self.transport.write(masked_text('421["subscribe",{"all":true}]'))
        elif message.startswith(b"431"):
            if message != b'431[{"ok":true}]':
                self.ready.set_exception(ConnectionError(message.decode(errors="replace")))
            elif not self.ready.done():
                self.ready.set_result(None)
        elif message.startswith(b"44"):  # connect refused
            self.ready.set_exception(ConnectionError(message.decode(errors="replace")))


def subscribe_request(transport: str, host: str, port: int) -> bytes:
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


async def connect(args: argparse.Namespace) -> tuple[list[Subscriber], float]:
    loop = asyncio.get_running_loop()
    url = urlsplit(args.url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    kind = SseSubscriber if args.transport == "sse" else SocketIoSubscriber
    subscribers: list[Subscriber] = []

    async def opened(subscriber: Subscriber) -> None:
        await loop.create_connection(lambda: subscriber, host, port, local_addr=(args.local, 0))

    started = time.monotonic()
    for first in range(0, args.count, CONNECT_BATCH):
        size = min(CONNECT_BATCH, args.count - first)
        batch = [kind(subscribe_request(args.transport, host, port)) for _ in range(size)]
        await asyncio.gather(*(opened(s) for s in batch))
        await asyncio.wait_for(asyncio.gather(*(s.ready for s in batch)), CONNECT_TIMEOUT_S)
        subscribers += batch
    return subscribers, time.monotonic() - started


async def subscribers(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    subscribers, connect_s = await connect(args)
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
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    client = parser.add_subparsers(dest="client", required=True)
    one = client.add_parser("load")
    one.add_argument("url", nargs="+")
    one.add_argument("--clients", type=int, required=True)
    one.add_argument("--duration", type=float, required=True, help="seconds of each loop")
    one.add_argument("--rate", type=float, required=True, help="requests per second")
    invoices = argparse.ArgumentParser(add_help=False)  # what burst and one-at-a-time take
    invoices.add_argument("url")
    invoices.add_argument("--docs", type=int, required=True)
    invoices.add_argument("--key", help="an API key, sent as Authorization: Bearer")
    one = client.add_parser("burst", parents=[invoices])
    one.add_argument("--lines", type=int, default=20)
    one.add_argument("--options", default="{}", help="the jobs' options, as JSON")
    client.add_parser("one-at-a-time", parents=[invoices])
    one = client.add_parser("subscribers")
    one.add_argument("url", help="the server, http://host:port")
    one.add_argument("--transport", choices=("sse", "socketio"), default="sse")
    one.add_argument("--count", type=int, required=True)
    one.add_argument("--local", default="127.0.0.1", help="the address to connect from")
    args = parser.parse_args()
    if args.client == "subscribers":
        _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        asyncio.run(subscribers(args))
        return
    if args.client == "load":
        result: Any = load(args.url, args.clients, args.duration, args.rate)
    elif args.client == "burst":
        result = burst(args.url, args.docs, args.lines, json.loads(args.options), args.key)
    else:
        result = one_at_a_time(args.url, args.docs, args.key)
    print(json.dumps(asyncio.run(result)))


if __name__ == "__main__":
    main()
