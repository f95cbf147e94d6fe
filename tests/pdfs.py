"""Small helpers the tests share: a minimal valid PDF and a renderer that makes one (or a
small image, for a job whose options ask for one)."""

from __future__ import annotations

import asyncio
import datetime as dt
import io
import re
from collections.abc import Callable, Iterator
from typing import Any

import pikepdf
from PIL import Image

from server.errors import RenderError
from server.options import RenderOptions
from server.render.chromium import Assets, RenderResult
from server.render.sources import Document


def page_contents(data: bytes) -> list[bytes]:
    """Each page's content, decoded: what a PDF draws, whatever Pressroom added to the file
    around it (its provenance in the XMP, its document information)."""
    with pikepdf.open(io.BytesIO(data)) as pdf:
        return [page.Contents.read_bytes() for page in pdf.pages]


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
    """Stands in for Chromium in API tests: instant PDFs, or held / failing on demand."""

    def __init__(self, *, pages: int = 1, text_of: Callable[[str], str] | None = None) -> None:
        self.pages = pages  # how many pages the PDFs claim to have
        self.text_of = text_of  # the text of each PDF, from the page's HTML (else "Pressroom")
        self.gate: asyncio.Event | None = None
        self.fail_with: RenderError | None = None
        self.rendered: list[Document] = []
        self.calls: list[Document] = []  # every render begun, finished or not
        self.options: list[RenderOptions] = []  # the options of every render begun
        self.assets: list[Assets | None] = []  # the files each render was given
        self.started = asyncio.Event()

    async def render(
        self,
        html: Document,
        options: RenderOptions,
        *,
        timeout_s: float,
        assets: Assets | None = None,
    ) -> RenderResult:
        self.calls.append(html)
        self.options.append(options)
        self.assets.append(assets)
        self.started.set()
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


# --- PDF/A, checked with pikepdf ----------------------------------------------------------
# veraPDF is not at hand; these are the rules of ISO 19005-2/-3 (level B) that a Chromium PDF
# after finishing could break, each read from the file with pikepdf.

_INFO_XMP = {
    "/Title": "dc:title",
    "/Author": "dc:creator",
    "/Subject": "dc:description",
    "/Keywords": "pdf:Keywords",
    "/Producer": "pdf:Producer",
    "/Creator": "xmp:CreatorTool",
    "/CreationDate": "xmp:CreateDate",
    "/ModDate": "xmp:ModifyDate",
}


def _pdf_date(text: str) -> dt.datetime:
    match = re.fullmatch(
        r"D:(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})(Z(?:00'00'?)?|[+-]\d{2}'?\d{2}'?)?", text
    )
    assert match, text
    zone = (match[7] or "Z").replace("'", "")
    stamp = "".join(match.groups()[:6]) + ("+0000" if zone.startswith("Z") else zone)
    return dt.datetime.strptime(stamp, "%Y%m%d%H%M%S%z")


def _fonts(resources: Any, seen: set[int]) -> Iterator[Any]:
    """Every font reachable from a resource dictionary, through forms and Type 3 glyphs."""
    if not isinstance(resources, pikepdf.Dictionary):
        return
    for font in resources.get("/Font", {}).values():
        if font.objgen not in seen:
            seen.add(font.objgen)
            yield font
            yield from _fonts(font.get("/Resources"), seen)
    for xobject in resources.get("/XObject", {}).values():
        if xobject.get("/Subtype") == "/Form" and xobject.objgen not in seen:
            seen.add(xobject.objgen)
            yield from _fonts(xobject.get("/Resources"), seen)


def pdfa_problems(data: bytes, part: int) -> list[str]:
    """What keeps `data` from being PDF/A-`part` level B, as far as these checks see."""
    problems: list[str] = []
    pdf = pikepdf.open(io.BytesIO(data))
    root = pdf.Root
    if pdf.is_encrypted:
        problems.append("encrypted")
    ids = pdf.trailer.get("/ID")
    if ids is None or len(ids) != 2:
        problems.append("no document ID in the trailer")
    if "/Metadata" not in root:
        return [*problems, "no XMP metadata"]
    if "/Filter" in root.Metadata:
        problems.append("the XMP metadata stream is compressed")
    meta = pdf.open_metadata()
    if (meta.get("pdfaid:part"), meta.get("pdfaid:conformance")) != (str(part), "B"):
        problems.append(f"pdfaid says {meta.get('pdfaid:part')}{meta.get('pdfaid:conformance')}")
    for name, key in _INFO_XMP.items():
        if name not in pdf.docinfo:
            continue
        value, shown = str(pdf.docinfo[name]), meta.get(key)
        if name.endswith("Date"):
            same = shown is not None and _pdf_date(value) == dt.datetime.fromisoformat(shown)
        elif key == "dc:creator":
            same = shown == [value]
        else:
            same = shown == value
        if not same:
            problems.append(f"Info {name} {value!r} is not XMP {key} {shown!r}")
    intents = [i for i in root.get("/OutputIntents", ()) if i.get("/S") == "/GTS_PDFA1"]
    if len(intents) != 1:
        problems.append(f"{len(intents)} PDF/A output intents")
    else:
        profile = intents[0].DestOutputProfile
        icc = profile.read_bytes()
        if int(profile.N) != 3 or icc[36:40] != b"acsp" or icc[16:20] != b"RGB " or icc[8] > 4:
            problems.append("the output intent's profile is not an RGB ICC profile (v4 or less)")
    seen: set[int] = set()
    for number, page in enumerate(pdf.pages, start=1):
        fonts = list(_fonts(page.obj.get("/Resources"), seen))
        for annotation in page.obj.get("/Annots", ()):
            flags = int(annotation.get("/F", 0))
            if flags & 4 == 0 or flags & (2 | 32 | 256):
                problems.append(f"page {number}: an annotation is not shown in print")
            appearance = annotation.get("/AP", {}).get("/N")
            if isinstance(appearance, pikepdf.Stream):
                fonts += _fonts(appearance.get("/Resources"), seen)
        for font in fonts:
            if font.get("/Subtype") == "/Type3":
                continue
            described = font.DescendantFonts[0] if font.Subtype == "/Type0" else font
            descriptor = described.get("/FontDescriptor", {})
            if not any(key in descriptor for key in ("/FontFile", "/FontFile2", "/FontFile3")):
                problems.append(f"page {number}: font {font.get('/BaseFont')} is not embedded")
    if "/JavaScript" in root.get("/Names", {}) or "/AA" in root:
        problems.append("scripts or actions")
    files = list(pdf.attachments.items())
    if files and part == 2:
        problems.append("embedded files (PDF/A-2 allows PDF/A files only)")
    listed = {spec.objgen for spec in root.get("/AF", ())}
    for name, spec in files:
        if spec.obj.objgen not in listed or "/AFRelationship" not in spec.obj:
            problems.append(f"{name} is not an associated file with a relationship")
        if not spec.get_file().mime_type:
            problems.append(f"{name} has no MIME type")
    return problems
