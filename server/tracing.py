"""OpenTelemetry traces, and trace ids on log lines. Every OpenTelemetry call of Pressroom is here.

Off unless the standard OTEL_* variables ask for an exporter (`plan`). Off, no OpenTelemetry
module is even imported: each function below checks one global and returns, and a job stores
no trace context. On, a job follows one trace: the submit request's span (continuing its
`traceparent` header, or starting a trace) is stored with the job as a traceparent; each attempt
in a worker is a span under it with a child per phase (claim, template, render, finishing and its
steps, store, done), and each webhook delivery is a span under it whose POST carries a
traceparent of its own, so a receiver continues the trace (docs/operations.md, "Traces and
logs").
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Final, TypeAlias

import server

if TYPE_CHECKING:
    import aiohttp
    from aiohttp import web
    from opentelemetry.context import Context
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

SERVICE_NAME = "pressroom"
EXPORTERS = ("otlp", "console")
PROTOCOLS = ("http/protobuf", "grpc")
TRUE = ("true", "1", "yes", "on")

# Span attributes, one name each wherever they are set (docs/operations.md lists them).
JOB_ID: Final = "pressroom.job.id"
TENANT: Final = "pressroom.tenant"
TEMPLATE: Final = "pressroom.template"
SOURCE: Final = "pressroom.job.source"
ATTEMPT: Final = "pressroom.job.attempt"
MAX_ATTEMPTS: Final = "pressroom.job.max_attempts"
PAGES: Final = "pressroom.job.pages"
BYTES: Final = "pressroom.job.bytes"
OUTCOME: Final = "pressroom.job.outcome"
BATCH_ID: Final = "pressroom.batch.id"
ITEMS: Final = "pressroom.batch.items"
WEBHOOK_ID: Final = "pressroom.webhook.id"
WEBHOOK_ATTEMPT: Final = "pressroom.webhook.attempt"
EVENT: Final = "pressroom.webhook.event"
STEP: Final = "pressroom.finishing.step"

Handler: TypeAlias = "Callable[[web.Request], Awaitable[web.StreamResponse]]"
Attribute = str | int | float | bool

# The process's tracer; None while tracing is off (the only thing the hot path reads).
_tracer: Tracer | None = None
_provider: TracerProvider | None = None


# --- Turning it on ---------------------------------------------------------------------------


def plan(environ: Mapping[str, str]) -> tuple[tuple[str, ...], str, list[str]]:
    """What the OTEL_* variables ask for: the exporters (none: tracing stays off), the OTLP
    protocol, and a warning for each value Pressroom cannot follow."""
    problems: list[str] = []
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() in TRUE:
        return (), "", problems
    named = environ.get("OTEL_TRACES_EXPORTER")
    if named is not None:
        asked = [name.strip().lower() for name in named.split(",") if name.strip()]
        if "none" in asked:
            return (), "", problems
        unknown = [name for name in asked if name not in EXPORTERS]
        if unknown:
            problems.append(
                f"OTEL_TRACES_EXPORTER names {', '.join(unknown)}: Pressroom exports to "
                f"{' or '.join(EXPORTERS)}; ignored"
            )
        exporters = tuple(name for name in EXPORTERS if name in asked)
    elif environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    ):
        exporters = ("otlp",)
    else:
        exporters = ()
    protocol = (
        environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or PROTOCOLS[0]
    ).strip()
    if "otlp" in exporters and protocol not in PROTOCOLS:
        problems.append(
            f"the OTLP protocol {protocol!r} (OTEL_EXPORTER_OTLP_PROTOCOL) is not one of "
            f"{', '.join(PROTOCOLS)}; no traces are exported over OTLP"
        )
        exporters = tuple(name for name in exporters if name != "otlp")
    return exporters, protocol, problems


def start(environ: Mapping[str, str] | None = None) -> bool:
    """Turn tracing on for this process when the OTEL_* variables ask for an exporter. Whether
    it is on."""
    if _provider is not None:
        return True  # started already (the global provider can be set once)
    provider = configured(environ)
    if provider is None:
        return False
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    use(provider)
    return True


def configured(environ: Mapping[str, str] | None = None) -> TracerProvider | None:
    """A provider exporting where the OTEL_* variables say (None: nowhere). The SDK reads its
    other variables itself (endpoint, headers, sampler, batching)."""
    exporters, protocol, problems = plan(os.environ if environ is None else environ)
    for problem in problems:
        log.warning("tracing: %s", problem)
    if not exporters:
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    made = [(name, one) for name in exporters if (one := _exporter(name, protocol)) is not None]
    if not made:
        return None
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    version = server.version()
    if version != "unknown" and "service.version" not in resource.attributes:
        resource = resource.merge(Resource({"service.version": version}))
    provider = TracerProvider(resource=resource)
    for _name, exporter in made:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    shown = ", ".join(name if name != "otlp" else f"OTLP ({protocol})" for name, _ in made)
    log.info("tracing on: spans go to %s as %s", shown, resource.attributes["service.name"])
    return provider


def _exporter(name: str, protocol: str) -> SpanExporter | None:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if protocol == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError:
            log.error(
                "tracing: OTLP over gRPC needs its exporter, which is not installed: "
                "pip install 'pressroom[otlp-grpc]', or set OTEL_EXPORTER_OTLP_PROTOCOL="
                "http/protobuf; no traces are exported over OTLP"
            )
            return None
        return GrpcExporter()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter()


def use(provider: TracerProvider | None) -> None:
    """Trace with `provider` from now on (None: off). `start` calls it; tests and benchmarks
    call it with a provider of their own, as the global one can be set once per process."""
    global _tracer, _provider
    _provider = provider
    _tracer = None if provider is None else provider.get_tracer(SERVICE_NAME, server.version())


def enabled() -> bool:
    return _tracer is not None


# --- Trace context ---------------------------------------------------------------------------


def traceparent() -> str | None:
    """The current span as a W3C traceparent, to store with a job (None: tracing off, or no
    span)."""
    if _tracer is None:
        return None
    from opentelemetry import trace

    context = trace.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def _parent(stored: str | None) -> Context:
    """The context a stored traceparent names (an empty one, so a new trace, without one)."""
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if not stored:
        return Context()
    return TraceContextTextMapPropagator().extract({"traceparent": stored}, Context())


def annotate(attributes: Mapping[str, Attribute]) -> None:
    """Set attributes on the current span (nothing while tracing is off)."""
    if _tracer is None:
        return
    from opentelemetry import trace

    trace.get_current_span().set_attributes(attributes)


# --- The submit routes -----------------------------------------------------------------------


def traced(handler: Handler) -> Handler:
    """A route handler in a server span that continues the request's traceparent (propagators
    as OTEL_PROPAGATORS says; a missing or malformed one starts a trace)."""

    @functools.wraps(handler)
    async def run(request: web.Request) -> web.StreamResponse:
        tracer = _tracer
        if tracer is None:
            return await handler(request)
        return await _serve(tracer, request, handler)

    return run


async def _serve(tracer: Tracer, request: web.Request, handler: Handler) -> web.StreamResponse:
    from opentelemetry import propagate, trace
    from opentelemetry.instrumentation import aiohttp_server as http

    with tracer.start_as_current_span(
        http.get_default_span_name(request),
        context=propagate.extract(request.headers),
        kind=trace.SpanKind.SERVER,
        attributes=http.collect_request_attributes(request),
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            response = await handler(request)
        except Exception as exc:
            # A problem (server.problems) or an HTTP exception answers with its status; anything
            # else the problem middleware answers (503 for the database, else 500) and logs.
            status = getattr(exc, "status", None)
            if isinstance(status, int):
                http.set_status_code(span, status)
            else:
                span.record_exception(exc)
                span.set_status(trace.Status(trace.StatusCode.ERROR, type(exc).__name__))
            raise
        http.set_status_code(span, response.status)
        return response


# --- A job's attempt -------------------------------------------------------------------------


def clock() -> int:
    """Now, as span times are given (nanoseconds since the epoch)."""
    return time.time_ns()


class Steps:
    """The spans of one attempt, a child per step; this one records nothing (tracing off)."""

    def step(self, name: str) -> None:
        """The current step ended; `name` begins."""

    def set(self, key: str, value: Attribute) -> None:
        """An attribute of the attempt's span."""

    def laid_out(self, steps: Mapping[str, float]) -> None:
        """Children of the current step, one per (name, seconds), laid end to end from its
        start: steps another process timed (the finishing steps)."""


