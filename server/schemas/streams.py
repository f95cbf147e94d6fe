"""The bodies of the streams: subscription tokens, Socket.IO's subscribe and refresh, the
event long-poll, and the event every transport carries."""

from __future__ import annotations

import datetime as dt
import uuid
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

from server import events
from server.access.signing import MAX_TOKEN_CHANNELS, MAX_TOKEN_CHARS
from server.schemas.common import QUERY, REQUEST, Channel, EventId, Integral, WaitSeconds
from server.schemas.jobs import Job, StreamReset


def _uuid(message: str) -> Any:
    def check(value: Any) -> uuid.UUID:
        try:
            return value if isinstance(value, uuid.UUID) else uuid.UUID(value)
        except (TypeError, ValueError, AttributeError):
            raise ValueError(message) from None

    return BeforeValidator(check)


def _event_types(value: Any, info: ValidationInfo) -> list[str]:
    if not isinstance(value, list) or not value or not all(isinstance(t, str) for t in value):
        raise ValueError("must be a list of event types")
    if errors := events.type_errors(info.field_name or "types", value):
        raise ValueError(errors[0][1])
    return value


#: The JSON Schema of an event type.
EVENT_TYPE: dict[str, Any] = {"type": "string", "enum": sorted(events.TYPES)}
EventType = Annotated[str, WithJsonSchema(EVENT_TYPE)]
EventTypes = Annotated[
    list[str],
    BeforeValidator(_event_types),
    WithJsonSchema({"type": "array", "minItems": 1, "items": EVENT_TYPE}),
]


#: What a token is for: no two of them at once (a dashboard token opens the whole tenant).
_TOKEN_SCOPES = ("job_id", "channel", "channels", "scope")


def _not_both_scopes(schema: dict[str, Any]) -> None:
    """No two of job_id, channel, channels and scope, not null (see TokenRequest._one_scope)."""
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
    scope: Literal["dashboard"] | None = Field(
        None,
        description='"dashboard": a dashboard token, which calls the API as the key would (as '
        "`Authorization: Bearer`) and opens every stream; asked with an API key, or with a "
        "dashboard token still valid to renew it. Alone, or with ttl_s.",
    )
    ttl_s: Annotated[int, Field(ge=1), Integral] | None = Field(
        None,
        description="Seconds the token lasts, up to PRESSROOM_TOKEN_TTL_S (the default; "
        "PRESSROOM_DASHBOARD_TOKEN_TTL_S for a dashboard token): a longer one lasts that long; "
        "expires_at says when it ends.",
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


class EventPollQuery(BaseModel):
    """GET /v1/events?wait=: the long-poll of the event stream, for clients without SSE."""

    model_config = QUERY

    wait: WaitSeconds | None = Field(
        None,
        description="Answer one JSON EventPoll instead of a stream: the events after "
        "last_event_id (or after now), as soon as there are some, else none after this "
        "many seconds.",
    )


class Event(BaseModel):
    """What SSE, Socket.IO and webhooks carry for one event."""

    event_id: int = Field(description="Its place in the log; resume after it.")
    type: EventType = Field(description="What happened: job.queued, job.done, batch.progress, …")
    at: dt.datetime = Field(description="When it happened.")
    job: Job | None = Field(None, description="The job then (job events).")
    batch: dict[str, Any] | None = Field(None, description="The batch then (batch events).")


class JobStreamReset(StreamReset):
    """A job stream's `reset`: with the job's state now, to reload from."""

    job: Job = Field(description="The job now.")


class StreamClosed(BaseModel):
    """A `closed`, the last message of a stream the server ends."""

    type: Literal["closed"] = Field(description="Always closed.")
    reason: str = Field(description="Why, for a person.")
    code: str = Field(
        description="What to do: token_expired, reconnect with a fresh token; revoked, with new "
        "credentials; behind, shutdown, unavailable or internal, reconnect from the last event id."
    )


class EventPoll(BaseModel):
    """The answer of GET /v1/events?wait=: events as the stream sends them, and the cursor."""

    events: list[Event | StreamReset] = Field(
        description="The events (each as an SSE event's data), or a reset first."
    )
    last_event_id: int = Field(
        description="Pass as last_event_id to the next poll: nothing is missed between polls."
    )


class Token(BaseModel):
    token: str = Field(
        description="A JWT for ?token= (SSE) or the Socket.IO auth; a dashboard token also "
        "for `Authorization: Bearer`."
    )
    expires_at: dt.datetime = Field(description="It stops working then.")
    renewable_until: dt.datetime | None = Field(
        None,
        description="A dashboard token's: renewals go on until then "
        "(PRESSROOM_DASHBOARD_SESSION_S after its key was given); then the key is needed again.",
    )


#: Models in components.schemas though no path names them (Socket.IO, streams).
EXTRA_SCHEMAS: tuple[type[BaseModel], ...] = (
    Event,
    JobStreamReset,
    StreamClosed,
    SubscribeRequest,
    RefreshRequest,
    EventPoll,
)
