"""The one gate every Chromium connection passes: an HTTP proxy that applies the network policy
to the address it actually connects to.

Request routing in Playwright never sees WebSockets, keepalive fetches, beacons, pings or
prefetches, so the policy is enforced here instead. Chromium is told to use this proxy for
every scheme and host, loopback included (Playwright adds `<-loopback>` to the bypass list),
and its own name resolution is switched off, so the only way out is through a gate. A gate
resolves each name once, refuses the connection when any address is not allowed, and connects
to an address it checked, so a name that changes between check and connect (DNS rebinding)
gains nothing. A name that does not resolve is a failed request, not a refusal: DNS may answer
the next attempt. Each render slot has a gate of its own, so a refusal lands in the warnings of
the job that slot prints.

One origin never leaves the gate: `DOCUMENT_URL`, where a job with assets (or with relative URLs)
has its document and files (server/files/assets.py). The gate answers its requests from the job's
`Site` itself, so relative URLs in the document resolve to the job's files; a path it has no
file for is a failed request, listed in the job's warnings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from urllib.parse import unquote, urlsplit

from server.netpolicy import NetworkPolicy, Resolver

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 64 * 1024
HEAD_TIMEOUT_S = 30.0
CONNECT_TIMEOUT_S = 10.0
RELAY_CHUNK_BYTES = 64 * 1024
# Headers meant for the proxy, or for one hop only (RFC 9110, 7.6.1): never forwarded.
_HOP_HEADERS = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"proxy-authorization", b"te", b"upgrade"}
)
# The gate's own answers say so (EGRESS_HEADER), so that a page's response can be told apart
# from the gate's refusal or failure to connect (server/render/navigation.py).
EGRESS_HEADER = "Pressroom-Egress"
_REFUSED = (
    b"HTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 33\r\n"
    b"Pressroom-Egress: refused\r\n"
    b"Connection: close\r\n\r\nrefused by Pressroom's net policy"
)
_UNREACHABLE = (
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nPressroom-Egress: unreachable\r\n"
    b"Connection: close\r\n\r\n"
)
_UNRESOLVED = (
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nPressroom-Egress: unresolved\r\n"
    b"Connection: close\r\n\r\n"
)
_NO_ASSET = (
    b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nPressroom-Egress: missing\r\n"
    b"Cache-Control: no-store\r\nConnection: close\r\n\r\n"
)
_BAD_GATEWAY = b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
#: The reserved origin of a job's own document and files: `.invalid` never resolves (RFC 2606),
#: and the gate answers it without a connection. Plain http: Chromium sends such requests to the
#: proxy whole (https would be a tunnel the gate cannot look into).
DOCUMENT_HOST = "document.pressroom.invalid"
DOCUMENT_URL = f"http://{DOCUMENT_HOST}/"
DOCUMENT_TYPE = "text/html; charset=utf-8"

# Chromium's Accept header per destination, for origins that get no Sec-Fetch-Dest.
_ACCEPT_KINDS = (
    ("image/", "image"),
    ("text/css", "style"),
    ("text/html", "document"),
    ("text/event-stream", "eventsource"),
)

Sink = Callable[[str], None]


class _Malformed(ValueError):
    pass


@dataclass(slots=True)
class _Request:
    method: str
    target: str
    headers: list[tuple[bytes, bytes]]

    def header(self, name: bytes) -> str:
        for key, value in self.headers:
            if key.lower() == name:
                return value.decode("latin-1").strip()
        return ""

    @property
    def kind(self) -> str:
        """What Chromium was doing, as far as the request shows it (warnings name it)."""
        if self.method == "CONNECT":
            return "connection"  # an https or WebSocket tunnel: nothing more is visible
        if self.header(b"upgrade").lower() == "websocket":
            return "websocket"
        purpose = f"{self.header(b'sec-purpose')} {self.header(b'purpose')}".lower()
        if "prefetch" in purpose:
            return "prefetch"
        if self.header(b"ping-to") or self.header(b"content-type").lower() == "text/ping":
            return "ping"
        dest = self.header(b"sec-fetch-dest")
        if dest and dest != "empty":
            return dest
        accept = self.header(b"accept")
        for prefix, kind in _ACCEPT_KINDS:
            if accept.startswith(prefix):
                return kind
        return "request" if self.method == "GET" else f"{self.method} request"


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    try:
        async with asyncio.timeout(HEAD_TIMEOUT_S):
            return await reader.readuntil(b"\r\n\r\n")
    except asyncio.LimitOverrunError:
        raise _Malformed("request head too long") from None


def _parse_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    lines = head[:-4].split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise _Malformed("bad header line")
        headers.append((name, value.strip()))
    return lines[0], headers


def _parse_request(head: bytes) -> _Request:
    first, headers = _parse_head(head)
    parts = first.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/1."):
        raise _Malformed("bad request line")
    try:
        method, target = parts[0].decode("ascii"), parts[1].decode("ascii")
    except UnicodeDecodeError:
        raise _Malformed("non-ASCII request line") from None
    return _Request(method, target, headers)


# Where a document names a file it loads (src, srcset, poster, <link href>, CSS url() and
# @import), and a value there that is relative: no scheme, not only a fragment.
_RELATIVE = r"""["']?(?=[^\s"'>)])(?![a-z][a-z0-9+.\-]*:|#)"""
_LOADS = {
    "src": re.compile(r"(?:set)?\s*=\s*" + _RELATIVE),
    "poster": re.compile(r"\s*=\s*" + _RELATIVE),
    "href": re.compile(r"\s*=\s*" + _RELATIVE),
    "url(": re.compile(r"\s*" + _RELATIVE),
    "@import": re.compile(r"""\s+["'](?![a-z][a-z0-9+.\-]*:)"""),
}


def loads_relative(html: str) -> bool:
    """Whether the document names a file by a relative URL, which only DOCUMENT_URL answers
    (written into about:blank, it would load nothing, and say nothing). A quick scan: the
    keywords are found by str.find, and only their values are matched."""
    lower = html.lower()
    for keyword, value in _LOADS.items():
        at = lower.find(keyword)
        while at != -1:
            end = at + len(keyword)
            if value.match(lower, end) and (
                keyword != "href" or lower.startswith("<link", lower.rfind("<", 0, at))
            ):
                return True
            at = lower.find(keyword, end)
    return False


@dataclass(frozen=True, slots=True)
class Site:
    """What DOCUMENT_URL serves for one job: the document at `/`, each file at its path."""

    document: bytes
    #: Path as the page names it (no leading slash, percent-escapes decoded) → (type, bytes).
    files: Mapping[str, tuple[str, bytes]]

    def find(self, path: str) -> tuple[str, bytes] | None:
        if path == "":
            return DOCUMENT_TYPE, self.document
        return self.files.get(path)


@dataclass(slots=True)
class Gate:
    """One listening port of the proxy, whose connections belong to one render slot."""

    policy: NetworkPolicy | None  # None: refuse everything
    sink: Sink | None = None
    resolver: Resolver | None = None  # default: the loop's getaddrinfo
    used: bool = False  # a connection came through since the slot last cleared it
    site: Site | None = None  # what DOCUMENT_URL serves for the job printing now
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", 0, limit=MAX_HEAD_BYTES
        )

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._serve(reader, writer)
        except (OSError, asyncio.IncompleteReadError, TimeoutError, _Malformed):
            pass  # either side went away or spoke nonsense; nothing of it matters to the job
        except asyncio.CancelledError:
            # The gate is closing. This task is the connection's own (asyncio's streams start
            # it), so it ends here: re-raised, asyncio would log it as an error.
            pass
        finally:
            self._tasks.discard(task)
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.used = True
        try:
            request = _parse_request(await _read_head(reader))
        except _Malformed as error:
            log.debug("egress: %s", error)
            writer.write(_BAD_REQUEST)
            return
        if request.method == "CONNECT":
            host, port, shown = self._authority(request.target)
        else:
            host, port, shown = self._absolute(request.target)
        if host is None:
            self._refuse(request, "blocked: the URL cannot be read", shown)
            writer.write(_REFUSED)
            return
        if host.lower() == DOCUMENT_HOST:
            await self._serve_site(request, writer, shown)
            return
        if self.policy is None:
            log.debug("egress refused the browser's own %s %s", request.method, shown[:200])
            writer.write(_REFUSED)
            return
        verdict, addresses = await self.policy.resolve(host, resolve=self.resolver)
        if verdict.unresolved:
            # A network failure, not a refusal: listed as a failed request of the page.
            self._note(f"failed {request.kind}: {verdict.reason} ({shown[:200]})")
            writer.write(_UNRESOLVED)
            return
        if not verdict.allowed:
            self._refuse(request, verdict.reason, shown)
            writer.write(_REFUSED)
            return
        upstream = await _connect(addresses, port)
        if upstream is None:
            writer.write(_UNREACHABLE)
            return
        up_reader, up_writer = upstream
        try:
            if request.method == "CONNECT":
                writer.write(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                await _relay(reader, writer, up_reader, up_writer)
            else:
                up_writer.write(_forwarded_head(request))
                await _relay(reader, writer, up_reader, up_writer, close_response=True)
        finally:
            up_writer.close()

    async def _serve_site(
        self, request: _Request, writer: asyncio.StreamWriter, shown: str
    ) -> None:
        """A request to the job's own origin, answered from its Site: never the network."""
        if self.site is None or request.method not in ("GET", "HEAD"):
            self._refuse(request, "not one of the job's assets", shown)
            writer.write(_REFUSED)
            return
        path = unquote(urlsplit(request.target).path).removeprefix("/")
        found = self.site.find(path)
        if found is None:
            # A relative URL the job has no file for: a failed resource, as a 404 would be.
            why = f"no asset is mapped to {path}; name one in the job's assets"
            self._note(f"failed {request.kind}: {why} ({shown[:200]})")
            writer.write(_NO_ASSET)
            return
        content_type, body = found
        # no-store: a reused slot's next job may map the same path to other bytes.
        head = (
            f"HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nCache-Control: no-store\r\n"
            "Connection: close\r\n\r\n"
        )
        writer.write(head.encode("latin-1"))
        if request.method == "GET":
            writer.write(body)
        await writer.drain()

    def _refuse(self, request: _Request, reason: str, shown: str) -> None:
        detail = reason.removeprefix("blocked: ")
        self._note(f"blocked {request.kind}: {detail} ({shown[:200]})")

    def _note(self, warning: str) -> None:
        if self.sink is not None:
            self.sink(warning)
        log.debug("egress: %s", warning)

    @staticmethod
    def _authority(target: str) -> tuple[str | None, int, str]:
        host, colon, port = target.rpartition(":")
        if not colon or not port.isdigit() or not host:
            return None, 0, target
        return host.strip("[]"), int(port), target

    @staticmethod
    def _absolute(target: str) -> tuple[str | None, int, str]:
        # Chromium sends plain http:// requests in absolute form; https and ws go by CONNECT.
        try:
            parts = urlsplit(target)
            port = parts.port or 80
        except ValueError:
            return None, 0, target
        if parts.scheme != "http" or not parts.hostname:
            return None, 0, target
        return parts.hostname, port, target


def _forwarded_head(request: _Request) -> bytes:
    parts = urlsplit(request.target)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [f"{request.method} {path} HTTP/1.1".encode("ascii")]
    lines += [k + b": " + v for k, v in request.headers if k.lower() not in _HOP_HEADERS]
    # One request per upstream connection: a reused proxy connection could otherwise carry
    # Chromium's next request, for another host, to this one.
    lines.append(b"Connection: close")
    return b"\r\n".join(lines) + b"\r\n\r\n"


async def _connect(
    addresses: list[str], port: int
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | None:
    for address in addresses:
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT_S):
                return await asyncio.open_connection(address, port, family=_family(address))
        except (OSError, TimeoutError):
            continue
    return None


def _family(address: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in address else socket.AF_INET


async def _relay(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: asyncio.StreamWriter,
    *,
    close_response: bool = False,
) -> None:
    """Copy both ways until the upstream side ends. `close_response` marks a plain HTTP
    response `Connection: close`, so Chromium does not send its next request on this one."""
    upward = asyncio.create_task(_pump(reader, up_writer))
    try:
        if close_response:
            await _response_head(up_reader, writer)
        await _pump(up_reader, writer)
    finally:
        upward.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError):
            await upward


async def _response_head(up_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while True:
        try:
            head = await up_reader.readuntil(b"\r\n\r\n")
        except asyncio.LimitOverrunError:
            writer.write(_BAD_GATEWAY)
            raise asyncio.IncompleteReadError(b"", None) from None
        first, headers = _parse_head(head)
        lines = [first] + [k + b": " + v for k, v in headers if k.lower() not in _HOP_HEADERS]
        informational = first[9:10] == b"1" and first[9:12] != b"101"
        if not informational:
            lines.append(b"Connection: close")
        writer.write(b"\r\n".join(lines) + b"\r\n\r\n")
        if not informational:
            return


async def _pump(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    while chunk := await source.read(RELAY_CHUNK_BYTES):
        sink.write(chunk)
        await sink.drain()
    with contextlib.suppress(OSError):
        if sink.can_write_eof():
            sink.write_eof()
