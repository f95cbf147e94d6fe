"""The finishing options of a job (`select_pages`, `rotate`, `fill_form`, `flatten`,
`metadata`, `pdfa`, `attachments`, `facturx`, `stamp`, `compress`, `encrypt`, `sign`): their
models, and what the finishing steps (server/pdf/finishing.py) read of them.

`tagged` and `outline` are Chromium's own (options.RenderOptions passes them to page.pdf);
the fields here are applied to the printed PDF, in the order server/pdf/finishing.py fixes.

Validation reads two things from its context when the API gives them (see `context`): the
tenant's assets the body names, so that an unknown asset id is refused where it is written,
and whether the server has a signing key. Options read back from a stored job are validated
without them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

ASSET_ID_PATTERN = r"sha256:[0-9a-f]{64}"  # as server/files/assets.py writes them
PAGES_PATTERN = r"^\s*[0-9]+(\s*-\s*[0-9]*)?(\s*,\s*[0-9]+(\s*-\s*[0-9]*)?)*\s*$"
#: The pages select_pages keeps: the same, counted from 1 (past the end is the document's to tell).
_PAGE = r"[1-9][0-9]*"
SELECT_PATTERN = rf"^\s*{_PAGE}(\s*-\s*({_PAGE})?)?(\s*,\s*{_PAGE}(\s*-\s*({_PAGE})?)?)*\s*$"
COLOR_PATTERN = r"^#[0-9a-fA-F]{6}$"
FIELD_PATTERN = r"^[A-Za-z0-9_-]{1,64}$"
FILE_NAME_PATTERN = r"^[^/\\\u0000-\u001f\u007f]{1,255}$"
MAX_ATTACHMENTS = 20
MAX_PASSWORD_CHARS = 127  # AES-256 (revision 6) reads at most 127 bytes of a password
MAX_SIGN_TEXT = 200
PDFA_LEVELS = ("2b", "3b")
RELATIONSHIPS = ("Data", "Source", "Alternative", "Supplement", "Unspecified")
FACTURX_PROFILES = ("minimum", "basicwl", "basic", "en16931", "extended")
PERMISSIONS = (
    "print",
    "print_high",
    "copy",
    "modify",
    "annotate",
    "fill_forms",
    "extract_accessibility",
    "assemble",
)
STAMP_IMAGE_TYPES = ("image/png", "image/jpeg")
PDF_TYPES = ("application/pdf",)
#: A form field's fully qualified name, and the path of a value in the job's data.
FORM_FIELD_PATTERN = r"^[^\u0000-\u001f\u007f]{1,200}$"
DATA_PATH_PATTERN = r"^[^.\u0000-\u001f\u007f]{1,100}(\.[^.\u0000-\u001f\u007f]{1,100}){0,15}$"
MAX_FORM_FIELDS = 500
#: A custom document information key (/Info), and the keys that are not custom: the four
#: options of their own, and those Pressroom writes itself.
INFO_KEY_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]{0,63}$"
MAX_INFO_KEYS = 50
INFO_OPTIONS = {"Title": "title", "Author": "author", "Subject": "subject", "Keywords": "keywords"}
INFO_RESERVED = ("Creator", "Producer", "CreationDate", "ModDate", "Trapped")
MIN_DPI, MAX_DPI = 36, 1200
XML_TYPES = ("application/xml",)
#: Context keys: the tenant's assets by id (objects with a `content_type`), and whether the
#: server can sign.
ASSETS_CONTEXT = "finish_assets"
SIGNING_CONTEXT = "finish_can_sign"
_PAGES = re.compile(PAGES_PATTERN)
_SELECT = re.compile(SELECT_PATTERN)


def context(assets: Mapping[str, Any], *, can_sign: bool) -> dict[str, Any]:
    """What validation of a submission reads (merged into the models' context)."""
    return {ASSETS_CONTEXT: assets, SIGNING_CONTEXT: can_sign}


def _asset(kinds: tuple[str, ...] | None, what: str) -> Any:
    def check(value: str, info: ValidationInfo) -> str:
        known = (info.context or {}).get(ASSETS_CONTEXT)
        if known is None:
            return value  # a stored job's options: checked when it was submitted
        asset = known.get(value)
        if asset is None:
            raise ValueError(f"no asset {value}: upload it with POST /v1/assets")
        if kinds is not None and asset.content_type not in kinds:
            raise ValueError(
                f"must be {what} ({' or '.join(kinds)}); this asset is {asset.content_type}"
            )
        return value

    return AfterValidator(check)


def _pages(value: Any) -> Any:
    if not isinstance(value, str) or not _PAGES.match(value):
        raise ValueError("must look like 1-, 1,3 or 2-4")
    return value.replace(" ", "")


def _select(value: Any) -> Any:
    if not isinstance(value, str) or not _SELECT.match(value):
        raise ValueError("must look like 3,1-2 or 2- (pages count from 1)")
    return value.replace(" ", "")


def _number(value: Any) -> Any:
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _integral(value: Any) -> Any:
    return int(value) if isinstance(value, float) and value.is_integer() else value


AssetId = Annotated[str, Field(pattern=f"^{ASSET_ID_PATTERN}$")]
Pages = Annotated[
    str, BeforeValidator(_pages), WithJsonSchema({"type": "string", "pattern": PAGES_PATTERN})
]
SelectPages = Annotated[
    str, BeforeValidator(_select), WithJsonSchema({"type": "string", "pattern": SELECT_PATTERN})
]
Number = BeforeValidator(_number)  # after the bounds: they stay JSON Schema keywords
SignText = Annotated[str, Field(min_length=1, max_length=MAX_SIGN_TEXT)]
Password = Annotated[str, Field(max_length=MAX_PASSWORD_CHARS)]


def page_numbers(pages: str, count: int) -> list[int]:
    """The 0-based indexes of the pages `pages` ("1-", "1,3", "2-4") chooses in a document of
    `count` pages; numbers past its end choose nothing."""
    chosen: set[int] = set()
    for part in pages.split(","):
        first, dash, last = part.partition("-")
        start = int(first)
        end = (int(last) if last else count) if dash else start
        chosen.update(range(max(start, 1), min(end, count) + 1))
    return [number - 1 for number in sorted(chosen)]


def page_order(pages: str, count: int) -> list[int]:
    """The 0-based pages `pages` ("3,1-2", "2-", "5-3") names in a document of `count` pages,
    in the order written, a page named twice taken twice (select_pages); ValueError names a
    page past the end."""
    chosen: list[int] = []
    for part in pages.split(","):
        first, dash, last = part.partition("-")
        start = int(first)
        end = (int(last) if last else count) if dash else start
        step = 1 if end >= start else -1
        for number in range(start, end + step, step):
            if not 1 <= number <= count:
                raise ValueError(f"page {number} is not in the document ({count} pages)")
            chosen.append(number - 1)
    return chosen


def data_at(data: Any, path: str) -> Any:
    """The value at a dotted path of a job's data ("customer.name", "lines.0.sku": list items
    by their index); ValueError when the data has none there."""
    value = data
    for key in path.split("."):
        if isinstance(value, Mapping) and key in value:
            value = value[key]
        elif isinstance(value, list) and key.isdigit() and int(key) < len(value):
            value = value[int(key)]
        else:
            raise ValueError(f"data has no {path!r}")
    return value


def _one_of_text_or_asset(schema: dict[str, Any]) -> None:
    """Exactly one of text and asset, not null (see Stamp._one)."""
    schema["oneOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in ("text", "asset")
    ]


class Attachment(BaseModel):
    """A file embedded in the PDF as an associated file (PDF/A-3 allows any file)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    asset: Annotated[AssetId, _asset(None, "any asset")] = Field(
        description="The file: an asset id from POST /v1/assets."
    )
    name: Annotated[str, Field(pattern=FILE_NAME_PATTERN)] = Field(
        description="Its file name in the PDF, such as invoice.xml."
    )
    description: Annotated[str, Field(max_length=1000)] | None = Field(
        default=None, description="What it is, as PDF readers show it."
    )
    relationship: Literal["Data", "Source", "Alternative", "Supplement", "Unspecified"] = Field(
        description="How it relates to the document (PDF/A-3 AFRelationship)."
    )


class FacturX(BaseModel):
    """A Factur-X / ZUGFeRD invoice: the XML embedded as factur-x.xml in a PDF/A-3b."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    xml: Annotated[AssetId, _asset(XML_TYPES, "an XML file")] = Field(
        description="The invoice's CII XML: an asset id (application/xml)."
    )
    profile: Literal["minimum", "basicwl", "basic", "en16931", "extended"] | None = Field(
        default=None,
        description="The Factur-X profile the XML must follow (default: the one it names).",
    )


