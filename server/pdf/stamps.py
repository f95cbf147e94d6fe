"""The stamp step: text or an image drawn on the chosen pages, over the content or under it.

fpdf2 lays out the stamp once, as a small PDF page of its own (the text set in DejaVu Sans,
subset and embedded with its ToUnicode map, so the stamp is real text that readers can search
and copy; or the image, kept as the image it is). pikepdf places that page as one Form
XObject on every chosen page: each page gains a few bytes of content, not a copy of the stamp
nor a rasterised page. The placement is marked as an artifact, so a tagged PDF stays one.
Runs in a finishing process (server/pdf/finishing.py).
"""

from __future__ import annotations

import functools
import io
import math
import os
from pathlib import Path

import pikepdf
from fpdf import FPDF
from PIL import Image

from server.errors import PermanentError
from server.options.finishing import Stamp, page_numbers

#: Where the stamp's font is looked for: Debian's fonts-dejavu-core (scripts/install-browser.sh
#: installs it), then other usual places.
FONT_PATHS = (
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/local/share/fonts/DejaVuSans.ttf",
)
PT_PER_PX = 0.75  # an image is drawn at its size in CSS pixels (96 per inch)
_PADDING_PT = 2.0


def font_path() -> Path:
    """DejaVu Sans, for stamps and visible signatures; PermanentError when none is installed."""
    for path in FONT_PATHS:
        if os.path.exists(path):
            return Path(path)
    raise PermanentError("no DejaVu Sans font is installed for the stamp (fonts-dejavu-core)")


@functools.lru_cache(maxsize=32)
def _text_page(text: str, font_size: float, color: str) -> bytes:
    """A PDF page just large enough for `text`: made once per text, size and colour in a
    process (fpdf2 reads and subsets the font each time, about a tenth of a second)."""
    sizer = FPDF(unit="pt")
    sizer.add_font("stamp", fname=str(font_path()))
    sizer.set_font("stamp", size=font_size)
    width = sizer.get_string_width(text) + 2 * _PADDING_PT
    height = font_size * 1.25 + 2 * _PADDING_PT
    pdf = FPDF(unit="pt", format=(width, height))
    pdf.set_margin(0)
    pdf.set_auto_page_break(False)
    pdf.add_page()
    pdf.add_font("stamp", fname=str(font_path()))
    pdf.set_font("stamp", size=font_size)
    red, green, blue = (int(color[i : i + 2], 16) for i in (1, 3, 5))
    pdf.set_text_color(red, green, blue)
    # The baseline sits a descender's depth above the bottom.
    pdf.text(_PADDING_PT, height - _PADDING_PT - font_size * 0.25, text)
    return bytes(pdf.output())


def _image_page(data: bytes) -> bytes:
    try:
        with Image.open(io.BytesIO(data)) as image:
            width_px, height_px = image.size
    except Exception:
        raise PermanentError("stamp.asset is not an image that can be read") from None
    width, height = width_px * PT_PER_PX, height_px * PT_PER_PX
    pdf = FPDF(unit="pt", format=(width, height))
    pdf.set_margin(0)
    pdf.set_auto_page_break(False)
    pdf.add_page()
    pdf.image(io.BytesIO(data), x=0, y=0, w=width, h=height)
    return bytes(pdf.output())


def apply(pdf: pikepdf.Pdf, stamp: Stamp, image: bytes | None) -> None:
    """Draw `stamp` on its pages of `pdf` (its image's bytes for an image stamp)."""
    if stamp.text is not None:
        made = _text_page(stamp.text, stamp.font_size, stamp.color)
    else:
        assert image is not None  # the worker reads the asset of an image stamp
        made = _image_page(image)
    with pikepdf.open(io.BytesIO(made)) as source:
        form = pdf.copy_foreign(source.pages[0].as_form_xobject())
    width, height = (float(v) for v in form.BBox[2:4])
    alpha = pdf.make_indirect(
        pikepdf.Dictionary(Type=pikepdf.Name.ExtGState, ca=stamp.opacity, CA=stamp.opacity)
    )
    under = stamp.layer == "under"
    for index in page_numbers(stamp.pages, len(pdf.pages)):
        page = pdf.pages[index]
        box = [float(v) for v in page.mediabox]
        matrix = _placement(box, width, height, stamp.rotate)
        name = page.add_resource(form, pikepdf.Name.XObject, _free(page, "XObject", "Stamp"))
        gs = page.add_resource(
            alpha, pikepdf.Name.ExtGState, _free(page, "ExtGState", "StampAlpha")
        )
        placed = " ".join(f"{v:.4f}" for v in matrix)
        content = f"/Artifact BMC q {gs} gs {placed} cm {name} Do Q EMC\n".encode()
        if under:
            page.contents_add(content, prepend=True)
        else:
            # The page's own content may leave its graphics state changed: wrap it first.
            page.contents_add(b"q\n", prepend=True)
            page.contents_add(b"Q\n" + content)


def _free(page: pikepdf.Page, kind: str, prefix: str) -> pikepdf.Name:
    """The first of /{prefix}1, /{prefix}2, … the page has no resource of `kind` by: the
    same names for the same document (pikepdf's own prefix adds random letters, and the
    same inputs must give the same bytes, server/pdf/provenance.py)."""
    resources = page.obj.get("/Resources")
    taken = resources.get(f"/{kind}") if isinstance(resources, pikepdf.Dictionary) else None
    number = 1
    while isinstance(taken, pikepdf.Dictionary) and f"/{prefix}{number}" in taken:
        number += 1
    return pikepdf.Name(f"/{prefix}{number}")


def _placement(box: list[float], width: float, height: float, degrees: float) -> tuple[float, ...]:
    """The matrix that puts a `width` x `height` stamp at the centre of the page box, turned
    `degrees` counter-clockwise, and scaled down if, turned, it would not fit."""
    x0, y0, x1, y1 = box
    page_w, page_h = x1 - x0, y1 - y0
    angle = math.radians(degrees)
    cos, sin = math.cos(angle), math.sin(angle)
    turned_w = abs(width * cos) + abs(height * sin)
    turned_h = abs(width * sin) + abs(height * cos)
    scale = min(1.0, page_w / turned_w, page_h / turned_h)
    a, b, c, d = scale * cos, scale * sin, -scale * sin, scale * cos
    centre_x, centre_y = x0 + page_w / 2, y0 + page_h / 2
    # The stamp's own centre goes to the page's centre.
    e = centre_x - (a * width / 2 + c * height / 2)
    f = centre_y - (b * width / 2 + d * height / 2)
    return (a, b, c, d, e, f)
