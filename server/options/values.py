"""What each render option may be: its types, limits and checks (lengths, margins, paper,
page ranges, cookies, headers, media features), shared by the options model in
server/options/__init__.py and the JSON Schema it shows."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)

from server.options.outputs import OUTPUTS

#: Each paper format's width and height in inches, as Playwright's page.pdf() prints it.
PAPER_INCHES = {
    "Letter": (8.5, 11.0),
    "Legal": (8.5, 14.0),
    "Tabloid": (11.0, 17.0),
    "Ledger": (17.0, 11.0),
    "A0": (33.1, 46.8),
    "A1": (23.4, 33.1),
    "A2": (16.54, 23.4),
    "A3": (11.7, 16.54),
    "A4": (8.27, 11.7),
    "A5": (5.83, 8.27),
    "A6": (4.13, 5.83),
}
PAPER_FORMATS = tuple(PAPER_INCHES)
LENGTH_PATTERN = r"^\s*[0-9]+(\.[0-9]+)?(px|in|cm|mm)?\s*$"
#: CSS pixels per unit of a length, as Playwright converts them (a bare number is pixels).
PX_PER_UNIT = {"px": 1.0, "in": 96.0, "cm": 37.8, "mm": 3.78}
PAGE_RANGES_PATTERN = r"^\s*[0-9]+(\s*-\s*[0-9]*)?(\s*,\s*[0-9]+(\s*-\s*[0-9]*)?)*\s*$"
MARGIN_SIDES = ("top", "right", "bottom", "left")
MAX_TEXT_OPTION = 64 * 1024
MAX_METADATA_CHARS = 4096
MAX_WAIT_DELAY_MS = 10_000
MAX_COOKIES = 50
MAX_HEADERS = 50
MAX_COOKIE_VALUE_CHARS = 4096
MAX_HEADER_VALUE_CHARS = 8192
MAX_USER_AGENT_CHARS = 1024
# RFC 9110 token (header and cookie names) and RFC 6265 cookie-octets.
TOKEN_PATTERN = r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]{1,256}$"
COOKIE_VALUE_PATTERN = r'^"?[\x21\x23-\x2B\x2D-\x3A\x3C-\x5B\x5D-\x7E]*"?$'
HEADER_VALUE_PATTERN = r"^[\t\x20-\x7E]*$"
COOKIE_PATH_PATTERN = r"^/[\x21-\x3A\x3C-\x7E]*$"
# What the page's own requests may not be given: the browser and the proxy own these, and
# cookies go in `cookies`.
FORBIDDEN_HEADERS = frozenset(
    {
        "connection",
        "content-length",
        "cookie",
        "expect",
        "host",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
#: media_features: each CSS media feature and the argument of Playwright's emulate_media.
MEDIA_FEATURES = {
    "prefers-color-scheme": "color_scheme",
    "prefers-reduced-motion": "reduced_motion",
    "forced-colors": "forced_colors",
    "prefers-contrast": "contrast",
}
#: A side's margin when the job names none: Gotenberg's 0.39 in and the browsers' own print
#: default (about 0.4 in), so a document reads as a document, not a screenshot edge to edge.
#: A stylesheet's `@page { margin }` still wins.
DEFAULT_MARGIN = "10mm"
# Chromium prints a header or footer into the page margin; with no margin it is cut away.
HEADER_FOOTER_MARGIN = "15mm"
_LENGTH = re.compile(LENGTH_PATTERN)
_PAGE_RANGES = re.compile(PAGE_RANGES_PATTERN)
_LENGTH_HINT = "must be a length such as 210mm, 8.5in or 800px"
# A screenshot's viewport (CSS pixels) and scale (device pixels per CSS pixel); Playwright's
# own default viewport, 1280x720, unless the job says otherwise.
SCREENSHOT_MIN_SIDE, SCREENSHOT_MAX_SIDE = 16, 4096
SCREENSHOT_WIDTH, SCREENSHOT_HEIGHT = 1280, 720
SCREENSHOT_MAX_SCALE = 4.0
THUMBNAIL_MIN_WIDTH, THUMBNAIL_MAX_WIDTH = 16, 2000
# The image formats that have a compression quality, and those that have transparency.
WITH_QUALITY, WITH_ALPHA = ("jpeg", "webp"), ("png", "webp")
#: Options that only a printed PDF has: refused beside an image output.
PDF_ONLY = (
    "format",
    "landscape",
    "margin",
    "scale",
    "print_background",
    "page_ranges",
    "prefer_css_page_size",
    "header_html",
    "footer_html",
    "title",
    "author",
    "subject",
    "keywords",
    "thumbnail",
    "height",
    "width",
    "pdfa",
    "tagged",
    "outline",
    "select_pages",
    "rotate",
    "fill_form",
    "flatten",
    "metadata",
    "compress",
    "attachments",
    "facturx",
    "stamp",
    "encrypt",
    "sign",
    "preflight",
)
_TOKEN = re.compile(TOKEN_PATTERN)
_HEADER_VALUE = re.compile(HEADER_VALUE_PATTERN)


#: The options that a finishing step applies after Chromium (server/pdf/finishing.py).
FINISHED_BY = (
    "select_pages",
    "rotate",
    "fill_form",
    "flatten",
    "metadata",
    "attachments",
    "facturx",
    "stamp",
    "pdfa",
    "compress",
    "encrypt",
    "sign",
)


def _length(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(_LENGTH_HINT)
    text = value if isinstance(value, str) else str(value)
    if "e" in text and not isinstance(value, str):  # 1e-05: write the number out
        text = f"{value:.6f}".rstrip("0").rstrip(".")
    if not _LENGTH.match(text):
        raise ValueError(_LENGTH_HINT)
    return text.strip()


def length_px(length: str) -> float:
    """A validated length (see _length) in CSS pixels."""
    number = length.strip()
    unit = number[-2:]
    if unit in PX_PER_UNIT:
        return float(number[:-2]) * PX_PER_UNIT[unit]
    return float(number)


def _margin(value: Any) -> Any:
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        side = _length(value)
        return {name: side for name in MARGIN_SIDES}
    if not isinstance(value, dict):
        raise ValueError("must be a length or an object with top, right, bottom, left")
    unknown = set(value) - set(MARGIN_SIDES)
    if unknown:
        raise ValueError(f"unknown side {sorted(unknown)[0]!r}")
    return {name: _length(length) for name, length in value.items()}


def _paper(value: Any) -> Any:
    for name in PAPER_FORMATS:
        if isinstance(value, str) and value.lower() == name.lower():
            return name
    raise ValueError(f"must be one of {', '.join(PAPER_FORMATS)}")


def _page_ranges(value: Any) -> Any:
    if not isinstance(value, str) or not _PAGE_RANGES.match(value):
        raise ValueError("must look like 1-3, 5")
    return value.replace(" ", "")


def scale_of(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError("must be a number")
    if not 0.1 <= value <= 2:
        raise ValueError("must be between 0.1 and 2")
    return float(value)


def integral_of(value: Any) -> Any:
    # JSON Schema counts 800.0 as an integer; so do the options.
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _output(value: Any) -> Any:
    if not isinstance(value, str) or value not in OUTPUTS:
        raise ValueError(f"must be one of {', '.join(OUTPUTS)}")
    return value


def _keywords(value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(word, str) for word in value):
        return ", ".join(value)
    if not isinstance(value, str):
        raise ValueError("must be a string or a list of strings")
    return value


_LENGTH_SCHEMA = {
    "anyOf": [
        {"type": "string", "pattern": LENGTH_PATTERN},
        {"type": "number", "minimum": 0},
    ],
    "description": "A length such as 210mm, 8.5in or 800px (a number is in pixels).",
}
Length = Annotated[str, BeforeValidator(_length), WithJsonSchema(_LENGTH_SCHEMA)]
Margin = Annotated[
    dict[str, str],
    BeforeValidator(_margin),
    WithJsonSchema(
        {
            "anyOf": [
                _LENGTH_SCHEMA,
                {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {side: _LENGTH_SCHEMA for side in MARGIN_SIDES},
                },
            ],
            "description": "Page margins: one length for every side, or one per side.",
        }
    ),
]
PaperFormat = Annotated[
    str,
    BeforeValidator(_paper),
    WithJsonSchema({"type": "string", "enum": list(PAPER_FORMATS)}),
]
PageRanges = Annotated[
    str,
    BeforeValidator(_page_ranges),
    WithJsonSchema({"type": "string", "pattern": PAGE_RANGES_PATTERN}),
]
Text = Annotated[str, Field(max_length=MAX_TEXT_OPTION)]
OutputName = Annotated[
    str, BeforeValidator(_output), WithJsonSchema({"type": "string", "enum": list(OUTPUTS)})
]
# After the bounds, so that they stay JSON Schema keywords.
Side = Annotated[
    int, Field(ge=SCREENSHOT_MIN_SIDE, le=SCREENSHOT_MAX_SIDE), BeforeValidator(integral_of)
]
Info = Annotated[str, Field(max_length=MAX_METADATA_CHARS)]
Keywords = Annotated[
    str,
    BeforeValidator(_keywords),
    Field(max_length=MAX_METADATA_CHARS),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "maxLength": MAX_METADATA_CHARS},
                {"type": "array", "items": {"type": "string"}},
            ]
        }
    ),
]


def null_schema(name: str) -> dict[str, Any]:
    """`name` is absent or null."""
    return {"properties": {name: {"type": "null"}}}


def integral(value: Any) -> Any:
    """JSON Schema counts 131.0 as an integer; so does the API."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _headers(value: Any) -> Any:
    if not isinstance(value, dict):
        raise ValueError("must be an object of header names and values")
    if len(value) > MAX_HEADERS:
        raise ValueError(f"at most {MAX_HEADERS} headers")
    seen: set[str] = set()
    # Messages name the header, never its value: values are secrets (server/pipeline/vault.py).
    for name, text in value.items():
        if not isinstance(name, str) or not _TOKEN.match(name):
            raise ValueError(f"{name[:64]!r} is not a header name")
        if name.lower() in FORBIDDEN_HEADERS:
            why = "use cookies" if name.lower() == "cookie" else "the browser sets it"
            raise ValueError(f"{name} cannot be set ({why})")
        if name.lower() in seen:
            raise ValueError(f"{name} is given twice")
        seen.add(name.lower())
        if not isinstance(text, str):
            raise ValueError(f"the value of {name} must be a string")
        if len(text) > MAX_HEADER_VALUE_CHARS or not _HEADER_VALUE.match(text):
            raise ValueError(
                f"the value of {name} must be printable ASCII of at most "
                f"{MAX_HEADER_VALUE_CHARS} characters"
            )
    return value


