"""Every connection Chromium opens passes the egress gate: a canary on loopback (not allowed)
receives nothing, whatever kind of request a page makes, with JavaScript on or off, in jobs
and in previews; each refusal is in the job's warnings with the kind of request."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from io import BytesIO
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pypdf import PdfReader

from tests.conftest import RunningApp
from tests.e2e.test_ssrf import render, text_of

pytestmark = pytest.mark.browser

SECRET = "CANARY-SECRET"


class Canary:
    """A service on 127.0.0.1 that counts every TCP connection and UDP datagram it gets, and
    answers any HTTP request with a secret the PDF must never show."""

    def __init__(self) -> None:
        self.connections = 0
        self.datagrams = 0
        self.tcp_port = 0
        self.udp_port = 0
        self._server: asyncio.Server | None = None
        self._udp: asyncio.DatagramTransport | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.tcp_port = self._server.sockets[0].getsockname()[1]
        canary = self

        class Udp(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr: Any) -> None:
                canary.datagrams += 1

        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(Udp, local_addr=("127.0.0.1", 0))
        self._udp = transport
        self.udp_port = transport.get_extra_info("sockname")[1]

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        body = f"<h1>{SECRET}</h1>".encode()
        head = (
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nAccess-Control-Allow-Origin: *\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        )
        writer.write(head.encode() + body)
        writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        if self._udp is not None:
            self._udp.close()

    def url(self, path: str = "/") -> str:
        return f"http://127.0.0.1:{self.tcp_port}{path}"


@pytest.fixture
async def canary() -> AsyncIterator[Canary]:
    found = Canary()
    await found.start()
    yield found
    await found.close()


@pytest.fixture
async def redirector(canary: Canary) -> AsyncIterator[str]:
    """An allow-listed host (127.0.0.2) whose every path redirects to the canary."""

    async def bounce(request: web.Request) -> web.Response:
        raise web.HTTPFound(canary.url(f"/via-redirect{request.path}"))

    app = web.Application()
    app.router.add_get("/{tail:.*}", bounce)
    server = TestServer(app, host="127.0.0.2")
    await server.start_server()
    yield f"http://127.0.0.2:{server.port}"
    await server.close()


def static_page(canary: Canary, redirector: str) -> str:
    """Requests a page makes without any script."""
    c = canary.url
    return f"""<h1>Statement</h1>
        <img src="{c("/img.png")}">
        <link rel="stylesheet" href="{c("/style.css")}">
        <iframe src="{c("/frame")}"></iframe>
        <link rel="prefetch" href="{c("/prefetch")}">
        <link rel="preconnect" href="{c("/")}">
        <link rel="dns-prefetch" href="//canary.internal">
        <a ping="{c("/ping")}" href="{c("/a")}" target="sink">link</a>
        <iframe name="sink"></iframe>
        <video src="{c("/video.mp4")}"></video>
        <img src="{redirector}/img.png">
        <div style="background: url('{c("/bg.png")}')">bg</div>"""


def scripted_page(canary: Canary, redirector: str) -> str:
    """Requests scripts make; `window.done` is set once each has settled."""
    c = canary.url
    ws = f"ws://127.0.0.1:{canary.tcp_port}/ws"
    return (
        static_page(canary, redirector)
        + f"""<pre id="out"></pre>
        <script>
        const out = (text) => document.getElementById("out").textContent += text + "\\n";
        const settle = (promise) => promise.then((r) => r && r.text ? r.text() : r)
            .then((t) => out(String(t)), () => {{}});
        const jobs = [
          settle(fetch("{c("/fetch")}")),
          settle(fetch("{c("/keepalive")}", {{keepalive: true, method: "POST", body: "x"}})),
          settle(fetch("{c("/no-cors")}", {{mode: "no-cors"}})),
          settle(fetch("{redirector}/fetch")),
          new Promise((done) => {{
            const xhr = new XMLHttpRequest();
            xhr.open("GET", "{c("/xhr")}");
            xhr.onload = () => {{ out(xhr.responseText); done(); }};
            xhr.onerror = done;
            xhr.send();
          }}),
          new Promise((done) => {{
            const socket = new WebSocket("{ws}");
            socket.onmessage = (m) => out(m.data);
            socket.onerror = socket.onclose = done;
          }}),
          new Promise((done) => {{
            const source = new EventSource("{c("/events")}");
            source.onmessage = (m) => out(m.data);
            source.onerror = () => {{ source.close(); done(); }};
          }}),
          new Promise((done) => {{
            out(String(navigator.sendBeacon("{c("/beacon")}", "x")));
            setTimeout(done, 300);
          }}),
          new Promise((done) => {{
            const peer = new RTCPeerConnection({{iceServers: [
              {{urls: "stun:127.0.0.1:{canary.udp_port}"}},
              {{urls: "turn:127.0.0.1:{canary.tcp_port}?transport=tcp",
                username: "u", credential: "p"}},
            ]}});
            peer.createDataChannel("x");
            peer.onicegatheringstatechange = () => {{
              if (peer.iceGatheringState === "complete") done();
            }};
            peer.createOffer().then((offer) => peer.setLocalDescription(offer));
            setTimeout(done, 2000);
          }}),
          new Promise((done) => {{
            const frame = document.createElement("iframe");
            frame.srcdoc = `<script>fetch("{c("/from-srcdoc")}").catch(() => 0)<\\/script>`;
            document.body.appendChild(frame);
            setTimeout(done, 200);
          }}),
        ];
        document.querySelector("a").click();
        Promise.all(jobs).then(() => {{ window.done = true; }});
        </script>"""
    )


async def run_job(app: RunningApp, template: str, **options: Any) -> dict[str, Any]:
    job, pdf = await render(app, template, **options)
    job["text"] = text_of(pdf)
    return job


@pytest.mark.parametrize("scripts", [False, True], ids=["javascript-off", "javascript-on"])
async def test_no_request_kind_reaches_loopback_from_a_job(
    start_app: Callable[..., Any], canary: Canary, redirector: str, scripts: bool
) -> None:
    app: RunningApp = await start_app(render_slots=1, allow_hosts=("127.0.0.2",))
    if scripts:
        job = await run_job(
            app, scripted_page(canary, redirector), wait_for_expression="window.done === true"
        )
    else:
        job = await run_job(app, static_page(canary, redirector))
    assert canary.connections == 0, job["warnings"]
    assert canary.datagrams == 0
    assert SECRET not in job["text"]
    assert "Statement" in job["text"]
    warnings = job["warnings"]
    port = f"127.0.0.1:{canary.tcp_port}"
    ours = [warning for warning in warnings if port in warning]
    assert ours and all("127.0.0.1 is a loopback address" in warning for warning in ours)
    kinds = {warning.split(":")[0] for warning in ours}
    assert {"blocked image", "blocked style"} <= kinds, warnings
    assert any("/via-redirect/img.png" in warning for warning in ours), "the redirect hop"
    if scripts:
        assert "blocked connection" in kinds, "the WebSocket's tunnel"
        for path in ("/fetch", "/keepalive", "/xhr", "/events", "/beacon", "/from-srcdoc"):
            assert any(f"{port}{path} " in f"{w} " or f"{port}{path})" in w for w in ours), (
                path,
                warnings,
            )


async def test_no_request_kind_reaches_loopback_from_a_preview(
    start_app: Callable[..., Any], canary: Canary, redirector: str
) -> None:
    app: RunningApp = await start_app(render_slots=1, allow_hosts=("127.0.0.2",))
    for html, options in (
        (static_page(canary, redirector), {}),
        (scripted_page(canary, redirector), {"wait_for_expression": "window.done === true"}),
    ):
        body = {"html": html, "options": options}
        async with app.http.post(app.url("/v1/templates/preview"), json=body) as resp:
            assert resp.status == 200, await resp.text()
            text = "\n".join(p.extract_text() for p in PdfReader(BytesIO(await resp.read())).pages)
        assert SECRET not in text and "Statement" in text
    assert canary.connections == 0
    assert canary.datagrams == 0


async def test_allowed_hosts_pass_the_gate(start_app: Callable[..., Any], canary: Canary) -> None:
    """The same canary, allow-listed: the gate connects, and the page shows its answer."""
    app: RunningApp = await start_app(render_slots=1, allow_hosts=("127.0.0.1",))
    template = f"""<h1>Statement</h1><pre id="out"></pre><script>
        fetch("{canary.url("/fetch")}").then((r) => r.text())
          .then((t) => {{ document.getElementById("out").textContent = t; window.done = true; }});
        </script>"""
    job = await run_job(app, template, wait_for_expression="window.done === true")
    assert canary.connections == 1
    assert SECRET in job["text"]
    assert job["warnings"] == []
