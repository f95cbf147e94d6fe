"""The archive steps: attachments (associated files), a Factur-X invoice, and PDF/A.

PDF/A is built with pikepdf on Chromium's own file, not by rewriting it: Chromium already
embeds every font (subset TrueType, with widths and an identity CID map) and writes no
encryption, JavaScript or external content, so what PDF/A-2b/3b still asks for is an sRGB
output intent with its ICC profile, XMP metadata that states the part and conformance and
repeats the document information, and a document ID. Everything else stays as Chromium made
it: the text layer, links, the outline and the structure tree of a tagged PDF. (Ghostscript's
pdfwrite, the other candidate, rewrites every page and drops the structure tree and /Lang;
docs/decisions/013-pdf-finishing-with-pikepdf.md has the comparison.) The sRGB profile is
made by Little CMS through Pillow, so no profile file has to be shipped or found.

Runs in a finishing process (server/pdf/finishing.py).
"""

from __future__ import annotations

import datetime as dt
import functools
import struct
from collections.abc import Mapping

import pikepdf
from PIL import ImageCms

from server.errors import PermanentError
from server.options.finishing import Attachment
from server.pdf.invoices import FILENAME, MIME_TYPE, Invoice

SRGB = "sRGB IEC61966-2.1"
_PRINT_FLAG = 4
_HIDING_FLAGS = 2 | 32 | 256  # Hidden, NoView, ToggleNoView: PDF/A wants every annotation shown
_INFO_FIELDS = {"/Title": "title", "/Author": "author", "/Subject": "subject"}
# The ICC header's creation date: six big-endian 16-bit numbers at byte 24 (ICC.1 7.2.1).
_ICC_DATE = 24
_ICC_FIXED_DATE = struct.pack(">6H", 1999, 10, 18, 0, 0, 0)  # any fixed date: the sRGB standard's


@functools.lru_cache(maxsize=1)
def srgb_profile() -> bytes:
    """An sRGB ICC profile (Little CMS's, via Pillow), the same bytes in every process: Little
    CMS writes the time it made the profile into its header, which is set to a fixed date
    here (the profile has no ID, which would be a digest over that date), so that the same
    inputs give the same PDF/A (server/pdf/provenance.py)."""
    data: bytes = ImageCms.ImageCmsProfile(ImageCms.createProfile("sRGB")).tobytes()
    return data[:_ICC_DATE] + _ICC_FIXED_DATE + data[_ICC_DATE + len(_ICC_FIXED_DATE) :]


def unembedded_font(pdf: pikepdf.Pdf) -> tuple[str, int] | None:
    """The first font the pages draw with (directly, in their form XObjects or in their
    annotations' appearances, such as a form field's) that is not embedded, with its page (1
    is the first); None when all are (Chromium's always are)."""
    seen: set[tuple[int, int]] = set()
    for number, page in enumerate(pdf.pages, start=1):
        pending = [page.obj.get("/Resources")]
        for annotation in page.obj.get("/Annots", ()):
            appearance = annotation.get("/AP")
            if not isinstance(appearance, pikepdf.Dictionary):
                continue
            shown = appearance.get("/N")
            states = shown.values() if isinstance(shown, pikepdf.Dictionary) else [shown]
            pending += [s.get("/Resources") for s in states if isinstance(s, pikepdf.Stream)]
        while pending:
            resources = pending.pop()
            if not isinstance(resources, pikepdf.Dictionary):
                continue
            if resources.is_indirect:
                if resources.objgen in seen:
                    continue
                seen.add(resources.objgen)
            fonts = resources.get("/Font")
            for font in fonts.values() if isinstance(fonts, pikepdf.Dictionary) else ():
                if isinstance(font, pikepdf.Dictionary) and not _embedded(font):
                    return str(font.get("/BaseFont", "?")).lstrip("/"), number
            xobjects = resources.get("/XObject")
            for xobject in xobjects.values() if isinstance(xobjects, pikepdf.Dictionary) else ():
                if isinstance(xobject, pikepdf.Stream) and xobject.get("/Subtype") == "/Form":
                    pending.append(xobject.get("/Resources"))
    return None


def _embedded(font: pikepdf.Dictionary) -> bool:
    if font.get("/Subtype") == "/Type3":
        return True  # its glyphs are content streams of the file
    descendants = font.get("/DescendantFonts")
    described = descendants[0] if isinstance(descendants, pikepdf.Array) and descendants else font
    descriptor = described.get("/FontDescriptor")
    if not isinstance(descriptor, pikepdf.Dictionary):
        return False
    return any(key in descriptor for key in ("/FontFile", "/FontFile2", "/FontFile3"))