class FailOn(BaseModel):
    """What fails a render instead of printing what came."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    http_status: bool = Field(
        default=True,
        description="A page_url whose response is 4xx or 5xx fails the job at once, naming "
        "the status.",
    )
    console_errors: bool = Field(
        default=False,
        description="An uncaught exception or console.error fails the job, quoting it "
        "(scripts run).",
    )
    resource_errors: bool = Field(
        default=False,
        description="A subresource that failed or was blocked fails the job (otherwise it is "
        "listed in the job's warnings).",
    )
    # The preflight kinds (server/render/preflight.py): each one true runs the checks and
    # fails the job, at once and naming what it found, instead of warning.
    overflow: bool = Field(
        default=False,
        description="Content wider than the page, or cut off by its box, fails the job "
        "(preflight).",
    )
    missing_glyph: bool = Field(
        default=False,
        description="Text that no installed or uploaded font can draw fails the job, naming "
        "the characters (preflight).",
    )
    low_resolution_image: bool = Field(
        default=False,
        description="An image printed below preflight.min_dpi fails the job, naming it "
        "(preflight).",
    )
    broken_image: bool = Field(
        default=False, description="An image that cannot be shown fails the job (preflight)."
    )
    blank_page: bool = Field(
        default=False, description="A page with nothing drawn on it fails the job (preflight)."
    )

    def preflight_kinds(self) -> tuple[str, ...]:
        """The preflight kinds that fail the job."""
        return tuple(kind for kind in PREFLIGHT_KINDS if getattr(self, kind))


#: The kinds of preflight warning, each a FailOn field of its own.
PREFLIGHT_KINDS = (
    "overflow",
    "missing_glyph",
    "low_resolution_image",
    "broken_image",
    "blank_page",
)
#: An image printed at fewer pixels per inch than this is a low_resolution_image.
DEFAULT_MIN_DPI = 150


def _preflight(value: Any) -> Any:
    """`true` runs the checks with their defaults, `false` (or null) runs them only when
    fail_on names a kind."""
    if value is True:
        return {}
    if value is False:
        return None
    return value


class Preflight(BaseModel):
    """How the preflight checks judge a printed page (server/render/preflight.py)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    min_dpi: Annotated[int, Field(ge=1, le=2400), BeforeValidator(integral_of)] = Field(
        default=DEFAULT_MIN_DPI,
        description="An image printed at fewer pixels per inch than this is a "
        "low_resolution_image.",
    )


