"""Traces (server/tracing.py) through the real app: a traceparent on POST /v1/jobs continues
through the queue into the attempt's spans and the webhook's own traceparent; the job shows
its trace id; log lines carry the ids; with tracing off, nothing of it."""

from __future__ import annotations

import asyncio
import io
import itertools
import json
import logging
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from server import tracing
from server.cli.admin import JsonFormatter
from server.errors import PermanentError
from server.keys import POOL
from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer
from tests.sse import collect

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{PARENT}-01"
HEX32 = re.compile(r"^[0-9a-f]{32}$")
WAIT_S = 20.0
PHASES = ["claim", "template", "render", "finishing", "store", "done"]


class Spans(SpanProcessor):
    """Every span the app ends, kept by the SDK's in-memory exporter; `until` waits for the
    ones a test expects, woken by each span that ends."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self._ended = asyncio.Event()

    def on_end(self, span: ReadableSpan) -> None:
        self._ended.set()

    @property
    def all(self) -> Sequence[ReadableSpan]:
        return self.exporter.get_finished_spans()

    def named(self, name: str) -> list[ReadableSpan]:
        return [span for span in self.all if span.name == name]

    async def until(self, *names: str, count: int = 1) -> None:
        """Until `count` spans of each name have ended."""
        async with asyncio.timeout(WAIT_S):
            while not all(len(self.named(name)) >= count for name in names):
                self._ended.clear()
                await self._ended.wait()


@pytest.fixture
def spans() -> Iterator[Spans]:
    """Tracing on for apps started in this test, into the SDK's InMemorySpanExporter."""
    seen = Spans()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(seen.exporter))
    provider.add_span_processor(seen)
    tracing.use(provider)
    yield seen
    tracing.use(None)
    provider.shutdown()


class Receiver:
    """A webhook endpoint on 127.0.0.1 that keeps the headers of what it receives."""

    def __init__(self) -> None:
        self.arrived: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.server: TestServer | None = None

    async def handle(self, request: web.Request) -> web.Response:
        await request.read()
        self.arrived.put_nowait(dict(request.headers))
        return web.Response(status=204)

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}/hook"

    async def next(self) -> dict[str, str]:
        return await asyncio.wait_for(self.arrived.get(), WAIT_S)


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    receiver.server = TestServer(app, host="127.0.0.1")
    await receiver.server.start_server()
    yield receiver
    await receiver.server.close()


@pytest.fixture
async def hooked(start_app: Callable[..., Any], fake_renderer: FakeRenderer) -> RunningApp:
    """One render slot on the fake renderer, webhooks allowed to 127.0.0.1."""
    app: RunningApp = await start_app(
        renderer=fake_renderer, render_slots=1, env={"PRESSROOM_ALLOW_HOSTS": "127.0.0.1"}
    )
    return app


@pytest.fixture
def log_lines(caplog: pytest.LogCaptureFixture) -> Iterator[io.StringIO]:
    """The server's log lines as PRESSROOM_LOG_FORMAT=json writes them, with tracing's filter."""
    caplog.set_level(logging.INFO, logger="server")
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(tracing.LogIds())
    server = logging.getLogger("server")
    server.addHandler(handler)
    yield out
    server.removeHandler(handler)


async def lines_of(out: io.StringIO, job_id: str, *messages: str) -> dict[str, dict[str, Any]]:
    """A job's log lines by message, once those messages are written.

    A line the worker writes after its database write may come after the client saw the
    write's event.
    """
    async with asyncio.timeout(WAIT_S):
        while True:
            lines = [json.loads(line) for line in out.getvalue().splitlines()]
            mine = {line["message"]: line for line in lines if line.get("job_id") == job_id}
            if all(message in mine for message in messages):
                return mine
            await asyncio.sleep(0.02)


async def submit(
    app: RunningApp, body: dict[str, Any], headers: dict[str, str] | None = None
) -> dict[str, Any]:
    async with app.http.post(app.url("/v1/jobs"), json=body, headers=headers or {}) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
        return job


async def job_of(app: RunningApp, job_id: str) -> dict[str, Any]:
    async with app.http.get(app.url(f"/v1/jobs/{job_id}")) as resp:
        assert resp.status == 200
        job: dict[str, Any] = await resp.json()
        return job


