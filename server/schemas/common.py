"""What every body of the API shares: the request configs, the limits, the validation
context (Checks), the field types and the problem body.

Requests are strict (a number is not a string, a boolean is not a number) and forbid fields
they do not name. What the app holds (its network policy, the stored templates and assets a
body names) reaches the validators through the validation context:
`Model.model_validate(body, context=Checks(...).context())`. The models are by
concern beside this module (jobs, batches, templates, assets, streams); server/web/openapi.py
builds the OpenAPI schemas from them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
import re
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
)

from server import jsontext
from server.channels import CHANNEL_PATTERN, check_channel
from server.files import assets
from server.files.library import Ref
from server.netpolicy import MAX_PAGE_URL_CHARS, MAX_WEBHOOK_URL_CHARS
from server.options import RenderOptions, finishing
from server.options.values import integral as _integral
from server.render import templates
from server.settings import Settings

REQUEST = ConfigDict(extra="forbid", strict=True)
QUERY = ConfigDict(extra="ignore", strict=True)  # other parameters (token=) belong to others

MAX_METADATA_BYTES = 16 * 1024
# A template and a job's data are bounded apart from the body, which a batch of many jobs or
# a multipart upload (its index.html a file part) may make far larger: one job's template is
# compiled and its data rendered on every attempt.
MAX_TEMPLATE_BYTES = 512 * 1024
MAX_DATA_BYTES = 1024 * 1024
MAX_LIST_LIMIT = 200
MAX_WAIT_S = 60
MAX_EVENT_ID = 2**63 - 1  # bigint
NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}"  # as the templates_name_format CHECK
TEMPLATE_ID_PATTERN = rf"{NAME_PATTERN}(@[1-9][0-9]{{0,8}})?"
TEMPLATE_ID = re.compile(rf"(?P<name>{NAME_PATTERN})(?:@(?P<version>[1-9][0-9]{{0,8}}))?")


def decimal_at_most(most: int) -> str:
    """A pattern of the numbers 0 to `most` in as many decimal digits as `most` has at most
    (leading zeros allowed): the shorter ones, then, for each nonzero digit of `most`, those
    that begin as `most` does up to it and have a smaller digit there."""
    digits = str(most)
    below = [
        f"{digits[:n]}[0-{int(digit) - 1}][0-9]{{{len(digits) - n - 1}}}"
        for n, digit in enumerate(digits)
        if digit != "0"
    ]
    return "|".join([f"[0-9]{{1,{len(digits) - 1}}}", *below, digits])


#: An event id as a header or query parameter carries it.
EVENT_ID_PATTERN = f"(?:{decimal_at_most(MAX_EVENT_ID)})"
_EVENT_ID = re.compile(EVENT_ID_PATTERN)


class StoredSource(Protocol):
    """What validation needs of a stored template (server/files/library.py: StoredTemplate)."""

    name: str
    version: int
    html: str | None
    options: dict[str, Any]
    assets: dict[str, str]
    docx: str | None

    @property
    def docx_name(self) -> str: ...


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


def checks_of(info: ValidationInfo) -> Checks:
    """The Checks a validator runs with (see Checks.context)."""
    checks: Checks = (info.context or {})["checks"]
    return checks


# --- plain values ------------------------------------------------------------------------


def ascii_digits(raw: str) -> bool:
    # str.isdigit() also accepts "²" and other digits int() refuses.
    return raw.isascii() and raw.isdigit() and len(raw) <= 19


def event_id(raw: str) -> int | None:
    """An event id from a header or query parameter, None when it cannot be one."""
    return int(raw) if _EVENT_ID.fullmatch(raw) else None


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
    `limit` bytes, or MAX_DATA_BYTES when None."""

    def check(value: Any, info: ValidationInfo) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise ValueError("must be an object")
        most = MAX_DATA_BYTES if limit is None else limit
        if jsontext.size(value) > most:
            raise ValueError(f"must be at most {most} bytes as JSON")
        return value

    return PlainValidator(check)


def _template_html(value: str, info: ValidationInfo) -> str:
    most = MAX_TEMPLATE_BYTES
    if len(value.encode()) > most:
        raise ValueError(f"must be at most {most} bytes")
    if (syntax := templates.check(value)) is not None:
        raise ValueError(syntax)
    return value


def _webhook_url(value: str, info: ValidationInfo) -> str:
    policy = checks_of(info).policy
    if policy is None:
        raise RuntimeError("webhook URLs are checked against the app's network policy")
    if (why := policy.validate_webhook_url(value)) is not None:
        raise ValueError(why)
    return value


def _page_url(value: str, info: ValidationInfo) -> str:
    policy = checks_of(info).policy
    if policy is None:
        raise RuntimeError("page URLs are checked against the app's network policy")
    if (why := policy.validate_page_url(value)) is not None:
        raise ValueError(why)
    return value


def _event_id(value: Any) -> int:
    if isinstance(value, str) and ascii_digits(value):
        value = int(value)
    value = _integral(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EVENT_ID:
        raise ValueError("must be an event id")
    return value


_DATE_TIME = {"type": "string", "format": "date-time"}

Timestamp = Annotated[dt.datetime, BeforeValidator(_time), WithJsonSchema(_DATE_TIME)]
Integral = BeforeValidator(_integral)  # after the bounds: they stay JSON Schema keywords
JsonObject = Annotated[dict[str, Any], _object(None), WithJsonSchema({"type": "object"})]
Metadata = Annotated[
    dict[str, Any], _object(MAX_METADATA_BYTES), WithJsonSchema({"type": "object"})
]
TemplateHtml = Annotated[str, AfterValidator(_template_html)]
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
EventId = Annotated[
    int,
    BeforeValidator(_event_id),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID}),
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


# --- the page's own secrets --------------------------------------------------------------


# The JSON Schema of "no cookies or headers in the options": they go with page_url only.
NO_PAGE_SECRETS: dict[str, Any] = {
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


def no_page_secrets(schema: dict[str, Any]) -> None:
    """No cookies or headers: nothing here opens a page_url (see no_cookies_or_headers)."""
    schema["allOf"] = [NO_PAGE_SECRETS]


def no_cookies_or_headers(given: RenderOptions | None, page_url: str | None) -> None:
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


# --- query parameters --------------------------------------------------------------------


def _query_int(value: Any) -> Any:
    return int(value) if isinstance(value, str) and ascii_digits(value) else value


def _query_float(value: Any) -> Any:
    try:
        number = float(value) if isinstance(value, str) else value
    except ValueError:
        return value
    return number if isinstance(number, float) and math.isfinite(number) else value


Limit = Annotated[int, Field(ge=1, le=MAX_LIST_LIMIT), BeforeValidator(_query_int)]

#: How long a long-poll may hold its answer.
WaitSeconds = Annotated[float, Field(ge=0, le=MAX_WAIT_S), BeforeValidator(_query_float)]


# --- problems and health -----------------------------------------------------------------


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
    limit_bytes: int | None = Field(
        None, description="A 413's limit, in bytes (the value of the setting named)."
    )
    setting: str | None = Field(None, description="A 413's setting: the variable that sets it.")


class Health(BaseModel):
    status: Literal["ok"] = Field(description="The process answers.")


class Readiness(BaseModel):
    ready: bool = Field(description="Every check is ok.")
    checks: dict[str, str] = Field(description="ok, or error: why, per dependency.")
    browser: dict[str, Any] | None = Field(None, description="The browser engine in use.")
