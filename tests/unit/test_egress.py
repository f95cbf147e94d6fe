"""The egress gate on its own: what it forwards, what it refuses, and where it connects."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from server.netpolicy import NetworkPolicy
from server.render.egress import DOCUMENT_HOST, DOCUMENT_URL, Gate, Site, loads_relative


class Upstream:
    """A server on 127.0.0.1 that records each connection's bytes and answers with `reply`."""

    def __init__(self, reply: bytes) -> None:
        self.reply = reply
        self.received: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.received.append(await reader.readuntil(b"\r\n\r\n"))
        writer.write(self.reply)
        await writer.drain()
        writer.close()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()


REPLY = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\nKeep-Alive: 5\r\n\r\nok"


@pytest.fixture
async def upstream() -> AsyncIterator[Upstream]:
    server = Upstream(REPLY)
    await server.start()
    yield server
    await server.close()


async def exchange(gate: Gate, request: bytes) -> bytes:
    port = int(gate.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    async with asyncio.timeout(10):
        answer = await reader.read()
    writer.close()
    return answer


async def started(gate: Gate) -> Gate:
    await gate.start()
    return gate


async def test_a_plain_request_goes_to_the_checked_address_one_per_connection(
    upstream: Upstream,
) -> None:
    warnings: list[str] = []

    async def resolve(host: str) -> list[str]:
        return ["127.0.0.1"]

    gate = await started(Gate(NetworkPolicy(["127.0.0.1"]), warnings.append, resolve))
    request = (
        f"GET http://app.test:{upstream.port}/a?b=1 HTTP/1.1\r\nHost: app.test\r\n"
        "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n\r\n"
    ).encode()
    answer = await exchange(gate, request)
    await gate.close()
    assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"\r\n\r\nok")
    assert b"Connection: close" in answer and b"keep-alive" not in answer.lower()
    sent = upstream.received[0]
    assert sent.startswith(b"GET /a?b=1 HTTP/1.1\r\n")
    assert b"Connection: close" in sent and b"Proxy-" not in sent
    assert gate.used and warnings == []


async def test_a_name_with_any_blocked_address_is_refused(upstream: Upstream) -> None:
    warnings: list[str] = []

    async def resolve(host: str) -> list[str]:
        return ["127.0.0.1", "10.0.0.7"]

    gate = await started(Gate(NetworkPolicy(["127.0.0.1"]), warnings.append, resolve))
    answer = await exchange(gate, f"CONNECT two.test:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    await gate.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert upstream.received == []
    assert warnings == [
        "blocked connection: two.test resolves to 10.0.0.7, a private address; "
        f"allow it with PRESSROOM_ALLOW_HOSTS=two.test (two.test:{upstream.port})"
    ]


async def test_a_tunnel_relays_both_ways(upstream: Upstream) -> None:
    gate = await started(Gate(NetworkPolicy(["127.0.0.1"])))
    answer = await exchange(
        gate,
        f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1\r\n\r\nHELLO\r\n\r\n".encode(),
    )
    await gate.close()
    assert answer == b"HTTP/1.1 200 Connection Established\r\n\r\n" + REPLY
    assert upstream.received == [b"HELLO\r\n\r\n"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /relative HTTP/1.1\r\n\r\n",
        b"GET ftp://127.0.0.1/x HTTP/1.1\r\n\r\n",
        b"CONNECT nohost HTTP/1.1\r\n\r\n",
        b"NONSENSE\r\n\r\n",
        b"GET http://127.0.0.1/ HTTP/1.1\r\nbad header\r\n\r\n",
    ],
)
async def test_what_cannot_be_read_is_refused(upstream: Upstream, request_bytes: bytes) -> None:
    gate = await started(Gate(NetworkPolicy(["127.0.0.1"])))
    answer = await exchange(gate, request_bytes)
    await gate.close()
    assert answer.startswith((b"HTTP/1.1 400 ", b"HTTP/1.1 403 "))
    assert upstream.received == []


async def test_the_browser_gate_refuses_everything(upstream: Upstream) -> None:
    gate = await started(Gate(None))
    answer = await exchange(gate, f"CONNECT 127.0.0.1:{upstream.port} HTTP/1.1\r\n\r\n".encode())
    await gate.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    assert upstream.received == []


SITE = Site(
    b"<img src=logo.png>", {"logo.png": ("image/png", b"PNG!"), "a b/c.css": ("text/css", b"p{}")}
)


async def never_resolve(host: str) -> list[str]:
    raise AssertionError(f"the reserved origin is never resolved ({host})")