class Stamp(BaseModel):
    """Text or an image drawn on the chosen pages, over the page (a stamp) or under it (a
    watermark), as real text with its font embedded or as the image itself."""

    model_config = ConfigDict(
        extra="forbid", strict=True, frozen=True, json_schema_extra=_one_of_text_or_asset
    )

    text: Annotated[str, Field(min_length=1, max_length=200)] | None = Field(
        default=None, description='The text, such as "PAID" (or give asset).'
    )
    asset: Annotated[AssetId, _asset(STAMP_IMAGE_TYPES, "a PNG or JPEG image")] | None = Field(
        default=None, description="An image to draw instead of text: a PNG or JPEG asset id."
    )
    opacity: Annotated[float, Field(ge=0, le=1), Number] = Field(
        default=0.5, description="0 (invisible) to 1 (opaque)."
    )
    rotate: Annotated[float, Field(ge=-360, le=360), Number] = Field(
        default=0.0, description="Degrees counter-clockwise about the page's centre."
    )
    font_size: Annotated[float, Field(ge=4, le=400), Number] = Field(
        default=48.0, description="Text size in points (a text stamp)."
    )
    color: Annotated[str, Field(pattern=COLOR_PATTERN)] = Field(
        default="#cc0000", description="Text colour as #rrggbb (a text stamp)."
    )
    pages: Pages = Field(default="1-", description="The pages to stamp: 1-, 1,3 or 2-4.")
    layer: Literal["over", "under"] = Field(
        default="over", description="over the page's content (a stamp) or under it (a watermark)."
    )

    @model_validator(mode="after")
    def _one(self) -> Stamp:
        if (self.text is None) == (self.asset is None):
            raise ValueError("give either text or asset")
        return self


