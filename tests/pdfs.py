"""Small helpers the tests share: a minimal valid PDF and a renderer that makes one (or a
small image, for a job whose options ask for one)."""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable

from PIL import Image

from server.errors import RenderError
from server.options import RenderOptions
from server.render import Assets, RenderResult


def minimal_pdf(text: str = "Pressroom") -> bytes:
    """A one-page PDF with `text` in its text layer, built by hand (no browser)."""
    stream = f"BT /F1 24 Tf 72 720 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % number + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


def small_image(output: str, size: tuple[int, int] = (4, 3)) -> bytes:
    """A real PNG, JPEG or WebP of `size` pixels, made by Pillow (no browser)."""
    out = io.BytesIO()
    Image.new("RGB", size, "white").save(out, format=output.upper())
    return out.getvalue()


class FakeRenderer:
    """Stands in for Chromium in API tests: instant PDFs, or held / failing on demand. With
    `prints`, it says it began printing (on_print) before it waits at the gate, as Chromium
    does once the page has loaded."""

    def __init__(
        self,
        *,
        prints: bool = False,
        load_s: float = 0.0,
        pages: int = 1,
        text_of: Callable[[str], str] | None = None,
    ) -> None:
        self.prints = prints
        self.pages = pages  # how many pages the PDFs claim to have
        self.text_of = text_of  # the text of each PDF, from the page's HTML (else "Pressroom")
        self.load_s = load_s  # how long the page takes to "load" before printing begins
        self.gate: asyncio.Event | None = None
        self.fail_with: RenderError | None = None
        self.rendered: list[str] = []
        self.calls: list[str] = []  # every render begun, finished or not
        self.assets: list[Assets | None] = []  # the files each render was given
        self.started = asyncio.Event()

    async def render(
        self,
        html: str,
        options: RenderOptions,
        *,
        timeout_s: float,
        on_print: Callable[[], None] | None = None,
        assets: Assets | None = None,
    ) -> RenderResult:
        self.calls.append(html)
        self.assets.append(assets)
        self.started.set()
        if self.load_s:
            await asyncio.sleep(self.load_s)
        if self.prints and on_print is not None:
            on_print()
        if self.gate is not None:
            await self.gate.wait()
        if self.fail_with is not None:
            raise self.fail_with
        self.rendered.append(html)
        if options.image:
            return RenderResult(data=small_image(options.output), pages=None, warnings=[])
        text = self.text_of(html) if self.text_of is not None else "Pressroom"
        return RenderResult(data=minimal_pdf(text), pages=self.pages, warnings=[])

    async def check(self) -> None:
        return None
