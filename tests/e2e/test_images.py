"""Images out in real Chromium: each format's signature and pixel size for the viewport, a
scale, the full page and one element; transparency; scripts on a page of their own; and a
PDF's thumbnail as printed (its page margins), exactly as wide as asked."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from typing import Any

import pytest
from PIL import Image

from tests.conftest import RunningApp
from tests.e2e.test_render import render

pytestmark = pytest.mark.browser

RED = (200, 30, 30)
# No background of its own: what is not painted is the page's default, white or transparent.
PAGE = (
    "<style>html, body { margin: 0 }"
    " #box { position: absolute; left: 40px; top: 900px; width: 120px; height: 50px;"
    " background: rgb(200, 30, 30) }</style>"
    '<div style="height: 1500px"></div><div id="box"></div>'
)
SIGNATURES = {
    "png": (b"\x89PNG\r\n\x1a\n", "image/png"),
    "jpeg": (b"\xff\xd8\xff", "image/jpeg"),
    "webp": (b"RIFF", "image/webp"),
}


@pytest.fixture
async def chromium_app(start_app: Callable[..., Any]) -> RunningApp:
    app: RunningApp = await start_app(render_slots=2)
    return app


async def shot(
    app: RunningApp, output: str, html: str = PAGE, **screenshot: Any
) -> tuple[Image.Image, bytes]:
    options: dict[str, Any] = {"output": output}
    if screenshot:
        options["screenshot"] = screenshot
    job, data = await render(app, {"template": html, "options": options})
    assert data is not None, job["error"]
    signature, content_type = SIGNATURES[output]
    assert data.startswith(signature), data[:16]
    if output == "webp":
        assert data[8:12] == b"WEBP"
    assert job["pages"] is None and job["bytes"] == len(data)
    async with app.http.get(job["url"]) as resp:
        assert resp.content_type == content_type
    return Image.open(io.BytesIO(data)), data


async def test_each_format_its_signature_and_size(chromium_app: RunningApp) -> None:
    scripted = "<script>document.documentElement.style.background = 'rgb(0, 0, 255)'</script>"
    results = await asyncio.gather(
        shot(chromium_app, "png"),
        shot(chromium_app, "jpeg", PAGE + scripted, width=640, height=480, quality=40),
        shot(chromium_app, "webp", width=300, height=200, scale=2),
        shot(chromium_app, "png", width=800, full_page=True),
        shot(chromium_app, "png", selector="#box", scale=2),
        shot(chromium_app, "png", omit_background=True),
    )
    (viewport, _), (jpeg, _), (webp, _), (full, _), (element, _), (clear, _) = results
    assert viewport.size == (1280, 720) and viewport.format == "PNG"
    assert viewport.convert("RGBA").getpixel((5, 5)) == (255, 255, 255, 255)
    assert jpeg.size == (640, 480) and jpeg.format == "JPEG"
    red, green, blue = jpeg.convert("RGB").getpixel((5, 5))  # type: ignore[misc]
    assert blue > 200 and red < 60 and green < 60, "the page's script ran before the shot"
    assert webp.size == (600, 400) and webp.format == "WEBP"
    assert full.size == (800, 1500)
    assert full.convert("RGB").getpixel((100, 925)) == RED  # the box, far below the viewport
    assert element.size == (240, 100)
    assert element.convert("RGB").getpixel((120, 50)) == RED
    assert clear.mode == "RGBA" and clear.getpixel((5, 5))[3] == 0  # type: ignore[index]


async def test_a_thumbnail_is_page_one_as_printed_and_exactly_as_wide_as_asked(
    chromium_app: RunningApp,
) -> None:
    # 210 pixels for an A4 page: one pixel per millimetre.
    html = (
        "<style>@page { margin: 20mm } body { margin: 0 }</style>"
        '<div style="height: 30mm; background: rgb(200, 30, 30)"></div><p>Invoice</p>'
    )
    job, pdf = await render(
        chromium_app, {"template": html, "options": {"thumbnail": {"width": 210}}}
    )
    assert pdf is not None and pdf.startswith(b"%PDF-"), job["error"]
    assert job["pages"] == 1
    async with chromium_app.http.get(job["thumbnail_url"]) as resp:
        assert resp.status == 200 and resp.content_type == "image/png"
        thumbnail = Image.open(io.BytesIO(await resp.read())).convert("RGB")
    assert thumbnail.width == 210 and abs(thumbnail.height - 297) <= 1
    assert thumbnail.getpixel((10, 10)) == (255, 255, 255), "the page margin, as printed"
    assert thumbnail.getpixel((105, 35)) == RED, "the block, inside the margins"
    assert thumbnail.getpixel((105, 55)) == (255, 255, 255), "below the 30 mm block"