class Encrypt(BaseModel):
    """AES-256 encryption: a password to open the PDF (or none), one for its owner, and what
    a reader who has only the first may do."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    # Never in a repr: an options object in a log line or a traceback shows no password.
    user_password: Password = Field(
        default="", repr=False, description="Needed to open the PDF (empty: it opens without one)."
    )
    owner_password: Annotated[Password, Field(min_length=1)] = Field(
        repr=False, description="Lifts the restrictions; never shown back."
    )
    allow: list[
        Literal[
            "print",
            "print_high",
            "copy",
            "modify",
            "annotate",
            "fill_forms",
            "extract_accessibility",
            "assemble",
        ]
    ] = Field(
        default_factory=list,
        description="What a reader may do, each once (default: nothing).",
        json_schema_extra={"uniqueItems": True},
    )

    @field_validator("allow")
    @classmethod
    def _once(cls, allow: list[str]) -> list[str]:
        if len(set(allow)) != len(allow):
            raise ValueError("names a permission twice")
        return allow


class SignVisible(BaseModel):
    """Where the signature shows: a box on one page (default: an invisible signature)."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    page: Annotated[int, Field(ge=1, le=100000), BeforeValidator(_integral)] = Field(
        description="The page (1 is the first)."
    )
    box: Annotated[
        list[Annotated[float, Field(ge=0), Number]], Field(min_length=4, max_length=4)
    ] = Field(description="[x1, y1, x2, y2] in points from the page's bottom left corner.")

    @field_validator("box")
    @classmethod
    def _ordered(cls, box: list[float]) -> list[float]:
        if box[2] <= box[0] or box[3] <= box[1]:
            raise ValueError("must be [x1, y1, x2, y2] with x2 > x1 and y2 > y1")
        return box


