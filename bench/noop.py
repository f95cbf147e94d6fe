"""Renderers for the queue benchmark only: a tiny valid PDF at once, so what is measured is the
queue (claim, store, finish, events), not Chromium. Never a default of the server."""

from __future__ import annotations

import time
from collections.abc import Callable

from server.options import RenderOptions
from server.render.chromium import Assets, RenderResult
from server.settings import Settings


def tiny_pdf() -> bytes:
    """A valid one-page blank PDF, built by hand."""
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 595 842] >>",
    ]
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (number, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for offset in offsets:
        out += b"%010d 00000 n \n" % offset
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


PDF = tiny_pdf()


class NoopRenderer:
    """Returns the same tiny PDF for every job, without a browser."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.rendered = 0

    async def render(
        self,
        html: str,
        options: RenderOptions,
        *,
        timeout_s: float,
        on_print: Callable[[], None] | None = None,
        assets: Assets | None = None,
    ) -> RenderResult:
        self.rendered += 1
        return RenderResult(data=PDF, pages=1, warnings=[])

    async def check(self) -> None:
        return None


class StartClock(NoopRenderer):
    """A no-op renderer that notes when each job reached it.

    The job's template renders to the submitter's time.perf_counter() reading (the same
    clock in this process), so start - submit is the submit→start latency."""

    def __init__(self, settings: Settings | None = None) -> None:
        super().__init__(settings)
        self.latencies_ms: list[float] = []
        self.started: dict[float, float] = {}  # submitted → started, both perf_counter()

    async def render(
        self,
        html: str,
        options: RenderOptions,
        *,
        timeout_s: float,
        on_print: Callable[[], None] | None = None,
        assets: Assets | None = None,
    ) -> RenderResult:
        started = time.perf_counter()
        self.latencies_ms.append((started - float(html)) * 1000)
        self.started[float(html)] = started
        return await super().render(html, options, timeout_s=timeout_s)