async def final(app: RunningApp, job_id: str) -> dict[str, Any]:
    """The job as its stream's last event shows it (the stream ends after the final one)."""
    messages = await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"), timeout_s=WAIT_S)
    job: dict[str, Any] = messages[-1].json["job"]
    return job


def parent_of(span: ReadableSpan) -> int | None:
    value: int | None = span.parent.span_id if span.parent is not None else None
    return value


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    value: int = span.context.span_id
    return value


def trace_of(span: ReadableSpan) -> str:
    assert span.context is not None
    return f"{span.context.trace_id:032x}"


def children(spans: Spans, parent: ReadableSpan) -> list[ReadableSpan]:
    return sorted(
        (span for span in spans.all if parent_of(span) == span_id(parent)),
        key=lambda span: span.start_time or 0,
    )


async def test_a_traceparent_continues_through_the_attempt_to_the_webhook(
    spans: Spans, hooked: RunningApp, receiver: Receiver, log_lines: io.StringIO
) -> None:
    body = {
        "template": "<p>Hi {{name}}</p>",
        "data": {"name": "Ana"},
        "webhook_url": receiver.url + "?token=receivers-own-secret",
        "options": {"stamp": {"text": "PAID"}},  # a finishing step or two
    }
    job = await submit(hooked, body, {"traceparent": TRACEPARENT})
    assert job["trace_id"] == TRACE
    headers = await receiver.next()
    await spans.until("job attempt", "webhook", "POST")

    [request] = spans.named("POST /v1/jobs")
    assert request.kind is SpanKind.SERVER and trace_of(request) == TRACE
    assert parent_of(request) == int(PARENT, 16), "the caller's span is the request's parent"
    assert request.attributes is not None
    assert request.attributes[tracing.JOB_ID] == job["id"]
    assert request.attributes[tracing.TENANT] == "default"
    assert request.attributes[tracing.TEMPLATE] == "template"

    [attempt] = spans.named("job attempt")
    assert trace_of(attempt) == TRACE and parent_of(attempt) == span_id(request)
    assert attempt.attributes is not None
    assert attempt.attributes[tracing.JOB_ID] == job["id"]
    assert attempt.attributes[tracing.TENANT] == "default"
    assert attempt.attributes[tracing.ATTEMPT] == 1
    assert attempt.attributes[tracing.PAGES] == 1
    assert attempt.attributes[tracing.OUTCOME] == "done"
    assert attempt.status.status_code is StatusCode.UNSET
    steps = children(spans, attempt)
    assert [step.name for step in steps] == PHASES
    assert all(trace_of(step) == TRACE for step in steps)
    # One after the other, inside the attempt.
    for before, after in itertools.pairwise(steps):
        assert before.end_time is not None and after.start_time is not None
        assert before.end_time <= after.start_time
    assert attempt.start_time == steps[0].start_time
    finishing = steps[PHASES.index("finishing")]
    assert [step.name for step in children(spans, finishing)] == ["stamp", "write"]

    # The webhook: a span under the request's, its POST a child, whose id the receiver got.
    [webhook] = spans.named("webhook")
    assert trace_of(webhook) == TRACE and parent_of(webhook) == span_id(request)
    assert webhook.attributes is not None
    assert webhook.attributes[tracing.EVENT] == "job.done"
    assert webhook.attributes[tracing.WEBHOOK_ATTEMPT] == 1
    assert webhook.attributes[tracing.JOB_ID] == job["id"]
    [post] = spans.named("POST")
    assert post.kind is SpanKind.CLIENT and parent_of(post) == span_id(webhook)
    assert headers["traceparent"] == f"00-{TRACE}-{span_id(post):016x}-01"
    shown = [str(value) for value in (post.attributes or {}).values()]
    assert any(receiver.url in value for value in shown)
    assert not any("receivers-own-secret" in value for value in shown), "the query is left out"

    # The job and its events show the trace id; the worker's log lines carry both ids.
    assert (await final(hooked, job["id"]))["trace_id"] == TRACE
    assert (await job_of(hooked, job["id"]))["trace_id"] == TRACE
    lines = await lines_of(
        log_lines, job["id"], "job queued", "job running (attempt 1/3)", "job done"
    )
    assert lines["job queued"]["trace_id"] == TRACE
    assert lines["job queued"]["span_id"] == f"{span_id(request):016x}"
    for message in ("job running (attempt 1/3)", "job done"):
        assert lines[message]["trace_id"] == TRACE
        assert lines[message]["span_id"] == f"{span_id(attempt):016x}"


