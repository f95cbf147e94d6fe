"""The OpenAPI 3.1 description of the HTTP API, served at /v1/openapi.json."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from server import admission, api, batches, events, options
from server.jobs import JobState
from server.keys import SETTINGS
from server.settings import Settings

JsonSchema = dict[str, Any]

PROBLEM = "application/problem+json"


def _ref(name: str) -> JsonSchema:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: JsonSchema) -> JsonSchema:
    return {"anyOf": [schema, {"type": "null"}]}


def _problem(description: str, *headers: str) -> JsonSchema:
    response: JsonSchema = {
        "description": description,
        "content": {PROBLEM: {"schema": _ref("Problem")}},
    }
    if headers:
        response["headers"] = {name: {"$ref": f"#/components/headers/{name}"} for name in headers}
    return response


def _json(description: str, schema: JsonSchema, *headers: str) -> JsonSchema:
    response: JsonSchema = {
        "description": description,
        "content": {"application/json": {"schema": schema}},
    }
    if headers:
        response["headers"] = {name: {"$ref": f"#/components/headers/{name}"} for name in headers}
    return response


# Every /v1 route can answer these; each operation adds its own.
COMMON_ERRORS: dict[str, JsonSchema] = {
    "400": {"$ref": "#/components/responses/BadRequest"},
    "401": {"$ref": "#/components/responses/Unauthorized"},
    "429": {"$ref": "#/components/responses/TooManyRequests"},
    "503": {"$ref": "#/components/responses/Unavailable"},
}

JOB_ID = {
    "name": "job_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "format": "uuid"},
    "description": "The job's id. Another tenant's job answers 404, exactly as an unknown id.",
}

STREAM_PARAMETERS = [
    {
        "name": "Last-Event-ID",
        "in": "header",
        "schema": {"type": "string", "pattern": "^[0-9]*$"},
        "description": "Resume after this event id: every missed event, then live ones.",
    },
    {
        "name": "last_event_id",
        "in": "query",
        "schema": {"type": "string", "pattern": "^[0-9]*$"},
        "description": "Last-Event-ID for clients that cannot set headers (a new EventSource).",
    },
    {
        "name": "token",
        "in": "query",
        "schema": {"type": "string"},
        "description": "A subscription token (POST /v1/tokens, or links.events of a new job) "
        "instead of the Authorization header, which EventSource cannot send.",
    },
]

TYPE_FILTER = {
    "name": "type",
    "in": "query",
    "schema": {"type": "array", "items": {"type": "string", "enum": sorted(events.TYPES)}},
    "style": "form",
    "explode": True,
    "description": "Only events of these types (repeat the parameter, or separate types with "
    "commas); a cursor resumes within the same filter. A job's stream still ends after the "
    "job's final event, sent or not.",
}

SSE = {
    "description": "Server-Sent Events: `id:` event id, `event:` type, `data:` an Event as "
    "JSON; `reset` when the cursor is no longer kept, `closed` (then the stream ends) when the "
    "server drops a slow consumer, shuts down, or the API key behind the stream (its own, or "
    "its token's) is revoked.",
    "content": {
        "text/event-stream": {
            "schema": {
                "type": "object",
                "description": "One message; `data` is an Event (see components) as JSON.",
                "properties": {
                    "id": {"type": "string"},
                    "event": {"type": "string"},
                    "data": {"type": "string"},
                },
            }
        }
    },
}


def _operation(
    summary: str,
    responses: dict[str, JsonSchema],
    *,
    parameters: list[JsonSchema] | None = None,
    body: JsonSchema | None = None,
    body_required: bool = True,
    security: list[dict[str, list[str]]] | None = None,
    tags: tuple[str, ...] = ("jobs",),
) -> JsonSchema:
    operation: JsonSchema = {
        "summary": summary,
        "tags": list(tags),
        "responses": {**COMMON_ERRORS, **responses},
    }
    if parameters:
        operation["parameters"] = parameters
    if body is not None:
        operation["requestBody"] = {
            "required": body_required,
            "content": {"application/json": {"schema": body}},
        }
    if security is not None:
        operation["security"] = security
    return operation


def _schemas(settings: Settings) -> dict[str, JsonSchema]:
    length = {"type": ["string", "number"], "description": "e.g. 210mm, 8.5in, 800px"}
    text = {"type": "string", "maxLength": options.MAX_TEXT_OPTION}
    timestamp = {"type": "string", "format": "date-time"}
    schemas: dict[str, JsonSchema] = {
        "Problem": {
            "type": "object",
            "description": "RFC 9457 problem details.",
            "required": ["type", "title", "status"],
            "properties": {
                "type": {"type": "string"},
                "title": {"type": "string"},
                "status": {"type": "integer"},
                "detail": {"type": "string"},
                "instance": {"type": "string"},
                "errors": {
                    "type": "array",
                    "description": "One entry per invalid field.",
                    "items": {
                        "type": "object",
                        "required": ["field", "message"],
                        "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
                    },
                },
            },
        },
        "RenderOptions": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "format": {"type": "string", "enum": list(options.PAPER_FORMATS)},
                "width": length,
                "height": length,
                "landscape": {"type": "boolean"},
                "margin": {
                    "anyOf": [
                        length,
                        {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {side: length for side in options.MARGIN_SIDES},
                        },
                    ]
                },
                "scale": {"type": "number", "minimum": 0.1, "maximum": 2},
                "print_background": {"type": "boolean"},
                "page_ranges": {"type": "string", "description": "e.g. 1-3, 5"},
                "prefer_css_page_size": {"type": "boolean"},
                "header_html": text,
                "footer_html": text,
                "media": {"type": "string", "enum": ["print", "screen"]},
                "wait_for_selector": text,
                "wait_for_expression": text,
                "javascript": {"type": "boolean"},
                "title": text,
            },
        },
        "JobRequest": {
            "type": "object",
            "additionalProperties": False,
            "description": "Either template or template_id.",
            "properties": {
                "template": {
                    "type": "string",
                    "description": "Jinja2 HTML template, rendered in a sandbox "
                    f"(at most {settings.max_template_bytes} bytes).",
                },
                "template_id": {
                    "type": "string",
                    "description": "A stored template: name (latest version) or name@version.",
                },
                "data": {
                    "type": "object",
                    "description": f"Template variables (at most {settings.max_data_bytes} "
                    "bytes as JSON).",
                },
                "options": _ref("RenderOptions"),
                "webhook_url": _nullable({"type": "string", "format": "uri"}),
                "priority": {"type": "integer", "minimum": -1000, "maximum": 1000},
                "max_attempts": {"type": "integer", "minimum": 1, "maximum": 25},
                "run_at": _nullable(timestamp),
                "metadata": {
                    "type": "object",
                    "description": f"Returned as given (at most {api.MAX_METADATA_BYTES} bytes).",
                },
            },
        },
        "Links": {
            "type": "object",
            "required": ["self", "events", "pdf"],
            "properties": {
                "self": {"type": "string"},
                "events": {
                    "type": "string",
                    "description": "The job's SSE stream; for requests made with an API key it "
                    "carries a subscription token for this job (?token=).",
                },
                "pdf": {"type": "string"},
            },
        },
        "Job": {
            "type": "object",
            "required": ["id", "status", "attempts", "max_attempts", "created_at", "links"],
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "status": {"type": "string", "enum": [state.value for state in JobState]},
                "attempts": {"type": "integer", "minimum": 0},
                "max_attempts": {"type": "integer", "minimum": 1},
                "priority": {"type": "integer"},
                "progress": _nullable({"type": "integer", "minimum": 0, "maximum": 100}),
                "error": _nullable({"type": "string"}),
                "errors": {"type": "array", "items": {"type": "object"}},
                "warnings": {"type": "array", "items": {"type": "string"}},
                "options": {"type": "object"},
                "metadata": {"type": "object"},
                "webhook_url": _nullable({"type": "string"}),
                "pages": _nullable({"type": "integer"}),
                "bytes": _nullable({"type": "integer"}),
                "run_after": timestamp,
                "created_at": timestamp,
                "updated_at": timestamp,
                "started_at": _nullable(timestamp),
                "finished_at": _nullable(timestamp),
                "links": _ref("Links"),
                "url": {
                    "type": "string",
                    "description": "Signed, expiring download URL (once done).",
                },
                "webhooks": {
                    "type": "array",
                    "description": "Webhook deliveries (GET /v1/jobs/{job_id} only).",
                    "items": {"type": "object"},
                },
            },
        },
        "JobList": {
            "type": "object",
            "required": ["items", "next_cursor"],
            "properties": {
                "items": {"type": "array", "items": _ref("Job")},
                "next_cursor": _nullable({"type": "string"}),
            },
        },
        "Event": {
            "type": "object",
            "description": "What every transport carries for one event.",
            "required": ["event_id", "type", "at", "job"],
            "properties": {
                "event_id": {"type": "integer"},
                "type": {"type": "string"},
                "at": timestamp,
                "job": _ref("Job"),
            },
        },
        "BatchRequest": {
            "type": "object",
            "additionalProperties": False,
            "required": ["items"],
            "properties": {
                "items": {
                    "type": "array",
                    "minItems": 1,
                    "maxItems": batches.MAX_BATCH_ITEMS,
                    "items": _ref("BatchItem"),
                },
                "webhook_url": _nullable({"type": "string", "format": "uri"}),
            },
        },
        "Batch": {
            "type": "object",
            "required": ["id", "status", "total", "counts", "items", "links"],
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "status": {"type": "string", "enum": ["running", "done"]},
                "total": {"type": "integer"},
                "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
                "progress": {"type": "integer", "minimum": 0, "maximum": 100},
                "webhook_url": _nullable({"type": "string"}),
                "created_at": timestamp,
                "finished_at": _nullable(timestamp),
                "items": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["key", "job_id", "status"],
                        "properties": {
                            "key": {"type": "string"},
                            "job_id": {"type": "string", "format": "uuid"},
                            "status": {"type": "string"},
                        },
                    },
                },
                "links": {"type": "object"},
            },
        },
        "TemplateRequest": {
            "type": "object",
            "additionalProperties": False,
            "required": ["name", "html"],
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"},
                "html": {"type": "string"},
                "options": _ref("RenderOptions"),
                "sample_data": {"type": "object"},
            },
        },
        "Template": {
            "type": "object",
            "required": ["name", "version", "template_id", "html", "links"],
            "properties": {
                "name": {"type": "string"},
                "version": {"type": "integer", "minimum": 1},
                "template_id": {"type": "string"},
                "html": {"type": "string"},
                "options": {"type": "object"},
                "sample_data": {"type": "object"},
                "created_at": timestamp,
                "versions": {"type": "array", "items": {"type": "object"}},
                "links": {"type": "object"},
            },
        },
        "TemplateList": {
            "type": "object",
            "required": ["items", "next_cursor"],
            "properties": {
                "items": {"type": "array", "items": {"type": "object"}},
                "next_cursor": _nullable({"type": "string"}),
            },
        },
        "PreviewRequest": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "data": {"type": "object"},
                "options": _ref("RenderOptions"),
                "version": {"type": "integer", "minimum": 1},
            },
        },
        "InlinePreviewRequest": {
            "type": "object",
            "additionalProperties": False,
            "required": ["html"],
            "properties": {
                "html": {"type": "string"},
                "data": {"type": "object"},
                "options": _ref("RenderOptions"),
            },
        },
        "TokenRequest": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "job_id": {
                    "type": "string",
                    "format": "uuid",
                    "description": "Limit the token to this job's stream.",
                }
            },
        },
        "Token": {
            "type": "object",
            "required": ["token", "expires_at"],
            "properties": {"token": {"type": "string"}, "expires_at": timestamp},
        },
    }
    job_request = schemas["JobRequest"]
    schemas["BatchItem"] = {
        **job_request,
        "description": "A job, plus its stable business key (one job per key and tenant).",
        "required": ["key"],
        "properties": {
            **job_request["properties"],
            "key": {"type": "string", "minLength": 1, "maxLength": batches.MAX_KEY_CHARS},
        },
    }
    return schemas


TEMPLATE_ID = {
    "name": "template_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string"},
    "description": "A template name (latest version) or name@version.",
}


def _preview_responses(settings: Settings) -> dict[str, JsonSchema]:
    return {
        "200": {
            "description": "The PDF (header Pressroom-Pages: its page count).",
            "content": {"application/pdf": {"schema": {"type": "string"}}},
        },
        "400": _problem("The body is not JSON or not UTF-8."),
        "413": _problem(f"The body is over {settings.max_body_bytes} bytes."),
        "415": _problem("The body is not application/json."),
        "422": _problem(
            "Invalid fields, or the template cannot be rendered (see detail): a template error "
            "or limit, as the same template's job would fail with."
        ),
        "503": _problem(
            "No renderer in this process (PRESSROOM_RENDER_SLOTS=0), the database is "
            "unreachable, or the browser failed, timed out or had no slot free: try again.",
            "Retry-After",
        ),
    }


def build(settings: Settings) -> JsonSchema:
    """The whole document; limits in the descriptions come from `settings`."""
    job = _ref("Job")
    not_found = _problem("No such job (or another tenant's).")
    conflict = _problem("The job is not in a state that allows this.")
    invalid_query = _problem("A query parameter is not valid (see errors).")
    bad_stream_query = _problem(
        "Last-Event-ID (or last_event_id) is not an event id, or a type is unknown (see errors)."
    )
    paths: dict[str, JsonSchema] = {
        "/v1/jobs": {
            "post": _operation(
                "Submit a job",
                {
                    "202": _json("Queued.", job, "Location"),
                    "200": _json(
                        "An earlier request with the same Idempotency-Key and body made this job.",
                        job,
                        "Location",
                    ),
                    "400": _problem("The body is not JSON, not UTF-8, or the key is malformed."),
                    "409": _problem(
                        "A request with this Idempotency-Key is still in progress.", "Retry-After"
                    ),
                    "413": _problem(f"The body is over {settings.max_body_bytes} bytes."),
                    "415": _problem("The body is not application/json."),
                    "422": _problem(
                        "Invalid fields (see errors), or the Idempotency-Key was used with "
                        "another body."
                    ),
                },
                parameters=[
                    {
                        "name": "Idempotency-Key",
                        "in": "header",
                        "schema": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": admission.MAX_IDEMPOTENCY_KEY_CHARS,
                        },
                        "description": "Retries with the same key and body return the original "
                        f"job; keys are kept {settings.idempotency_ttl_s} s, per tenant.",
                    }
                ],
                body=_ref("JobRequest"),
            ),
            "get": _operation(
                "List jobs, newest first",
                {"200": _json("A page of jobs.", _ref("JobList")), "422": invalid_query},
                parameters=[
                    {
                        "name": "status",
                        "in": "query",
                        "schema": {"type": "string", "enum": [s.value for s in JobState]},
                    },
                    {
                        "name": "limit",
                        "in": "query",
                        "schema": {"type": "integer", "minimum": 1, "maximum": api.MAX_LIST_LIMIT},
                    },
                    {"name": "created_from", "in": "query", "schema": {"type": "string"}},
                    {"name": "created_to", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "cursor",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "next_cursor of the previous page.",
                    },
                ],
            ),
        },
        "/v1/jobs/{job_id}": {
            "parameters": [JOB_ID],
            "get": _operation(
                "Get a job (long-poll with ?wait=)",
                {
                    "200": _json("The job.", job, "ETag"),
                    "304": {"description": "Unchanged since If-None-Match."},
                    "404": not_found,
                    "422": invalid_query,
                },
                parameters=[
                    {
                        "name": "wait",
                        "in": "query",
                        "schema": {"type": "number", "minimum": 0, "maximum": api.MAX_WAIT_S},
                        "description": "Hold the answer up to this many seconds until the job "
                        "changes; a wait whose API key is revoked meanwhile is answered 401.",
                    },
                    {"name": "since", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "If-None-Match", "in": "header", "schema": {"type": "string"}},
                ],
            ),
        },
        "/v1/jobs/{job_id}/cancel": {
            "parameters": [JOB_ID],
            "post": _operation(
                "Cancel a queued or running job",
                {"200": _json("Cancelled.", job), "404": not_found, "409": conflict},
            ),
        },
        "/v1/jobs/{job_id}/retry": {
            "parameters": [JOB_ID],
            "post": _operation(
                "Re-queue a failed job",
                {"202": _json("Queued again.", job), "404": not_found, "409": conflict},
            ),
        },
        "/v1/jobs/{job_id}/pdf": {
            "parameters": [JOB_ID],
            "get": _operation(
                "Download the PDF (with an API key, or with the signed url of the job)",
                {
                    "200": {
                        "description": "The PDF.",
                        "content": {"application/pdf": {"schema": {"type": "string"}}},
                    },
                    "302": {"description": "Redirect to a presigned S3 URL."},
                    "401": _problem(
                        "The signed link was minted for an API key that has been revoked.",
                        "WWW-Authenticate",
                    ),
                    "403": _problem("The signed link is invalid or has expired."),
                    "404": not_found,
                    "409": _problem("The job is not done."),
                    "410": _problem("The file was deleted (retention)."),
                },
                parameters=[
                    {"name": "expires", "in": "query", "schema": {"type": "string"}},
                    {
                        "name": "key",
                        "in": "query",
                        "schema": {"type": "string"},
                        "description": "The id of the API key the link was minted for (0: none, "
                        "as in webhook deliveries); signed with the rest.",
                    },
                    {"name": "sig", "in": "query", "schema": {"type": "string"}},
                ],
                security=[{"bearer": []}, {}],
            ),
        },
        "/v1/jobs/{job_id}/events": {
            "parameters": [JOB_ID],
            "get": _operation(
                "Server-Sent Events of one job; ends after its final event",
                {
                    "200": SSE,
                    "404": not_found,
                    "422": bad_stream_query,
                },
                parameters=[*STREAM_PARAMETERS, TYPE_FILTER],
                security=[{"bearer": []}, {"subscriptionToken": []}],
                tags=("events",),
            ),
        },
        "/v1/events": {
            "get": _operation(
                "Server-Sent Events of all the tenant's jobs",
                {
                    "200": SSE,
                    "422": bad_stream_query,
                },
                parameters=[*STREAM_PARAMETERS, TYPE_FILTER],
                security=[{"bearer": []}, {"subscriptionToken": []}],
                tags=("events",),
            ),
        },
        "/v1/tokens": {
            "post": _operation(
                "A short-lived subscription token for browsers (EventSource, Socket.IO)",
                {
                    "200": _json("The token.", _ref("Token")),
                    "400": _problem("The body is not JSON."),
                    "404": not_found,
                    "415": _problem("The body is not application/json."),
                    "422": _problem("Invalid fields (see errors)."),
                },
                body=_ref("TokenRequest"),
                body_required=False,
                tags=("auth",),
            ),
        },
        "/v1/batches": {
            "post": _operation(
                "Submit many documents, one job per item key",
                {
                    "202": _json("Accepted.", _ref("Batch"), "Location"),
                    "200": _json("The same request was made before: that batch.", _ref("Batch")),
                    "400": _problem("The body is not JSON or not UTF-8."),
                    "413": _problem(f"The body is over {settings.max_body_bytes} bytes."),
                    "415": _problem("The body is not application/json."),
                    "422": _problem(
                        "Invalid items (see errors), or a key reused with new content."
                    ),
                },
                body=_ref("BatchRequest"),
                tags=("batches",),
            ),
        },
        "/v1/batches/{batch_id}": {
            "parameters": [{**JOB_ID, "name": "batch_id", "description": "The batch's id."}],
            "get": _operation(
                "A batch: progress, counts and its items' jobs",
                {"200": _json("The batch.", _ref("Batch")), "404": _problem("No such batch.")},
                tags=("batches",),
            ),
        },
        "/v1/templates": {
            "post": _operation(
                "Store a new version of a named template",
                {
                    "201": _json("Stored.", _ref("Template"), "Location"),
                    "400": _problem("The body is not JSON or not UTF-8."),
                    "413": _problem(f"The body is over {settings.max_body_bytes} bytes."),
                    "415": _problem("The body is not application/json."),
                    "422": _problem("Invalid fields (see errors)."),
                },
                body=_ref("TemplateRequest"),
                tags=("templates",),
            ),
            "get": _operation(
                "The latest version of each template, by name",
                {"200": _json("A page.", _ref("TemplateList")), "422": invalid_query},
                parameters=[
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 1}},
                    {"name": "cursor", "in": "query", "schema": {"type": "string"}},
                ],
                tags=("templates",),
            ),
        },
        "/v1/templates/preview": {
            "post": _operation(
                "Render template html to PDF now, without storing it",
                _preview_responses(settings),
                body=_ref("InlinePreviewRequest"),
                tags=("templates",),
            ),
        },
        "/v1/templates/{template_id}": {
            "parameters": [TEMPLATE_ID],
            "get": _operation(
                "A stored template (latest, or name@version) and its versions",
                {
                    "200": _json("The template.", _ref("Template")),
                    "404": _problem("No such template."),
                },
                tags=("templates",),
            ),
        },
        "/v1/templates/{template_id}/preview": {
            "parameters": [TEMPLATE_ID],
            "post": _operation(
                "Render a stored template with its sample data (or data given) to PDF now",
                {**_preview_responses(settings), "404": _problem("No such template.")},
                body=_ref("PreviewRequest"),
                body_required=False,
                tags=("templates",),
            ),
        },
        "/v1/openapi.json": {
            "get": {
                "summary": "This document",
                "tags": ["meta"],
                "security": [],
                "responses": {"200": _json("OpenAPI 3.1.", {"type": "object"})},
            }
        },
        "/healthz": {
            "get": {
                "summary": "Liveness",
                "tags": ["meta"],
                "security": [],
                "responses": {"200": _json("The process answers.", {"type": "object"})},
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "tags": ["meta"],
                "security": [],
                "responses": {
                    "200": {
                        "description": "The Prometheus text format.",
                        "content": {"text/plain": {"schema": {"type": "string"}}},
                    }
                },
            }
        },
        "/readyz": {
            "get": {
                "summary": "Readiness: database, LISTEN connection, storage, browser",
                "tags": ["meta"],
                "security": [],
                "responses": {
                    "200": _json("Ready.", _ref("Readiness")),
                    "503": _json("Not ready; checks say why.", _ref("Readiness")),
                },
            }
        },
    }
    _name_operations(paths)
    schemas = _schemas(settings)
    schemas["Readiness"] = {
        "type": "object",
        "required": ["ready", "checks"],
        "properties": {
            "ready": {"type": "boolean"},
            "checks": {"type": "object", "additionalProperties": {"type": "string"}},
        },
    }
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Pressroom",
            "version": "1",
            "description": "HTML templates + JSON data in, PDFs out, every state change pushed "
            "(SSE, Socket.IO at /socket.io/, webhooks). Errors are RFC 9457 problem+json.",
        },
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key from `pressroom keys create --tenant NAME`. "
                    "With no key created the server runs open on 127.0.0.1 (dev mode).",
                },
                "subscriptionToken": {"type": "apiKey", "in": "query", "name": "token"},
            },
            "headers": {
                "Location": {"schema": {"type": "string"}, "description": "The job's URL."},
                "Retry-After": {"schema": {"type": "string"}, "description": "Seconds."},
                "ETag": {"schema": {"type": "string"}},
                "WWW-Authenticate": {"schema": {"type": "string"}},
            },
            "responses": {
                "BadRequest": _problem(
                    "A malformed request: a NUL character in the URL, or HTTP the server cannot "
                    "parse (a line or header over 8190 bytes, a bad method or request line, "
                    "Content-Length with Transfer-Encoding, a broken chunked body)."
                ),
                "Unauthorized": _problem("No, unknown or revoked credentials.", "WWW-Authenticate"),
                "TooManyRequests": _problem(
                    "The key's rate limit or the tenant's jobs-in-flight cap.", "Retry-After"
                ),
                "Unavailable": _problem("The database is unreachable.", "Retry-After"),
            },
        },
    }


def _name_operations(paths: dict[str, JsonSchema]) -> None:
    """operationIds, and links from a created job or batch to what can be done with it."""
    for path, item in paths.items():
        for method, operation in item.items():
            if method == "parameters":
                continue
            words = [w.strip("{}") for w in path.removeprefix("/v1").split("/") if w]
            name = method + "".join(
                word.replace("_", " ").title().replace(" ", "") for word in words
            )
            operation["operationId"] = name.replace(".", "")
    job_links = {
        operation_id: {"operationId": operation_id, "parameters": {"job_id": "$response.body#/id"}}
        for operation_id in (
            "getJobsJobId",
            "postJobsJobIdCancel",
            "postJobsJobIdRetry",
            "getJobsJobIdPdf",
            "getJobsJobIdEvents",
        )
    }
    for status in ("200", "202"):
        paths["/v1/jobs"]["post"]["responses"][status]["links"] = job_links
    paths["/v1/batches"]["post"]["responses"]["202"]["links"] = {
        "getBatchesBatchId": {
            "operationId": "getBatchesBatchId",
            "parameters": {"batch_id": "$response.body#/id"},
        }
    }


async def handler(request: web.Request) -> web.Response:
    """GET /v1/openapi.json: the routes this app serves (a worker-only or trimmed app has fewer)."""
    document = build(request.app[SETTINGS])
    served = {route.resource.canonical for route in request.app.router.routes() if route.resource}
    document["paths"] = {path: item for path, item in document["paths"].items() if path in served}
    return web.json_response(document)
