"""Tracing on for a benchmark's rounds (--tracing): an OTLP/HTTP receiver in a process of its
own on loopback, and the provider Pressroom makes from the OTEL_* variables, pointed at it.

    python -m bench.otlp    (the receiver: prints its URL, counts spans and traces until stdin
                             closes, then prints {"spans": N, "traces": T, "requests": M})
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, TypeVar

from aiohttp import web

from bench.common import serving, start_python
from server import tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

T = TypeVar("T")


class Tracing:
    """Turns Pressroom's tracing off and on within a round; `spans` and `traces` are what the
    receiver got (known once the context ends)."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self.spans = 0
        self.traces = 0

    async def off_and_on(self, n: int, measure: Callable[[], Awaitable[T]]) -> dict[str, T]:
        """`measure()` with tracing off and with it on: off first in round `n` even, on first
        in `n` odd."""
        measured = {}
        for side in ("off", "on") if n % 2 == 0 else ("on", "off"):
            tracing.use(self._provider if side == "on" else None)
            try:
                measured[side] = await measure()
            finally:
                tracing.use(None)
        return measured


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[Tracing]:
    """The receiver started, OTEL_EXPORTER_OTLP_ENDPOINT naming it, tracing off except in
    `off_and_on`; at the end every span is flushed and counted."""
    proc = await start_python("-m", "bench.otlp")
    assert proc.stdin is not None and proc.stdout is not None
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = json.loads(await proc.stdout.readline())["url"]
    try:
        provider = tracing.configured()
        assert provider is not None
        switch = Tracing(provider)
        try:
            yield switch
        finally:
            tracing.use(None)
            await asyncio.to_thread(provider.shutdown)  # exports what is left
    finally:
        del os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"]
        proc.stdin.close()
        out, _ = await proc.communicate()
    got = json.loads(out.decode().strip().splitlines()[-1])
    switch.spans, switch.traces = got["spans"], got["traces"]


def spread(ratios: Sequence[float]) -> str:
    """The median ratio and each round's: `0.97 (0.95, 0.97, 1.01)`."""
    return f"{statistics.median(ratios):.2f} ({', '.join(f'{r:.2f}' for r in ratios)})"


async def serve() -> None:
    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2 as otlp

    spans = requests = 0
    trace_ids: set[bytes] = set()
    answer = otlp.ExportTraceServiceResponse().SerializeToString()

    async def traces(request: web.Request) -> web.Response:
        nonlocal spans, requests
        got = otlp.ExportTraceServiceRequest.FromString(await request.read())
        requests += 1
        for resource in got.resource_spans:
            for scope in resource.scope_spans:
                spans += len(scope.spans)
                trace_ids.update(span.trace_id for span in scope.spans)
        return web.Response(body=answer, content_type="application/x-protobuf")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/traces", traces)
    async with serving(app) as base:
        print(json.dumps({"url": base}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until it closes
    print(json.dumps({"spans": spans, "traces": len(trace_ids), "requests": requests}), flush=True)


if __name__ == "__main__":
    asyncio.run(serve())
