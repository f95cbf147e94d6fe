"""PDF document information (title, author, subject, keywords) set after Chromium prints.

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
        info = document.docinfo
        for name, value in fields.items():
            info[pikepdf.Name(name)] = value
        out = io.BytesIO()
        document.save(out)
    return out.getvalue()


async def apply(pdf: bytes, options: RenderOptions) -> bytes:
    """The PDF with the metadata the options ask for; unchanged (no copy) when they ask none."""
    fields = options.metadata()
    if not fields:
        return pdf
    return await asyncio.to_thread(with_metadata, pdf, fields)
