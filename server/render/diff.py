"""What changes between two renders of one sample: the page count, the text added and removed
per page (PDFium's text), and the share of pixels that differ per page (PDFium rasterises both
at DIFF_DPI), with an image of each changed page: the published render beside the new one, the
changed pixels marked in red. CPU work: run it off the event loop."""

from __future__ import annotations

import dataclasses
import difflib
import io
from typing import Any

import pypdfium2 as pdfium
from PIL import Image, ImageChops

#: 50 dpi: an A4 page is 414 by 586 pixels, enough to see that a line moved or a total went to
#: the next page, and small enough that a page's side-by-side PNG can be kept in its row.
DIFF_DPI = 50
#: Pages compared per sample; those after it are counted, not compared.
MAX_PAGES = 20
#: A pixel has changed when its grey level differs by more than this (of 255): anti-aliasing
#: noise stays under it, a glyph that moved does not.
TOLERANCE = 24
_MARK = (220, 30, 30)


@dataclasses.dataclass(frozen=True, slots=True)
class PageDiff:
    page: int
    #: Share of the page's pixels that differ (0 to 1); 1 for a page only one render has.
    changed: float
    added: list[str]
    removed: list[str]

    def public(self) -> dict[str, Any]:
        return {
            "page": self.page,
            "changed_pixels": round(self.changed, 6),
            "text_added": self.added,
            "text_removed": self.removed,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Compared:
    """Two renders of one sample: the pages that changed and their images (PNG)."""

    pages_before: int
    pages_after: int
    changed: list[PageDiff]
    images: dict[int, bytes]


@dataclasses.dataclass(frozen=True, slots=True)
class _Page:
    image: Image.Image
    lines: list[str]


def pages(document: bytes, limit: int = MAX_PAGES) -> tuple[int, list[_Page]]:
    """A render's page count and its first `limit` pages, rasterised in grey, with their text
    lines. An image output (PNG, JPEG, WebP) is one page without text."""
    if not document.startswith(b"%PDF"):
        with Image.open(io.BytesIO(document)) as shot:
            return 1, [_Page(shot.convert("L"), [])]
    pdf = pdfium.PdfDocument(document)
    try:
        count = len(pdf)
        found = []
        for index in range(min(count, limit)):
            page = pdf[index]
            try:
                bitmap = page.render(scale=DIFF_DPI / 72, grayscale=True)
                image = bitmap.to_pil().convert("L")
                text = page.get_textpage()
                lines = [line.strip() for line in text.get_text_bounded().splitlines()]
                text.close()
            finally:
                page.close()
            found.append(_Page(image, [line for line in lines if line]))
        return count, found
    finally:
        pdf.close()


def compare(before: bytes, after: bytes) -> Compared:
    """What changed from the `before` render to the `after` one."""
    count_before, old = pages(before)
    count_after, new = pages(after)
    changed: list[PageDiff] = []
    images: dict[int, bytes] = {}
    for index in range(max(len(old), len(new))):
        a = old[index] if index < len(old) else None
        b = new[index] if index < len(new) else None
        share, mask = _pixels(a, b)
        removed, added = _lines(a.lines if a else [], b.lines if b else [])
        if share == 0 and not added and not removed:
            continue
        changed.append(PageDiff(index + 1, share, added, removed))
        images[index + 1] = _side_by_side(a, b, mask)
    return Compared(count_before, count_after, changed, images)


def _pixels(a: _Page | None, b: _Page | None) -> tuple[float, Image.Image | None]:
    """The share of changed pixels and their mask (None: the whole page changed)."""
    if a is None or b is None or a.image.size != b.image.size:
        return 1.0, None
    mask = ImageChops.difference(a.image, b.image).point(lambda v: 255 if v > TOLERANCE else 0)
    width, height = mask.size
    return mask.histogram()[255] / (width * height), mask


def _lines(before: list[str], after: list[str]) -> tuple[list[str], list[str]]:
    removed, added = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, before, after).get_opcodes():
        if tag in ("replace", "delete"):
            removed += before[i1:i2]
        if tag in ("replace", "insert"):
            added += after[j1:j2]
    return removed, added


def _side_by_side(a: _Page | None, b: _Page | None, mask: Image.Image | None) -> bytes:
    """The published page (left) beside the new one (right), changed pixels in red on the new."""
    size = (b or a).image.size  # type: ignore[union-attr]  # one of them is a page
    blank = Image.new("L", size, 255)
    left = (a.image if a else blank).convert("RGB")
    right = (b.image if b else blank).convert("RGB")
    if mask is not None:
        right.paste(Image.new("RGB", right.size, _MARK), mask=mask)
    gap = 8
    sheet = Image.new("RGB", (left.width + gap + right.width, max(left.height, right.height)))
    sheet.paste((128, 128, 128), (0, 0, sheet.width, sheet.height))
    sheet.paste(left, (0, 0))
    sheet.paste(right, (left.width + gap, 0))
    out = io.BytesIO()
    sheet.convert("P", palette=Image.Palette.ADAPTIVE, colors=64).save(out, "PNG", optimize=True)
    return out.getvalue()
