"""Traces leave a real Pressroom process over OTLP, as an operator turns them on: only the
standard OTEL_* variables set, a receiver on loopback that decodes what the SDK's exporter sends
(ExportTraceServiceRequest, with opentelemetry-proto), and the JSON log lines of the same
process carrying the same trace id."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1.common_pb2 import KeyValue

from tests.processes import PressroomProcess, free_port, wait_ready
from tests.timings import as_env

pytestmark = pytest.mark.slow

TRACE = "0af7651916cd43dd8448eb211c80319c"
CALLER = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE}-{CALLER}-01"
WAIT_S = 60.0


def _value(pair: KeyValue) -> Any:
    kind = pair.value.WhichOneof("value")
    return getattr(pair.value, kind) if kind else None


class Collector:
    """What an OTLP receiver got: every span, with its service's name, as plain dicts."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self._arrived = asyncio.Event()

    def take(self, request: trace_service_pb2.ExportTraceServiceRequest) -> None:
        self.requests += 1
        for resource in request.resource_spans:
            service = {p.key: _value(p) for p in resource.resource.attributes}
            for scope in resource.scope_spans:
                for span in scope.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent": span.parent_span_id.hex() or None,
                            "attributes": {p.key: _value(p) for p in span.attributes},
                            "service": service.get("service.name"),
                        }
                    )
        self._arrived.set()

    def named(self, name: str, trace_id: str = TRACE) -> list[dict[str, Any]]:
        return [s for s in self.spans if s["name"] == name and s["trace_id"] == trace_id]

    async def until(self, *names: str, trace_id: str = TRACE) -> None:
        """Until spans of each name, of the trace, have arrived (woken by each export)."""
        async with asyncio.timeout(WAIT_S):
            while not all(self.named(name, trace_id) for name in names):
                self._arrived.clear()
                await self._arrived.wait()


