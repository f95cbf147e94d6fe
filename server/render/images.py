"""Images out: the last step of a render (page.pdf(), or a screenshot for an image output) and
a PNG thumbnail of a PDF's first page.

Screenshots are taken with Chromium's own Page.captureScreenshot over a CDP session rather than
Playwright's page.screenshot(), which knows PNG and JPEG only and scales by its context's device
factor alone: the one call writes all three formats, WebP included, and its clip's scale renders
at that resolution (as a device scale factor would) on a slot's reused page.
docs/decisions/012-images-by-cdp-and-pdfium.md has the figures.

A thumbnail is page 1 of the PDF as printed, rasterised by PDFium (pypdfium2, Chromium's own
PDF engine) and written by Pillow, in a thread: a screenshot of the page would show the screen
layout, not the paper's (no page margins, headers or page breaks).
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import threading
from typing import Any

import pypdfium2
from playwright.async_api import Error as PlaywrightError
from playwright.async_api import Page, ViewportSize

from server.errors import PermanentError
from server.options import RenderOptions, Screenshot

#: Chromium draws larger images, but one side past this is a page nobody meant to capture whole.
MAX_IMAGE_SIDE_PX = 16384
# PDFium is not thread-safe: one use at a time in this process (a rasterisation takes a few ms;
# server/render/preflight.py reads PDFs with it too).
PDFIUM = threading.Lock()
_UNDER_PX = 0.001
_TRANSPARENT = {"color": {"r": 0, "g": 0, "b": 0, "a": 0}}
# What to capture, in CSS pixels of the document: the first element the selector matches, the
# whole scrollable page, or the viewport where it is scrolled to; null when nothing matches.
# Fonts first: a screenshot taken before a web font arrives shows the fallback.
_CLIP = """async ([selector, fullPage]) => {
  await document.fonts.ready;
  const root = document.documentElement;
  if (selector !== null) {
    const element = document.querySelector(selector);
    if (element === null) return null;
    const box = element.getBoundingClientRect();
    return [box.x + scrollX, box.y + scrollY, box.width, box.height];
  }
  if (fullPage) {
    const body = document.body || root;
    return [0, 0, Math.max(root.scrollWidth, body.scrollWidth, innerWidth),
            Math.max(root.scrollHeight, body.scrollHeight, innerHeight)];
  }
  return [scrollX, scrollY, innerWidth, innerHeight];
}"""


def viewport(options: RenderOptions) -> ViewportSize | None:
    """The viewport an image output asks for; None for a PDF (the renderer chooses)."""
    if not options.image:
        return None
    shot = options.screenshot_or_default()
    return {"width": shot.width, "height": shot.height}


async def capture(page: Page, options: RenderOptions, max_pages: int | None) -> bytes:
    """The job's file from the loaded page: its PDF (at most `max_pages` and one more, see
    RenderOptions.pdf_arguments), or the screenshot its output asks for."""
    if not options.image:
        return await page.pdf(**options.pdf_arguments(max_pages))
    return await screenshot(page, options.output, options.screenshot_or_default())


async def screenshot(page: Page, output: str, shot: Screenshot) -> bytes:
    """A PNG, JPEG or WebP of the page; PermanentError when the selector matches nothing or the
    image would be too large."""
    try:
        found = await page.evaluate(_CLIP, [shot.selector, shot.full_page])
    except PlaywrightError as exc:
        if shot.selector is not None and "SyntaxError" in str(exc):
            raise PermanentError(f"screenshot.selector {shot.selector!r} is not CSS") from None
        raise
    if found is None:
        raise PermanentError(f"screenshot.selector {shot.selector!r} matches no element")
    x, y, width, height = found
    left, top = math.floor(x), math.floor(y)
    clip = {
        "x": left,
        "y": top,
        "width": math.ceil(x + width) - left,
        "height": math.ceil(y + height) - top,
        "scale": shot.scale,
    }
    if clip["width"] < 1 or clip["height"] < 1:
        raise PermanentError(f"screenshot.selector {shot.selector!r} matches an empty element")
    pixels = [round(clip[side] * shot.scale) for side in ("width", "height")]
    if max(pixels) > MAX_IMAGE_SIDE_PX:
        raise PermanentError(
            f"the screenshot would be {pixels[0]}x{pixels[1]} pixels; "
            f"at most {MAX_IMAGE_SIDE_PX} a side"
        )
    params: dict[str, Any] = {"format": output, "clip": clip, "captureBeyondViewport": True}
    if shot.quality is not None:
        params["quality"] = shot.quality
    session = await page.context.new_cdp_session(page)
    try:
        if shot.omit_background:
            await session.send("Emulation.setDefaultBackgroundColorOverride", _TRANSPARENT)
        try:
            answer = await session.send("Page.captureScreenshot", params)
        finally:
            if shot.omit_background:  # the slot's page prints the next job on white again
                await session.send("Emulation.setDefaultBackgroundColorOverride", {})
    finally:
        await session.detach()
    return base64.b64decode(answer["data"])


def rasterise_first_page(pdf: bytes, width_px: int) -> bytes:
    """A PNG of the PDF's first page, `width_px` wide, as printed (white paper)."""
    with PDFIUM:
        document = pypdfium2.PdfDocument(pdf)
        try:
            page = document[0]
            try:
                # PDFium makes the bitmap ceil(width * scale) wide: just under width_px keeps
                # a float's rounding from adding a column.
                scale = (width_px - _UNDER_PX) / page.get_width()
                bitmap = page.render(scale=scale, may_draw_forms=False)
                try:
                    out = io.BytesIO()
                    # Encoded before the bitmap goes: the image may share its memory.
                    bitmap.to_pil().save(out, format="PNG")
                finally:
                    bitmap.close()
            finally:
                page.close()
        finally:
            document.close()
    return out.getvalue()


async def thumbnail(pdf: bytes, width_px: int) -> bytes:
    """`rasterise_first_page` off the event loop (CPU work)."""
    return await asyncio.to_thread(rasterise_first_page, pdf, width_px)
