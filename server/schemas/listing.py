"""The job list's bodies: its filters (GET /v1/jobs, /v1/jobs/counts, the bulk actions), its
page's cursor, and what the counts and the bulk actions answer."""

from __future__ import annotations

import datetime as dt
import re
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, PlainValidator, WithJsonSchema

from server.queue import listing
from server.queue.jobs import JobState
from server.schemas.common import (
    QUERY,
    Channel,
    Limit,
    TemplateId,
    Timestamp,
    parse_template_id,
    parse_time,
)

#: next_cursor of a page of jobs: its last job's created_at (ISO 8601) and id, joined by "~".
CURSOR_PATTERN = (
    r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{6})?[+-][0-9]{2}:[0-9]{2}"
    r"~[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
)
_CURSOR = re.compile(CURSOR_PATTERN)


def _cursor(value: Any) -> tuple[dt.datetime, uuid.UUID]:
    if isinstance(value, str) and _CURSOR.fullmatch(value):
        created, _, job_id = value.partition("~")
        if (parsed := parse_time(created)) is not None:
            return parsed, uuid.UUID(job_id)
    raise ValueError("is not a cursor this server gave out")


#: A page's cursor as a query takes it (the job list's and the batch list's): the created_at
#: and id of the previous page's last row.
Cursor = Annotated[
    tuple[dt.datetime, uuid.UUID],
    PlainValidator(_cursor),
    WithJsonSchema({"type": "string", "pattern": f"^{CURSOR_PATTERN}$"}),
]


def encode_cursor(created_at: dt.datetime, job_id: uuid.UUID) -> str:
    return f"{created_at.isoformat()}~{job_id}"


def _state(value: Any) -> Any:
    try:
        return JobState(value)
    except ValueError:
        raise ValueError(f"must be one of {', '.join(s.value for s in JobState)}") from None


#: A job state as a filter takes it.
State = Annotated[JobState, BeforeValidator(_state)]
#: A search as a filter takes it (queue/listing.py JobFilter): an id, an idempotency key or a
#: metadata value.
Search = Annotated[str, Field(min_length=1, max_length=200)]


class JobFilterFields(BaseModel):
    """Which jobs: every filter of the list but the state (GET /v1/jobs/counts)."""

    model_config = QUERY

    channel: Channel | None = Field(None, description="Only the jobs of this channel.")
    created_from: Timestamp | None = Field(None, description="Created at or after this time.")
    created_to: Timestamp | None = Field(
        None, description="Created before this time (at or before created_from: no job)."
    )
    q: Search | None = Field(
        None,
        description="Only the jobs found by this text: a job id, whole or its first "
        f"{listing.MIN_ID_PREFIX} or more hexadecimal digits; an idempotency key; or the value of "
        "any key of the job's metadata (exactly, as a string).",
    )
    template: TemplateId | None = Field(
        None,
        description="Only the jobs made from this stored template (template_id): `name` for "
        "every version of it, `name@version` for one.",
    )

    def matching(self, status: JobState | None = None) -> listing.JobFilter:
        return listing.JobFilter(
            status=status,
            channel=self.channel,
            created_from=self.created_from,
            created_to=self.created_to,
            q=self.q,
            template=parse_template_id(self.template),
        )


class JobCountsQuery(JobFilterFields):
    """GET /v1/jobs/counts: the list's filters but the state."""


class JobListQuery(JobFilterFields):
    """GET /v1/jobs: filters and the page."""

    status: State | None = Field(None, description="Only jobs in this state.")
    limit: Limit = Field(50, description="Jobs per page.")
    cursor: Cursor | None = Field(None, description="next_cursor of the previous page.")


class JobBulkRequest(JobFilterFields):
    """POST /v1/jobs/retry and /v1/jobs/cancel: the jobs, by the list's filters."""

    model_config = ConfigDict(extra="forbid", strict=True)

    status: State | None = Field(
        None,
        description="Only jobs in this state; the jobs the action cannot apply to (retry: not "
        "failed; cancel: neither queued nor running) are counted in skipped.",
    )
    dry_run: bool = Field(
        False, description="Count only: what the action would apply to, changing nothing."
    )


class JobCounts(BaseModel):
    """How many jobs match, by state."""

    queued: int = Field(description="Waiting for a worker, or for run_after.")
    running: int = Field(description="Being rendered.")
    done: int = Field(description="Finished; the file is stored.")
    failed: int = Field(description="Failed for good (retry them with POST /v1/jobs/retry).")
    cancelled: int = Field(description="Cancelled.")
    total: int = Field(description="All of them.")


class JobBulkResult(BaseModel):
    """What a bulk retry or cancel did (or, with dry_run, would do)."""

    action: Literal["retry", "cancel"] = Field(description="The action.")
    dry_run: bool = Field(description="Whether nothing was changed.")
    matched: int = Field(description="Jobs the filter matched when the action began.")
    applied: int = Field(
        description="Jobs retried (each with job.queued) or cancelled (each with "
        "job.cancelled); with dry_run, those it would be."
    )
    skipped: int = Field(
        description="Jobs matched and left as they are: in a state the action does not apply "
        "to, changed meanwhile, or (retry) failed with secrets that were erased."
    )