NO_STEPS = Steps()
_OFF: contextlib.AbstractContextManager[Steps] = contextlib.nullcontext(NO_STEPS)


def attempt(
    stored: str | None,
    attributes: Mapping[str, Attribute],
    *,
    claimed: tuple[int, int] | None = None,
) -> contextlib.AbstractContextManager[Steps]:
    """The span of one job attempt, current for its task (its log lines carry its ids), under
    the job's stored traceparent (a new trace without one). `claimed` (clock() before and after
    the claim) starts it with a claim step. An error leaving it marks it and its step failed."""
    if _tracer is None:
        return _OFF
    return _Attempt(_tracer, stored, attributes, claimed)


class _Attempt(Steps, contextlib.AbstractContextManager[Steps]):
    def __init__(
        self,
        tracer: Tracer,
        stored: str | None,
        attributes: Mapping[str, Attribute],
        claimed: tuple[int, int] | None,
    ) -> None:
        from opentelemetry import trace

        self._tracer = tracer
        self._trace = trace
        began = claimed[0] if claimed is not None else None
        self._span = tracer.start_span(
            "job attempt",
            context=_parent(stored),
            kind=trace.SpanKind.CONSUMER,
            attributes=attributes,
            start_time=began,
        )
        self._inside = trace.set_span_in_context(self._span)
        self._current: Span | None = None
        self._since = 0
        if claimed is not None:
            claim = tracer.start_span("claim", context=self._inside, start_time=claimed[0])
            claim.end(end_time=claimed[1])
        self._token: object = None

    def __enter__(self) -> Steps:
        from opentelemetry import context

        self._token = context.attach(self._inside)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        from opentelemetry import context

        trace = self._trace
        if exc is not None:
            if isinstance(exc, asyncio.CancelledError):
                self._span.set_attribute(OUTCOME, "aborted")
            else:
                error = trace.Status(trace.StatusCode.ERROR, str(exc))
                for span in (self._current, self._span):
                    if span is not None:
                        span.record_exception(exc)
                        span.set_status(error)
                self._span.set_attribute(OUTCOME, "failed")
        if self._current is not None:
            self._current.end()
        self._span.end()
        if exc is None:
            context.detach(self._token)  # type: ignore[arg-type]
        # Else the attempt's context stays current for the rest of its task (which ends once the
        # failure is recorded), so the consumer's line that records the failure carries its ids.

    def step(self, name: str) -> None:
        if self._current is not None:
            self._current.end()
        self._since = clock()
        self._current = self._tracer.start_span(name, context=self._inside, start_time=self._since)

    def set(self, key: str, value: Attribute) -> None:
        self._span.set_attribute(key, value)

    def laid_out(self, steps: Mapping[str, float]) -> None:
        if self._current is None:
            return
        parent = self._trace.set_span_in_context(self._current)
        at = self._since
        for name, seconds in steps.items():
            end = at + round(seconds * 1e9)
            child = self._tracer.start_span(
                name, context=parent, start_time=at, attributes={STEP: name}
            )
            child.end(end_time=end)
            at = end


