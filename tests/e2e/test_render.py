"""The render path on real Chromium: the seed flow, isolation between jobs, permanent errors."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import unicodedata
from collections.abc import Callable
from io import BytesIO
from typing import Any

import psutil
import pytest
from pypdf import PdfReader

from tests.conftest import RunningApp
from tests.sse import collect

pytestmark = pytest.mark.browser


def pdf_text(data: bytes) -> str:
    reader = PdfReader(BytesIO(data))
    # pypdf returns ligatures (ﬁ); NFKC folds them back into letters.
    return unicodedata.normalize("NFKC", "\n".join(page.extract_text() for page in reader.pages))


@pytest.fixture
async def chromium_app(start_app: Callable[..., Any]) -> RunningApp:
    app: RunningApp = await start_app(render_slots=2)
    return app


async def render(app: RunningApp, body: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    messages = await collect(app.http, app.url(job["links"]["events"]), timeout_s=60)
    final = messages[-1].json["job"]
    if final["status"] != "done":
        return final, None
    async with app.http.get(final["url"]) as resp:
        assert resp.status == 200
        return final, await resp.read()


async def test_seed_flow_renders_hi_ana(chromium_app: RunningApp) -> None:
    body = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}
    async with chromium_app.http.post(chromium_app.url("/v1/jobs"), json=body) as resp:
        job = await resp.json()
    messages = await collect(
        chromium_app.http, chromium_app.url(job["links"]["events"]), timeout_s=60
    )
    assert [m.event for m in messages] == ["job.queued", "job.running", "job.done"]
    done = messages[-1].json["job"]
    async with chromium_app.http.get(done["url"]) as resp:
        data = await resp.read()
    assert data.startswith(b"%PDF")
    assert "Hi Ana" in pdf_text(data)
    assert done["pages"] == len(PdfReader(BytesIO(data)).pages) == 1
    assert done["bytes"] == len(data)


async def test_options_reach_the_pdf(chromium_app: RunningApp) -> None:
    pages = "".join(f'<p style="page-break-after: always">page {i}</p>' for i in range(3))
    job, data = await render(
        chromium_app,
        {"template": pages, "options": {"format": "A5", "landscape": True, "margin": "10mm"}},
    )
    assert data is not None and job["pages"] == 3
    box = PdfReader(BytesIO(data)).pages[0].mediabox
    assert float(box.width) > float(box.height), "landscape"
    assert round(float(box.width) / 72 * 25.4) == 210, "A5 is 210 mm on its long side"


async def test_state_does_not_leak_between_jobs(chromium_app: RunningApp) -> None:
    writer = """<script>
      try { document.cookie = "leak=cookie; path=/"; } catch (e) {}
      try { localStorage.setItem("leak", "storage"); } catch (e) {}
      window.leak = "global";
      document.title = "writer";
    </script><p>wrote</p>"""
    reader = """<p id="out">pending</p><script>
      let storage = "none", cookie = "none";
      try { storage = localStorage.getItem("leak") || "none"; } catch (e) {}
      try { cookie = document.cookie || "none"; } catch (e) {}
      document.getElementById("out").textContent =
        "cookie=" + cookie + " storage=" + storage +
        " global=" + (window.leak || "none");
    </script>"""
    _, first = await render(chromium_app, {"template": writer})
    assert first is not None
    for _ in range(3):  # whichever slot or context the next jobs land in
        _, second = await render(chromium_app, {"template": reader})
        assert second is not None
        text = pdf_text(second)
        assert "cookie=none storage=none global=none" in text, text
    # A page without scripts shares a reused page; it must not see the writer's title either.
    _, plain = await render(chromium_app, {"template": "<p>plain {{ 1 + 1 }}</p>"})
    assert plain is not None and "plain 2" in pdf_text(plain)


async def test_template_errors_fail_permanently_with_a_clear_error(
    chromium_app: RunningApp,
) -> None:
    job, data = await render(chromium_app, {"template": "<p>{{ invoice.total }}</p>", "data": {}})
    assert data is None
    assert job["status"] == "failed" and job["attempts"] == 1
    assert "'invoice' is undefined" in job["error"]


async def test_scripts_run_when_a_template_needs_them(chromium_app: RunningApp) -> None:
    chart = """<div id="chart"></div><script>
      document.getElementById("chart").textContent = "drawn by script " + (6 * 7);
    </script>"""
    _, data = await render(chromium_app, {"template": chart})
    assert data is not None and "drawn by script 42" in pdf_text(data)


RESPONSIVE = """<style>
  .half { width: 50vw; height: 10vh; background: #c00; } .big { font-size: 3vw; }
  @media (min-width: 600px) { .mq { color: green; font-size: 30px; } }
  @media (max-width: 599px) { .mq { color: blue; font-size: 10px; } #wide { display: none; } }
  .grid { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); }
  .cols { columns: 3 150px; } .fixed { position: fixed; bottom: 0; right: 0; }
</style><div class="half"></div><p class="big">sized by the viewport</p>
<p class="mq">media query</p><p id="wide">shown on wide screens</p>
<div class="grid">{% for i in range(12) %}<div>cell {{ i }}</div>{% endfor %}</div>
<div class="cols">{% for i in range(300) %}word {% endfor %}</div><div class="fixed">footer</div>"""


def without_dates(pdf: bytes) -> bytes:
    return re.sub(rb"/(CreationDate|ModDate) \(D:[^)]*\)", b"", pdf)


PRINT_OPTIONS = [
    {"media": "print"},
    {"media": "screen"},
    {
        "landscape": True,
        "scale": 0.7,
        "margin": "20mm",
        "header_html": '<span style="font-size: 8px" class="title"></span>',
        "footer_html": '<span style="font-size: 8px" class="pageNumber"></span>',
    },
]


@pytest.mark.parametrize("raw_options", PRINT_OPTIONS)
async def test_the_print_viewport_does_not_change_the_pdf(raw_options: dict[str, Any]) -> None:
    """Script-free pages print from a one-pixel viewport; a job waiting for a selector gets
    1280x720. Printing lays the document out at the paper's width, so a document full of
    viewport units and width media queries comes out as the same bytes either way, and the
    slot switches back and forth between the two."""
    from server import options
    from server.netpolicy import NetworkPolicy
    from server.render import templates
    from server.render.chromium import ChromiumRenderer

    html = templates.render(RESPONSIVE, {})
    tiny = options.parse(raw_options)
    screen = options.parse({**raw_options, "wait_for_selector": "#wide"})  # visible when wide
    renderer = ChromiumRenderer(policy=NetworkPolicy(), slots=1)
    await renderer.start()
    try:
        printed = [
            (await renderer.render(html, each, timeout_s=20)).data for each in (tiny, screen, tiny)
        ]
    finally:
        await renderer.close()
    assert without_dates(printed[0]) == without_dates(printed[1]) == without_dates(printed[2])
    assert "media query" in pdf_text(printed[0])


async def test_browser_is_recycled_after_a_number_of_jobs() -> None:
    from server.netpolicy import NetworkPolicy
    from server.options import RenderOptions
    from server.render.browsers import browser_processes
    from server.render.chromium import ChromiumRenderer

    others = {p.pid for p in browser_processes()}  # other tests' browsers, if any are open
    renderer = ChromiumRenderer(policy=NetworkPolicy(), slots=1, recycle_after_jobs=3)
    await renderer.start()
    try:
        first_browser = {p.pid for p in browser_processes()} - others
        for n in range(4):
            result = await renderer.render(f"<p>{n}</p>", RenderOptions(), timeout_s=20)
            assert result.data.startswith(b"%PDF-")
        assert renderer.launches == 2
        assert first_browser.isdisjoint(p.pid for p in browser_processes()), (
            "the old browser is gone"
        )
    finally:
        await renderer.close()
    assert {p.pid for p in browser_processes()} - others == set()


class Logged(logging.Handler):
    """Sets `seen` once a record whose message starts with `start` is logged."""

    def __init__(self, start: str) -> None:
        super().__init__()
        self.start = start
        self.seen = asyncio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(self.start):
            self.seen.set()


async def test_browser_above_its_memory_mark_is_recycled_without_holding_up_renders(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from server.netpolicy import NetworkPolicy
    from server.options import RenderOptions
    from server.render import chromium

    # Any browser uses more than 1 MiB: the reading taken in the background marks it, and
    # the render after that starts a new one.
    renderer = chromium.ChromiumRenderer(
        policy=NetworkPolicy(), slots=1, max_rss_mb=1, memory_check_interval_s=0
    )
    caplog.set_level(logging.INFO, logger=chromium.__name__)
    marked = Logged("browser uses")
    logging.getLogger(chromium.__name__).addHandler(marked)
    await renderer.start()
    try:
        result = await renderer.render("<p>1</p>", RenderOptions(), timeout_s=20)
        assert result.data.startswith(b"%PDF-") and renderer.launches == 1
        async with asyncio.timeout(10):
            await marked.seen.wait()  # the background reading found it above its mark
        result = await renderer.render("<p>2</p>", RenderOptions(), timeout_s=20)
        assert result.data.startswith(b"%PDF-")
        assert renderer.launches == 2, "the render after the reading starts a new browser"
    finally:
        logging.getLogger(chromium.__name__).removeHandler(marked)
        await renderer.close()


async def test_a_browser_that_stops_answering_mid_setup_does_not_hold_the_job(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from playwright.async_api import BrowserContext

    from server.errors import TransientError
    from server.netpolicy import NetworkPolicy
    from server.options import RenderOptions
    from server.render import chromium

    async def hang(*_args: Any, **_kwargs: Any) -> None:
        await asyncio.Event().wait()  # a frozen browser: the call never answers

    renderer = chromium.ChromiumRenderer(policy=NetworkPolicy(), slots=1)
    await renderer.start()
    try:
        monkeypatch.setattr(chromium, "CLOSE_TIMEOUT_S", 0.5)
        # The browser freezes after the context exists: opening its page and closing it hang.
        monkeypatch.setattr(BrowserContext, "new_page", hang)
        monkeypatch.setattr(BrowserContext, "close", hang)
        started = asyncio.get_running_loop().time()
        with pytest.raises(TransientError, match="timed out"):
            async with asyncio.timeout(10):  # without a bound on the clean-up: never
                await renderer.render("<script></script><p>x</p>", RenderOptions(), timeout_s=1)
        assert asyncio.get_running_loop().time() - started < 3
        monkeypatch.undo()
        # The next job checks the browser first; this one answers again and renders.
        result = await renderer.render("<p>after</p>", RenderOptions(), timeout_s=20)
        assert result.data.startswith(b"%PDF-")
    finally:
        monkeypatch.undo()
        await renderer.close()


async def test_killing_a_hung_browser_spares_other_renderers_of_the_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from playwright.async_api import Browser

    from server.netpolicy import NetworkPolicy
    from server.options import RenderOptions
    from server.render import chromium

    async def hang(*_args: Any, **_kwargs: Any) -> None:
        await asyncio.Event().wait()

    def main_process(renderer: chromium.ChromiumRenderer) -> psutil.Process:
        """The browser process itself: its driver's child (its helpers come and go)."""
        assert renderer.driver_pid is not None
        [browser] = [
            p for p in psutil.Process(renderer.driver_pid).children() if "chrom" in p.name()
        ]
        return browser

    def alive(process: psutil.Process) -> bool:
        with contextlib.suppress(psutil.Error):
            return process.status() != psutil.STATUS_ZOMBIE
        return False

    hung = chromium.ChromiumRenderer(policy=NetworkPolicy(), slots=1)
    other = chromium.ChromiumRenderer(policy=NetworkPolicy(), slots=1)
    await hung.start()
    await other.start()
    try:
        await other.render("<p>other</p>", RenderOptions(), timeout_s=20)
        hung_browser, other_browser = main_process(hung), main_process(other)
        monkeypatch.setattr(chromium, "CLOSE_TIMEOUT_S", 0.5)
        monkeypatch.setattr(Browser, "close", hang)  # the browser does not close: it is killed
        await hung.close()
        monkeypatch.undo()
        assert not alive(hung_browser)
        assert alive(other_browser), "another renderer's browser was killed"
        result = await other.render("<p>still here</p>", RenderOptions(), timeout_s=20)
        assert result.data.startswith(b"%PDF-") and other.launches == 1
    finally:
        monkeypatch.undo()
        await other.close()