async def test_a_job_without_traceparent_starts_a_trace(spans: Spans, hooked: RunningApp) -> None:
    job = await submit(hooked, {"template": "<p>{{n}}</p>", "data": {"n": 1}})
    assert HEX32.match(job["trace_id"]) and job["trace_id"] != TRACE
    await spans.until("job attempt")
    [request] = spans.named("POST /v1/jobs")
    assert request.parent is None and trace_of(request) == job["trace_id"]
    [attempt] = spans.named("job attempt")
    assert trace_of(attempt) == job["trace_id"] and parent_of(attempt) == span_id(request)
    # No webhook_url: no delivery, no webhook span.
    assert spans.named("webhook") == []


@pytest.mark.parametrize(
    "malformed",
    [
        "00-not-a-trace-01",
        f"00-{'0' * 32}-{PARENT}-01",  # an all-zero trace id is invalid (W3C)
        f"00-{TRACE}-{'0' * 16}-01",  # so is an all-zero parent id
        f"ff-{TRACE}-{PARENT}-01",  # version ff is forbidden
        f"00-{TRACE.upper()}-{PARENT}-01",  # upper case is not the header's form
    ],
)
async def test_a_malformed_traceparent_is_ignored_for_a_new_trace(
    spans: Spans, hooked: RunningApp, malformed: str
) -> None:
    job = await submit(hooked, {"template": "<p>x</p>"}, {"traceparent": malformed})
    assert HEX32.match(job["trace_id"]) and job["trace_id"] not in (TRACE, "0" * 32)
    await spans.until("job attempt")
    [request] = spans.named("POST /v1/jobs")
    assert request.parent is None and trace_of(request) == job["trace_id"]


async def test_a_refused_submission_is_a_span_with_its_status(
    spans: Spans, hooked: RunningApp
) -> None:
    headers = {"traceparent": TRACEPARENT}
    body = {"template": "<p>x</p>", "priority": "high"}
    async with hooked.http.post(hooked.url("/v1/jobs"), json=body, headers=headers) as resp:
        assert resp.status == 422
        assert resp.content_type == "application/problem+json"
    [request] = spans.named("POST /v1/jobs")
    assert parent_of(request) == int(PARENT, 16)
    assert request.attributes is not None and request.attributes["http.status_code"] == 422
    assert tracing.JOB_ID not in request.attributes, "no job was made"
    assert request.status.status_code is StatusCode.UNSET, "a client's error is not the server's"


async def test_every_item_of_a_batch_carries_the_batch_requests_trace(
    spans: Spans, hooked: RunningApp
) -> None:
    items = [{"key": f"t-{n}", "template": "<p>{{n}}</p>", "data": {"n": n}} for n in range(3)]
    async with hooked.http.post(
        hooked.url("/v1/batches"), json={"items": items}, headers={"traceparent": TRACEPARENT}
    ) as resp:
        assert resp.status == 202, await resp.text()
        batch = await resp.json()
    ids = [item["job_id"] for item in batch["items"]]
    shown = [await job_of(hooked, job_id) for job_id in ids]
    assert [job["trace_id"] for job in shown] == [TRACE] * 3
    [request] = spans.named("POST /v1/batches")
    assert parent_of(request) == int(PARENT, 16)
    assert request.attributes is not None and request.attributes[tracing.ITEMS] == 3
    await spans.until("job attempt", count=3)
    attempts = spans.named("job attempt")
    assert {parent_of(a) for a in attempts} == {span_id(request)}
    assert sorted(str((a.attributes or {})[tracing.JOB_ID]) for a in attempts) == sorted(ids)


