"""Every body the API reads or writes, as pydantic models: validation, error paths and the
OpenAPI schemas (server/web/openapi.py) come from here.

Requests are strict (a number is not a string, a boolean is not a number) and forbid fields
they do not name. Limits that are settings reach the validators through the validation
context: `Model.model_validate(body, context=Checks(...).context())`.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Protocol
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from server import events, jsontext
from server.access.signing import MAX_TOKEN_CHANNELS, MAX_TOKEN_CHARS
from server.channels import CHANNEL_PATTERN, CHANNEL_RULE, check_channel
from server.files import assets
from server.netpolicy import MAX_PAGE_URL_CHARS, MAX_WEBHOOK_URL_CHARS
from server.options import RenderOptions, finishing, layered
from server.options import integral as _integral
from server.queue.jobs import JobState
from server.render import templates
from server.settings import Settings

REQUEST = ConfigDict(extra="forbid", strict=True)
QUERY = ConfigDict(extra="ignore", strict=True)  # other parameters (token=) belong to others

MAX_METADATA_BYTES = 16 * 1024
MAX_LIST_LIMIT = 200
MAX_WAIT_S = 60
MAX_EVENT_ID = 2**63 - 1  # bigint
MAX_BATCH_ITEMS = 1000
MAX_KEY_CHARS = 200
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"  # as the templates_name_format CHECK
TEMPLATE_ID_PATTERN = rf"{NAME_PATTERN}(@[1-9][0-9]{{0,8}})?"
TEMPLATE_ID = re.compile(rf"(?P<name>{NAME_PATTERN})(?:@(?P<version>[1-9][0-9]{{0,8}}))?")
Ref = tuple[str, int | None]
MAX_JOB_ASSETS = 100
MAX_ASSET_PATH_CHARS = 255
# An asset path: segments of characters a URL path carries as they are (no \ ? # % : or
# control characters), none of them empty, "." or "..". Written out positively (a segment
# starts with a character that is not a dot, or with one dot and then one, or with two dots
# and then anything) so that the JSON Schema carries the same pattern.
_PATH_CHAR = r"[^/\\?#%:\u0000-\u001f\u007f]"
_PATH_START = r"[^/\\?#%:.\u0000-\u001f\u007f]"
_PATH_SEGMENT = rf"(?:{_PATH_START}{_PATH_CHAR}*|\.{_PATH_START}{_PATH_CHAR}*|\.\.{_PATH_CHAR}+)"
ASSET_PATH_PATTERN = rf"{_PATH_SEGMENT}(?:/{_PATH_SEGMENT})*"
_ASSET_PATH = re.compile(ASSET_PATH_PATTERN)


class StoredSource(Protocol):
    """What validation needs of a stored template (library.StoredTemplate)."""

    html: str
    options: dict[str, Any]
    assets: dict[str, str]


class NetworkPolicy(Protocol):
    def validate_webhook_url(self, url: str) -> str | None: ...

    def validate_page_url(self, url: str) -> str | None: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Checks:
    """What validators read from the app: its settings, its network policy, and the stored
    templates and the tenant's assets the body names (looked up before validation, in one
    query each)."""

    settings: Settings
    policy: NetworkPolicy | None = None
    templates: Mapping[Ref, StoredSource] = dataclasses.field(default_factory=dict)
    assets: Mapping[str, assets.Asset] = dataclasses.field(default_factory=dict)

    def context(self) -> dict[str, Any]:
        can_sign = self.settings.signing_key is not None
        return {"checks": self, **finishing.context(self.assets, can_sign=can_sign)}


def _checks(info: ValidationInfo) -> Checks:
    checks: Checks = (info.context or {})["checks"]
    return checks


# --- plain values ------------------------------------------------------------------------


def ascii_digits(raw: str) -> bool:
    # str.isdigit() also accepts "²" and other digits int() refuses.
    return raw.isascii() and raw.isdigit() and len(raw) <= 19


def event_id(raw: str) -> int | None:
    """An event id from a header or query parameter, None when it cannot be one."""
    if not ascii_digits(raw) or int(raw) > MAX_EVENT_ID:
        return None
    return int(raw)


def parse_time(value: Any) -> dt.datetime | None:
    """An ISO 8601 time with a zone, else None."""
    if not isinstance(value, str):
        return None
    try:
        parsed = dt.datetime.fromisoformat(value.upper().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def parse_template_id(raw: Any) -> Ref | None:
    """(name, version or None for the latest) from `name` or `name@version`; None if malformed."""
    if not isinstance(raw, str) or (match := TEMPLATE_ID.fullmatch(raw)) is None:
        return None
    version = match["version"]
    return match["name"], int(version) if version else None


def _time(value: Any) -> dt.datetime:
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value
    if (parsed := parse_time(value)) is None:
        raise ValueError("must be an ISO 8601 time with a time zone")
    return parsed


def _object(limit: int | None) -> Any:
    """A JSON object, kept as the very object read (key order, number forms), bounded in size:
    `limit` bytes, or the max_data_bytes setting when None."""

    def check(value: Any, info: ValidationInfo) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ValueError("must be an object")
        most = _checks(info).settings.max_data_bytes if limit is None else limit
        if jsontext.size(value) > most:
            raise ValueError(f"must be at most {most} bytes as JSON")
        return value

    return PlainValidator(check)


def _template_html(value: str, info: ValidationInfo) -> str:
    most = _checks(info).settings.max_template_bytes
    if len(value.encode()) > most:
        raise ValueError(f"must be at most {most} bytes")
    if (syntax := templates.check(value)) is not None:
        raise ValueError(syntax)
    return value


def _webhook_url(value: str, info: ValidationInfo) -> str:
    policy = _checks(info).policy
    if policy is None:
        raise RuntimeError("webhook URLs are checked against the app's network policy")
    if (why := policy.validate_webhook_url(value)) is not None:
        raise ValueError(why)
    return value


def asset_path_problem(path: str) -> str | None:
    """Why `path` cannot name an asset in a page, None when it can."""
    if len(path) > MAX_ASSET_PATH_CHARS:
        return f"must be at most {MAX_ASSET_PATH_CHARS} characters"
    if _ASSET_PATH.fullmatch(path):
        return None
    if path.startswith("/"):
        return "must be a relative path such as img/logo.png, without a leading /"
    if ":" in path:
        return "must be a relative path such as img/logo.png, not a URL"
    if any(segment in ("", ".", "..") for segment in path.split("/")):
        return "must be a relative path such as img/logo.png, without '.', '..' or empty parts"
    return (
        "must not contain \\, ?, #, % or control characters: give the path as the page "
        "names it, without percent-escapes"
    )


def _asset_path(path: str) -> str:
    if (why := asset_path_problem(path)) is not None:
        raise ValueError(why)
    return path


def _asset_ref(value: str, info: ValidationInfo) -> str:
    if not assets.is_id(value):
        raise ValueError("must be an asset id: sha256: and 64 hexadecimal digits")
    if value not in _checks(info).assets:
        raise ValueError(f"no asset {value}: upload it with POST /v1/assets")
    return value


def _page_url(value: str, info: ValidationInfo) -> str:
    policy = _checks(info).policy
    if policy is None:
        raise RuntimeError("page URLs are checked against the app's network policy")
    if (why := policy.validate_page_url(value)) is not None:
        raise ValueError(why)
    return value


def _uuid(message: str) -> Any:
    def check(value: Any) -> uuid.UUID:
        try:
            return value if isinstance(value, uuid.UUID) else uuid.UUID(value)
        except (TypeError, ValueError, AttributeError):
            raise ValueError(message) from None

    return BeforeValidator(check)


def _event_id(value: Any) -> int:
    if isinstance(value, str) and ascii_digits(value):
        value = int(value)
    value = _integral(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EVENT_ID:
        raise ValueError("must be an event id")
    return value


def _event_types(value: Any, info: ValidationInfo) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        raise ValueError("must be a list of event types")
    if errors := events.type_errors(info.field_name or "types", value):
        raise ValueError(errors[0][1])
    return value


def _required(value: Any) -> Any:
    if value is _REQUIRED:
        raise PydanticCustomError("missing", "is required")
    if value is _NO_SOURCE:
        raise PydanticCustomError("no_source", _NO_SOURCE_MESSAGE)
    return value


#: A job's sources: it names exactly one.
SOURCES = ("template", "template_id", "page_url", "markdown")
_NO_SOURCE_MESSAGE = "give one of template, template_id, page_url or markdown"
_REQUIRED = object()
_NO_SOURCE = object()  # put in place of a missing template by JobRequest._one_source
_DATE_TIME = {"type": "string", "format": "date-time"}

Timestamp = Annotated[dt.datetime, BeforeValidator(_time), WithJsonSchema(_DATE_TIME)]
Integral = BeforeValidator(_integral)  # after the bounds: they stay JSON Schema keywords
JsonObject = Annotated[dict[str, Any], _object(None), WithJsonSchema({"type": "object"})]
Metadata = Annotated[
    dict[str, Any], _object(MAX_METADATA_BYTES), WithJsonSchema({"type": "object"})
]
TemplateHtml = Annotated[str, BeforeValidator(_required), AfterValidator(_template_html)]
Markdown = Annotated[str, AfterValidator(_template_html)]
PageUrl = Annotated[
    str,
    AfterValidator(_page_url),
    WithJsonSchema(
        {
            "type": "string",
            "format": "uri",
            "pattern": "^https?://[^/?#@]+",
            "maxLength": MAX_PAGE_URL_CHARS,
        }
    ),
]
WebhookUrl = Annotated[
    str,
    AfterValidator(_webhook_url),
    WithJsonSchema(
        {
            "type": "string",
            "format": "uri",
            "pattern": "^https?://[^/?#@]+",
            "maxLength": MAX_WEBHOOK_URL_CHARS,
        }
    ),
]
AssetMap = Annotated[
    dict[
        Annotated[str, AfterValidator(_asset_path)],
        Annotated[str, AfterValidator(_asset_ref)],
    ],
    Field(max_length=MAX_JOB_ASSETS),
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_JOB_ASSETS,
            "propertyNames": {
                "pattern": f"^{ASSET_PATH_PATTERN}$",
                "maxLength": MAX_ASSET_PATH_CHARS,
            },
            "additionalProperties": {"type": "string", "pattern": f"^{assets.ID_PATTERN}$"},
        }
    ),
]
EventId = Annotated[
    int,
    BeforeValidator(_event_id),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}),
]
EventTypes = Annotated[
    list[str],
    BeforeValidator(_event_types),
    WithJsonSchema(
        {"type": "array", "minItems": 1, "items": {"type": "string", "enum": sorted(events.TYPES)}}
    ),
]


def _channel(value: Any) -> Any:
    if (why := check_channel(value)) is not None:
        raise ValueError(why)
    return value


Channel = Annotated[
    str,
    BeforeValidator(_channel),
    WithJsonSchema({"type": "string", "pattern": f"^{CHANNEL_PATTERN}$"}),
]


def _template_id(value: Any) -> Any:
    if parse_template_id(value) is None:
        raise ValueError("must be a template name, or name@version")
    return value


TemplateId = Annotated[
    str,
    BeforeValidator(_template_id),
    WithJsonSchema({"type": "string", "pattern": f"^{TEMPLATE_ID_PATTERN}$"}),
]


# --- requests ----------------------------------------------------------------------------


# The JSON Schema of "no cookies or headers in the options": they go with page_url only.
_NO_PAGE_SECRETS: dict[str, Any] = {
    "properties": {
        "options": {
            "anyOf": [
                {"type": "null"},
                {
                    "properties": {
                        "cookies": {"anyOf": [{"type": "null"}, {"maxItems": 0}]},
                        "headers": {"anyOf": [{"type": "null"}, {"maxProperties": 0}]},
                    }
                },
            ]
        }
    }
}


def _one_source(schema: dict[str, Any]) -> None:
    """Exactly one source, not null (see JobRequest._one_source); cookies and headers only
    with page_url (see JobRequest._page_secrets)."""
    schema["oneOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in SOURCES
    ]
    schema["anyOf"] = [
        {"required": ["page_url"], "properties": {"page_url": {"not": {"type": "null"}}}},
        _NO_PAGE_SECRETS,
    ]


def _no_page_secrets(schema: dict[str, Any]) -> None:
    """No cookies or headers: nothing here opens a page_url (see _no_cookies_or_headers)."""
    schema["allOf"] = [_NO_PAGE_SECRETS]


def _no_cookies_or_headers(given: RenderOptions | None, page_url: str | None) -> None:
    """Cookies and headers are sent to the page_url's own origin: without one, they would go
    nowhere. A cookie's domain must be the page's host or a domain it is in."""
    if given is None:
        return
    if page_url is None:
        if given.cookies or given.headers:
            raise ValueError(
                "cookies and headers go with page_url only (they are sent to its origin)"
            )
        return
    host = (urlsplit(page_url).hostname or "").rstrip(".")
    for index, cookie in enumerate(given.cookies or ()):
        domain = (cookie.domain or host).lower().lstrip(".").rstrip(".")
        if host != domain and not host.endswith(f".{domain}"):
            raise ValueError(
                f"cookies[{index}].domain must be the page_url's host or a domain it is in"
            )


class JobRequest(BaseModel):
    """A job: exactly one source (template, template_id, page_url or markdown), with its data
    and options."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_one_source)

    template: TemplateHtml | None = Field(
        None,
        description="Jinja2 HTML template, rendered in a sandbox (at most "
        "PRESSROOM_MAX_TEMPLATE_BYTES bytes).",
    )
    template_id: TemplateId | None = Field(
        None, description="A stored template: name (its latest version) or name@version."
    )
    page_url: PageUrl | None = Field(
        None,
        description="An http(s) page that Chromium opens and prints, under the renderer's "
        "network policy (PRESSROOM_ALLOW_HOSTS).",
    )
    markdown: Markdown | None = Field(
        None,
        description="Markdown (CommonMark, GitHub tables, strikethrough, task lists), Jinja2 "
        "applied first with data, printed in a built-in stylesheet.",
    )
    data: JsonObject = Field(
        default_factory=dict,
        description="Template variables, as sent (at most PRESSROOM_MAX_DATA_BYTES as JSON).",
    )
    options: RenderOptions | None = Field(
        None, description="How to print; with template_id, on top of the template's own."
    )
    webhook_url: WebhookUrl | None = Field(None, description="Where to POST the job's events.")
    priority: Annotated[int, Field(ge=-1000, le=1000), Integral] = Field(
        0, description="Higher runs first."
    )
    max_attempts: Annotated[int, Field(ge=1, le=25), Integral] | None = Field(
        None, description="Attempts before the job fails (default PRESSROOM_MAX_ATTEMPTS)."
    )
    run_at: Timestamp | None = Field(None, description="Run no earlier than this time.")
    metadata: Metadata = Field(
        default_factory=dict,
        description=f"Returned as given (at most {MAX_METADATA_BYTES} bytes as JSON).",
    )
    assets: AssetMap = Field(
        default_factory=dict,
        description="The files the page names by relative path (img/logo.png), each an asset "
        "id from POST /v1/assets; the page then loads those paths, and only those, from "
        f"storage. At most {MAX_JOB_ASSETS}; with template_id, on top of the template's own.",
    )
    channel: Channel | None = Field(
        None,
        description="The channel the job belongs to (one end user's documents, say): "
        f"{CHANNEL_RULE}. Streams and subscription tokens can be scoped to it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _one_source(cls, data: Any, info: ValidationInfo) -> Any:
        """A missing source is reported with the other fields' problems; a stored
        template's options and assets lie under the job's own."""
        if not isinstance(data, dict):
            return data
        if not any(data.get(name) is not None for name in SOURCES):
            return {**data, "template": _NO_SOURCE}
        if data.get("template_id") is None:
            return data
        ref = parse_template_id(data["template_id"])
        stored = _checks(info).templates.get(ref) if ref else None
        if stored is None:
            return data
        merged = dict(data)
        for name, under in (("options", stored.options), ("assets", stored.assets)):
            given = data.get(name)
            if given is None or isinstance(given, dict):
                own = given or {}
                merged[name] = layered(under, own) if name == "options" else {**under, **own}
        return merged

    @field_validator("template_id", "page_url", "markdown")
    @classmethod
    def _only_one(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is None:
            return None
        for other in SOURCES[: SOURCES.index(info.field_name or "")]:
            if info.data.get(other) is not None:
                raise ValueError(
                    f"give only one of template, template_id, page_url and markdown "
                    f"({other} is given too)"
                )
        return value

    @field_validator("template_id")
    @classmethod
    def _known(cls, template_id: str | None, info: ValidationInfo) -> str | None:
        if template_id is None:
            return None
        ref = parse_template_id(template_id)
        if ref not in _checks(info).templates:
            raise ValueError(f"no template {template_id!r}")
        return template_id

    @field_validator("options")
    @classmethod
    def _page_secrets(cls, given: RenderOptions | None, info: ValidationInfo) -> Any:
        _no_cookies_or_headers(given, info.data.get("page_url"))
        return given

    @field_validator("assets")
    @classmethod
    def _not_for_a_page_url(cls, mapped: dict[str, str], info: ValidationInfo) -> Any:
        if mapped and info.data.get("page_url") is not None:
            raise ValueError(
                "a page_url loads its files from its own site; assets are for template, "
                "template_id and markdown jobs"
            )
        return mapped


class _ItemKey(BaseModel):
    model_config = REQUEST

    key: Annotated[str, Field(min_length=1, max_length=MAX_KEY_CHARS)] = Field(
        description="The item's stable business key: one job per key and tenant."
    )

    @model_validator(mode="before")
    @classmethod
    def _count(cls, data: Any, info: ValidationInfo) -> Any:
        # Items are validated in order: this counter is the index of the item being validated.
        if info.context is not None:
            info.context["item"] = info.context.get("item", -1) + 1
        return data

    @field_validator("key", mode="before")
    @classmethod
    def _printable_once(cls, key: Any, info: ValidationInfo) -> Any:
        if not isinstance(key, str) or not 1 <= len(key) <= MAX_KEY_CHARS or not key.isprintable():
            raise ValueError(f"must be a string of 1 to {MAX_KEY_CHARS} printable characters")
        if info.context is not None:
            first = info.context.setdefault("keys", {}).setdefault(key, info.context["item"])
            if first != info.context["item"]:
                raise ValueError(f"{key!r} is also the key of items[{first}]")
        return key


class BatchItem(JobRequest, _ItemKey):
    """A job, plus its stable business key."""

    @field_validator("options")
    @classmethod
    def _joinable(cls, options: RenderOptions | None, info: ValidationInfo) -> Any:
        # BatchRequest.combine is validated before the items and says so in the context.
        if options is not None and options.image and (info.context or {}).get("combine"):
            raise ValueError(
                f"the batch joins its items' PDFs (combine), and this item makes an image "
                f"(output {options.output!r})"
            )
        return options


class CombineOptions(BaseModel):
    """How a batch's items are joined into one PDF."""

    model_config = REQUEST

    outline: bool = Field(
        True,
        description="One outline entry (bookmark) per item, titled with its key, at its first "
        "page; the item's own outline (options.outline) goes below it.",
    )


def _combine(value: Any, info: ValidationInfo) -> Any:
    if value is True:
        value = {}
    elif value is False or value is None:
        return None
    if not isinstance(value, dict):
        raise PydanticCustomError(
            "combine_type", 'must be true, false or an object such as {"outline": false}'
        )
    if info.context is not None:
        info.context["combine"] = True
    return value


def _boolean_too(schema: dict[str, Any]) -> None:
    schema["anyOf"].insert(0, {"type": "boolean"})


def _joined_items_print_pdfs(schema: dict[str, Any]) -> None:
    """With combine, every item prints a PDF (see BatchItem._joinable)."""
    pdf = {"anyOf": [{"type": "null"}, {"properties": {"output": {"enum": [None, "pdf"]}}}]}
    no_combine = {"properties": {"combine": {"enum": [None, False]}}}
    pdf_items = {"properties": {"items": {"items": {"properties": {"options": pdf}}}}}
    schema["dependentSchemas"] = {"combine": {"anyOf": [no_combine, pdf_items]}}


class BatchRequest(BaseModel):
    """Many documents in one call; an item without webhook_url or channel takes the batch's."""

    model_config = ConfigDict(
        extra="forbid", strict=True, json_schema_extra=_joined_items_print_pdfs
    )

    webhook_url: WebhookUrl | None = Field(None, description="Where to POST the items' events.")
    channel: Channel | None = Field(
        None, description="The batch's channel (its events are on it), and its items'."
    )
    combine: Annotated[CombineOptions | None, BeforeValidator(_combine)] = Field(
        None,
        description="Join the items' PDFs, in item order, into one file once every item is "
        "done (combined, on GET and in batch.done): true, or how. Every item must print a "
        "PDF, not an image.",
        json_schema_extra=_boolean_too,
    )
    items: Annotated[list[BatchItem], Field(min_length=1, max_length=MAX_BATCH_ITEMS)] = Field(
        description="The documents, one job per key."
    )


class _OpensNoPage(BaseModel):
    """A body with options but no page_url: its options carry no cookies or headers."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_no_page_secrets)

    @field_validator("options", check_fields=False)
    @classmethod
    def _no_page_secrets(cls, given: RenderOptions | None) -> RenderOptions | None:
        _no_cookies_or_headers(given, None)
        return given


def _no_template_secrets(schema: dict[str, Any]) -> None:
    """No cookies, headers or PDF passwords (see TemplateRequest._no_passwords)."""
    _no_page_secrets(schema)
    no_encrypt = {"properties": {"encrypt": {"type": "null"}}}
    schema["allOf"].append({"properties": {"options": {"anyOf": [{"type": "null"}, no_encrypt]}}})


class TemplateRequest(_OpensNoPage):
    """A new version of a named template."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_no_template_secrets)

    name: Annotated[str, Field(pattern=f"^{NAME_PATTERN}$")] = Field(
        description="1 to 100 letters, digits, '.', '_' or '-', not starting with a symbol."
    )
    html: TemplateHtml = Field(description="Jinja2 HTML template.")
    options: RenderOptions | None = Field(
        None, description="Options for the jobs that name it (all but encrypt)."
    )
    sample_data: JsonObject = Field(default_factory=dict, description="Data for previews.")
    assets: AssetMap = Field(
        default_factory=dict,
        description="Relative path → asset id, as a job's assets: the version keeps this map, "
        "and a job's own map lies over it.",
    )

    @field_validator("options")
    @classmethod
    def _no_passwords(cls, given: RenderOptions | None) -> RenderOptions | None:
        # A template keeps its options for good; PDF passwords are kept only while a job may
        # run (server/pipeline/vault.py).
        if given is not None and given.encrypt is not None:
            raise ValueError("encrypt is a job's own: PDF passwords are not kept in a template")
        return given

    @field_validator("name", mode="before")
    @classmethod
    def _name(cls, name: Any) -> Any:
        if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
            raise ValueError(
                "must be 1 to 100 letters, digits, '.', '_' or '-', not starting with a symbol"
            )
        return name


class PreviewRequest(_OpensNoPage):
    """A preview of a stored template."""

    data: JsonObject | None = Field(None, description="Template variables (default: sample).")
    options: RenderOptions | None = Field(None, description="On top of the template's own.")
    version: Annotated[int, Field(ge=1), Integral] | None = Field(
        None, description="The version to preview (default: the one in the path)."
    )


class InlinePreviewRequest(_OpensNoPage):
    """A preview of template html sent in the body."""

    html: TemplateHtml = Field(description="Jinja2 HTML template.")
    data: JsonObject = Field(default_factory=dict, description="Template variables.")
    options: RenderOptions | None = Field(None, description="How to print.")


_TOKEN_SCOPES = ("job_id", "channel", "channels")


def _not_both_scopes(schema: dict[str, Any]) -> None:
    """No two of job_id, channel and channels, not null (see TokenRequest._one_scope)."""
    pairs = [(a, b) for n, a in enumerate(_TOKEN_SCOPES) for b in _TOKEN_SCOPES[n + 1 :]]
    schema["not"] = {
        "anyOf": [
            {"required": [a, b], "properties": {n: {"not": {"type": "null"}} for n in (a, b)}}
            for a, b in pairs
        ]
    }


class TokenRequest(BaseModel):
    """What a subscription token may open: with none of job_id, channel and channels, every
    stream of the tenant."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_not_both_scopes)

    job_id: Annotated[uuid.UUID, _uuid("must be a job id (UUID)")] | None = Field(
        None, description="Limit the token to this job's stream (and its long-poll)."
    )
    channel: Channel | None = Field(
        None, description="Limit the token to this channel: its stream and its jobs."
    )
    channels: (
        Annotated[
            list[Channel],
            Field(
                min_length=1,
                max_length=MAX_TOKEN_CHANNELS,
                json_schema_extra={"uniqueItems": True},
            ),
        ]
        | None
    ) = Field(
        None,
        description=f"Limit the token to these channels (1-{MAX_TOKEN_CHANNELS}, each once): "
        "their streams and their jobs.",
    )
    ttl_s: Annotated[int, Field(ge=1), Integral] | None = Field(
        None,
        description="Seconds the token lasts, up to PRESSROOM_TOKEN_TTL_S (the default): a "
        "longer one lasts that long; expires_at says when it ends.",
    )

    @field_validator("channels")
    @classmethod
    def _each_once(cls, channels: list[str] | None) -> list[str] | None:
        if channels is not None and len(set(channels)) != len(channels):
            twice = sorted({name for name in channels if channels.count(name) > 1})
            raise ValueError(f"must name each channel once; named twice: {', '.join(twice)}")
        return channels

    @model_validator(mode="after")
    def _one_scope(self) -> TokenRequest:
        given = [f'"{name}"' for name in _TOKEN_SCOPES if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"give one of {', '.join(given)}, not several")
        return self

    @property
    def scope_channels(self) -> frozenset[str]:
        """The channels the token opens (none: it is not a channel token)."""
        return frozenset(self.channels or ([self.channel] if self.channel else []))

    def lifetime_s(self, most_s: int) -> int:
        """How long the token lasts: ttl_s, bounded by `most_s` (PRESSROOM_TOKEN_TTL_S)."""
        return most_s if self.ttl_s is None else min(self.ttl_s, most_s)


class SubscribeRequest(BaseModel):
    """Socket.IO `subscribe` / `unsubscribe`: one job, one channel, or all the tenant's jobs."""

    model_config = REQUEST

    job_id: Annotated[uuid.UUID, _uuid("must be a job id")] | None = Field(
        None, description="The job to follow."
    )
    channel: Channel | None = Field(
        None, description="The channel to follow: its jobs' and batches' events."
    )
    all: bool = Field(False, description="True to follow every job of the tenant.")
    since: EventId | None = Field(None, description="Replay the events after this one first.")
    types: EventTypes | None = Field(None, description="Only events of these types.")

    @model_validator(mode="after")
    def _one_target(self) -> SubscribeRequest:
        if [self.job_id is not None, self.channel is not None, self.all].count(True) != 1:
            raise ValueError('give one of "job_id", "channel" or "all": true')
        return self


class RefreshRequest(BaseModel):
    """Socket.IO `refresh`: a new subscription token for what the connection's token opens."""

    model_config = REQUEST

    token: str = Field(
        min_length=1, max_length=MAX_TOKEN_CHARS, description="The new subscription token."
    )


def _query_int(value: Any) -> Any:
    return int(value) if isinstance(value, str) and ascii_digits(value) else value


def _query_float(value: Any) -> Any:
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        return value
    return number if isinstance(number, float) and math.isfinite(number) else value


def _cursor(value: Any) -> tuple[dt.datetime, uuid.UUID]:
    created, _, job_id = value.partition("~") if isinstance(value, str) else ("", "", "")
    parsed = parse_time(created)
    try:
        if parsed is not None:
            return parsed, uuid.UUID(job_id)
    except ValueError:
        pass
    raise ValueError("is not a cursor this server gave out")


def encode_cursor(created_at: dt.datetime, job_id: uuid.UUID) -> str:
    return f"{created_at.isoformat()}~{job_id}"


Limit = Annotated[int, Field(ge=1, le=MAX_LIST_LIMIT), BeforeValidator(_query_int)]


class JobListQuery(BaseModel):
    """GET /v1/jobs: filters and the page."""

    model_config = QUERY

    status: JobState | None = Field(None, description="Only jobs in this state.")
    channel: Channel | None = Field(None, description="Only the jobs of this channel.")
    limit: Limit = Field(50, description="Jobs per page.")
    created_from: Timestamp | None = Field(None, description="Created at or after this time.")
    created_to: Timestamp | None = Field(None, description="Created before this time.")
    cursor: (
        Annotated[
            tuple[dt.datetime, uuid.UUID],
            PlainValidator(_cursor),
            WithJsonSchema({"type": "string"}),
        ]
        | None
    ) = Field(None, description="next_cursor of the previous page.")

    @field_validator("status", mode="before")
    @classmethod
    def _state(cls, value: Any) -> Any:
        try:
            return JobState(value)
        except ValueError:
            raise ValueError(f"must be one of {', '.join(s.value for s in JobState)}") from None


#: How long a long-poll may hold its answer.
WaitSeconds = Annotated[float, Field(ge=0, le=MAX_WAIT_S), BeforeValidator(_query_float)]


class JobWaitQuery(BaseModel):
    """GET /v1/jobs/{job_id}: the long-poll."""

    model_config = QUERY

    wait: WaitSeconds | None = Field(
        None,
        description="Hold the answer up to this many seconds until the job changes; a wait "
        "whose API key is revoked meanwhile is answered 401.",
    )
    since: EventId | None = Field(None, description="Answer once the job has events after this.")


class EventPollQuery(BaseModel):
    """GET /v1/events?wait=: the long-poll of the event stream, for clients without SSE."""

    model_config = QUERY

    wait: WaitSeconds | None = Field(
        None,
        description="Answer one JSON EventPoll instead of a stream: the events after "
        "last_event_id (or after now), as soon as there are some, else none after this "
        "many seconds.",
    )


class EventPoll(BaseModel):
    """The answer of GET /v1/events?wait=: events as the stream sends them, and the cursor."""

    events: list[dict[str, Any]] = Field(
        description="The events (each as an SSE event's data), or a reset first."
    )
    last_event_id: int = Field(
        description="Pass as last_event_id to the next poll: nothing is missed between polls."
    )


class TemplateListQuery(BaseModel):
    """GET /v1/templates: the page."""

    model_config = QUERY

    limit: Limit = Field(50, description="Templates per page.")
    cursor: str | None = Field(None, description="next_cursor of the previous page.")


class AssetListQuery(BaseModel):
    """GET /v1/assets: the page."""

    model_config = QUERY

    limit: Limit = Field(50, description="Assets per page.")
    cursor: Annotated[str, Field(pattern=f"^{assets.ID_PATTERN}$")] | None = Field(
        None, description="next_cursor of the previous page."
    )


# --- responses ---------------------------------------------------------------------------


class JobLinks(BaseModel):
    self: str = Field(description="The job.")
    events: str = Field(
        description="The job's SSE stream; for requests made with an API key it carries a "
        "subscription token for this job (?token=)."
    )
    pdf: str = Field(description="The job's file once done: the PDF, or the image (output).")
    thumbnail: str | None = Field(
        None, description="The PNG of the PDF's first page, once done (options.thumbnail)."
    )


class WebhookDelivery(BaseModel):
    id: uuid.UUID = Field(description="The delivery (its webhook-id).")
    type: str = Field(description="The event delivered.")
    status: str = Field(description="pending, delivered or failed.")
    attempts: int = Field(description="Attempts made so far.")
    last_status_code: int | None = Field(description="The last answer's HTTP status.")
    last_error: str | None = Field(description="The last attempt's error.")
    next_attempt_at: dt.datetime | None = Field(description="When it is tried next (pending).")
    created_at: dt.datetime = Field(description="When the event happened.")
    delivered_at: dt.datetime | None = Field(description="When it was delivered.")


class StreamReset(BaseModel):
    """A `reset`: the cursor a client sent cannot be resumed from; reload state."""

    type: Literal["reset"] = Field(description="Always reset.")
    reason: str = Field(description="Why, for a person.")
    code: Literal["pruned", "unknown_cursor"] = Field(
        description="pruned: the event is no longer kept; unknown_cursor: this server never "
        "gave out that event (to this tenant)."
    )


class Job(BaseModel):
    """A job as every route and stream shows it."""

    id: uuid.UUID = Field(description="The job's id.")
    status: JobState = Field(description="Where the job stands.")
    attempts: Annotated[int, Field(ge=0)] = Field(description="Attempts started.")
    max_attempts: Annotated[int, Field(ge=1)] = Field(description="Attempts allowed.")
    priority: int = Field(description="Higher runs first.")
    progress: Annotated[int, Field(ge=0, le=100)] | None = Field(description="Percent done.")
    error: str | None = Field(description="The last attempt's error.")
    errors: list[dict[str, Any]] = Field(description="Every attempt's error, oldest first.")
    warnings: list[str] = Field(description="What the render noticed but did not fail on.")
    options: dict[str, Any] = Field(description="The render options that differ from defaults.")
    metadata: dict[str, Any] = Field(description="As submitted.")
    channel: str | None = Field(description="Its channel, as submitted.")
    webhook_url: str | None = Field(description="Where its events are POSTed.")
    pages: int | None = Field(description="Pages of the PDF, once done; null for an image.")
    bytes: int | None = Field(description="Size of the file (PDF or image), once done.")
    run_after: dt.datetime = Field(description="Not claimed before this time.")
    created_at: dt.datetime = Field(description="Submitted at.")
    updated_at: dt.datetime = Field(description="Last changed at.")
    started_at: dt.datetime | None = Field(description="The last attempt started at.")
    finished_at: dt.datetime | None = Field(description="Finished at.")
    links: JobLinks = Field(description="What can be done with it.")
    url: str | None = Field(None, description="Signed, expiring download URL (once done).")
    thumbnail_url: str | None = Field(
        None, description="Signed, expiring URL of the thumbnail (once done, if asked for)."
    )
    webhooks: list[WebhookDelivery] | None = Field(
        None, description="Webhook deliveries (GET /v1/jobs/{job_id} only)."
    )
    reset: StreamReset | None = Field(
        None,
        description="A long-poll's `since` could not be resumed from (pruned, or never given "
        "out): this is the job's state; continue from its events.",
    )


class JobList(BaseModel):
    items: list[Job] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")


class Event(BaseModel):
    """What SSE, Socket.IO and webhooks carry for one event."""

    event_id: int = Field(description="Its place in the log; resume after it.")
    type: str = Field(description="job.queued, job.done, batch.progress, …")
    at: dt.datetime = Field(description="When it happened.")
    job: Job | None = Field(None, description="The job then (job events).")
    batch: dict[str, Any] | None = Field(None, description="The batch then (batch events).")


class BatchCounts(BaseModel):
    queued: int = Field(description="Items queued.")
    running: int = Field(description="Items running.")
    done: int = Field(description="Items done.")
    failed: int = Field(description="Items failed.")
    cancelled: int = Field(description="Items cancelled.")


class BatchItemSummary(BaseModel):
    key: str = Field(description="The item's key.")
    job_id: uuid.UUID = Field(description="Its job.")
    status: JobState = Field(description="Its job's state.")
    error: str | None = Field(None, description="Its job's last error.")
    pages: int | None = Field(None, description="Pages, once done.")
    url: str | None = Field(None, description="Signed download URL, once done.")


class BatchLinks(BaseModel):
    self: str = Field(description="The batch.")
    events: str = Field(description="The stream its progress events come on.")
    pdf: str | None = Field(None, description="The combined PDF once done (a batch with combine).")


class BatchCombined(BaseModel):
    """The one PDF of a batch with combine: its items' PDFs joined in item order."""

    status: Literal["pending", "running", "done", "failed"] = Field(
        description="pending until every item is done and the join starts; failed when an "
        "item failed or was cancelled (retrying it joins again) or the join itself failed."
    )
    outline: bool = Field(description="One outline entry per item, titled with its key.")
    attempts: Annotated[int, Field(ge=0)] = Field(description="Joins started.")
    error: str | None = Field(description="Why it failed: the item's key and error, or the join's.")
    pages: int | None = Field(description="Pages, once done.")
    bytes: int | None = Field(description="Size of the file, once done.")
    finished_at: dt.datetime | None = Field(description="Done or failed at.")
    url: str | None = Field(None, description="Signed, expiring download URL (once done).")


class Batch(BaseModel):
    id: uuid.UUID = Field(description="The batch's id.")
    status: Literal["running", "done"] = Field(
        description="done once every item is final and, with combine, the join is over."
    )
    total: int = Field(description="Items.")
    counts: BatchCounts = Field(description="Items by state.")
    progress: Annotated[int, Field(ge=0, le=100)] = Field(description="Percent final.")
    webhook_url: str | None = Field(description="The batch's webhook URL.")
    channel: str | None = Field(description="The batch's channel, as submitted.")
    created_at: dt.datetime = Field(description="Submitted at.")
    finished_at: dt.datetime | None = Field(
        description="When the last item finished (with combine: when the join ended)."
    )
    combined: BatchCombined | None = Field(description="The combined PDF (null without combine).")
    items: list[BatchItemSummary] = Field(description="In submission order.")
    links: BatchLinks = Field(description="What can be done with it.")


class TemplateLinks(BaseModel):
    self: str = Field(description="This version.")
    latest: str = Field(description="The latest version.")
    preview: str = Field(description="Render it to PDF now.")


class TemplateVersion(BaseModel):
    version: int = Field(description="The version.")
    created_at: dt.datetime = Field(description="Stored at.")


class Template(BaseModel):
    name: str = Field(description="The template's name.")
    version: Annotated[int, Field(ge=1)] = Field(description="This version.")
    template_id: str = Field(description="name@version, for jobs.")
    html: str = Field(description="The Jinja2 HTML.")
    options: dict[str, Any] = Field(description="Its render options.")
    sample_data: dict[str, Any] = Field(description="Data for previews.")
    assets: dict[str, str] = Field(description="Relative path → asset id, for its jobs.")
    created_at: dt.datetime = Field(description="Stored at.")
    links: TemplateLinks = Field(description="What can be done with it.")
    versions: list[TemplateVersion] | None = Field(None, description="Every version (GET only).")


class TemplateSummaryLinks(BaseModel):
    self: str = Field(description="The template's latest version.")


class TemplateSummary(BaseModel):
    name: str = Field(description="The template's name.")
    version: int = Field(description="Its latest version.")
    versions: int = Field(description="How many versions it has.")
    created_at: dt.datetime = Field(description="The latest version was stored at.")
    links: TemplateSummaryLinks = Field(description="Where it is.")


class TemplateList(BaseModel):
    items: list[TemplateSummary] = Field(description="By name.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")


class AssetLinks(BaseModel):
    self: str = Field(description="The asset.")
    content: str = Field(description="Its bytes, with its content type.")


class Asset(BaseModel):
    """A stored asset: the same bytes are the same asset, for good."""

    id: Annotated[str, Field(pattern=f"^{assets.ID_PATTERN}$")] = Field(
        description="sha256: and the SHA-256 of its bytes, in hexadecimal."
    )
    size: Annotated[int, Field(ge=0)] = Field(description="Its size in bytes.")
    content_type: str = Field(description="Its content type, as jobs' pages get it.")
    created_at: dt.datetime = Field(description="First stored at.")
    links: AssetLinks = Field(description="What can be done with it.")


class AssetList(BaseModel):
    items: list[Asset] = Field(description="By id.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")
    total_bytes: Annotated[int, Field(ge=0)] = Field(
        description="What all of the tenant's assets take, every page together."
    )
    quota_bytes: Annotated[int, Field(ge=0)] = Field(
        description="What they may take (PRESSROOM_TENANT_MAX_ASSET_BYTES)."
    )


class Token(BaseModel):
    token: str = Field(description="A JWT for ?token= (SSE) or the Socket.IO auth.")
    expires_at: dt.datetime = Field(description="It stops working then.")


class FieldError(BaseModel):
    field: str = Field(description="Where: items[3].options.scale; empty for the body.")
    message: str = Field(description="What is wrong with it.")


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(description="A URI naming the kind of problem.")
    title: str = Field(description="A short summary.")
    status: int = Field(description="The HTTP status.")
    detail: str | None = Field(None, description="What happened, for a person.")
    instance: str | None = Field(None, description="The path of the request.")
    errors: list[FieldError] | None = Field(None, description="One entry per invalid field.")


class Health(BaseModel):
    status: Literal["ok"] = Field(description="The process answers.")


class Readiness(BaseModel):
    ready: bool = Field(description="Every check is ok.")
    checks: dict[str, str] = Field(description="ok, or error: why, per dependency.")
    browser: dict[str, Any] | None = Field(None, description="The browser engine in use.")


#: Models in components.schemas though no path names them (Socket.IO, streams).
EXTRA_SCHEMAS: tuple[type[BaseModel], ...] = (
    Event,
    SubscribeRequest,
    RefreshRequest,
    EventPoll,
)
