"""Render options: the pydantic model a submission is validated with, stored as JSON on the
job and read back by the renderer, and what each option means to Chromium.

A job prints a PDF (the default) or, with `output`, takes a PNG, JPEG or WebP screenshot of
the page (`screenshot` says how). Options that only mean something to a printed PDF are
refused beside an image output, and the image's own beside a PDF, each naming its field."""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from server.fields import field_errors
from server.options.finishing import (
    MAX_ATTACHMENTS,
    MAX_INFO_KEYS,
    Attachment,
    Compress,
    Encrypt,
    FacturX,
    FillForm,
    InfoKey,
    Rotate,
    SelectPages,
    Sign,
    Stamp,
)
from server.options.outputs import IMAGES
from server.options.values import (
    DEFAULT_MARGIN,
    FINISHED_BY,
    HEADER_FOOTER_MARGIN,
    MARGIN_SIDES,
    MAX_COOKIES,
    MAX_WAIT_DELAY_MS,
    MEDIA_FEATURES,
    PAPER_INCHES,
    PDF_ONLY,
    PX_PER_UNIT,
    SCREENSHOT_HEIGHT,
    SCREENSHOT_MAX_SCALE,
    SCREENSHOT_WIDTH,
    THUMBNAIL_MAX_WIDTH,
    THUMBNAIL_MIN_WIDTH,
    WITH_ALPHA,
    WITH_QUALITY,
    Cookie,
    FailOn,
    Headers,
    Info,
    Keywords,
    Length,
    Margin,
    MediaFeatures,
    OutputName,
    PageRanges,
    PaperFormat,
    Preflight,
    PreflightOption,
    Side,
    Text,
    UserAgent,
    integral,
    integral_of,
    length_px,
    null_schema,
    scale_of,
)


class OptionsError(ValueError):
    """Invalid options; `errors` lists (field, message) pairs."""

    def __init__(self, errors: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors))
        self.errors = errors


_NO_FAILURES = FailOn()


def _screenshot_has(field: str, absent: dict[str, Any]) -> dict[str, Any]:
    """The screenshot's `field` is absent, or matches `absent` (its value that asks nothing)."""
    return {"properties": {"screenshot": {"properties": {field: absent}}}}


def _output_in(*names: str) -> dict[str, Any]:
    return {"required": ["output"], "properties": {"output": {"enum": list(names)}}}


def _nullable(schema: dict[str, Any]) -> None:
    """Every field may be sent as null, which leaves it at its default (see _drop_nulls)."""
    for name, prop in schema["properties"].items():
        if {"type": "null"} in prop.get("anyOf", ()):
            continue
        described = {key: prop.pop(key) for key in ("description", "default") if key in prop}
        schema["properties"][name] = {"anyOf": [prop, {"type": "null"}], **described}


def _options_schema(schema: dict[str, Any]) -> None:
    """Null means the default; width and height go together (see _with_height); PDF options
    go with a PDF and screenshot with an image, whose quality and transparency need a format
    that has them (see _for_pdf and _for_image)."""
    _nullable(schema)
    pdf = {"output": {"anyOf": [{"type": "null"}, {"const": "pdf"}]}}
    depends: dict[str, Any] = {
        name: {"anyOf": [null_schema(name), {"properties": pdf}]} for name in PDF_ONLY
    }
    for one, other in (("width", "height"), ("height", "width")):
        given = {"required": [other], "properties": {other: {"not": {"type": "null"}}, **pdf}}
        depends[one] = {"anyOf": [null_schema(one), given]}
    depends["screenshot"] = {"anyOf": [null_schema("screenshot"), _output_in(*IMAGES)]}
    schema["dependentSchemas"] = depends
    schema["allOf"] = [
        {"anyOf": [_screenshot_has("quality", {"type": "null"}), _output_in(*WITH_QUALITY)]},
        {
            "anyOf": [
                _screenshot_has("omit_background", {"anyOf": [{"type": "null"}, {"const": False}]}),
                _output_in(*WITH_ALPHA),
            ]
        },
        *_finishing_schema(),
    ]


