"""PDF document information (title, author, subject, keywords, custom keys) set after Chromium
prints, and read back for the job (server/pdf/finishing.py).

Chromium's page.pdf() takes the title from the page and has no way to set the other fields,
so the finished bytes are rewritten with pikepdf, in a thread (it is CPU work).
"""

from __future__ import annotations

import asyncio
import io

import pikepdf

from server.options import RenderOptions


def with_metadata(pdf: bytes, fields: dict[str, str]) -> bytes:
    """The same document with these /Info fields set (others, such as /Producer, kept)."""
    with pikepdf.open(io.BytesIO(pdf)) as document:
        set_fields(document, fields)
        out = io.BytesIO()
        document.save(out)
    return out.getvalue()


def set_fields(document: pikepdf.Pdf, fields: dict[str, str]) -> None:
    """Set these /Info fields (names with their slash: /Title) on an open document."""
    info = document.docinfo
    for name, value in fields.items():
        info[pikepdf.Name(name)] = value


def read(document: pikepdf.Pdf) -> dict[str, str]:
    """The document's /Info fields that hold text, by name without the slash (Title), dates
    and the Trapped flag left out: what a job shows of the PDF it made."""
    shown: dict[str, str] = {}
    for name, value in document.docinfo.items():
        key = str(name).lstrip("/")
        dated = key in ("CreationDate", "ModDate", "Trapped")
        if dated or not isinstance(value, pikepdf.String | str):
            continue
        shown[key] = str(value)
    return shown


async def apply(pdf: bytes, options: RenderOptions) -> bytes:
    """The PDF with the metadata the options ask for; unchanged (no copy) when they ask none,
    or when finishing will rewrite the file anyway and sets them there (server/pdf/finishing.py)."""
    fields = options.document_info()
    if not fields or options.finishing:
        return pdf
    return await asyncio.to_thread(with_metadata, pdf, fields)
