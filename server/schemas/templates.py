"""Named, versioned templates (Jinja2 HTML or a Word template): a new version, previews
(stored or inline), the list query and the template as the routes show it."""

from __future__ import annotations

import datetime as dt
import re
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
from pydantic_core import InitErrorDetails, PydanticCustomError

from server.files import library, office_formats
from server.files.assets import ID_PATTERN
from server.options import RenderOptions
from server.schemas.assets import AssetMap
from server.schemas.common import (
    NAME_PATTERN,
    QUERY,
    Integral,
    JsonObject,
    Limit,
    TemplateHtml,
    checks_of,
    no_cookies_or_headers,
    no_page_secrets,
)

_NO_SOURCE = object()  # put in place of a missing html by TemplateRequest._html_or_docx

#: Samples a version may carry (each is rendered when it is published).
MAX_SAMPLES = 10
SampleName = Annotated[str, Field(pattern=f"^{NAME_PATTERN}$")]


def _source_given(value: Any) -> Any:
    if value is _NO_SOURCE:
        raise PydanticCustomError(
            "no_source", "give html (Jinja2 HTML) or docx (a Word template's asset id)"
        )
    return value


class _OpensNoPage(BaseModel):
    """A body with options but no page_url: its options carry no cookies or headers."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=no_page_secrets)

    @field_validator("options", check_fields=False)
    @classmethod
    def _no_page_secrets(cls, given: RenderOptions | None) -> RenderOptions | None:
        no_cookies_or_headers(given, None)
        return given


def _no_template_secrets(schema: dict[str, Any]) -> None:
    """No cookies, headers or PDF passwords (see TemplateRequest._no_passwords)."""
    no_page_secrets(schema)
    no_encrypt = {"properties": {"encrypt": {"type": "null"}}}
    schema["allOf"].append({"properties": {"options": {"anyOf": [{"type": "null"}, no_encrypt]}}})
    schema["oneOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in ("html", "docx")
    ]


class TemplateRequest(_OpensNoPage):
    """A new version of a named template."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_no_template_secrets)

    name: Annotated[str, Field(pattern=f"^{NAME_PATTERN}$")] = Field(
        description="1 to 100 letters, digits, '.', '_' or '-', not starting with a symbol."
    )
    html: Annotated[TemplateHtml, BeforeValidator(_source_given)] | None = Field(
        None, description="Jinja2 HTML template (or docx)."
    )
    options: RenderOptions | None = Field(
        None, description="Options for the jobs that name it (all but encrypt)."
    )
    sample_data: JsonObject = Field(default_factory=dict, description="Data for previews.")
    data_schema: JsonObject | None = Field(
        None,
        description="The data contract: a JSON Schema (draft 2020-12) that the data of every "
        "job naming this version must meet (422 naming each path that does not); the samples "
        "and sample_data must meet it too.",
    )
    samples: dict[SampleName, JsonObject] = Field(
        default_factory=dict,
        max_length=MAX_SAMPLES,
        description=f"Named data sets (at most {MAX_SAMPLES}), for previews (`sample`) and the "
        "renders that publishing compares.",
    )
    assets: AssetMap = Field(
        default_factory=dict,
        description="Relative path → asset id, as a job's assets: the version keeps this map, "
        "and a job's own map lies over it.",
    )
    docx: Annotated[str, Field(pattern=f"^{ID_PATTERN}$")] | None = Field(
        None,
        description="Instead of html: a Word template (.docx) uploaded with POST /v1/assets, "
        "its text carrying Jinja2 in docxtpl's convention; its jobs are filled with their data "
        "and converted by LibreOffice, as a job's docx (checked for Jinja syntax when stored).",
    )

    publish: bool = Field(
        False,
        description="Publish the version at once (as POST …/publish without force: checked "
        "against the published version with its samples; refused with 409, the version kept "
        "as a draft). Without it a new version is a draft: jobs naming the template alone "
        "keep getting its latest published version.",
    )

    @field_validator("data_schema")
    @classmethod
    def _a_schema(cls, schema: dict[str, Any] | None) -> dict[str, Any] | None:
        if schema is not None and (problems := library.schema_problems(schema)):
            raise ValueError(problems[0])
        return schema

    @model_validator(mode="after")
    def _samples_meet_the_contract(self) -> TemplateRequest:
        """Each sample (and sample_data) meets data_schema, every problem named by its path."""
        if self.data_schema is None:
            return self
        sets = [("sample_data", self.sample_data)] if self.sample_data else []
        sets += [(f"samples.{name}", data) for name, data in self.samples.items()]
        problems = [
            problem
            for root, data in sets
            for problem in library.contract_problems(self.data_schema, data, root)
        ]
        contract_error(problems)
        return self

    @model_validator(mode="before")
    @classmethod
    def _html_or_docx(cls, data: Any) -> Any:
        """A missing source is reported with the other fields' problems."""
        if isinstance(data, dict) and data.get("html") is None and data.get("docx") is None:
            return {**data, "html": _NO_SOURCE}
        return data

    @field_validator("docx")
    @classmethod
    def _word_template(cls, docx: str | None, info: ValidationInfo) -> str | None:
        if docx is None:
            return None
        if info.data.get("html") is not None:
            raise ValueError("give html or docx, not both")
        given = info.data.get("options")
        if isinstance(given, RenderOptions) and given.image:
            raise ValueError("a Word template becomes a PDF: leave options.output out")
        asset = checks_of(info).assets.get(docx)
        if asset is None:
            raise ValueError(f"no asset {docx}: upload it with POST /v1/assets")
        if asset.content_type != office_formats.DOCX.content_type:
            raise ValueError(
                f"the asset {docx} is {asset.content_type}, not a Word document (.docx)"
            )
        return docx

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


