"""The parts of the OpenAPI description for what Pressroom pushes rather than answers: the
messages of its event streams, its webhooks (OpenAPI 3.1 `webhooks`), and Socket.IO, which
OpenAPI cannot describe, in prose. server/web/openapi.py puts them in the document."""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Annotated, Any

from pydantic import BaseModel, Field, WithJsonSchema, create_model

from server import events
from server.access.tenants import ROTATION_OVERLAP_S
from server.delivery import webhooks
from server.events.streams import FINAL_TYPES
from server.schemas.batches import Batch
from server.schemas.common import EVENT_ID_PATTERN
from server.schemas.jobs import Job
from server.schemas.streams import Event, StreamClosed
from server.schemas.templates import PublishedTemplate
from server.web import sockets, sse

JsonSchema = dict[str, Any]
#: Where a component schema is, by its model's name.
REF = "#/components/schemas/{model}"
JOB_TYPES = sorted(t for t in events.TYPES if t.startswith("job."))
BATCH_TYPES = sorted(t for t in events.TYPES if t.startswith("batch."))
#: The events a webhook is POSTed for (the SQL function event_is_delivered decides).
JOB_WEBHOOKS = sorted(FINAL_TYPES)
BATCH_WEBHOOK = "batch.done"
#: The events POSTed to a tenant's own endpoints (`pressroom tenants webhooks`).
TENANT_WEBHOOKS = sorted(events.TENANT_TYPES)


def ref(name: str) -> JsonSchema:
    return {"$ref": REF.format(model=name)}


#: Fields of a batch that only GET /v1/batches/{batch_id} shows.
BATCH_ONLY_FIELDS = ("items", "links")
_EVENT_BATCH_FIELDS: dict[str, Any] = {
    name: (field.annotation, field)
    for name, field in Batch.model_fields.items()
    if name not in BATCH_ONLY_FIELDS
}
EventBatch = create_model(
    "EventBatch",
    __doc__="A batch as its events (batch.progress, batch.done) and its webhook carry it: GET "
    "/v1/batches/{batch_id} without " + " and ".join(BATCH_ONLY_FIELDS) + ".",
    **_EVENT_BATCH_FIELDS,
)


@dataclasses.dataclass(frozen=True, slots=True)
class Stream:
    """A text/event-stream body: its events, and the `reset` model the stream sends."""

    reset: type[BaseModel]
    #: Whether batch events come on it too (the tenant's and a channel's stream do).
    batches: bool = False


SSE = (
    "Server-Sent Events. Each event is `id:` its event id (resume after it with Last-Event-ID), "
    "`event:` its type and `data:` one line of JSON, an Event: `job` on job events, `batch` "
    "on batch events. `event: reset` when the cursor is no longer kept (reload state, go on "
    "reading); `event: closed`, then the stream ends, when the server drops a slow consumer, "
    "shuts down, loses its database, or the token expires or the key behind it is revoked. An "
    f"idle stream gets a `: ping` comment every {sse.PING_S:g} s."
)

LIVE_UPDATES = f"""\
Every event is pushed as it is committed, to every process's clients. The same JSON, an
`Event`, travels on every transport:

- **Server-Sent Events**: `GET /v1/jobs/{{job_id}}/events` (one job: its history, then live; it
  ends after the job's final event) and `GET /v1/events` (the tenant's, or a channel's, job and
  batch events). The messages are described with each operation's `text/event-stream`
  response. EventSource cannot send headers: use a subscription token (`?token=`).
- **Socket.IO** at `/socket.io/` (Engine.IO 4, namespace `/`), which OpenAPI cannot describe:
  connect with `auth: {{"token": …}}` or `{{"api_key": …}}` (or an `Authorization: Bearer`
  header); a refused connection gets `connect_error`. The client emits, each answered by an
  acknowledgement `{{"ok": true}}` or `{{"ok": false, "error": {{…a Problem…}}}}`:
  - `subscribe` (a `SubscribeRequest`): `{{"job_id": …}}`, `{{"channel": …}}` or
    `{{"all": true}}`, with optional `since` (an event id) and `types`; at most
    {sockets.MAX_SUBSCRIPTIONS} subscriptions a connection;
  - `unsubscribe`: the same object;
  - `refresh` (a `RefreshRequest`): a new token for the same tenant and scope, answered with
    its `expires_at`; the subscriptions and their cursors go on.

  The server emits `job` (an `Event` with `job`), `batch` (an `Event` with `batch`), `reset`
  (a `StreamReset`) and `closed` (a `StreamClosed`, then it disconnects).
- **Long-polls**: `GET /v1/jobs/{{job_id}}?wait=` and `GET /v1/events?wait=`.
- **Webhooks**: see the webhooks of this document."""