def _pdf_date(now: dt.datetime) -> str:
    return now.strftime("D:%Y%m%d%H%M%S+00'00'")


def attach(
    pdf: pikepdf.Pdf,
    name: str,
    data: bytes,
    mime_type: str,
    relationship: str,
    description: str,
    uploaded: dt.datetime | None = None,
) -> None:
    """Embed `data` as `name`, an associated file of the document (its /AF), as PDF/A-3 wants:
    with its MIME type, modification date and relationship. The date is when its asset was
    uploaded (the same asset, the same bytes: server/pdf/provenance.py), else now."""
    now = _pdf_date(uploaded.astimezone(dt.UTC) if uploaded else dt.datetime.now(dt.UTC))
    spec = pikepdf.AttachedFileSpec(
        pdf,
        data,
        description=description,
        filename=name,
        mime_type=mime_type,
        creation_date=now,
        mod_date=now,
        relationship=pikepdf.Name("/" + relationship),
    )
    pdf.attachments[name] = spec  # pikepdf lists a file with a relationship in /AF too


def attachments(
    pdf: pikepdf.Pdf,
    files: list[Attachment],
    contents: dict[str, tuple[str, bytes]],
    uploaded: Mapping[str, dt.datetime] | None = None,
) -> None:
    """The job's attachments; `contents` holds each asset's (content type, bytes) by id,
    `uploaded` when each was uploaded."""
    for file in files:
        mime_type, data = contents[file.asset]
        when = (uploaded or {}).get(file.asset)
        description = file.description or ""
        attach(pdf, file.name, data, mime_type, file.relationship, description, when)


def facturx(pdf: pikepdf.Pdf, invoice: Invoice, uploaded: dt.datetime | None = None) -> None:
    """Embed the invoice's XML as factur-x.xml (dated when it was `uploaded`), and the XMP of
    a Factur-X invoice (its extension schema included); the PDF/A step completes it."""
    relationship = invoice.relationship
    attach(pdf, FILENAME, invoice.xml, MIME_TYPE, relationship, "Factur-X invoice", uploaded)
    info = {
        key: str(pdf.docinfo[name]) if name in pdf.docinfo else ""
        for name, key in _INFO_FIELDS.items()
    }
    pdf.Root.Metadata = pdf.make_stream(invoice.xmp(info), Type=pikepdf.Name.Metadata)
    pdf.Root.Metadata.Subtype = pikepdf.Name.XML


def pdfa(pdf: pikepdf.Pdf, level: str) -> None:
    """Make the document PDF/A-`level` ("2b" or "3b"). PermanentError names a font that is not
    embedded (an uploaded PDF's, or a form field's filled in a standard font): PDF/A needs
    every font embedded, and no step embeds one after the fact."""
    missing = unembedded_font(pdf)
    if missing is not None:
        name, number = missing
        raise PermanentError(
            f"pdfa: the font {name} (page {number}) is not embedded, and PDF/A needs every font "
            "embedded: give PDFs whose fonts are embedded, or leave pdfa out"
        )
    if "/OutputIntents" not in pdf.Root:
        profile = pdf.make_stream(srgb_profile(), N=3)
        intent = pikepdf.Dictionary(
            Type=pikepdf.Name.OutputIntent,
            S=pikepdf.Name.GTS_PDFA1,
            OutputConditionIdentifier=pikepdf.String(SRGB),
            Info=pikepdf.String(SRGB),
            DestOutputProfile=profile,
        )
        pdf.Root.OutputIntents = pikepdf.Array([pdf.make_indirect(intent)])
    for page in pdf.pages:
        for annotation in page.obj.get("/Annots", ()):
            flags = int(annotation.get("/F", 0))
            if flags & _PRINT_FLAG == 0 or flags & _HIDING_FLAGS:
                annotation.F = (flags | _PRINT_FLAG) & ~_HIDING_FLAGS
    # Also updates the document information to match (pikepdf keeps the two in step).
    with pdf.open_metadata(set_pikepdf_as_editor=False) as meta:
        meta.load_from_docinfo(pdf.docinfo)
        meta["pdfaid:part"] = level[0]
        meta["pdfaid:conformance"] = level[1].upper()