async def test_a_failed_attempt_marks_its_span_and_step_failed(
    spans: Spans, hooked: RunningApp, fake_renderer: FakeRenderer, log_lines: io.StringIO
) -> None:
    fake_renderer.fail_with = PermanentError("the page cannot be printed")
    job = await submit(hooked, {"template": "<p>x</p>"}, {"traceparent": TRACEPARENT})
    await spans.until("job attempt")
    [attempt] = spans.named("job attempt")
    assert attempt.status.status_code is StatusCode.ERROR, attempt.to_json()
    assert "the page cannot be printed" in (attempt.status.description or "")
    assert attempt.attributes is not None and attempt.attributes[tracing.OUTCOME] == "failed"
    steps = children(spans, attempt)
    assert [step.name for step in steps] == ["claim", "template", "render"], [
        step.to_json() for step in spans.all
    ]
    render = steps[-1]
    assert render.status.status_code is StatusCode.ERROR
    assert [event.name for event in render.events] == ["exception"]
    failed = await final(hooked, job["id"])
    assert failed["status"] == "failed" and failed["trace_id"] == TRACE
    # The line that records the failure, once the attempt's span ended, still names it.
    failure = "job failed: the page cannot be printed"
    line = (await lines_of(log_lines, job["id"], failure))[failure]
    assert line["trace_id"] == TRACE and line["span_id"] == f"{span_id(attempt):016x}"


async def test_with_tracing_off_a_job_has_no_trace_and_sends_none(
    hooked: RunningApp, receiver: Receiver, log_lines: io.StringIO
) -> None:
    assert not tracing.enabled()
    body = {"template": "<p>x</p>", "webhook_url": receiver.url}
    job = await submit(hooked, body, {"traceparent": TRACEPARENT})
    assert job["trace_id"] is None
    headers = await receiver.next()
    assert "traceparent" not in {name.lower() for name in headers}
    stored = await hooked.app[POOL].fetchval(
        "SELECT traceparent FROM jobs WHERE id = $1", job["id"]
    )
    assert stored is None
    assert (await job_of(hooked, job["id"]))["trace_id"] is None
    await lines_of(log_lines, job["id"], "job done")
    lines = [json.loads(line) for line in log_lines.getvalue().splitlines()]
    assert not any("trace_id" in line or "span_id" in line for line in lines)


HTTP, GRPC = "http/protobuf", "grpc"
EXPORTER, PROTOCOL = "OTEL_TRACES_EXPORTER", "OTEL_EXPORTER_OTLP_PROTOCOL"
TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}


@pytest.mark.parametrize(
    ("environ", "exporters", "protocol", "warned"),
    [
        ({}, (), HTTP, False),
        (ENDPOINT, ("otlp",), HTTP, False),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, ("otlp",), HTTP, False),
        ({EXPORTER: "console"}, ("console",), HTTP, False),
        ({EXPORTER: "otlp, console"}, ("otlp", "console"), HTTP, False),
        ({EXPORTER: "none", **ENDPOINT}, (), "", False),
        ({"OTEL_SDK_DISABLED": "true", EXPORTER: "otlp"}, (), "", False),
        ({"OTEL_SDK_DISABLED": "false", EXPORTER: "otlp"}, ("otlp",), HTTP, False),
        ({PROTOCOL: GRPC, **ENDPOINT}, ("otlp",), GRPC, False),
        (
            {PROTOCOL: GRPC, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": HTTP, **ENDPOINT},
            ("otlp",),
            HTTP,
            False,
        ),
        ({PROTOCOL: "http/json", **ENDPOINT}, (), "http/json", True),
        ({EXPORTER: "zipkin,console"}, ("console",), HTTP, True),
        ({EXPORTER: "zipkin"}, (), HTTP, True),
    ],
)
def test_the_otel_variables_decide_whether_and_where_spans_go(
    environ: dict[str, str], exporters: tuple[str, ...], protocol: str, warned: bool
) -> None:
    got_exporters, got_protocol, problems = tracing.plan(environ)
    assert got_exporters == exporters
    if exporters or warned:
        assert got_protocol == protocol
    assert bool(problems) is warned
    for problem in problems:
        assert "OTEL_" in problem, "a warning names the variable to change"
