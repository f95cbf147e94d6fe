"""The body of GET /v1/stats: a tenant's last hour, minute by minute, and its queue now."""

from __future__ import annotations

import datetime as dt

from pydantic import BaseModel, Field

#: The minutes GET /v1/stats covers: the current one and those before it.
MINUTES = 60


class Latency(BaseModel):
    """How long the jobs done took from submission to done (seconds), None without any."""

    p50_s: float | None = Field(description="The median submit→done time.")
    p95_s: float | None = Field(description="The 95th percentile submit→done time.")


class MinuteStats(Latency):
    at: dt.datetime = Field(description="The minute's start.")
    done: int = Field(description="Jobs done in that minute.")
    failed: int = Field(description="Jobs failed in that minute.")


class HourStats(Latency):
    done: int = Field(description="Jobs done in the whole span.")
    failed: int = Field(description="Jobs failed in the whole span.")


class QueueStats(BaseModel):
    depth: int = Field(description="Queued jobs, due or not.")
    due: int = Field(
        description="Queued jobs due now (not waiting for their run_at or a retry's backoff)."
    )
    oldest_due_at: dt.datetime | None = Field(
        description="When the oldest due job was submitted; None when none is due."
    )
    oldest_age_s: float | None = Field(
        description="How long ago that was, in seconds, by the database's clock."
    )


class Stats(BaseModel):
    """The tenant's jobs over the last hour and its queue, as the database has them now."""

    at: dt.datetime = Field(description="When these figures were read (the database's clock).")
    minutes: list[MinuteStats] = Field(
        description=f"{MINUTES} minutes, oldest first, the last one still running; minutes "
        "without jobs are given, with zeros."
    )
    hour: HourStats = Field(description="The same over the whole span.")
    queue: QueueStats
