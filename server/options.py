"""Render options: validated once at submission, stored as JSON, read back by the renderer."""

from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

PAPER_FORMATS = ("Letter", "Legal", "Tabloid", "Ledger", "A0", "A1", "A2", "A3", "A4", "A5", "A6")
_LENGTH = re.compile(r"^\d+(\.\d+)?(px|in|cm|mm)?$")
_PAGE_RANGES = re.compile(r"^\s*\d+(\s*-\s*\d*)?(\s*,\s*\d+(\s*-\s*\d*)?)*\s*$")
MARGIN_SIDES = ("top", "right", "bottom", "left")
MAX_TEXT_OPTION = 64 * 1024
MAX_METADATA_CHARS = 4096
# Chromium prints a header or footer into the page margin; with no margin it is cut away.
HEADER_FOOTER_MARGIN = "15mm"


class OptionsError(ValueError):
    """Invalid options; `errors` lists (field, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors))
        self.errors = errors


@dataclasses.dataclass(frozen=True, slots=True)
class RenderOptions:
    format: str | None = "A4"
    width: str | None = None
    height: str | None = None
    landscape: bool = False
    margin: dict[str, str] = dataclasses.field(default_factory=dict)
    scale: float = 1.0
    print_background: bool = True
    page_ranges: str = ""
    prefer_css_page_size: bool = False
    header_html: str | None = None
    footer_html: str | None = None
    media: str = "print"
    wait_for_selector: str | None = None
    wait_for_expression: str | None = None
    javascript: bool | None = None
    title: str | None = None
    author: str | None = None
    subject: str | None = None
    keywords: str | None = None

    def metadata(self) -> dict[str, str]:
        """PDF document information to set after printing (Chromium sets only the title)."""
        fields = {
            "/Title": self.title,
            "/Author": self.author,
            "/Subject": self.subject,
            "/Keywords": self.keywords,
        }
        return {name: value for name, value in fields.items() if value is not None}

    def pdf_arguments(self, max_pages: int | None = None) -> dict[str, Any]:
        """Keyword arguments for Playwright's page.pdf(); with `max_pages`, Chromium prints at
        most one page more than that (enough to tell the document is too long)."""
        args: dict[str, Any] = {
            "landscape": self.landscape,
            "scale": self.scale,
            "print_background": self.print_background,
            "prefer_css_page_size": self.prefer_css_page_size,
            "outline": False,
            "tagged": False,
        }
        if self.width or self.height:
            args["width"] = self.width
            args["height"] = self.height
        elif self.format:
            args["format"] = self.format
        margin = dict(self.margin)
        if self.header_html is not None:
            margin.setdefault("top", HEADER_FOOTER_MARGIN)
        if self.footer_html is not None:
            margin.setdefault("bottom", HEADER_FOOTER_MARGIN)
        if margin:
            args["margin"] = margin
        ranges = self.page_ranges
        if max_pages is not None:
            ranges = capped_ranges(ranges, max_pages + 1)
        if ranges:
            args["page_ranges"] = ranges
        if self.header_html is not None or self.footer_html is not None:
            args["display_header_footer"] = True
            # Chromium prints its own date/title header when a template is empty; a blank span
            # keeps the side the user did not ask for empty.
            args["header_template"] = self.header_html or "<span></span>"
            args["footer_template"] = self.footer_html or "<span></span>"
        return args

    def needs_javascript(self, html: str) -> bool:
        """Scripts run only in a fresh browser context; pages without them share one safely."""
        if self.javascript is not None:
            return self.javascript
        return self.wait_for_expression is not None or "<script" in html.lower()


def capped_ranges(ranges: str, pages: int) -> str:
    """Chromium's `ranges` ("" for all) cut to the first `pages` pages they select. Chromium
    prints the pages of its ranges in document order, each once, so that is the order here."""
    spans: list[tuple[int, float]] = []
    for part in ranges.split(",") if ranges else ["1-"]:
        first, dash, last = part.partition("-")
        start, end = int(first), float(last) if last else (math.inf if dash else float(first))
        if start < 1 or end < start:
            return ranges  # Chromium refuses it, and says why
        spans.append((start, end))
    kept: list[str] = []
    next_page, left = 1, pages
    for start, end in sorted(spans):
        start = max(start, next_page)
        if end < start:
            continue
        if left == 0:
            break
        stop = int(min(end, start + left - 1))
        kept.append(str(start) if stop == start else f"{start}-{stop}")
        left -= stop - start + 1
        next_page = stop + 1
    return ",".join(kept)


def _length(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError("must be a length such as 210mm, 8.5in or 800px")
    text = str(value).strip()
    if not _LENGTH.match(text):
        raise ValueError("must be a length such as 210mm, 8.5in or 800px")
    return text


#: Frozen, so one instance serves every job that asks for nothing else.
_DEFAULT = RenderOptions()


def parse(raw: Any) -> RenderOptions:
    """Validate a submitted `options` object; raise OptionsError with every problem found."""
    if raw is None or raw == {}:  # most jobs: the defaults, with no walk over the fields
        return _DEFAULT
    if not isinstance(raw, dict):
        raise OptionsError([("options", "must be an object")])
    errors: list[tuple[str, str]] = []
    values: dict[str, Any] = {}
    known = {f.name for f in dataclasses.fields(RenderOptions)}
    for key in raw:
        if key not in known:
            errors.append((f"options.{key}", "is not a known option"))

    def take(name: str, check: Any) -> None:
        if name not in raw or raw[name] is None:
            return
        try:
            values[name] = check(raw[name])
        except ValueError as exc:
            errors.append((f"options.{name}", str(exc)))

    def boolean(value: Any) -> bool:
        if not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value

    def text(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        if len(value) > MAX_TEXT_OPTION:
            raise ValueError(f"must be at most {MAX_TEXT_OPTION} characters")
        return value

    def paper(value: Any) -> str:
        for name in PAPER_FORMATS:
            if isinstance(value, str) and value.lower() == name.lower():
                return name
        raise ValueError(f"must be one of {', '.join(PAPER_FORMATS)}")

    def scale(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError("must be a number")
        if not 0.1 <= value <= 2:
            raise ValueError("must be between 0.1 and 2")
        return float(value)

    def margin(value: Any) -> dict[str, str]:
        if isinstance(value, (int, float, str)) and not isinstance(value, bool):
            side = _length(value)
            return {name: side for name in MARGIN_SIDES}
        if not isinstance(value, dict):
            raise ValueError("must be a length or an object with top, right, bottom, left")
        unknown = set(value) - set(MARGIN_SIDES)
        if unknown:
            raise ValueError(f"unknown side {sorted(unknown)[0]!r}")
        return {name: _length(length) for name, length in value.items()}

    def page_ranges(value: Any) -> str:
        if not isinstance(value, str) or not _PAGE_RANGES.match(value):
            raise ValueError("must look like 1-3, 5")
        return value.replace(" ", "")

    def info(value: Any) -> str:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        if len(value) > MAX_METADATA_CHARS:
            raise ValueError(f"must be at most {MAX_METADATA_CHARS} characters")
        return value

    def keywords(value: Any) -> str:
        if isinstance(value, list) and all(isinstance(word, str) for word in value):
            value = ", ".join(value)
        if not isinstance(value, str):
            raise ValueError("must be a string or a list of strings")
        return info(value)

    def media(value: Any) -> str:
        if value not in ("print", "screen"):
            raise ValueError("must be print or screen")
        return str(value)

    take("format", paper)
    take("width", _length)
    take("height", _length)
    take("landscape", boolean)
    take("margin", margin)
    take("scale", scale)
    take("print_background", boolean)
    take("page_ranges", page_ranges)
    take("prefer_css_page_size", boolean)
    take("header_html", text)
    take("footer_html", text)
    take("media", media)
    take("wait_for_selector", text)
    take("wait_for_expression", text)
    take("javascript", boolean)
    take("title", info)
    take("author", info)
    take("subject", info)
    take("keywords", keywords)
    if ("width" in values) != ("height" in values):
        errors.append(("options.width", "width and height go together"))
    if errors:
        raise OptionsError(errors)
    return RenderOptions(**values)


def to_json(options: RenderOptions) -> dict[str, Any]:
    """The options as stored on the job (only what differs from the defaults)."""
    default = _DEFAULT
    # Most jobs: the defaults themselves (see parse), known without comparing every field.
    if options is default or options == default:
        return {}
    return {
        f.name: getattr(options, f.name)
        for f in dataclasses.fields(options)
        if getattr(options, f.name) != getattr(default, f.name)
    }