class HttpReceiver(Collector):
    """OTLP/HTTP on 127.0.0.1 (POST /v1/traces, protobuf), and a webhook endpoint beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.hooks: asyncio.Queue[dict[str, str]] = asyncio.Queue()
        self.server: TestServer | None = None

    async def traces(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf"
        self.take(trace_service_pb2.ExportTraceServiceRequest.FromString(await request.read()))
        answer = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
        return web.Response(body=answer, content_type="application/x-protobuf")

    async def hook(self, request: web.Request) -> web.Response:
        await request.read()
        self.hooks.put_nowait(dict(request.headers))
        return web.Response(status=204)

    @property
    def base(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.port}"


@pytest.fixture
async def receiver() -> AsyncIterator[HttpReceiver]:
    receiver = HttpReceiver()
    app = web.Application()
    app.router.add_post("/v1/traces", receiver.traces)
    app.router.add_post("/hook", receiver.hook)
    receiver.server = TestServer(app, host="127.0.0.1")
    await receiver.server.start_server()
    yield receiver
    await receiver.server.close()


def pressroom_env(dsn: str, tmp_path: Path, port: int) -> dict[str, str]:
    return {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
        "PRESSROOM_PORT": str(port),
        "PRESSROOM_LOG_FORMAT": "json",
        "PRESSROOM_ALLOW_HOSTS": "127.0.0.1",
        # Spans leave in batches every 5 s (the SDK's default), and at the latest when the
        # process stops: the tests stop it before that, so what they get was flushed at exit.
        **as_env(POLL_INTERVAL_S=0.5),
    }


def json_lines(log: str) -> list[dict[str, Any]]:
    lines = []
    for line in log.splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


@pytest.mark.browser
@pytest.mark.timeout(240)
async def test_a_jobs_spans_reach_an_otlp_http_receiver_and_its_log_lines_name_the_trace(
    dsn: str, tmp_path: Path, receiver: HttpReceiver
) -> None:
    port = free_port()
    env = {
        **pressroom_env(dsn, tmp_path, port),
        "PRESSROOM_RENDER_SLOTS": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.base,  # the only variable that turns it on
    }
    server = PressroomProcess("serve", env, tmp_path / "serve.log")
    await server.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base)
            body = {
                "template": "<h1>Invoice {{ n }}</h1>",
                "data": {"n": 7},
                "webhook_url": f"{receiver.base}/hook",
            }
            headers = {"traceparent": TRACEPARENT}
            async with http.post(f"{base}/v1/jobs", json=body, headers=headers) as resp:
                assert resp.status == 202, await resp.text()
                job = await resp.json()
            assert job["trace_id"] == TRACE
            hook = await asyncio.wait_for(receiver.hooks.get(), WAIT_S)
            async with http.get(f"{base}/v1/jobs/{job['id']}") as resp:
                assert (await resp.json())["trace_id"] == TRACE
    finally:
        assert await server.stop() == 0, server.log()[-3000:]
    await receiver.until("POST /v1/jobs", "job attempt", "render", "done", "webhook", "POST")

    [request] = receiver.named("POST /v1/jobs")
    assert request["parent"] == CALLER and request["service"] == "pressroom"
    assert request["attributes"]["pressroom.job.id"] == job["id"]
    [attempt] = receiver.named("job attempt")
    assert attempt["parent"] == request["span_id"]
    assert attempt["attributes"]["pressroom.job.pages"] == 1
    assert attempt["attributes"]["pressroom.job.outcome"] == "done"
    steps = {s["name"] for s in receiver.spans if s["parent"] == attempt["span_id"]}
    assert steps == {"claim", "template", "render", "store", "done"}
    [webhook] = receiver.named("webhook")
    [post] = receiver.named("POST")
    assert webhook["parent"] == request["span_id"] and post["parent"] == webhook["span_id"]
    assert hook["traceparent"] == f"00-{TRACE}-{post['span_id']}-01"

    lines = json_lines(server.log())
    assert any(line["message"].startswith("tracing on: spans go to OTLP") for line in lines)
    mine = [line for line in lines if line.get("job_id") == job["id"]]
    by_message = {line["message"]: line for line in mine}
    assert by_message["job queued"]["trace_id"] == TRACE
    assert by_message["job queued"]["span_id"] == request["span_id"]
    assert by_message["job done"]["trace_id"] == TRACE
    assert by_message["job done"]["span_id"] == attempt["span_id"]
    # Lines outside any span carry no ids.
    assert not any("trace_id" in line for line in lines if line["message"] == "shutting down")


class GrpcReceiver(Collector, trace_service_pb2_grpc.TraceServiceServicer):
    """OTLP over gRPC: the collector's TraceService, as opentelemetry-proto states it."""

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: Any
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        self.take(request)
        return trace_service_pb2.ExportTraceServiceResponse()


@pytest.fixture
async def grpc_receiver() -> AsyncIterator[tuple[GrpcReceiver, int]]:
    receiver = GrpcReceiver()
    server = grpc.aio.server()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
        receiver, server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield receiver, port
    await server.stop(grace=None)


async def test_spans_go_over_grpc_when_the_protocol_says_so(
    dsn: str, tmp_path: Path, grpc_receiver: tuple[GrpcReceiver, int]
) -> None:
    receiver, grpc_port = grpc_receiver
    port = free_port()
    env = {
        **pressroom_env(dsn, tmp_path, port),
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": f"http://127.0.0.1:{grpc_port}",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_SERVICE_NAME": "pressroom-web-eu",
    }
    server = PressroomProcess("web", env, tmp_path / "web.log")  # no renders: no browser
    await server.start()
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base)
            body = {"template": "<p>x</p>"}
            async with http.post(f"{base}/v1/jobs", json=body) as resp:
                assert resp.status == 202, await resp.text()
                job = await resp.json()
    finally:
        assert await server.stop() == 0, server.log()[-3000:]
    await receiver.until("POST /v1/jobs", trace_id=job["trace_id"])
    [request] = receiver.named("POST /v1/jobs", job["trace_id"])
    assert request["parent"] is None, "no traceparent: a trace of its own"
    assert request["service"] == "pressroom-web-eu"
    assert request["attributes"]["pressroom.job.id"] == job["id"]
    lines = json_lines(server.log())
    started = "tracing on: spans go to OTLP (grpc) as pressroom-web-eu"
    assert any(line["message"] == started for line in lines)