def _duration(seconds: float) -> str:
    for unit, size in (("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _data(model: type[BaseModel] | str, *required: str, **properties: JsonSchema) -> JsonSchema:
    """An SSE `data:` field: one JSON object of `model` (a component's name for a str)."""
    shown = ref(model if isinstance(model, str) else model.__name__)
    if required or properties:
        shown = {"allOf": [shown], "required": list(required), "properties": properties}
    return {"type": "string", "contentMediaType": "application/json", "contentSchema": shown}


def stream_schema(stream: Stream) -> JsonSchema:
    """One message of an event stream, as its fields (OpenAPI 3.2's itemSchema, which 3.1
    tools read from `schema`): a job event, a batch event, a reset, or the closing message."""
    event_id = {"type": "string", "pattern": f"^{EVENT_ID_PATTERN}$"}
    kinds: list[JsonSchema] = [
        {
            "title": "A job event",
            "required": ["id"],
            "properties": {
                "id": event_id,
                "event": {"type": "string", "enum": JOB_TYPES},
                "data": _data(Event, "job"),
            },
        },
    ]
    if stream.batches:
        kinds.append(
            {
                "title": "A batch event",
                "required": ["id"],
                "properties": {
                    "id": event_id,
                    "event": {"type": "string", "enum": BATCH_TYPES},
                    "data": _data(Event, "batch", batch=ref(EventBatch.__name__)),
                },
            }
        )
    kinds += [
        {
            "title": "reset",
            "properties": {
                "event": {"type": "string", "const": "reset"},
                "data": _data(stream.reset),
            },
        },
        {
            "title": "closed",
            "properties": {
                "event": {"type": "string", "const": "closed"},
                "data": _data(StreamClosed),
            },
        },
    ]
    return {"type": "object", "required": ["event", "data"], "oneOf": kinds}


class JobWebhookData(BaseModel):
    job: Job = Field(
        description="The job as GET /v1/jobs/{job_id} shows it, its url signed afresh for "
        "each attempt and absolute (PRESSROOM_PUBLIC_URL)."
    )


class JobWebhook(BaseModel):
    """The body of a job's webhook, POSTed to its webhook_url when the job ends."""

    type: Annotated[str, WithJsonSchema({"type": "string", "enum": JOB_WEBHOOKS})] = Field(
        description="How the job ended."
    )
    timestamp: dt.datetime = Field(description="When it ended (UTC).")
    data: JobWebhookData


class BatchWebhookData(BaseModel):
    batch: EventBatch = Field(  # type: ignore[valid-type]
        description="The batch, combined.url signed afresh for each attempt and absolute."
    )


class BatchWebhook(BaseModel):
    """The body of a batch's webhook, POSTed to its webhook_url when a batch with combine is
    done (its combined PDF is made, or failed)."""

    type: Annotated[str, WithJsonSchema({"type": "string", "const": BATCH_WEBHOOK})] = Field(
        description="Always batch.done."
    )
    timestamp: dt.datetime = Field(description="When the batch was done (UTC).")
    data: BatchWebhookData


class TemplateWebhookData(BaseModel):
    template: PublishedTemplate = Field(description="The version published.")


class TemplateWebhook(BaseModel):
    """The body of a tenant's webhook, POSTed to each of its own endpoints that takes the
    event (`pressroom tenants webhooks`) when one of its template versions is published."""

    type: Annotated[str, WithJsonSchema({"type": "string", "enum": TENANT_WEBHOOKS})] = Field(
        description="What happened."
    )
    timestamp: dt.datetime = Field(description="When it was published (UTC).")
    data: TemplateWebhookData


#: Models the document's components hold for this module (server/web/openapi.py).
MODELS: tuple[type[BaseModel], ...] = (JobWebhook, BatchWebhook, TemplateWebhook, EventBatch)


SIGNATURE = "v1,[A-Za-z0-9+/]+={0,2}"
WEBHOOK_HEADERS: list[JsonSchema] = [
    {
        "name": "webhook-id",
        "in": "header",
        "required": True,
        "schema": {"type": "string", "format": "uuid"},
        "description": "The delivery's id, the same on every attempt: ignore one seen before.",
    },
    {
        "name": "webhook-timestamp",
        "in": "header",
        "required": True,
        "schema": {"type": "string", "pattern": "^[0-9]+$"},
        "description": "When this attempt was signed, in Unix seconds: refuse one far from "
        "your clock (a replay).",
    },
    {
        "name": "webhook-signature",
        "in": "header",
        "required": True,
        "schema": {"type": "string", "pattern": f"^{SIGNATURE}( {SIGNATURE})*$"},
        "description": "`v1,` and the base64 HMAC-SHA256 of `{webhook-id}.{webhook-timestamp}."
        "{body}`, keyed with the base64 part of the tenant's `whsec_…` secret (`pressroom "
        "tenants webhook-secret TENANT`). After a rotation, two signatures, space-separated "
        f"(the new secret's first), for {_duration(ROTATION_OVERLAP_S)}. The standardwebhooks "
        "package verifies it.",
    },
]
SCHEDULE = ", ".join(_duration(s) for s in webhooks.SCHEDULE_S)
WEBHOOK_RESPONSES: JsonSchema = {
    "2XX": {"description": f"Delivered. Answer within {webhooks.TIMEOUT_S:g} s, and work later."},
    "410": {
        "description": "Gone: no more deliveries to this URL for this job (or batch); to a "
        "tenant's own endpoint, none at all until it is added again."
    },
    "429": {"description": "Retried as a 5XX is, not before its Retry-After."},
    "5XX": {
        "description": f"Retried, as a timeout or a network error is, after {SCHEDULE} "
        f"({len(webhooks.SCHEDULE_S) + 1} attempts), then failed (see webhooks of the job)."
    },
    "default": {"description": "Any other status (a redirect, a 4xx) fails the delivery."},
}


def _webhook(kind: str, summary: str, body: JsonSchema) -> JsonSchema:
    """One webhook: `body` is the component of its model, narrowed here to its one type."""
    narrowed = {**body["properties"]["type"], "const": kind}
    narrowed.pop("enum", None)
    return {
        "post": {
            "summary": summary,
            "description": f"Pressroom POSTs `{kind}` as JSON (Standard Webhooks: "
            f"User-Agent {webhooks.USER_AGENT}), from an outbox written with the state change, "
            "so no event is lost; signed with the tenant's secret (dev mode: "
            "PRESSROOM_WEBHOOK_SECRET).",
            "operationId": "webhook" + kind.title().replace(".", ""),
            "parameters": WEBHOOK_HEADERS,
            "requestBody": {
                "required": True,
                "content": {
                    "application/json": {
                        "schema": {**body, "properties": {**body["properties"], "type": narrowed}}
                    }
                },
            },
            "responses": WEBHOOK_RESPONSES,
            "security": [],
        }
    }


#: What each webhook says, in the order the reference shows them.
WEBHOOKS: dict[str, tuple[str, type[BaseModel]]] = {
    "job.done": ("The job is done: its PDF (or image) is stored", JobWebhook),
    "job.failed": ("The job failed for good: no attempt left, or a permanent error", JobWebhook),
    "job.cancelled": ("The job was cancelled", JobWebhook),
    BATCH_WEBHOOK: (
        "A batch with combine is done (one without posts its items' only)",
        BatchWebhook,
    ),
    "template.published": (
        "A template version was published (to the tenant's own endpoints)",
        TemplateWebhook,
    ),
}


def webhooks_section(schemas: dict[str, JsonSchema]) -> JsonSchema:
    """The document's `webhooks`, one for each event a webhook is POSTed for; `schemas` are the
    document's components (their models' schemas, by name)."""
    return {
        kind: _webhook(kind, summary, schemas[model.__name__])
        for kind, (summary, model) in WEBHOOKS.items()
    }