PreflightOption = Annotated[
    Preflight | None,
    BeforeValidator(_preflight),
    WithJsonSchema(
        {
            "anyOf": [{"type": "boolean"}, Preflight.model_json_schema()],
            "description": "Run the preflight checks (true, or their settings); they also run "
            "when fail_on names one of their kinds.",
        }
    ),
]


def _text_matching(
    pattern: str, hint: str, *, max_chars: int, min_chars: int = 0
) -> tuple[BeforeValidator, WithJsonSchema]:
    """A string validated against `pattern`, refused with `hint` (the value itself is never
    repeated: cookie values are secrets), and documented with the pattern."""
    compiled = re.compile(pattern)

    def check(value: Any) -> Any:
        if not isinstance(value, str) or not min_chars <= len(value) <= max_chars:
            raise ValueError(f"must be {hint}, at most {max_chars} characters")
        if not compiled.match(value):
            raise ValueError(f"must be {hint}")
        return value

    schema: dict[str, Any] = {"type": "string", "pattern": pattern, "maxLength": max_chars}
    if min_chars:
        schema["minLength"] = min_chars
    return BeforeValidator(check), WithJsonSchema(schema)


CookieName = Annotated[
    str, *_text_matching(TOKEN_PATTERN, "a cookie name (a token)", max_chars=256, min_chars=1)
]
CookieValue = Annotated[
    str,
    *_text_matching(
        COOKIE_VALUE_PATTERN,
        "a cookie value: printable ASCII without spaces, quotes, commas, semicolons or backslashes",
        max_chars=MAX_COOKIE_VALUE_CHARS,
    ),
]
CookiePath = Annotated[
    str,
    *_text_matching(
        COOKIE_PATH_PATTERN, "a path starting with / (no spaces or semicolons)", max_chars=1024
    ),
]
CookieDomain = Annotated[
    str,
    *_text_matching(r"^\.?[A-Za-z0-9._-]+$", "a host or domain name", max_chars=253, min_chars=1),
]
UserAgent = Annotated[
    str,
    *_text_matching(
        r"^[\x20-\x7E]+$", "printable ASCII", max_chars=MAX_USER_AGENT_CHARS, min_chars=1
    ),
]


