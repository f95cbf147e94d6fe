"""A job's story (GET /v1/jobs/{id}/story): the job, what it was asked, each attempt, its event
timeline with the time spent in each phase, and its webhook deliveries with every try."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, Literal

from pydantic import BaseModel, Field

from server.schemas.jobs import Job

#: What a job does between two of its events: waits in the queue, or runs in a worker.
Phase = Literal["queued", "running"]


class AttemptPhases(BaseModel):
    """The seconds an attempt spent in each step of its worker, as the worker measured them;
    null for a step it did not reach (or does not take: a pdfs job is not rendered)."""

    template: float | None = Field(
        description="Its source made ready: the Jinja2 template or the Markdown filled, the "
        "options read, the assets loaded."
    )
    render: float | None = Field(description="Printed by Chromium, or converted by LibreOffice.")
    finishing: float | None = Field(
        description="Its PDF finished (pages, forms, PDF/A, stamps, encryption, signature)."
    )
    store: float | None = Field(description="Its files written to storage.")


class JobAttempt(BaseModel):
    attempt: int = Field(description="Its number (1 for the first).")
    worker_id: str = Field(description="The worker that ran it (host:pid:random).")
    started_at: dt.datetime = Field(description="When its worker claimed it.")
    ended_at: dt.datetime | None = Field(description="When it ended; null while it runs.")
    outcome: Literal["running", "done", "retrying", "failed", "cancelled", "released"] = Field(
        description="How it ended: done; retrying (a transient error, queued again); failed; "
        "cancelled; released (handed back at a shutdown, not counted); running while it runs."
    )
    error: str | None = Field(description="Its error (retrying, failed).")
    warnings: list[str] = Field(description="What its render noticed but did not fail on.")
    seconds: float = Field(description="How long it ran (until now while it runs).")
    phases: AttemptPhases | None = Field(
        description="The time it spent in each step (done, retrying, failed: those it reached); "
        "null while it runs and for an attempt ended otherwise (cancelled, released, its worker "
        "lost)."
    )


class StoryEvent(BaseModel):
    event_id: int = Field(description="The event's id, as its streams carry it.")
    type: str = Field(description="job.queued, job.running, job.retrying, job.done, …")
    at: dt.datetime = Field(description="When it happened.")
    status: str = Field(description="The job's status it left.")
    attempt: int = Field(description="Attempts started by then.")
    progress: int | None = Field(description="Percent done by then.")
    error: str | None = Field(description="The job's last error by then.")
    phase: Phase | None = Field(
        description="What the job did from this event until the next one; null after its "
        "final event."
    )
    seconds: float | None = Field(
        description="How long that lasted (until now for the last event of a job in flight)."
    )


class StoryPhase(BaseModel):
    phase: Phase = Field(description="queued (every wait, retries' backoff included) or running.")
    seconds: float = Field(description="The time spent in it, summed over the timeline.")


class WebhookTry(BaseModel):
    attempt: int = Field(description="Its number.")
    status_code: int | None = Field(description="The answer's HTTP status; null: no answer.")
    duration_ms: int = Field(description="How long it took.")
    error: str | None = Field(description="Why it did not count as delivered.")
    at: dt.datetime = Field(description="When it was made.")


class StoryDelivery(BaseModel):
    id: uuid.UUID = Field(description="The delivery (its webhook-id).")
    type: str = Field(description="The event delivered.")
    url: str = Field(description="Where it is POSTed.")
    status: Literal["pending", "delivered", "failed", "disabled"] = Field(
        description="pending (due, or in flight), delivered, failed (gave up), or disabled "
        "(the URL answered 410 Gone)."
    )
    attempts: int = Field(description="Attempts made so far.")
    last_status_code: int | None = Field(description="The last answer's HTTP status.")
    last_error: str | None = Field(description="The last attempt's error.")
    next_attempt_at: dt.datetime | None = Field(description="When it is tried next (pending).")
    created_at: dt.datetime = Field(description="When the event happened.")
    delivered_at: dt.datetime | None = Field(description="When it was delivered.")
    tries: list[WebhookTry] = Field(description="Every attempt, oldest first.")
    redeliver: str = Field(description="POST here to deliver it again.")


class StoryBatch(BaseModel):
    id: uuid.UUID = Field(description="The batch.")
    key: str = Field(description="The job's item key in it.")
    link: str = Field(description="GET /v1/batches/{batch_id}.")


class StoryFile(BaseModel):
    name: str = Field(description="The file as the job names it: its path, or its asset id.")
    asset_id: str | None = Field(description="The asset it is (null: no longer known).")


class Story(BaseModel):
    """Everything known of one job, for the dashboard's job page."""

    job: Job = Field(description="The job as GET /v1/jobs/{job_id} shows it (signed URLs too).")
    source: Literal["template", "markdown", "page_url", "office", "docx", "pdfs"] = Field(
        description="Its kind of source (template_id jobs are template or docx jobs)."
    )
    template: str | None = Field(
        description="The stored template it was made from, name@version (template_id jobs); "
        "null for others."
    )
    files: list[StoryFile] = Field(
        description="The files it converts or merges (office, docx: one; pdfs: each, in order); "
        "none for the others."
    )
    data: Any = Field(description="Its data as stored (as sent: the job's own order).")
    attempts: list[JobAttempt] = Field(description="Every attempt, oldest first.")
    timeline: list[StoryEvent] = Field(
        description="Its events in log order, those the event log still keeps (pruned by age)."
    )
    phases: list[StoryPhase] = Field(description="The time spent queued and running.")
    deliveries: list[StoryDelivery] = Field(description="Its webhook deliveries, oldest first.")
    batches: list[StoryBatch] = Field(description="The batches it is an item of.")
    live: bool = Field(description="Whether it may change still (not final): follow events.")
