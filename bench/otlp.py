"""Tracing on for a benchmark's rounds (--tracing): an OTLP/HTTP receiver in a process of its
own on loopback, and the provider Pressroom makes from the OTEL_* variables, pointed at it.

    python -m bench.otlp    (the receiver: prints its port, counts spans and traces until stdin
                             closes, then prints {"spans": N, "traces": T, "requests": M})
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from aiohttp import web

from bench.common import ROOT
from server import tracing

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider


class Tracing:
    """Turns Pressroom's tracing on and off between rounds; `spans` and `traces` are what the
    receiver got (known once the context ends)."""

    def __init__(self, provider: TracerProvider) -> None:
        self._provider = provider
        self.spans = 0
        self.traces = 0

    def on(self) -> None:
        tracing.use(self._provider)

    def off(self) -> None:
        tracing.use(None)


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[Tracing]:
    """The receiver started, OTEL_EXPORTER_OTLP_ENDPOINT naming it, tracing off until `on`;
    at the end every span is flushed and counted."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bench.otlp",
        cwd=ROOT,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None
    port = json.loads(await proc.stdout.readline())["port"]
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{port}"
    try:
        provider = tracing.configured()
        assert provider is not None
        switch = Tracing(provider)
        try:
            yield switch
        finally:
            switch.off()
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
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    print(json.dumps({"port": port}), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until it closes
    await runner.cleanup()
    print(json.dumps({"spans": spans, "traces": len(trace_ids), "requests": requests}), flush=True)


if __name__ == "__main__":
    asyncio.run(serve())
