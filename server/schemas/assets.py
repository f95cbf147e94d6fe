"""Assets in bodies: the relative paths a page names them by, the map of a job or template,
and the asset routes' query and answers."""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field, ValidationInfo, WithJsonSchema

from server.files import assets
from server.schemas.common import QUERY, Limit, checks_of

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
    if value not in checks_of(info).assets:
        raise ValueError(f"no asset {value}: upload it with POST /v1/assets")
    return value


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


class AssetListQuery(BaseModel):
    """GET /v1/assets: the page."""

    model_config = QUERY

    limit: Limit = Field(50, description="Assets per page.")
    cursor: Annotated[str, Field(pattern=f"^{assets.ID_PATTERN}$")] | None = Field(
        None, description="next_cursor of the previous page."
    )


class AssetLinks(BaseModel):
    self: str = Field(description="The asset.")
    content: str = Field(description="Its bytes, with its content type.")


MAX_USERS_SHOWN = 20


class TemplateUser(BaseModel):
    name: str = Field(description="The template.")
    version: Annotated[int, Field(ge=1)] = Field(description="The version whose map names it.")
    path: str = Field(description="The path it is mapped to there.")
    link: str = Field(description="That version.")


class JobUser(BaseModel):
    id: str = Field(description="A queued or running job that uses it.")
    link: str = Field(description="That job.")


class AssetUsage(BaseModel):
    """What uses an asset: the template versions that map it, and the jobs in flight."""

    templates: list[TemplateUser] = Field(
        description=f"Template versions whose assets map names it (at most {MAX_USERS_SHOWN}, "
        "by name, newest version first)."
    )
    template_versions: Annotated[int, Field(ge=0)] = Field(
        description="How many template versions name it, all told."
    )
    jobs: list[JobUser] = Field(
        description="The first queued or running jobs that use it (oldest first, at most 5): "
        "in their asset map, as an attachment, a stamp image or a Factur-X XML."
    )
    jobs_in_flight: Annotated[int, Field(ge=0)] = Field(
        description="How many queued or running jobs use it: while any do, it cannot be deleted."
    )


class Asset(BaseModel):
    """A stored asset: the same bytes are the same asset, for good."""

    id: Annotated[str, Field(pattern=f"^{assets.ID_PATTERN}$")] = Field(
        description="sha256: and the SHA-256 of its bytes, in hexadecimal."
    )
    size: Annotated[int, Field(ge=0)] = Field(description="Its size in bytes.")
    content_type: str = Field(description="Its content type, as jobs' pages get it.")
    created_at: dt.datetime = Field(description="First stored at.")
    links: AssetLinks = Field(description="What can be done with it.")
    used_by: AssetUsage = Field(description="What uses it.")


class FormField(BaseModel):
    """A field of a PDF's form, as fill_form names it."""

    name: str = Field(description="Its fully qualified name: the key fill_form.fields takes.")
    type: Literal["text", "checkbox", "radio", "choice", "signature", "button"] = Field(
        description="What it holds: text, a checkbox (true or false), one of its options."
    )
    value: str | bool | None = Field(description="What it holds now.")
    options: list[str] = Field(description="The values a choice or radio group takes.")
    read_only: bool = Field(description="Whether a reader may change it.")


class AssetFields(BaseModel):
    """A PDF asset's form fields and pages."""

    id: str = Field(description="The asset.")
    pages: Annotated[int, Field(ge=0)] = Field(description="Its page count.")
    title: str | None = Field(description="Its own document title, if any.")
    fields: list[FormField] = Field(description="Its form's fields, in the form's order.")


class AssetList(BaseModel):
    items: list[Asset] = Field(description="By id.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")
    total_bytes: Annotated[int, Field(ge=0)] = Field(
        description="What all of the tenant's assets take, every page together."
    )
    quota_bytes: Annotated[int, Field(ge=0)] = Field(
        description="What they may take (PRESSROOM_TENANT_MAX_ASSET_BYTES)."
    )