async def test_the_reserved_origin_is_answered_from_the_site_without_a_connection() -> None:
    warnings: list[str] = []
    gate = await started(Gate(NetworkPolicy([]), warnings.append, never_resolve))
    gate.site = SITE
    document = await exchange(gate, f"GET {DOCUMENT_URL} HTTP/1.1\r\n\r\n".encode())
    logo = await exchange(gate, f"GET {DOCUMENT_URL}logo.png?v=2 HTTP/1.1\r\n\r\n".encode())
    spaced = await exchange(gate, f"GET {DOCUMENT_URL}a%20b/c.css HTTP/1.1\r\n\r\n".encode())
    head = await exchange(gate, f"HEAD {DOCUMENT_URL}logo.png HTTP/1.1\r\n\r\n".encode())
    await gate.close()
    assert document.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"Content-Type: text/html; charset=utf-8\r\n" in document
    assert document.endswith(b"\r\n\r\n<img src=logo.png>")
    assert b"Content-Type: image/png\r\n" in logo and logo.endswith(b"\r\n\r\nPNG!")
    # A reused slot's next job may map the same path to other bytes: nothing is cached.
    assert b"Cache-Control: no-store\r\n" in logo and b"Content-Length: 4\r\n" in logo
    assert spaced.endswith(b"\r\n\r\np{}")
    assert b"Content-Length: 4\r\n" in head and head.endswith(b"\r\n\r\n")
    assert warnings == []


async def test_a_path_the_site_has_no_file_for_is_a_failed_request() -> None:
    warnings: list[str] = []
    gate = await started(Gate(NetworkPolicy([]), warnings.append, never_resolve))
    gate.site = SITE
    answer = await exchange(
        gate, f"GET {DOCUMENT_URL}img/other%20logo.png HTTP/1.1\r\n\r\n".encode()
    )
    await gate.close()
    assert answer.startswith(b"HTTP/1.1 404 ") and b"Pressroom-Egress: missing\r\n" in answer
    assert warnings == [
        "failed request: no asset is mapped to img/other logo.png; name one in the job's assets"
        f" ({DOCUMENT_URL}img/other%20logo.png)"
    ]


@pytest.mark.parametrize(
    ("site", "request_line", "kind"),
    [
        (SITE, f"POST {DOCUMENT_URL}logo.png", "POST request"),
        (SITE, f"CONNECT {DOCUMENT_HOST}:443", "connection"),
        (None, f"GET {DOCUMENT_URL}logo.png", "request"),
    ],
)
async def test_what_the_site_does_not_hold_is_refused_into_the_warnings(
    site: Site | None, request_line: str, kind: str
) -> None:
    warnings: list[str] = []
    gate = await started(Gate(NetworkPolicy([]), warnings.append, never_resolve))
    gate.site = site
    answer = await exchange(gate, f"{request_line} HTTP/1.1\r\n\r\n".encode())
    await gate.close()
    assert answer.startswith(b"HTTP/1.1 403 ")
    shown = request_line.split(" ", 1)[1]
    assert warnings == [f"blocked {kind}: not one of the job's assets ({shown})"]


@pytest.mark.parametrize(
    "html",
    [
        '<img src="logo.png">',
        "<IMG SRC=./logo.png>",
        '<img srcset="a.png 1x, b.png 2x">',
        '<video poster="still.png">',
        '<script src="/app.js"></script>',
        '<link href=site.css rel="stylesheet">',
        "<p style=\"background: url( 'paper.png' )\">",
        '<style>@import "theme.css";</style>',
        '<img src="//cdn.example.com/logo.png">',
    ],
)
def test_a_document_naming_a_file_by_a_relative_url_is_served(html: str) -> None:
    assert loads_relative(html)


@pytest.mark.parametrize(
    "html",
    [
        '<img src="https://cdn.example.com/logo.png"><img src="HTTP://x/a.png">',
        '<img src="data:image/png;base64,AAAA"><img src="">',
        '<a href="terms.html">terms</a><a href="#top">top</a>',
        '<link rel="stylesheet" href="https://cdn.example.com/site.css">',
        '<svg><rect fill="url(#grad)"/></svg><p style="filter: url(\'#f\')">',
        '<style>@import url("https://fonts.example.com/a.css"); @import "https://x/b.css";</style>',
        "<p>the src of the problem</p>",
    ],
)
def test_a_document_naming_no_file_by_a_relative_url_is_written_into_the_page(html: str) -> None:
    assert not loads_relative(html)
