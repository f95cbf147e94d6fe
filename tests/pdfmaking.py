"""PDFs the PDF-operation tests start from, made here with pikepdf and Pillow (no file checked
in): pages of text, a form with a text field, a checkbox and a choice, photographs, and the
same files encrypted or broken."""

from __future__ import annotations

import io
import random
from typing import Any

import pikepdf
from pikepdf import Array, Dictionary, Name, String
from PIL import Image


def text_pdf(texts: list[str], *, title: str | None = None) -> bytes:
    """One Letter page per text, each line of it in Helvetica (a real text layer)."""
    pdf = pikepdf.new()
    font = pdf.make_indirect(
        Dictionary(Type=Name.Font, Subtype=Name.Type1, BaseFont=Name.Helvetica)
    )
    for text in texts:
        pdf.add_blank_page(page_size=(612, 792))
        page = pdf.pages[-1]
        page.Resources = Dictionary(Font=Dictionary(F1=font))
        page.Contents = pdf.make_stream(f"BT /F1 24 Tf 72 700 Td ({text}) Tj ET".encode())
    if title is not None:
        pdf.docinfo["/Title"] = title
    return _saved(pdf)


def form_pdf() -> bytes:
    """One page with an AcroForm: `customer` (text), `agree` (checkbox), `plan` (a choice of
    basic or pro, basic chosen), `size` (a radio group of S, M and L, none chosen)."""
    pdf = pikepdf.new()
    pdf.add_blank_page(page_size=(612, 792))
    page = pdf.pages[0]
    helv = pdf.make_indirect(
        Dictionary(
            Type=Name.Font,
            Subtype=Name.Type1,
            BaseFont=Name.Helvetica,
            Encoding=Name.WinAnsiEncoding,
        )
    )
    widgets = []

    def widget(**entries: Any) -> None:
        annotation = Dictionary(Type=Name.Annot, Subtype=Name.Widget, P=page.obj, F=4, **entries)
        widgets.append(pdf.make_indirect(annotation))

    widget(
        FT=Name.Tx,
        T=String("customer"),
        Rect=[72, 700, 300, 720],
        DA=String("/Helv 12 Tf 0 g"),
        V=String(""),
    )
    on = pdf.make_stream(b"q 0 0 1 rg 0 0 12 12 re f Q")
    off = pdf.make_stream(b"")
    for state in (on, off):
        state.Type, state.Subtype, state.BBox = Name.XObject, Name.Form, [0, 0, 12, 12]
    widget(
        FT=Name.Btn,
        T=String("agree"),
        Rect=[72, 660, 84, 672],
        V=Name.Off,
        AS=Name.Off,
        AP=Dictionary(N=Dictionary(Yes=on, Off=off)),
    )
    widget(
        FT=Name.Ch,
        Ff=1 << 17,  # a combo box
        T=String("plan"),
        Rect=[72, 620, 200, 640],
        DA=String("/Helv 12 Tf 0 g"),
        Opt=Array([String("basic"), String("pro")]),
        V=String("basic"),
    )
    # A radio group: one field, a button (widget) per option.
    size = pdf.make_indirect(Dictionary(FT=Name.Btn, Ff=1 << 15, T=String("size"), V=Name.Off))
    buttons = []
    for number, option in enumerate(("S", "M", "L")):
        chosen, blank = pdf.make_stream(b"0 0 12 12 re f"), pdf.make_stream(b"")
        for state in (chosen, blank):
            state.Type, state.Subtype, state.BBox = Name.XObject, Name.Form, [0, 0, 12, 12]
        button = Dictionary(
            Type=Name.Annot,
            Subtype=Name.Widget,
            Parent=size,
            P=page.obj,
            F=4,
            Rect=[72 + 20 * number, 580, 84 + 20 * number, 592],
            AS=Name.Off,
            AP=Dictionary(N=Dictionary({f"/{option}": chosen, "/Off": blank})),
        )
        buttons.append(pdf.make_indirect(button))
    size.Kids = Array(buttons)
    page.obj.Annots = pdf.make_indirect(Array([*widgets, *buttons]))
    pdf.Root.AcroForm = pdf.make_indirect(
        Dictionary(
            Fields=Array([*widgets, size]),
            DA=String("/Helv 0 Tf 0 g"),
            DR=Dictionary(Font=Dictionary(Helv=helv)),
        )
    )
    return _saved(pdf)


def photo_pdf(pages: int, *, pixels: tuple[int, int] = (1600, 1200), seed: int = 7) -> bytes:
    """`pages` pages, each a JPEG photograph-like image (smooth gradients with noise) of
    `pixels`, shown on a 4 x 3 inch area (400 dpi at 1600 x 1200): Pillow's PDF writer."""
    rng = random.Random(seed)
    images = []
    width = pixels[0]
    for number in range(pages):
        base = Image.linear_gradient("L").resize(pixels).convert("RGB")
        noise = Image.effect_noise(pixels, 40 + number % 5).convert("RGB")
        tint = Image.new("RGB", pixels, (rng.randrange(256), rng.randrange(256), 128))
        images.append(Image.blend(Image.blend(base, noise, 0.35), tint, 0.3))
    out = io.BytesIO()
    images[0].save(
        out,
        format="PDF",
        save_all=True,
        append_images=images[1:],
        resolution=width / 4,
        quality=90,
    )
    return out.getvalue()


def encrypted(data: bytes, *, user_password: str = "open") -> bytes:
    """The same PDF, AES-256 encrypted (an empty user password: it opens, but is encrypted)."""
    with pikepdf.open(io.BytesIO(data)) as pdf:
        out = io.BytesIO()
        pdf.save(out, encryption=pikepdf.Encryption(user=user_password, owner="owner"))
    return out.getvalue()


def broken(data: bytes) -> bytes:
    """A PDF whose header and end are whole but whose objects are noise: no xref to recover."""
    middle = bytes(random.Random(3).randrange(256) for _ in range(2000))
    return data[:9] + middle + b"\n%%EOF\n"


def _saved(pdf: pikepdf.Pdf) -> bytes:
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()
