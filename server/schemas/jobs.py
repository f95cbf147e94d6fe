"""A job's bodies: the submission (one source, its data and options), the list and
long-poll queries, and the job as every route and stream shows it."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from server.channels import CHANNEL_RULE
from server.files import assets as stored_assets
from server.files import library, office_formats
from server.files.assets import is_id
from server.options import RenderOptions, layered
from server.options.finishing import PDF_TYPES
from server.options.values import FINISHED_BY
from server.queue.jobs import JobState
from server.schemas.assets import ASSET_PATH_PATTERN, MAX_JOB_ASSETS, AssetMap
from server.schemas.common import (
    MAX_DATA_BYTES,
    MAX_METADATA_BYTES,
    MAX_TEMPLATE_BYTES,
    NO_PAGE_SECRETS,
    QUERY,
    Channel,
    EventId,
    Integral,
    JsonObject,
    Markdown,
    Metadata,
    PageUrl,
    TemplateHtml,
    TemplateId,
    Timestamp,
    WaitSeconds,
    WebhookUrl,
    checks_of,
    no_cookies_or_headers,
    parse_template_id,
)
from server.schemas.templates import contract_error

#: A job's sources: it names exactly one.
SOURCES = ("template", "template_id", "page_url", "markdown", "office", "docx", "pdfs")
_SOURCE_NAMES = ", ".join(SOURCES[:-1])
MAX_JOB_PDFS = 100
#: What a `pdfs` job's options may hold: nothing is printed, so only what applies to a PDF.
PDFS_OPTIONS = frozenset(("title", "author", "subject", "keywords", "thumbnail", *FINISHED_BY))
_NO_SOURCE = object()  # put in place of a missing template by JobRequest._one_source


def _source_given(value: Any) -> Any:
    if value is _NO_SOURCE:
        raise PydanticCustomError("no_source", f"give one of {_SOURCE_NAMES} or {SOURCES[-1]}")
    return value


#: A job's template: the field a missing source is reported on (see JobRequest._one_source).
JobTemplate = Annotated[TemplateHtml, BeforeValidator(_source_given)]


def _one_source(schema: dict[str, Any]) -> None:
    """Exactly one source, not null (see JobRequest._one_source); cookies and headers only
    with page_url (see JobRequest._page_secrets)."""
    schema["oneOf"] = [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}} for name in SOURCES
    ]
    schema["anyOf"] = [
        {"required": ["page_url"], "properties": {"page_url": {"not": {"type": "null"}}}},
        NO_PAGE_SECRETS,
    ]


#: A file a job names: an asset id, or its path in the job's `assets` (a multipart part's).
AssetOrPath = Annotated[
    str,
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "pattern": f"^{stored_assets.ID_PATTERN}$"},
                {"type": "string", "pattern": f"^{ASSET_PATH_PATTERN}$"},
            ]
        }
    ),
]


class JobRequest(BaseModel):
    """A job: exactly one source (template, template_id, page_url, markdown, office, docx or
    pdfs), with its data and options."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_one_source)

    template: JobTemplate | None = Field(
        None,
        description="Jinja2 HTML template, rendered in a sandbox (at most "
        f"{MAX_TEMPLATE_BYTES} bytes).",
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
        description=f"Template variables, as sent (at most {MAX_DATA_BYTES} bytes as JSON).",
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
    # After `assets`: its validator reads the map a multipart body's file is in.
    office: AssetOrPath | None = Field(
        None,
        description="An Office file that LibreOffice converts to PDF (finishing applies as to "
        f"any PDF): {office_formats.accepted()}, told by content. An asset id from POST "
        "/v1/assets, or the path of the file in `assets` (what a multipart body's file part "
        "named office gives). Its own title and author are kept unless the options set them; "
        "page_ranges, landscape (spreadsheets) and outline (its headings as bookmarks) apply.",
    )
    docx: AssetOrPath | None = Field(
        None,
        description="A Word template (.docx, told by content) whose text carries Jinja2 "
        "placeholders, loops and conditions (docxtpl's convention: {%tr for %} repeats a table "
        "row, {%p if %} a paragraph), filled with data in the templates' sandbox, then "
        "converted to PDF by LibreOffice like office. An asset id, or the path of the file in "
        "`assets` (a multipart body's file part named docx). A data value "
        '{"image": ID_OR_PATH, "width_mm": 40, "height_mm": 20} (sizes optional) is a PNG, '
        "JPEG or GIF asset placed where the template prints it.",
    )
    channel: Channel | None = Field(
        None,
        description="The channel the job belongs to (one end user's documents, say): "
        f"{CHANNEL_RULE}. Streams and subscription tokens can be scoped to it.",
    )
    # After assets: an uploaded PDF may be named by its path there.
    pdfs: (
        Annotated[
            list[Annotated[str, Field(min_length=1, max_length=1024)]],
            Field(min_length=1, max_length=MAX_JOB_PDFS),
        ]
        | None
    ) = Field(
        None,
        description="Uploaded PDFs merged in order, no browser involved, each an asset id or "
        "a path of `assets` (contract.pdf), with an outline entry per file titled by that file "
        "name, else the PDF's own title; encrypted or unreadable files are refused. Options: "
        f"document information, thumbnail and finishing only. At most {MAX_JOB_PDFS}.",
    )
    cache: bool | None = Field(
        None,
        description="Serve the job from the render cache: when a done job of the tenant that "
        "used it had the same source, data, options, assets and Pressroom version, the job is "
        "done at once with that job's file (cached_from names it), else it renders and serves "
        "later ones. Left out or null: as the tenant's default (`pressroom tenants cache`; off "
        "unless turned on, and off for the dev-mode tenant); false: not even then. true is "
        "refused for page_url (the page may change) and a thumbnail; the default leaves those "
        "jobs to render.",
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
        stored = checks_of(info).templates.get(ref) if ref else None
        if stored is None:
            return data
        merged = dict(data)
        for name, under in (("options", stored.options), ("assets", stored.assets)):
            given = data.get(name)
            if given is None or isinstance(given, dict):
                own = given or {}
                merged[name] = layered(under, own) if name == "options" else {**under, **own}
        return merged

    @field_validator("template_id", "page_url", "markdown", "office", "docx", "pdfs")
    @classmethod
    def _only_one(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None:
            return None
        for other in SOURCES[: SOURCES.index(info.field_name or "")]:
            if info.data.get(other) is not None:
                raise ValueError(
                    f"give only one of {_SOURCE_NAMES} and {SOURCES[-1]} ({other} is given too)"
                )
        return value

    @field_validator("template_id")
    @classmethod
    def _known(cls, template_id: str | None, info: ValidationInfo) -> str | None:
        if template_id is None:
            return None
        ref = parse_template_id(template_id)
        if ref not in checks_of(info).templates:
            raise ValueError(f"no template {template_id!r}")
        return template_id

    @model_validator(mode="after")
    def _meets_the_contract(self, info: ValidationInfo) -> JobRequest:
        """A stored version's data contract (its data_schema): each problem by its data path."""
        ref = parse_template_id(self.template_id)
        stored = checks_of(info).templates.get(ref) if ref else None
        if isinstance(stored, library.StoredTemplate) and stored.data_schema is not None:
            contract_error(library.contract_problems(stored.data_schema, self.data))
        return self

    @field_validator("options")
    @classmethod
    def _page_secrets(cls, given: RenderOptions | None, info: ValidationInfo) -> Any:
        no_cookies_or_headers(given, info.data.get("page_url"))
        return given

    @field_validator("cache")
    @classmethod
    def _cacheable(cls, cache: bool | None, info: ValidationInfo) -> bool | None:
        if cache:
            refused = _not_cached(info.data.get("page_url"), info.data.get("options"))
            if refused is not None:
                raise ValueError(refused)
        return cache

    def uses_cache(self, tenant_default: bool) -> bool:
        """Whether the render cache serves the job: as its `cache` says, else as its tenant's
        default, for a job the cache may serve (a default makes no valid job invalid)."""
        if self.cache is not None:
            return self.cache
        return tenant_default and _not_cached(self.page_url, self.options) is None

    @field_validator("assets")
    @classmethod
    def _not_for_a_page_url(cls, mapped: dict[str, str], info: ValidationInfo) -> Any:
        if mapped and info.data.get("page_url") is not None:
            raise ValueError(
                "a page_url loads its files from its own site; assets are for template, "
                "template_id and markdown jobs"
            )
        return mapped

    @field_validator("office")
    @classmethod
    def _office_file(cls, office: str | None, info: ValidationInfo) -> str | None:
        if office is None or "assets" not in info.data:  # no file, or a map already refused
            return office
        given = info.data.get("options")
        if isinstance(given, RenderOptions) and given.image:
            raise ValueError("an Office file becomes a PDF: leave options.output out")
        mapped = info.data["assets"]
        asset_id = office_asset(office, mapped)
        if asset_id is None:
            raise ValueError(
                "must be an asset id (sha256: and 64 hexadecimal digits) or a path of assets; "
                f"{office!r} is neither"
            )
        if len(mapped) > (0 if asset_id == office else 1):
            raise ValueError(
                "an Office file is its job's only asset: give it by its asset id without "
                "assets, or by its path with assets holding it alone"
            )
        asset = checks_of(info).assets.get(asset_id)
        if asset is None:
            raise ValueError(f"no asset {asset_id}: upload it with POST /v1/assets")
        if asset.content_type not in office_formats.BY_TYPE:
            raise ValueError(
                f"the asset {asset_id} is {asset.content_type}, not an Office file: they may "
                f"be {office_formats.accepted()}"
            )
        return office

    @field_validator("docx")
    @classmethod
    def _word_template(cls, docx: str | None, info: ValidationInfo) -> str | None:
        """An uploaded Word document, by id or by its path in assets (its images and Jinja
        syntax are checked after validation: server/web/submission.py)."""
        if docx is None or "assets" not in info.data:  # no file, or a map already refused
            return docx
        given = info.data.get("options")
        if isinstance(given, RenderOptions) and given.image:
            raise ValueError("a Word template becomes a PDF: leave options.output out")
        asset_id = office_asset(docx, info.data["assets"])
        if asset_id is None:
            raise ValueError(
                "must be an asset id (sha256: and 64 hexadecimal digits) or a path of assets; "
                f"{docx!r} is neither"
            )
        asset = checks_of(info).assets.get(asset_id)
        if asset is None:
            raise ValueError(f"no asset {asset_id}: upload it with POST /v1/assets")
        if asset.content_type != office_formats.DOCX.content_type:
            raise ValueError(
                f"the asset {asset_id} is {asset.content_type}, not a Word document (.docx): "
                "a Word template is a .docx whose text carries Jinja2"
            )
        return docx

    @field_validator("pdfs")
    @classmethod
    def _uploaded_pdfs(cls, refs: list[str] | None, info: ValidationInfo) -> list[str] | None:
        """Each file an uploaded PDF (by id, or by its path in assets); the options only
        those that apply to a PDF that is not printed."""
        if refs is None or "assets" not in info.data:  # no files, or a map already refused
            return refs
        known = checks_of(info).assets
        mapped: dict[str, str] = info.data["assets"]
        for index, ref in enumerate(refs):
            asset_id = ref if is_id(ref) else mapped.get(ref)
            if asset_id is None:
                raise ValueError(
                    f"pdfs[{index}] {ref!r} is neither an asset id nor a path of assets: give "
                    "the id POST /v1/assets answered, or map the path in assets"
                )
            asset = known.get(asset_id)
            if asset is None:
                raise ValueError(
                    f"pdfs[{index}]: no asset {asset_id}: upload it with POST /v1/assets"
                )
            if asset.content_type not in PDF_TYPES:
                raise ValueError(
                    f"pdfs[{index}] must be a PDF (application/pdf); {ref} is {asset.content_type}"
                )
        given = info.data.get("options")
        if isinstance(given, RenderOptions):
            printing = sorted(
                name
                for name in given.model_fields_set
                if name not in PDFS_OPTIONS and getattr(given, name) is not None
            )
            if printing or given.image:
                names = ", ".join(f"options.{name}" for name in printing or ["output"])
                raise ValueError(
                    f"a pdfs job is not printed, so {names} cannot apply: give only document "
                    "information (title, author, subject, keywords), thumbnail and finishing "
                    "options"
                )
        return refs


def _not_cached(page_url: Any, options: Any) -> str | None:
    """Why the render cache cannot serve a job (what `cache: true` is refused with), or None."""
    if page_url is not None:
        return "a page_url job is not cached: the page may change between two jobs; leave cache out"
    if isinstance(options, RenderOptions) and options.thumbnail is not None:
        return "a job with a thumbnail is not cached: leave cache or thumbnail out"
    return None


def office_asset(office: str, mapped: Mapping[str, str]) -> str | None:
    """The asset id an `office` field names: itself, or the one its path maps to (or None)."""
    return office if stored_assets.is_id(office) else mapped.get(office)


class JobWaitQuery(BaseModel):
    """GET /v1/jobs/{job_id}: the long-poll."""

    model_config = QUERY

    wait: WaitSeconds | None = Field(
        None,
        description="Hold the answer up to this many seconds until the job changes; a wait "
        "whose API key is revoked meanwhile is answered 401.",
    )
    since: EventId | None = Field(None, description="Answer once the job has events after this.")


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


class CompressReport(BaseModel):
    bytes_before: int = Field(description="The PDF's size as written without compress.")
    bytes_after: int = Field(description="Its size as written with it (before a signature).")


class JobFinishing(BaseModel):
    """What a job's finishing reports."""

    metadata: dict[str, str] | None = Field(
        None,
        description="The document information of the finished PDF as read back from it "
        "(Title, Author, Subject, Keywords, Creator, Producer and custom keys).",
    )
    compress: CompressReport | None = Field(None, description="The sizes compress made.")


class PreflightFinding(BaseModel):
    """One finding of the preflight checks (docs/documents.md, "Preflight")."""

    kind: Literal["overflow", "missing_glyph", "low_resolution_image", "broken_image", "blank_page"]
    page: Annotated[int, Field(ge=1)] | None = Field(
        description="Its page (1 is the first), as printed; null for what is measured in the "
        "page before it is paginated (overflow, broken_image, missing_glyph)."
    )
    detail: str = Field(description="What was found, naming the element, image or characters.")


class JobProvenance(BaseModel):
    """What made the job's PDF, as its XMP metadata records it."""

    pressroom: str = Field(description="Pressroom's version.")
    engine: str = Field(description="The engine that printed it, and its version.")
    template: str | None = Field(description="The stored template, name@version; null: none.")
    data_sha256: str = Field(description="SHA-256 of the job's data as sorted, compact JSON.")
    assets: dict[str, str] = Field(
        description="Each asset it used, by its path (or the option naming it): its id, "
        "sha256:… of its bytes."
    )
    finishing: list[str] = Field(description="The finishing steps, in the order they ran.")


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
    trace_id: Annotated[str, Field(pattern="^[0-9a-f]{32}$")] | None = Field(
        None,
        description="The OpenTelemetry trace its spans belong to: the submitting request's "
        "(its traceparent header continued) or a new one; null while tracing is off.",
    )
    finishing: JobFinishing | None = Field(
        None,
        description="What its finishing reports once done: the document information it set "
        "(metadata) and the sizes before and after compress; null when it reports nothing.",
    )
    provenance: JobProvenance | None = Field(
        None, description="What made its PDF, once done (as in the PDF's XMP); null otherwise."
    )
    preflight: list[PreflightFinding] | None = Field(
        None,
        description="What the preflight checks found, once done (each also in warnings); null "
        "when they did not run.",
    )
    cached_from: uuid.UUID | None = Field(
        None,
        description="The job that rendered its file, for a job served from the render cache "
        "(cache); null for a job that rendered its own.",
    )
    links: JobLinks = Field(description="What can be done with it.")
    url: str | None = Field(None, description="Signed, expiring download URL (once done).")
    thumbnail_url: str | None = Field(
        None, description="Signed, expiring URL of the thumbnail (once done, if asked for)."
    )
    webhooks: list[WebhookDelivery] | None = Field(
        None, description="Webhook deliveries (GET /v1/jobs/{job_id} only)."
    )
    source: str | None = Field(
        None,
        description="What it is made from, in a word (GET /v1/jobs only): Template, Markdown, "
        "Office, Word template, PDFs, or the host of a page_url.",
    )
    reset: StreamReset | None = Field(
        None,
        description="A long-poll's `since` could not be resumed from (pruned, or never given "
        "out): this is the job's state; continue from its events.",
    )


class JobList(BaseModel):
    items: list[Job] = Field(description="Newest first.")
    next_cursor: str | None = Field(description="The next page's cursor; null on the last.")
