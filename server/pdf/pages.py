"""Page steps of finishing: `select_pages` (which pages, in which order) and `rotate`."""

from __future__ import annotations

import pikepdf

from server.errors import PermanentError
from server.options.finishing import Rotate, page_numbers, page_order


def select(pdf: pikepdf.Pdf, spec: str) -> None:
    """Keep the pages `spec` names, in its order (select_pages); PermanentError names a page
    past the end."""
    try:
        order = page_order(spec, len(pdf.pages))
    except ValueError as exc:
        raise PermanentError(f"select_pages: {exc}") from None
    chosen = [pdf.pages[index] for index in order]
    del pdf.pages[:]
    for page in chosen:
        pdf.pages.append(page)  # a page named twice: pikepdf appends a copy


def rotate(pdf: pikepdf.Pdf, rotation: Rotate) -> None:
    """Turn the chosen pages clockwise by the degrees given, on top of their own rotation."""
    for index in page_numbers(rotation.pages, len(pdf.pages)):
        pdf.pages[index].rotate(rotation.degrees, relative=True)
