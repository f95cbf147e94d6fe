"""PDF document information (title, author, subject, keywords, custom keys) set after Chromium
prints, and read back for the job (server/pdf/finishing.py).

Chromium's page.pdf() takes the title from the page and has no way to set the other fields,
so they are set with pikepdf in the one pass every PDF goes through after it is printed: the
finishing steps' write, or, for a job without any, the pass that records its provenance
(server/pdf/provenance.py).
"""

from __future__ import annotations

import pikepdf


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