# --- Webhooks --------------------------------------------------------------------------------


@contextlib.contextmanager
def delivery(stored: str | None, attributes: Mapping[str, Attribute]) -> Iterator[None]:
    """The span of one webhook POST, current while it is sent (its request's traceparent is a
    child of it), under the job's stored traceparent."""
    tracer = _tracer
    if tracer is None:
        yield
        return
    from opentelemetry import trace

    with tracer.start_as_current_span(
        "webhook", context=_parent(stored), kind=trace.SpanKind.PRODUCER, attributes=attributes
    ):
        yield


def client_trace_configs() -> list[aiohttp.TraceConfig]:
    """For an HTTP client session: a client span per request, its traceparent sent (none
    while tracing is off). The URL's query is left out of the span: it may hold a token."""
    if _provider is None:
        return []
    from opentelemetry.instrumentation.aiohttp_client import create_trace_config

    return [
        create_trace_config(
            url_filter=lambda url: str(url.with_query(None)), tracer_provider=_provider
        )
    ]


# --- Logs ------------------------------------------------------------------------------------


class LogIds(logging.Filter):
    """Adds `trace_id` and `span_id` to a log record made while a span is current."""

    def filter(self, record: logging.LogRecord) -> bool:
        if _tracer is None:
            return True
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = f"{context.trace_id:032x}"
            record.span_id = f"{context.span_id:016x}"
        return True