class MediaFeatures(BaseModel):
    """CSS media features to emulate; those not given stay as the browser has them."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, serialize_by_alias=True)

    prefers_color_scheme: Literal["light", "dark", "no-preference"] | None = Field(
        default=None, alias="prefers-color-scheme", description="CSS prefers-color-scheme."
    )
    prefers_reduced_motion: Literal["reduce", "no-preference"] | None = Field(
        default=None, alias="prefers-reduced-motion", description="CSS prefers-reduced-motion."
    )
    forced_colors: Literal["active", "none"] | None = Field(
        default=None, alias="forced-colors", description="CSS forced-colors."
    )
    prefers_contrast: Literal["more", "no-preference"] | None = Field(
        default=None, alias="prefers-contrast", description="CSS prefers-contrast."
    )


class Cookie(BaseModel):
    """A cookie sent with the requests to the page_url's own origin, and nowhere else."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    name: CookieName = Field(description="The cookie's name.")
    value: CookieValue = Field(description="The cookie's value: a secret, never shown back.")
    domain: CookieDomain | None = Field(
        default=None, description="The page_url's host, or a domain it is in (the default)."
    )
    path: CookiePath | None = Field(
        default=None, description="Sent only to paths under this one (default: every path)."
    )
    secure: bool = Field(default=False, description="Sent over https only.")
    http_only: bool = Field(
        default=False, description="Hidden from scripts (every such cookie is: it is a header)."
    )


Headers = Annotated[
    dict[str, str],
    BeforeValidator(_headers),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_HEADERS,
            "propertyNames": {"pattern": TOKEN_PATTERN},
            "additionalProperties": {
                "type": "string",
                "maxLength": MAX_HEADER_VALUE_CHARS,
                "pattern": HEADER_VALUE_PATTERN,
            },
        }
    ),
]