def contract_error(problems: list[tuple[str, str]]) -> None:
    """Raise the problems of a data contract as pydantic errors, one per path (`data.items[3]
    .price`), so that they read as the body's other field errors do."""
    if problems:
        raise ValidationError.from_exception_data(
            "contract",
            [
                InitErrorDetails(
                    type=PydanticCustomError("data_contract", message),
                    loc=tuple(_steps(path)),
                    input=None,
                )
                for path, message in problems
            ],
        )


def _steps(path: str) -> list[str | int]:
    steps: list[str | int] = []
    for name, index in re.findall(r"([^.\[\]]+)|\[(\d+)\]", path):
        steps.append(int(index) if index else name)
    return steps


class PreviewRequest(_OpensNoPage):
    """A preview of a stored template."""

    data: JsonObject | None = Field(
        None, description="Template variables (default: the sample named, else sample_data)."
    )
    sample: SampleName | None = Field(
        None, description="Render the version's sample of this name (instead of data)."
    )
    options: RenderOptions | None = Field(None, description="On top of the template's own.")
    version: Annotated[int, Field(ge=1), Integral] | None = Field(
        None, description="The version to preview (default: the one in the path)."
    )

    @field_validator("sample")
    @classmethod
    def _data_or_sample(cls, sample: str | None, info: ValidationInfo) -> str | None:
        if sample is not None and info.data.get("data") is not None:
            raise ValueError("give data or sample, not both")
        return sample


class InlinePreviewRequest(_OpensNoPage):
    """A preview of template html sent in the body."""

    html: TemplateHtml = Field(description="Jinja2 HTML template.")
    data: JsonObject = Field(default_factory=dict, description="Template variables.")
    options: RenderOptions | None = Field(None, description="How to print.")
    assets: AssetMap = Field(
        default_factory=dict,
        description="Relative path → asset id, as a stored template's: the files its page loads.",
    )


#: The default share of a page's pixels that may change without refusing publishing: 0.5 %.
DEFAULT_THRESHOLD = 0.005


class PublishRequest(BaseModel):
    """POST /v1/templates/{name}@{version}/publish."""

    model_config = ConfigDict(extra="forbid", strict=True)

    force: bool = Field(
        False,
        description="Publish even when a sample fails, changes its page count or its "
        "pixels beyond the threshold (the diff is kept all the same).",
    )
    threshold: Annotated[float, Field(ge=0, le=1)] = Field(
        DEFAULT_THRESHOLD,
        description="The share of a page's pixels (0 to 1) that may change; above it on any "
        "page of any sample, publishing is refused.",
    )


class PageDiff(BaseModel):
    page: int = Field(description="The page (from 1).")
    changed_pixels: float = Field(description="Share of its pixels that differ (0 to 1).")
    text_added: list[str] = Field(description="Lines of text only the new version has.")
    text_removed: list[str] = Field(description="Lines of text only the published one has.")
    image: str | None = Field(
        description="The published page beside the new one, changed pixels marked (PNG)."
    )


class SampleDiff(BaseModel):
    sample: str = Field(description="The sample's name.")
    pages_before: int | None = Field(description="Pages with the published version.")
    pages_after: int | None = Field(description="Pages with this version (null: it failed).")
    error: str | None = Field(description="Why this version did not render it.")
    pages: list[PageDiff] = Field(description="The pages that changed (empty: none).")


class TemplateDiff(BaseModel):
    template_id: str = Field(description="The version published, or refused.")
    against: int | None = Field(description="The published version compared (null: none).")
    published: bool = Field(description="Whether this publishing published it.")
    forced: bool = Field(description="Whether it was forced.")
    threshold: float = Field(description="The pixel threshold it ran with.")
    refused: list[str] = Field(description="What refused it (empty: nothing).")
    samples: list[SampleDiff] = Field(description="Per sample, what changed.")
    created_at: dt.datetime = Field(description="When it ran.")