def _finishing_schema() -> list[dict[str, Any]]:
    """What cannot be finished together (see _finishable): PDF/A and encryption (Factur-X is a
    PDF/A), Factur-X or attachments with PDF/A-2, a thumbnail of a PDF that needs a password."""
    pdfa_3b = {"properties": {"pdfa": {"anyOf": [{"type": "null"}, {"const": "3b"}]}}}
    no_user_password = {"properties": {"encrypt": {"properties": {"user_password": {"const": ""}}}}}
    return [
        {"anyOf": [null_schema("pdfa"), null_schema("encrypt")]},
        {"anyOf": [null_schema("facturx"), null_schema("encrypt")]},
        {"anyOf": [null_schema("facturx"), pdfa_3b]},
        {"anyOf": [null_schema("attachments"), pdfa_3b]},
        {"anyOf": [null_schema("thumbnail"), null_schema("encrypt"), no_user_password]},
    ]


def _screenshot_schema(schema: dict[str, Any]) -> None:
    """Null means the default; a selector or the full page, not both (see _not_both)."""
    _nullable(schema)
    not_full = {"properties": {"full_page": {"anyOf": [{"type": "null"}, {"const": False}]}}}
    schema["dependentSchemas"] = {"selector": {"anyOf": [null_schema("selector"), not_full]}}


def _drop_null_fields(data: Any) -> Any:
    if isinstance(data, dict):
        return {key: value for key, value in data.items() if value is not None}
    return data


class Screenshot(BaseModel):
    """How an image output is taken: the viewport, what part of the page, at what scale."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, json_schema_extra=_screenshot_schema
    )

    full_page: bool = Field(
        default=False, description="The whole scrollable page, not only the viewport."
    )
    width: Side = Field(default=SCREENSHOT_WIDTH, description="Viewport width in CSS pixels.")
    height: Side = Field(default=SCREENSHOT_HEIGHT, description="Viewport height in CSS pixels.")
    scale: Annotated[float, Field(ge=0.1, le=SCREENSHOT_MAX_SCALE)] = Field(
        default=1.0, description="Image pixels per CSS pixel (2 for a sharp, retina image)."
    )
    quality: Annotated[int, Field(ge=0, le=100), BeforeValidator(integral_of)] | None = Field(
        default=None, description="Compression quality, jpeg and webp only (Chromium's default)."
    )
    omit_background: bool = Field(
        default=False,
        description="A transparent background where the page sets none (png and webp only).",
    )
    # Last: its check reads full_page.
    selector: Annotated[Text, Field(min_length=1)] | None = Field(
        default=None, description="Only the first element this CSS selector matches."
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        return _drop_null_fields(data)

    @field_validator("scale", mode="before")
    @classmethod
    def _number(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        return value

    @field_validator("selector")
    @classmethod
    def _not_both(cls, selector: str | None, info: ValidationInfo) -> str | None:
        if selector is not None and info.data.get("full_page"):
            raise ValueError("give either selector or full_page, not both")
        return selector


class Thumbnail(BaseModel):
    """A PNG of the PDF's first page, stored beside it."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    width: Annotated[
        int, Field(ge=THUMBNAIL_MIN_WIDTH, le=THUMBNAIL_MAX_WIDTH), BeforeValidator(integral_of)
    ] = Field(description="Its width in pixels; the height follows the page's proportions.")


