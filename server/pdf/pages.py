"""Page steps of finishing: `select_pages` (which pages, in which order) and `rotate`."""

from __future__ import annotations

import pikepdf

from server.errors import PermanentError
from server.options.finishing import Rotate, page_numbers


def ordered(spec: str, count: int) -> list[int]:
    """The 0-based pages `spec` ("3,1-2", "2-", "5-3") names in a document of `count` pages,
    in the order written, a page named twice taken twice; PermanentError names a page past
    the end."""
    chosen: list[int] = []
    for part in spec.split(","):
        first, dash, last = part.partition("-")
        start = int(first)
        end = (int(last) if last else count) if dash else start
        step = 1 if end >= start else -1
        for number in range(start, end + step, step):
            if not 1 <= number <= count:
                raise PermanentError(
                    f"select_pages: page {number} is not in the document ({count} pages)"
                )
            chosen.append(number - 1)
    return chosen


def select(pdf: pikepdf.Pdf, spec: str) -> None:
    """Keep the pages `spec` names, in its order (select_pages)."""
    chosen = [pdf.pages[index] for index in ordered(spec, len(pdf.pages))]
    del pdf.pages[:]
    for page in chosen:
        pdf.pages.append(page)  # a page named twice: pikepdf appends a copy


def rotate(pdf: pikepdf.Pdf, rotation: Rotate) -> None:
    """Turn the chosen pages clockwise by the degrees given, on top of their own rotation."""
    for index in page_numbers(rotation.pages, len(pdf.pages)):
        pdf.pages[index].rotate(rotation.degrees, relative=True)