class TemplateListQuery(BaseModel):
    """GET /v1/templates: the page."""

    model_config = QUERY

    limit: Limit = Field(50, description="Templates per page.")
    cursor: Annotated[str, Field(pattern=f"^{NAME_PATTERN}$")] | None = Field(
        None, description="next_cursor of the previous page: the last name it showed."
    )


class TemplateLinks(BaseModel):
    self: str = Field(description="This version.")
    latest: str = Field(description="The latest published version.")
    preview: str = Field(description="Render it to PDF now.")
    publish: str = Field(description="Publish this version.")
    diff: str = Field(description="What its last publishing found.")


class TemplateVersion(BaseModel):
    version: int = Field(description="The version.")
    status: Literal["draft", "published"] = Field(description="A draft, or published.")
    created_at: dt.datetime = Field(description="Stored at.")


class Template(BaseModel):
    name: str = Field(description="The template's name.")
    version: Annotated[int, Field(ge=1)] = Field(description="This version.")
    template_id: str = Field(description="name@version, for jobs.")
    kind: Literal["html", "docx"] = Field(description="Jinja2 HTML, or a Word template.")
    status: Literal["draft", "published"] = Field(
        description="A draft (only jobs naming it get it), or published."
    )
    published_at: dt.datetime | None = Field(description="Published at (null: a draft).")
    html: str | None = Field(description="The Jinja2 HTML (null for a Word template).")
    docx: str | None = Field(description="The Word template's asset id (null for HTML).")
    options: dict[str, Any] = Field(description="Its render options.")
    sample_data: dict[str, Any] = Field(description="Data for previews.")
    data_schema: dict[str, Any] | None = Field(
        description="The JSON Schema its jobs' data must meet (null: none)."
    )
    samples: dict[str, dict[str, Any]] = Field(description="Named data sets.")
    assets: dict[str, str] = Field(description="Relative path → asset id, for its jobs.")
    created_at: dt.datetime = Field(description="Stored at.")
    links: TemplateLinks = Field(description="What can be done with it.")
    versions: list[TemplateVersion] | None = Field(None, description="Every version (GET only).")
    diff: TemplateDiff | None = Field(None, description="What publishing found (publish only).")


class PublishedTemplateLinks(BaseModel):
    self: str = Field(description="The version published.")
    diff: str = Field(description="What its publishing found.")


class PublishedTemplate(BaseModel):
    """What template.published carries, on the tenant's streams and to its webhook endpoints."""

    name: str = Field(description="The template's name.")
    version: Annotated[int, Field(ge=1)] = Field(description="The version published.")
    template_id: str = Field(description="name@version.")
    kind: Literal["html", "docx"] = Field(description="Jinja2 HTML, or a Word template.")
    published_at: dt.datetime = Field(description="Published at.")
    replaces: int | None = Field(
        description="The version jobs naming the template got until now (null: none)."
    )
    links: PublishedTemplateLinks = Field(description="Where it is.")


class TemplateSummaryLinks(BaseModel):
    self: str = Field(description="The template's latest version.")


class TemplateSummary(BaseModel):
    name: str = Field(description="The template's name.")
    version: int = Field(description="Its latest version (a draft, maybe).")
    published: int | None = Field(
        description="Its latest published version, which jobs naming it get (null: none)."
    )
    versions: int = Field(description="How many versions it has.")
    created_at: dt.datetime = Field(description="The latest version was stored at.")
    links: TemplateSummaryLinks = Field(description="Where it is.")


class TemplateList(BaseModel):
    items: list[TemplateSummary] = Field(description="By name.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")


class TemplateVersionListQuery(BaseModel):
    """GET /v1/templates/{name}/versions: the page."""

    model_config = QUERY

    limit: Limit = Field(50, description="Versions per page.")
    cursor: Annotated[str, Field(pattern=r"^[1-9][0-9]{0,8}$")] | None = Field(
        None, description="next_cursor of the previous page: the last version it showed."
    )


class TemplateVersionLinks(BaseModel):
    self: str = Field(description="This version, whole.")


class TemplateVersionSummary(BaseModel):
    version: Annotated[int, Field(ge=1)] = Field(description="The version.")
    template_id: str = Field(description="name@version, for jobs.")
    kind: Literal["html", "docx"] = Field(description="Jinja2 HTML, or a Word template.")
    status: Literal["draft", "published"] = Field(description="A draft, or published.")
    created_at: dt.datetime = Field(description="Stored at.")
    links: TemplateVersionLinks = Field(description="Where it is.")


class TemplateVersionList(BaseModel):
    name: str = Field(description="The template's name.")
    items: list[TemplateVersionSummary] = Field(description="Newest version first.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")
