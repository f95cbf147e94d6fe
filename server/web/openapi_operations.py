"""The operations of the HTTP API, as a table: each route's credentials, parameters, bodies,
answers and problems. server/web/openapi.py builds /v1/openapi.json from it and from the models
of server/schemas/."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from server.channels import CHANNEL_PATTERN
from server.files import assets
from server.options import outputs
from server.queue import admission
from server.schemas.assets import Asset, AssetFields, AssetList, AssetListQuery
from server.schemas.batches import Batch, BatchList, BatchListQuery, BatchRequest
from server.schemas.common import (
    EVENT_ID_PATTERN,
    NAME_PATTERN,
    TEMPLATE_ID_PATTERN,
    Health,
    Readiness,
)
from server.schemas.jobs import Job, JobList, JobRequest, JobWaitQuery, StreamReset
from server.schemas.listing import (
    JobBulkRequest,
    JobBulkResult,
    JobCounts,
    JobCountsQuery,
    JobListQuery,
)
from server.schemas.stats import Stats
from server.schemas.story import Story, StoryDelivery
from server.schemas.streams import (
    EVENT_TYPE,
    EventPoll,
    EventPollQuery,
    JobStreamReset,
    Token,
    TokenRequest,
)
from server.schemas.templates import (
    InlinePreviewRequest,
    PreviewRequest,
    PublishRequest,
    Template,
    TemplateDiff,
    TemplateList,
    TemplateListQuery,
    TemplateRequest,
    TemplateVersionList,
    TemplateVersionListQuery,
)
from server.web.openapi_push import SSE, Stream

JsonSchema = dict[str, Any]


# A model, a media type (its bytes), a stream, several of them (one is sent), or no body.
Part = type[BaseModel] | str | Stream
Body = Part | tuple[Part, ...] | None
PROBLEM = "application/problem+json"
UUID: JsonSchema = {"type": "string", "format": "uuid"}
PATH_PARAMETERS: dict[str, tuple[JsonSchema, str]] = {
    "job_id": (UUID, "The job's id. Another tenant's job answers 404, as an unknown id."),
    "delivery_id": (UUID, "A webhook delivery of the job (its webhook-id)."),
    "batch_id": (UUID, "The batch's id. Another tenant's batch answers 404, as an unknown id."),
    "name": (
        {"type": "string", "pattern": f"^{NAME_PATTERN}$"},
        "A template's name. Another tenant's template answers 404, as an unknown name.",
    ),
    "template_id": (
        {"type": "string", "pattern": f"^{TEMPLATE_ID_PATTERN}$"},
        "A template name (latest version) or name@version.",
    ),
    "sample": (
        {"type": "string", "pattern": f"^{NAME_PATTERN}$"},
        "A sample of the template version (its `samples`).",
    ),
    "page": ({"type": "string", "pattern": "^[1-9][0-9]{0,3}$"}, "A page, from 1."),
    "asset_id": (
        {"type": "string", "pattern": f"^{assets.ID_PATTERN}$"},
        "The asset's id, sha256:<hex>. Another tenant's asset answers 404, as an unknown id.",
    ),
}
#: An event id, or empty for none.
CURSOR: JsonSchema = {"type": "string", "pattern": f"^({EVENT_ID_PATTERN})?$"}
STREAM_PARAMETERS: list[JsonSchema] = [
    {
        "name": "Last-Event-ID",
        "in": "header",
        "schema": CURSOR,
        "description": "Resume after this event id: every missed event, then live ones.",
    },
    {
        "name": "last_event_id",
        "in": "query",
        "schema": CURSOR,
        "description": "Last-Event-ID for clients that cannot set headers (a new EventSource).",
    },
    {
        "name": "type",
        "in": "query",
        "schema": {"type": "array", "items": EVENT_TYPE},
        "style": "form",
        "explode": True,
        "description": "Only events of these types (repeat the parameter, or separate types "
        "with commas); a job's stream still ends after the job's final event, sent or not.",
    },
]
CHANNEL_PARAMETER: JsonSchema = {
    "name": "channel",
    "in": "query",
    "schema": {"type": "string", "pattern": f"^{CHANNEL_PATTERN}$"},
    "description": "Only the events of this channel's jobs and batches (see `channel` of a "
    "job), with the same cursors and resets as the tenant's stream.",
}
IDEMPOTENCY_KEY = {
    "name": "Idempotency-Key",
    "in": "header",
    "schema": {
        "type": "string",
        "pattern": "^[!-~]([ -~]*[!-~])?$",
        "maxLength": admission.MAX_IDEMPOTENCY_KEY_CHARS,
    },
    "description": "Retries with the same key and body return the original job; keys are "
    f"kept {admission.IDEMPOTENCY_TTL_S // 3600} hours, per tenant. Printable ASCII.",
}
#: A signed link's parameters besides its signature (the `signedLink` credential).
DOWNLOAD_PARAMETERS: list[JsonSchema] = [
    {
        "name": "expires",
        "in": "query",
        "schema": {"type": "integer", "minimum": 0},
        "description": "When the link stops working (Unix seconds); signed with the rest.",
    },
    {
        "name": "key",
        "in": "query",
        "schema": {"type": "integer", "minimum": 0},
        "description": "The id of the API key the link was minted for (0: none, as in webhook "
        "deliveries); signed with the rest.",
    },
]

# Problems any operation can answer; the table adds each operation's own.
COMMON_ERRORS = {
    "400": "A malformed request: a NUL character in the URL, HTTP the server cannot parse, or "
    "a body whose Content-Encoding it cannot decode (type …/content-encoding; see "
    "Accept-Encoding).",
    "401": "No, unknown or revoked credentials.",
    "429": "The key's rate limit or the tenant's jobs-in-flight cap.",
    "503": "The database is unreachable.",
}
BODY_ERRORS = {
    "400": "The body is not JSON or not UTF-8, is nested more than 128 levels deep, or a "
    "string in it holds NUL (\\u0000) or a lone surrogate, which no stored text can.",
    "413": "The body is over PRESSROOM_MAX_BODY_BYTES.",
    "415": "The body is not application/json.",
    "422": "Invalid fields (see errors).",
}
PREVIEW_ERRORS = {
    **BODY_ERRORS,
    "422": "Invalid fields, or the template cannot be rendered (see detail), as the same "
    "template's job would fail.",
    "503": "No renderer in this process (PRESSROOM_RENDER_SLOTS=0), the database is "
    "unreachable, or the browser failed or had no slot free: try again.",
}
HEADERS = {"ETag", "Location", "Retry-After", "WWW-Authenticate"}
NO_JOB = {"404": "No such job (or another tenant's)."}
NO_ASSET = {"404": "No such asset (or another tenant's)."}
STORAGE_DOWN = {"503": "The database or the file storage is unreachable."}
BULK_ERRORS = {
    **BODY_ERRORS,
    "503": "The database is unreachable, or it kept aborting a batch for conflicting writes "
    "(type …/bulk-interrupted; detail says after how many jobs): the jobs before it were acted "
    "on, and the same request sent again acts on the others.",
}
BINARY: JsonSchema = {"schema": {"type": "string", "format": "binary", "minLength": 1}}
#: A JSON asset is stored as sent, whatever JSON (or bytes) it is.
ANY_JSON: JsonSchema = {"schema": {}}
#: A job as multipart/form-data, as Gotenberg takes one: parts that are files are known by
#: their file names, which OpenAPI cannot name, so the schema lists the named parts.
MULTIPART_JOB: JsonSchema = {
    "schema": {
        "type": "object",
        "description": "The page as a part named or with the file name index.html (or index.md: "
        "Markdown), or an Office file to convert as a part named office with its file name "
        "(report.docx, say); every other part with a file name becomes an asset of the job, "
        "mapped by its file name (img/logo.png, say); the part named job holds the job's other "
        "fields as JSON (data, options, webhook_url, assets, …, but no template). Nothing is "
        "stored unless the whole job is valid.",
        "properties": {
            "index.html": {"type": "string", "format": "binary"},
            "office": {"type": "string", "format": "binary"},
            "job": {"type": "string", "contentMediaType": "application/json"},
        },
        "anyOf": [{"required": ["index.html"]}, {"required": ["office"]}],
    },
    "encoding": {"job": {"contentType": "application/json"}},
}
OUT_OF_SCOPE = {"403": "The subscription token opens another scope (job, channel) only."}
BAD_QUERY = {"422": "A query parameter is not valid (see errors)."}
PDF = outputs.PDF.content_type
# A job's document, or a preview: a PDF, or the image options.output asks for.
DOCUMENT = (PDF, *(outputs.OUTPUTS[name].content_type for name in outputs.IMAGES))


# What an operation takes as credentials, any one of: an API key; a subscription token as well
# (the streams and the long-poll, as EventSource sends no header); a signed link as well (the
# downloads); nothing. In dev mode (no key exists) requests need none: see build().
KEY = ("bearer",)
TOKEN = ("bearer", "subscriptionToken")
LINK = ("bearer", "signedLink")
OPEN: tuple[str, ...] = ()
SECURITY_SCHEMES: dict[str, JsonSchema] = {
    "bearer": {
        "type": "http",
        "scheme": "bearer",
        "description": "An API key from `pressroom keys create --tenant NAME`, as "
        "`Authorization: Bearer KEY`; or a dashboard token (POST /v1/tokens "
        '{"scope": "dashboard"}), which acts as its key until it expires.',
    },
    "subscriptionToken": {
        "type": "apiKey",
        "in": "query",
        "name": "token",
        "description": "A subscription token (POST /v1/tokens, links.events of a new job, or a "
        "JWT the tenant's backend mints with its token secret, HS256, or with a private key it "
        "registered, by `kid`), for clients that cannot send the Authorization header "
        "(EventSource). It opens its scope only: the tenant's streams, one job's, or those of "
        "its channels; a request with an Authorization header is judged by its key.",
    },
    "signedLink": {
        "type": "apiKey",
        "in": "query",
        "name": "sig",
        "description": "The signature of a download link (a job's url or thumbnail_url, a "
        "batch's combined.url), with its expires and key: the link works without other "
        "credentials until it expires or its key is revoked.",
    },
}


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    """One operation: what it reads, what it answers."""

    method: str
    path: str
    summary: str
    tag: str
    ok: Mapping[str, tuple[str, Body]]
    errors: Mapping[str, str] = dataclasses.field(default_factory=dict)
    body: type[BaseModel] | None = None
    #: Request bodies other than JSON: media type → its media type object.
    media: Mapping[str, JsonSchema] = dataclasses.field(default_factory=dict)
    body_required: bool = True
    query: type[BaseModel] | None = None
    parameters: tuple[JsonSchema, ...] = ()
    #: The credentials it takes, any one of them (securitySchemes); OPEN: none at all.
    security: tuple[str, ...] = KEY
    headers: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)


OPERATIONS = (
    Op("post", "/v1/jobs", "Submit a job (JSON, or multipart/form-data with its files)", "jobs",
       {"202": ("Queued, or done already when the render cache served it (cached_from).", Job),
        "200": ("An earlier request with this Idempotency-Key and body made this job.", Job)},
       {**BODY_ERRORS, "400": "The body is not JSON, not UTF-8, or the key is malformed.",
        "409": "A request with this Idempotency-Key is still in progress.",
        "413": "The body is over PRESSROOM_MAX_BODY_BYTES; a multipart body over "
        "PRESSROOM_MAX_UPLOAD_BYTES, a file over PRESSROOM_MAX_ASSET_BYTES, or its files over "
        "the tenant's asset quota.",
        "415": "The body is neither application/json nor multipart/form-data, or a file's "
        "type is not one an asset may have.",
        "422": "Invalid fields (see errors), a file of a multipart job is empty, or the "
        "Idempotency-Key was used with another body.",
        **STORAGE_DOWN},
       body=JobRequest, media={"multipart/form-data": MULTIPART_JOB},
       parameters=(IDEMPOTENCY_KEY,),
       headers={"202": ("Location",), "200": ("Location",), "409": ("Retry-After",)}),
    Op("get", "/v1/jobs", "List jobs, newest first", "jobs", {"200": ("A page.", JobList)},
       BAD_QUERY, query=JobListQuery),
    Op("get", "/v1/jobs/counts", "Count jobs by state, with the list's filters but the state",
       "jobs", {"200": ("The counts.", JobCounts)}, BAD_QUERY, query=JobCountsQuery),
    Op("post", "/v1/jobs/retry", "Re-queue every failed job the filter matches (dry_run: "
       "count them)", "jobs", {"200": ("What was done.", JobBulkResult)}, BULK_ERRORS,
       body=JobBulkRequest, body_required=False),
    Op("post", "/v1/jobs/cancel", "Cancel every queued or running job the filter matches "
       "(dry_run: count them)", "jobs", {"200": ("What was done.", JobBulkResult)},
       BULK_ERRORS, body=JobBulkRequest, body_required=False),
    Op("get", "/v1/jobs/{job_id}", "Get a job (long-poll with ?wait=)", "jobs",
       {"200": ("The job.", Job), "304": ("Unchanged since If-None-Match.", None)},
       {**NO_JOB, **BAD_QUERY, **OUT_OF_SCOPE}, query=JobWaitQuery,
       parameters=({"name": "If-None-Match", "in": "header", "schema": {"type": "string"}},),
       headers={"200": ("ETag",)}, security=TOKEN),
    Op("post", "/v1/jobs/{job_id}/cancel", "Cancel a queued or running job", "jobs",
       {"200": ("Cancelled.", Job)}, {**NO_JOB, "409": "The job is final."}),
    Op("post", "/v1/jobs/{job_id}/retry", "Re-queue a failed job", "jobs",
       {"202": ("Queued again.", Job)}, {**NO_JOB, "409": "The job has not failed."}),
    Op("get", "/v1/jobs/{job_id}/story", "A job's story: attempts, event timeline with the "
       "time spent queued and running, webhook deliveries with every try", "jobs",
       {"200": ("The story.", Story)}, NO_JOB),
    Op("post", "/v1/jobs/{job_id}/webhooks/{delivery_id}/redeliver", "Deliver one of the "
       "job's webhooks again (same webhook-id, signed afresh when sent)", "jobs",
       {"202": ("Back in the outbox, due now.", StoryDelivery)},
       {"404": "No such job or delivery (or another tenant's).",
        "409": "The delivery is pending already (due, or in flight)."}),
    Op("get", "/v1/jobs/{job_id}/pdf",
       "Download the job's file: the PDF, or its image (with an API key, or with the signed "
       "url of the job)", "jobs",
       {"200": ("The PDF, or the image options.output asked for.", DOCUMENT),
        "302": ("Redirect to a presigned S3 URL.", None)},
       {**NO_JOB, "401": "The signed link was minted for an API key since revoked.",
        "403": "The signed link is invalid or has expired.", "409": "The job is not done.",
        "410": "The file was deleted (retention)."},
       parameters=tuple(DOWNLOAD_PARAMETERS), security=LINK),
    Op("get", "/v1/jobs/{job_id}/thumbnail",
       "Download the PNG of the PDF's first page (with an API key, or with the signed "
       "thumbnail_url of the job)", "jobs",
       {"200": ("The thumbnail.", outputs.THUMBNAIL.content_type),
        "302": ("Redirect to a presigned S3 URL.", None)},
       {"404": "No such job (or another tenant's), or the job asked for no thumbnail.",
        "401": "The signed link was minted for an API key since revoked.",
        "403": "The signed link is invalid or has expired.", "409": "The job is not done.",
        "410": "The file was deleted (retention)."},
       parameters=tuple(DOWNLOAD_PARAMETERS), security=LINK),
    Op("get", "/v1/jobs/{job_id}/events", "Server-Sent Events of one job; ends after its "
       "final event", "events",
       {"200": (SSE, Stream(JobStreamReset)),
        "204": ("The job is final and the cursor is at or after its final event: nothing "
                "more will come (EventSource stops reconnecting).", None)},
       {**NO_JOB, **OUT_OF_SCOPE,
        "422": "Last-Event-ID is not an event id, or a type is unknown."},
       parameters=tuple(STREAM_PARAMETERS), security=TOKEN),
    Op("get", "/v1/events", "Server-Sent Events of all the tenant's jobs, or of one channel; "
       "with ?wait=, a long-poll answering the same events as JSON", "events",
       {"200": (f"{SSE} With ?wait=, an EventPoll.",
                (Stream(StreamReset, batches=True), EventPoll))},
       {**OUT_OF_SCOPE,
        "422": "Last-Event-ID is not an event id, a type is unknown, the channel is "
        "malformed, or wait is not a number of seconds from 0 to 60."},
       query=EventPollQuery, parameters=(*STREAM_PARAMETERS, CHANNEL_PARAMETER),
       security=TOKEN),
    Op("post", "/v1/tokens", "A short-lived subscription token for browsers (EventSource, "
       "Socket.IO, long-poll): the tenant's streams, one job's or one channel's; or a "
       "dashboard token, made or renewed", "auth",
       {"200": ("The token.", Token)},
       {**BODY_ERRORS, **NO_JOB, "401": "No, unknown or revoked credentials, or a dashboard "
        "token renewed past PRESSROOM_DASHBOARD_SESSION_S.",
        "422": "Invalid fields (see errors), or both job_id and channel."},
       body=TokenRequest, body_required=False),
    Op("get", "/v1/stats", "The tenant's last hour minute by minute (jobs done, failed, "
       "submit→done p50 and p95) and its queue now (depth, the oldest due job)", "jobs",
       {"200": ("The figures.", Stats)}),
    Op("post", "/v1/batches", "Submit many documents, one job per item key", "batches",
       {"202": ("Accepted; the items the render cache served are done already.", Batch),
        "200": ("The same request was made before.", Batch)},
       {**BODY_ERRORS, "422": "Invalid items (see errors), or a key reused with new content."},
       body=BatchRequest, headers={"202": ("Location",), "200": ("Location",)}),
    Op("get", "/v1/batches", "The tenant's batches, newest first, with their progress",
       "batches", {"200": ("A page.", BatchList)}, BAD_QUERY, query=BatchListQuery),
    Op("get", "/v1/batches/{batch_id}", "A batch: progress, counts, its items' jobs and "
       "its combined PDF", "batches", {"200": ("The batch.", Batch)}, {"404": "No such batch."}),
    Op("get", "/v1/batches/{batch_id}/pdf",
       "Download the batch's combined PDF (with an API key, or with the signed combined.url "
       "of the batch)", "batches",
       {"200": ("The items' PDFs joined in item order.", PDF),
        "302": ("Redirect to a presigned S3 URL.", None)},
       {"404": "No such batch (or another tenant's), or the batch asked for no combine.",
        "401": "The signed link was minted for an API key since revoked.",
        "403": "The signed link is invalid or has expired.",
        "409": "The combined PDF is not done (pending, running or failed).",
        "410": "The file was deleted (retention)."},
       parameters=tuple(DOWNLOAD_PARAMETERS), security=LINK),
    Op("post", "/v1/assets", "Upload an asset: the body is the file, of its Content-Type",
       "assets",
       {"201": ("Stored.", Asset), "200": ("The same bytes were stored before.", Asset)},
       {"413": "The asset is over PRESSROOM_MAX_ASSET_BYTES, or would take the tenant's "
        "assets over PRESSROOM_TENANT_MAX_ASSET_BYTES (type …/asset-quota).",
        "415": "The Content-Type is not one an asset may have.",
        "422": "The file is empty, or a PDF asset is not a whole PDF.", **STORAGE_DOWN},
       media={kind: ANY_JSON if kind == "application/json" else BINARY
              for kind in assets.CONTENT_TYPES},
       headers={"201": ("Location",), "200": ("Location",)}),
    Op("get", "/v1/assets", "The tenant's assets, by id, with what uses each and what they "
       "take of its quota",
       "assets", {"200": ("A page.", AssetList)}, BAD_QUERY, query=AssetListQuery),
    Op("get", "/v1/assets/{asset_id}", "An asset: its size, content type and what uses it",
       "assets",
       {"200": ("The asset.", Asset)}, NO_ASSET),
    Op("get", "/v1/assets/{asset_id}/content", "An asset's bytes (as a download)", "assets",
       {"200": ("The bytes, with the asset's content type.", tuple(assets.CONTENT_TYPES))},
       {**NO_ASSET, "410": "The bytes are no longer stored.", **STORAGE_DOWN}),
    Op("get", "/v1/assets/{asset_id}/fields", "A PDF asset's form fields (the names "
       "fill_form takes), with their types and values, and its pages", "assets",
       {"200": ("The fields.", AssetFields)},
       {**NO_ASSET, "410": "The bytes are no longer stored.",
        "409": "The asset is not a PDF, or is encrypted or unreadable.", **STORAGE_DOWN}),
    Op("delete", "/v1/assets/{asset_id}", "Delete an asset no queued or running job uses",
       "assets", {"204": ("Deleted.", None)},
       {**NO_ASSET, "409": "Queued or running jobs use it (jobs: a few of their ids).",
        **STORAGE_DOWN}),
    Op("post", "/v1/templates", "Store a new version of a named template", "templates",
       {"201": ("Stored (a draft, or published with `publish`).", Template)},
       {**BODY_ERRORS, "409": "With `publish`: stored, but publishing refused (as POST "
        "…/publish answers); the version is a draft.",
        "503": "With `publish`: no renderer free to run the checks; the version is a draft."},
       body=TemplateRequest,
       headers={"201": ("Location",)}),
    Op("get", "/v1/templates", "The latest version of each template, by name", "templates",
       {"200": ("A page.", TemplateList)}, BAD_QUERY, query=TemplateListQuery),
    Op("post", "/v1/templates/preview", "Render template html to PDF now, without storing it",
       "templates", {"200": ("The PDF (header Pressroom-Pages: its pages), or the image "
                             "options.output asks for.", DOCUMENT)},
       PREVIEW_ERRORS, body=InlinePreviewRequest),
    Op("get", "/v1/templates/{template_id}", "A stored template (latest, or name@version) "
       "and its versions", "templates", {"200": ("The template.", Template)},
       {"404": "No such template."}),
    Op("get", "/v1/templates/{name}/versions", "A template's versions, newest first",
       "templates", {"200": ("A page.", TemplateVersionList)},
       {**BAD_QUERY, "404": "No such template (or another tenant's)."},
       query=TemplateVersionListQuery),
    Op("post", "/v1/templates/{template_id}/preview", "Render a stored template with its "
       "sample data (or data given) to PDF now", "templates",
       {"200": ("The PDF (header Pressroom-Pages: its pages), or the image options.output "
                "asks for.", DOCUMENT)},
       {**PREVIEW_ERRORS, "404": "No such template."}, body=PreviewRequest,
       body_required=False),
    Op("post", "/v1/templates/{template_id}/publish", "Publish a draft (name@version): its "
       "samples rendered with it and the published version and compared", "templates",
       {"200": ("Published (or it already was), with the diff.", Template)},
       {**PREVIEW_ERRORS, "404": "No such version (a name alone is none).",
        "409": "Refused: a sample fails, changes its page count or its pixels beyond the "
               "threshold (refused: what; diff: the diff). The version stays a draft."},
       body=PublishRequest, body_required=False),
    Op("get", "/v1/templates/{template_id}/diff", "What the last publishing of a version "
       "found", "templates", {"200": ("The diff.", TemplateDiff)},
       {"404": "No such version, or never published."}),
    Op("get", "/v1/templates/{template_id}/diff/{sample}/{page}", "A changed page of a "
       "version's diff: the published page beside the new one, changes in red", "templates",
       {"200": ("The image.", "image/png")}, {"404": "No such version, sample or page."}),
    Op("get", "/v1/openapi.json", "This document", "meta",
       {"200": ("OpenAPI 3.1.", "application/json")}, security=OPEN),
    Op("get", "/healthz", "Liveness", "meta", {"200": ("The process answers.", Health)},
       security=OPEN),
    Op("get", "/readyz", "Readiness: database, LISTEN connection, storage, browser", "meta",
       {"200": ("Ready.", Readiness), "503": ("Not ready; checks say why.", Readiness)},
       security=OPEN),
    Op("get", "/metrics", "Prometheus metrics", "meta",
       {"200": ("The Prometheus text format.", "text/plain")}, security=OPEN),
)  # fmt: skip
TAGS = [
    {"name": "jobs", "description": "Submit a document, follow it, download it."},
    {"name": "events", "description": "Every state change, as it is committed: Server-Sent "
     "Events and their long-poll (Socket.IO: see the description above)."},
    {"name": "auth", "description": "Subscription tokens for browsers, which hold no API key."},
    {"name": "batches", "description": "Many documents in one call, joined into one with combine."},
    {"name": "assets", "description": "Files (images, fonts, CSS, …) jobs map in by path."},
    {"name": "templates", "description": "Named, versioned templates, and previews."},
    {"name": "meta", "description": "This description, health and metrics."},
]  # fmt: skip
# What a created job or batch links to (schemathesis' stateful phase follows these).
LINKS = {
    ("/v1/jobs", "post"): ("job_id", ("getJobsJobId", "postJobsJobIdCancel",
                                     "postJobsJobIdRetry", "getJobsJobIdPdf")),
    ("/v1/batches", "post"): ("batch_id", ("getBatchesBatchId", "getBatchesBatchIdPdf")),
    ("/v1/assets", "post"): ("asset_id", ("getAssetsAssetId", "getAssetsAssetIdContent",
                                         "deleteAssetsAssetId")),
}  # fmt: skip