class Sign(BaseModel):
    """A PAdES signature with the server's key (PRESSROOM_SIGNING_KEY): B-B, or B-T with a
    timestamp when PRESSROOM_TSA_URL is set."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    reason: SignText | None = Field(default=None, description="Why it is signed.")
    location: SignText | None = Field(default=None, description="Where it is signed.")
    contact: SignText | None = Field(default=None, description="How to reach the signer.")
    field: Annotated[str, Field(pattern=FIELD_PATTERN)] = Field(
        default="Signature", description="The signature field's name."
    )
    visible: SignVisible | None = Field(
        default=None, description="A visible signature box (default: invisible)."
    )

    @model_validator(mode="after")
    def _key(self, info: ValidationInfo) -> Sign:
        if (info.context or {}).get(SIGNING_CONTEXT) is False:
            raise ValueError(
                "this server has no signing key: its operator sets PRESSROOM_SIGNING_KEY"
            )
        return self


class Rotate(BaseModel):
    """Pages turned clockwise by a multiple of 90 degrees, on top of their own rotation."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    degrees: Annotated[int, Field(ge=-270, le=270, multiple_of=90), BeforeValidator(_integral)] = (
        Field(description="90, 180 or 270 (clockwise); -90 and so on turn the other way.")
    )
    pages: Pages = Field(default="1-", description="The pages to turn: 1-, 1,3 or 2-4.")


class FillForm(BaseModel):
    """The PDF's AcroForm fields set from the job's data before flattening."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    fields: Annotated[
        dict[
            Annotated[str, Field(pattern=FORM_FIELD_PATTERN)],
            Annotated[str, Field(pattern=DATA_PATH_PATTERN)],
        ],
        Field(min_length=1, max_length=MAX_FORM_FIELDS),
    ] = Field(
        description="Field name (as GET /v1/assets/{id}/fields lists it) → the path of its "
        'value in data, such as "customer.name" or "lines.0.sku": text or a number for a '
        "text field, true or false for a checkbox, one of its options for a choice or radio."
    )

    def values(self, data: Any) -> dict[str, Any]:
        """Field name → its value in the job's data; ValueError names a path the data lacks
        (and the field it is for)."""
        found: dict[str, Any] = {}
        for name, path in self.fields.items():
            try:
                found[name] = data_at(data, path)
            except ValueError as exc:
                raise ValueError(f"{exc} (for the field {name!r})") from None
        return found


class Compress(BaseModel):
    """A smaller file: images stored once, object streams, and optionally images downsampled."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)

    image_dpi: Annotated[int, Field(ge=MIN_DPI, le=MAX_DPI), BeforeValidator(_integral)] | None = (
        Field(
            default=None,
            description="Downsample images shown above this resolution to it (default: keep "
            "every pixel).",
        )
    )
    jpeg_quality: Annotated[int, Field(ge=1, le=100), BeforeValidator(_integral)] = Field(
        default=80, description="The JPEG quality of a downsampled JPEG image."
    )


def _info_key(key: str) -> str:
    if key in INFO_OPTIONS:
        raise ValueError(f"{key} is an option of its own: set options.{INFO_OPTIONS[key]}")
    if key in INFO_RESERVED:
        raise ValueError(f"{key} is written by Pressroom")
    return key


InfoKey = Annotated[str, Field(pattern=INFO_KEY_PATTERN), AfterValidator(_info_key)]


def asset_ids(options: Any) -> list[str]:
    """The asset ids that raw (unvalidated) options name in their finishing fields."""
    if not isinstance(options, dict):
        return []
    found: list[Any] = []
    for attachment in _list(options.get("attachments")):
        if isinstance(attachment, dict):
            found.append(attachment.get("asset"))
    for name, key in (("stamp", "asset"), ("facturx", "xml")):
        value = options.get(name)
        if isinstance(value, dict):
            found.append(value.get(key))
    return [value for value in found if isinstance(value, str)]


def _list(value: Any) -> Iterable[Any]:
    return value if isinstance(value, list) else ()
