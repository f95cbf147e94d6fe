"""A job's source → what Chromium loads: HTML (a template, or Markdown, through Jinja2 with the
job's data) or a page to open (page_url). `options.css` joins any of them. An Office file goes
to LibreOffice instead (server/render/office.py), and so does a Word template once filled
(server/render/docx.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from html import escape
from typing import Any

from server.options import RenderOptions
from server.render import markdown, templates

#: A job's sources, as the jobs_source_known CHECK names them. A `pdfs` job loads nothing here:
#: its uploads are joined in finishing (server/pdf/finishing.py).
TEMPLATE, MARKDOWN, PAGE_URL, OFFICE, PDFS = "template", "markdown", "page_url", "office", "pdfs"
DOCX = "docx"


@dataclasses.dataclass(frozen=True, slots=True)
class PageUrl:
    """A page Chromium opens (and the render then prints) instead of HTML it is given."""

    url: str


#: What the renderer prints: HTML, or a page to open.
Document = str | PageUrl


@dataclasses.dataclass(frozen=True, slots=True)
class OfficeFile:
    """An Office file LibreOffice converts (not Chromium): its path in the job's assets, or
    its asset id."""

    name: str


@dataclasses.dataclass(frozen=True, slots=True)
class WordTemplate(OfficeFile):
    """A Word template, filled with the job's data before LibreOffice converts it."""


def office(source: str, text: str) -> OfficeFile | None:
    """The Office file a job converts (None for a job Chromium prints)."""
    if source == DOCX:
        return WordTemplate(text)
    return OfficeFile(text) if source == OFFICE else None


async def load(
    source: str, text: str, data: dict[str, Any], options: RenderOptions, *, timeout_s: float
) -> Document:
    """The document for a job's source; template failures are PermanentError."""
    if source == PAGE_URL:
        return PageUrl(text)  # its stylesheet is added once the page has loaded
    html = await templates.render_async(text, data, timeout_s=timeout_s)
    if source == MARKDOWN:
        html = await asyncio.to_thread(markdown.to_html, html)
    if options.css:
        html = with_css(html, options.css)
    if options.title:
        html = with_title(html, options.title)
    return html


def with_title(html: str, title: str) -> str:
    """`html` whose document title is `title`: the first <title> is the document's, so one goes
    before the document's own (after a doctype, which must stay first). Chromium prints it where
    a header or footer has `class="title"`."""
    head = ""
    stripped = html.lstrip()
    if stripped[:9].lower() == "<!doctype":
        end = stripped.find(">") + 1
        head, html = stripped[:end], stripped[end:]
    return f"{head}<title>{escape(title)}</title>{html}"


def with_css(html: str, css: str) -> str:
    """`html` with `css` after its own styles (a style element at the end still applies to the
    whole document, and wins over the document's own rules of the same weight)."""
    # "</style" would end the element early; in CSS "<\/style" reads the same.
    escaped = css.replace("</", "<\\/")
    return f"{html}<style>{escaped}</style>"
