"""Prometheus metrics: one registry per app, durations observed where they happen, the rest
(queue depth, job states, pools, browser launches) read at scrape time."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from server import keys
from server.queue.jobs import JobState
from server.sql import query

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
DURATION_BUCKETS_S = (
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    5,
    10,
    30,
    60,
)


class Metrics:
    """Everything Pressroom counts, in a registry of its own (no process-global state)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.claim_seconds = Histogram(
            "pressroom_claim_duration_seconds",
            "Time of one claim statement.",
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.render_seconds = Histogram(
            "pressroom_render_duration_seconds",
            "Time from template to PDF bytes for one attempt.",
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.phase_seconds = Histogram(
            "pressroom_job_phase_duration_seconds",
            "Time an attempt spent in each phase of its worker: preparing (options, template, "
            "assets), rendering, finishing, storing (writing the files), recording (the final "
            "statement).",
            ["phase"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.finish_seconds = Histogram(
            "pressroom_finish_duration_seconds",
            "Time of each finishing step of a PDF (stamp, attachments, facturx, pdfa, encrypt "
            "or write, sign), in its finishing process.",
            ["step"],
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.finish_memory_bytes = Gauge(
            "pressroom_finish_memory_peak_bytes",
            "The largest peak resident memory a finishing process of this worker reached.",
            registry=self.registry,
        )
        self.jobs_started = Counter(
            "pressroom_job_starts",
            "Attempts started (claimed from the queue).",
            registry=self.registry,
        )
        self.jobs_finished = Counter(
            "pressroom_job_attempts",
            "Finished attempts by outcome (done, retrying, failed, aborted).",
            ["outcome"],
            registry=self.registry,
        )
        self.combine_seconds = Histogram(
            "pressroom_combine_duration_seconds",
            "Time of one join of a batch's PDFs (combine): fetching the items, joining, storing.",
            buckets=DURATION_BUCKETS_S,
            registry=self.registry,
        )
        self.combines_finished = Counter(
            "pressroom_combine_attempts",
            "Finished joins of batches' PDFs by outcome (done, retrying, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.webhook_attempts = Counter(
            "pressroom_webhook_attempts",
            "Webhook delivery attempts by outcome (delivered, retry, failed, disabled).",
            ["outcome"],
            registry=self.registry,
        )
        self.render_cache = Counter(
            "pressroom_render_cache",
            "New jobs and batch items that use the render cache (cache: true, or their "
            "tenant's default) by result: hit (done at once with a done job's file) or miss "
            "(rendered).",
            ["result"],
            registry=self.registry,
        )
        self.snapshot: dict[str, Any] = {}
        self.registry.register(_Snapshot(self))

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _Snapshot(Collector):
    """Values read at scrape time from the database and the app's components."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        snap = self._metrics.snapshot
        states = GaugeMetricFamily("pressroom_jobs", "Jobs by state.", labels=["state"])
        for state in JobState:
            states.add_metric([state.value], snap.get("states", {}).get(state.value, 0))
        yield states
        yield GaugeMetricFamily(
            "pressroom_queue_depth", "Queued jobs that are due now.", value=snap.get("due", 0)
        )
        yield GaugeMetricFamily(
            "pressroom_queue_oldest_due_age_seconds",
            "How long the oldest due job has waited.",
            value=snap.get("oldest_due_age_s", 0.0),
        )
        subscribers = GaugeMetricFamily(
            "pressroom_subscribers",
            "Connected event subscribers by transport.",
            labels=["transport"],
        )
        for transport, count in sorted(snap.get("subscribers", {}).items()):
            subscribers.add_metric([transport], count)
        yield subscribers
        yield CounterMetricFamily(
            "pressroom_events_published",
            "Events fanned out by this process.",
            value=snap.get("published", 0),
        )
        yield CounterMetricFamily(
            "pressroom_chromium_launches",
            "Chromium launches (the first and every relaunch).",
            value=snap.get("launches", 0),
        )
        yield CounterMetricFamily(
            "pressroom_chromium_restarts",
            "Chromium relaunches after a crash, hang or recycle.",
            value=max(snap.get("launches", 0) - 1, 0),
        )
        if "browser" in snap:
            browser = InfoMetricFamily("pressroom_browser", "The browser that renders.")
            browser.add_metric([], snap["browser"])
            yield browser
        yield GaugeMetricFamily(
            "pressroom_db_pool_size", "Connections in the pool.", value=snap.get("pool_size", 0)
        )
        yield GaugeMetricFamily(
            "pressroom_db_pool_in_use", "Pool connections in use.", value=snap.get("pool_in_use", 0)
        )
        yield GaugeMetricFamily(
            "pressroom_scrape_timestamp_seconds",
            "When these values were read.",
            value=snap.get("at", 0.0),
        )


async def refresh(app: web.Application, metrics: Metrics) -> None:
    """Read what is only known at scrape time into the metrics snapshot."""
    pool = app[keys.POOL]
    rows = await pool.fetch(query("metrics_jobs"))
    states = {row["status"]: row["n"] for row in rows}
    queue = await pool.fetchrow(query("metrics_queue"))
    hub = app[keys.HUB]
    snapshot: dict[str, Any] = {
        "states": states,
        "due": queue["due"],
        "oldest_due_age_s": float(queue["oldest_due_age_s"] or 0.0),
        "published": hub.published,
        "subscribers": hub.subscribers_by_transport(),
        "pool_size": pool.get_size(),
        "pool_in_use": pool.get_size() - pool.get_idle_size(),
        "at": time.time(),
    }
    if keys.CHROMIUM in app:
        chromium = app[keys.CHROMIUM]
        snapshot["launches"] = chromium.launches
        snapshot["browser"] = {
            key: str(value).lower() if isinstance(value, bool) else value
            for key, value in chromium.about().items()
        }
    metrics.snapshot = snapshot
