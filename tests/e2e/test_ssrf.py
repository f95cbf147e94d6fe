"""The renderer's network policy on real Chromium: local files, loopback, private and metadata
addresses are not fetched (and are listed in the job's warnings); allowed hosts and data: are."""

from __future__ import annotations

import base64
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from io import BytesIO
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from pypdf import PdfReader

from tests.conftest import RunningApp
from tests.sse import collect

pytestmark = pytest.mark.browser


def png(size: int = 16) -> bytes:
    """A solid red square as a PNG, built by hand."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * size for _ in range(size))
    header = struct.pack(">IIBBBBB", size, size, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


class Intranet:
    """A server on 127.0.0.1 standing in for something internal; it records every request."""

    def __init__(self, server: TestServer, hits: list[str]) -> None:
        self.server = server
        self.hits = hits

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.server.port}{path}"


@pytest.fixture
async def intranet() -> AsyncIterator[Intranet]:
    hits: list[str] = []

    async def logo(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(body=png(), content_type="image/png")

    async def secret(request: web.Request) -> web.Response:
        hits.append(request.path)
        return web.Response(text="root:x:0:0:TOP-SECRET", content_type="text/html")

    async def bounce(request: web.Request) -> web.Response:
        hits.append(request.path)
        raise web.HTTPFound(request.query["to"])

    app = web.Application()
    app.router.add_get("/logo.png", logo)
    app.router.add_get("/secret", secret)
    app.router.add_get("/bounce", bounce)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield Intranet(server, hits)
    await server.close()


async def render(
    app: RunningApp, template: str, **options: Any
) -> tuple[dict[str, Any], PdfReader]:
    """Submit a job, wait for it to be done, and read its PDF."""
    body = {"template": template, "options": options}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    got = await collect(app.http, app.url(job["links"]["events"]), timeout_s=60)
    final: dict[str, Any] = got[-1].json["job"]
    assert final["status"] == "done", final
    async with app.http.get(final["url"]) as resp:
        return final, PdfReader(BytesIO(await resp.read()))


def text_of(reader: PdfReader) -> str:
    return "\n".join(page.extract_text() for page in reader.pages)


@pytest.mark.parametrize("script", ["", "<script>document.title = 'js'</script>"])
async def test_local_files_loopback_and_metadata_are_not_fetched(
    start_app: Callable[..., Any], intranet: Intranet, script: str
) -> None:
    app: RunningApp = await start_app(render_slots=1)
    port = intranet.server.port
    template = f"""{script}<h1>Invoice</h1>
        <iframe src="file:///etc/passwd"></iframe>
        <img src="http://169.254.169.254/latest/meta-data/">
        <img src="http://[fd00:ec2::254]/latest/meta-data/">
        <iframe src="{intranet.url("/secret")}"></iframe>
        <img src="http://localhost:{port}/logo.png">
        <img src="http://[::ffff:127.0.0.1]:{port}/logo.png">
        <img src="http://2130706433:{port}/logo.png">
        <link rel="stylesheet" href="http://10.0.0.1/style.css">"""
    job, pdf = await render(app, template)
    text = text_of(pdf)
    assert "Invoice" in text
    assert "root:" not in text and "TOP-SECRET" not in text
    assert intranet.hits == [], "nothing reached the internal server"
    # file: from the page is refused by Chromium itself, before any request the policy sees.
    warnings = "\n".join(job["warnings"])
    for expected in (
        "169.254.169.254 is a cloud metadata address",
        "fd00:ec2::254 is a cloud metadata address",
        "127.0.0.1 is a loopback address",
        "localhost is a loopback host name",
        "IPv4-mapped 127.0.0.1",
        "10.0.0.1 is a private address",
    ):
        assert expected in warnings, (expected, job["warnings"])


async def test_redirects_to_internal_addresses_are_not_followed(
    start_app: Callable[..., Any], intranet: Intranet
) -> None:
    # 127.0.0.1 stands for an allowed (or any public) host; "localhost" is not allowed (it is
    # ::1 as well). A redirect from the allowed host must not launder the blocked one.
    app: RunningApp = await start_app(render_slots=1, allow_hosts=("127.0.0.1",))
    target = intranet.url("/secret", host="localhost")
    job, pdf = await render(
        app, f'<h1>Doc</h1><iframe src="{intranet.url("/bounce")}?to={target}"></iframe>'
    )
    assert intranet.hits[0] == "/bounce"
    assert "/secret" not in intranet.hits, "the redirect target was fetched"
    assert "TOP-SECRET" not in text_of(pdf)
    assert any("localhost is a loopback host name" in warning for warning in job["warnings"])


async def test_allowed_hosts_and_data_uris_are_fetched(
    start_app: Callable[..., Any], intranet: Intranet
) -> None:
    app: RunningApp = await start_app(render_slots=1, allow_hosts=("127.0.0.1",))
    inline = "data:image/png;base64," + base64.b64encode(png(24)).decode()
    template = f"""<h1>Logos</h1>
        <img style="width: 200px" src="{intranet.url("/logo.png")}">
        <img style="width: 200px" src="{inline}">"""
    job, pdf = await render(app, template)
    assert intranet.hits == ["/logo.png"]
    assert job["warnings"] == []
    assert len(pdf.pages[0].images) == 2, "both images are in the PDF"