class RenderOptions(BaseModel):
    """How the page is printed; every field is optional."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, json_schema_extra=_options_schema
    )

    # First: the checks of the fields after it read it.
    output: OutputName = Field(
        default="pdf", description="A PDF, or a screenshot of the page as png, jpeg or webp."
    )
    screenshot: Screenshot | None = Field(
        default=None, description="How an image output is taken (image outputs only)."
    )
    thumbnail: Thumbnail | None = Field(
        default=None, description="Also store a PNG of the PDF's first page (PDF only)."
    )
    format: PaperFormat = Field(
        default="A4", description="Paper size, unless width and height are set."
    )
    landscape: bool = Field(default=False, description="Print in landscape orientation.")
    margin: Margin = Field(default_factory=dict, description="Page margins.")
    scale: Annotated[float, Field(ge=0.1, le=2), BeforeValidator(scale_of)] = Field(
        default=1.0, description="Rendering scale."
    )
    print_background: bool = Field(default=True, description="Print background colours and images.")
    page_ranges: PageRanges = Field(
        default="", description="Pages to print, e.g. 1-3, 5 (all if empty)."
    )
    prefer_css_page_size: bool = Field(
        default=False, description="Let CSS @page size win over format."
    )
    header_html: Text | None = Field(
        default=None, description="HTML printed at the top of each page."
    )
    footer_html: Text | None = Field(
        default=None, description="HTML printed at the bottom of each page."
    )
    media: Literal["print", "screen"] = Field(
        default="print", description="CSS media type to emulate (an image's default: screen)."
    )
    wait_for_selector: Text | None = Field(
        default=None, description="Print once this selector exists."
    )
    wait_for_expression: Text | None = Field(
        default=None, description="Print once this JavaScript expression is true."
    )
    javascript: bool | None = Field(
        default=None, description="Run scripts (default: when the page has any)."
    )
    title: Info | None = Field(default=None, description="The PDF's document title.")
    author: Info | None = Field(default=None, description="The PDF's author.")
    subject: Info | None = Field(default=None, description="The PDF's subject.")
    keywords: Keywords | None = Field(
        default=None, description="The PDF's keywords: a string or a list of words."
    )
    css: Text | None = Field(
        default=None, description="A stylesheet added to the page, after its own styles."
    )
    wait_until: Literal["load", "networkidle"] = Field(
        default="load",
        description="Print after the load event, or once the network has been idle for 500 ms.",
    )
    wait_delay_ms: Annotated[int, Field(ge=0, le=MAX_WAIT_DELAY_MS), BeforeValidator(integral)] = (
        Field(default=0, description="Then wait this many milliseconds more.")
    )
    lazy_load: bool = Field(
        default=False,
        description="Scroll the page to its end before printing, so lazy images load "
        "(scripts run).",
    )
    fail_on: FailOn = Field(
        default=_NO_FAILURES, description="What fails the job instead of printing."
    )
    preflight: PreflightOption = Field(
        default=None,
        description="Check the printed PDF for overflow, missing glyphs, low-resolution and "
        "broken images and blank pages, each a warning (PDF only; also when fail_on names one).",
    )
    cookies: Annotated[list[Cookie], Field(max_length=MAX_COOKIES)] | None = Field(
        default=None,
        description="Cookies for the page_url's own origin only (page_url jobs); values are "
        "secrets, shown as ***.",
    )
    headers: Headers | None = Field(
        default=None,
        description="HTTP headers for the page_url's own origin only (page_url jobs); values "
        "are secrets, shown as ***.",
    )
    user_agent: UserAgent | None = Field(
        default=None, description="The User-Agent the page sees (navigator.userAgent too)."
    )
    media_features: MediaFeatures | None = Field(
        default=None,
        description='CSS media features to emulate, e.g. {"prefers-color-scheme": "dark"}.',
    )
    # Finishing (server/pdf/finishing.py), in the order the steps run; the checks of the later
    # ones read the earlier ones.
    tagged: bool = Field(
        default=False,
        description="A tagged PDF: a structure tree, and the language of <html lang>.",
    )
    outline: bool = Field(
        default=False, description="Bookmarks from the page's headings (a tagged PDF too)."
    )
    select_pages: SelectPages | None = Field(
        default=None,
        description='The pages kept, in the order given: "3,1-2", "2-" (to the end), "5-3".',
    )
    rotate: Rotate | None = Field(default=None, description="Pages turned clockwise.")
    fill_form: FillForm | None = Field(
        default=None, description="The PDF's form fields set from the job's data."
    )
    flatten: bool = Field(
        default=False,
        description="Form fields and annotations drawn into the pages: nothing left to edit.",
    )
    metadata: (
        Annotated[dict[InfoKey, Info], Field(min_length=1, max_length=MAX_INFO_KEYS)] | None
    ) = Field(
        default=None,
        description="Custom document information keys (beside title, author, subject and "
        'keywords), such as {"Department": "Sales"}.',
    )
    pdfa: Literal["2b", "3b"] | None = Field(
        default=None, description="PDF/A-2b or PDF/A-3b, for archives."
    )
    attachments: Annotated[list[Attachment], Field(max_length=MAX_ATTACHMENTS)] | None = Field(
        default=None,
        description=f"Files embedded as associated files (at most {MAX_ATTACHMENTS}).",
    )
    facturx: FacturX | None = Field(
        default=None, description="A Factur-X / ZUGFeRD invoice (implies pdfa 3b)."
    )
    stamp: Stamp | None = Field(default=None, description="A stamp or watermark on the pages.")
    compress: Compress | None = Field(
        default=None,
        description="A smaller file: images stored once, object streams, images downsampled "
        "to image_dpi if given.",
    )
    encrypt: Encrypt | None = Field(
        default=None, description="AES-256 encryption with passwords (not with pdfa)."
    )
    sign: Sign | None = Field(
        default=None, description="A PAdES signature with the server's signing key."
    )
    # Last: their check needs the height (validated before the width), and is reported last.
    height: Length | None = Field(default=None, description="Page height; goes with width.")
    width: Length | None = Field(
        default=None, validate_default=True, description="Page width; goes with height."
    )

    @model_validator(mode="before")
    @classmethod
    def _drop_nulls(cls, data: Any) -> Any:
        data = _drop_null_fields(data)
        # A screenshot shows the page as a screen does, unless the job asks for print.
        if isinstance(data, dict) and data.get("output") in IMAGES and "media" not in data:
            data = {**data, "media": "screen"}
        return data

    @field_validator(*PDF_ONLY)
    @classmethod
    def _for_pdf(cls, value: Any, info: ValidationInfo) -> Any:
        output = info.data.get("output")  # absent: itself invalid, and reported
        if value is not None and output not in (None, "pdf"):
            raise ValueError(f"applies to a PDF only, and output is {output}")
        return value

    @field_validator("fail_on")
    @classmethod
    def _preflight_for_pdf(cls, fail_on: FailOn, info: ValidationInfo) -> FailOn:
        output = info.data.get("output")
        kinds = fail_on.preflight_kinds()
        if kinds and output not in (None, "pdf"):
            raise ValueError(f"{kinds[0]} is a check of a printed PDF, and output is {output}")
        return fail_on

    @field_validator("screenshot")
    @classmethod
    def _for_image(cls, shot: Screenshot | None, info: ValidationInfo) -> Screenshot | None:
        output = info.data.get("output")  # absent: itself invalid, and reported
        if shot is None or output is None:
            return shot
        if output == "pdf":
            raise ValueError(f"applies to an image only: set output to {' or '.join(IMAGES)}")
        if shot.quality is not None and output not in WITH_QUALITY:
            formats = " and ".join(WITH_QUALITY)
            raise ValueError(f"quality applies to {formats} only, and output is {output}")
        if shot.omit_background and output not in WITH_ALPHA:
            formats = " or ".join(WITH_ALPHA)
            raise ValueError(f"omit_background needs {formats}: {output} has no transparency")
        return shot

    @field_validator("attachments", "facturx", "encrypt")
    @classmethod
    def _finishable(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return value
        pdfa, field = info.data.get("pdfa"), info.field_name
        if field == "attachments":
            names = [attachment.name for attachment in value]
            if twice := next((name for name in names if names.count(name) > 1), None):
                raise ValueError(f"two attachments are named {twice!r}")
            if pdfa == "2b":
                raise ValueError("PDF/A-2 embeds PDF/A files only: use pdfa 3b")
        elif field == "facturx":
            if pdfa == "2b":
                raise ValueError("a Factur-X invoice is a PDF/A-3b: use pdfa 3b, or none")
            if any(a.name == "factur-x.xml" for a in info.data.get("attachments") or ()):
                raise ValueError("an attachment is named factur-x.xml, the invoice's name")
        elif pdfa is not None or info.data.get("facturx") is not None:
            raise ValueError("PDF/A forbids encryption: give pdfa (or facturx) or encrypt")
        elif value.user_password and info.data.get("thumbnail") is not None:
            raise ValueError("a thumbnail would show page 1 of a PDF its user_password protects")
        return value

    @field_validator("width")
    @classmethod
    def _with_height(cls, width: str | None, info: ValidationInfo) -> str | None:
        if (width is None) != (info.data.get("height") is None):
            raise ValueError("width and height go together")
        return width

    @property
    def image(self) -> bool:
        """Whether the output is a screenshot rather than a PDF."""
        return self.output != "pdf"

    @property
    def finishing(self) -> bool:
        """Whether the printed PDF goes through a finishing step (server/pdf/finishing.py)."""
        return any(getattr(self, name) not in (None, False) for name in FINISHED_BY)

    def preflight_checks(self) -> Preflight | None:
        """How the preflight checks run, or None when they do not (server/render/preflight.py):
        asked for, or a kind of theirs named in fail_on; a PDF only."""
        if self.image:
            return None
        if self.preflight is None and self.fail_on.preflight_kinds():
            return _DEFAULT_PREFLIGHT
        return self.preflight

    def screenshot_or_default(self) -> Screenshot:
        """How to take the screenshot (an image output)."""
        return self.screenshot or _DEFAULT_SCREENSHOT

    def document_info(self) -> dict[str, str]:
        """PDF document information to set after printing (Chromium sets only the title): the
        four options of their own, then the custom keys of `metadata`."""
        fields = {
            "/Title": self.title,
            "/Author": self.author,
            "/Subject": self.subject,
            "/Keywords": self.keywords,
        }
        fields.update({f"/{key}": value for key, value in (self.metadata or {}).items()})
        return {name: value for name, value in fields.items() if value is not None}

    def pdf_arguments(self, max_pages: int | None = None) -> dict[str, Any]:
        """Keyword arguments for Playwright's page.pdf(); with `max_pages`, Chromium prints at
        most one page more than that (enough to tell the document is too long)."""
        args: dict[str, Any] = {
            "landscape": self.landscape,
            "scale": self.scale,
            "print_background": self.print_background,
            "prefer_css_page_size": self.prefer_css_page_size,
            "outline": self.outline,
            # Chromium builds the outline from the structure of a tagged PDF.
            "tagged": self.tagged or self.outline,
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
        args["margin"] = {side: margin.get(side, DEFAULT_MARGIN) for side in MARGIN_SIDES}
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

    def paper_px(self) -> tuple[float, float]:
        """The sheet's width and height in CSS pixels of the page as laid out for it (the
        options' scale applied), margins included; a stylesheet's @page size not known."""
        if self.width is not None and self.height is not None:
            width, height = length_px(self.width), length_px(self.height)
        else:
            inches = PAPER_INCHES[self.format]
            width, height = (side * PX_PER_UNIT["in"] for side in inches)
        if self.landscape:
            width, height = height, width
        return width / self.scale, height / self.scale

    def needs_javascript(self, html: str) -> bool:
        """Scripts run only in a fresh browser context; pages without them share one safely.
        Scrolling for lazy images and catching script errors are done by scripts."""
        if self.javascript is not None:
            return self.javascript
        return (
            self.wait_for_expression is not None
            or self.lazy_load
            or self.fail_on.console_errors
            or "<script" in html.lower()
        )

    def emulated_media(self) -> dict[str, str]:
        """Keyword arguments for Playwright's page.emulate_media(): the media type and every
        media feature ("null" leaves a feature as the browser has it)."""
        features = self.media_features
        emulated: dict[str, str] = {"media": self.media}
        for name, argument in MEDIA_FEATURES.items():
            value = None if features is None else getattr(features, name.replace("-", "_"))
            emulated[argument] = value or "null"
        return emulated


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


#: Frozen, so one instance serves every job that asks for nothing else.
_DEFAULT = RenderOptions()
_DEFAULT_SCREENSHOT = Screenshot()
_DEFAULT_PREFLIGHT = Preflight()


def parse(raw: Any) -> RenderOptions:
    """Options as stored on a job (or given by a caller); OptionsError lists every problem."""
    if raw is None or raw == {}:  # most jobs: the defaults, with no walk over the fields
        return _DEFAULT
    try:
        return RenderOptions.model_validate(raw)
    except ValidationError as exc:
        raise OptionsError(field_errors(exc, ("options",))) from None


def to_json(options: RenderOptions) -> dict[str, Any]:
    """The options as stored on the job (only what differs from the defaults, an image's own
    default media included: a template's stays its output's when a job changes the output)."""
    if options is _DEFAULT:
        return {}
    stored = options.model_dump(exclude_defaults=True)
    if options.image and options.media == "screen":
        del stored["media"]
    return stored


def layered(base: dict[str, Any], own: dict[str, Any]) -> dict[str, Any]:
    """A job's own options on top of its stored template's. A job that names another output
    leaves behind the template's options for the output it does not want (a print's margins
    under a screenshot, a screenshot's viewport under a PDF); its own are checked as given."""
    merged = {**base, **own}
    if "output" not in own:
        return merged
    unwanted = PDF_ONLY if (own["output"] or "pdf") in IMAGES else ("screenshot",)
    return {name: value for name, value in merged.items() if name in own or name not in unwanted}
