"""What bounds one render on real Chromium: its memory, its page count, and the user and
sandbox the browser runs with."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Callable
from io import BytesIO
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer as SiteServer
from pypdf import PdfReader

from server.errors import PageLimitError
from server.keys import CHROMIUM
from server.netpolicy import NetworkPolicy
from server.options import parse
from server.render.browsers import browser_memory_mb, browser_processes
from server.render.cgroups import RenderCgroups
from server.render.chromium import ChromiumRenderer
from server.render.sources import PageUrl
from tests.conftest import RunningApp
from tests.sse import collect

pytestmark = pytest.mark.browser

BOUND_MB = 400
# Keeps 24 arrays of 256 MiB, each written so that its pages are really used: 6 GiB.
BOMB = """<h1>bomb</h1><script>
const kept = [];
for (let i = 0; i < 24; i++) {
  const a = new Uint8Array(256 * 1024 * 1024); a.fill(1); kept.push(a);
}
window.done = true;
</script>"""
CALM = "<h1>calm</h1><script>window.done = true;</script>"
LIMIT_50 = "the PDF has more than 50 pages, the limit (PRESSROOM_MAX_PAGES)"


async def submit(app: RunningApp, template: str, **options: Any) -> str:
    body = {"template": template, "options": options}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job_id: str = (await resp.json())["id"]
        return job_id


async def final_state(app: RunningApp, job_id: str) -> dict[str, Any]:
    got = await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"), timeout_s=90)
    job: dict[str, Any] = got[-1].json["job"]
    return job


async def test_a_page_that_needs_too_much_memory_fails_at_once_and_the_other_slot_finishes(
    start_app: Callable[..., Any],
) -> None:
    if os.geteuid() != 0 and RenderCgroups.create(BOUND_MB)[0] is None:
        pytest.skip("no memory cgroup can be made by this user (CI runs as root, where it can)")
    app: RunningApp = await start_app(render_slots=2, render_max_mb=BOUND_MB)
    assert app.app[CHROMIUM].memory_bound == f"cgroup v1, {BOUND_MB} MiB per render" or (
        app.app[CHROMIUM].memory_bound == f"cgroup v2, {BOUND_MB} MiB per render"
    )
    driver = app.app[CHROMIUM].driver_pid

    async def peak_while(template: str) -> tuple[float, dict[str, Any], dict[str, Any]]:
        """Chromium's peak memory (PSS, shared pages counted once) while a page with scripts
        runs next to a plain invoice in the other slot, and both jobs' final states."""
        peak = 0.0
        sampling = True

        async def watch() -> None:
            nonlocal peak
            while sampling:
                peak = max(peak, await asyncio.to_thread(browser_memory_mb, driver))

        watcher = asyncio.create_task(watch())
        scripted = await submit(app, template, wait_for_expression="window.done === true")
        normal = await submit(app, "<h1>Invoice</h1>" + "<p>line</p>" * 50)
        states = await final_state(app, scripted), await final_state(app, normal)
        sampling = False
        await watcher
        return peak, *states

    base_mb, calm, _ = await peak_while(CALM)
    assert calm["status"] == "done"
    peak_mb, bombed, done = await peak_while(BOMB)
    assert bombed["status"] == "failed", bombed
    assert f"needs more than {BOUND_MB} MiB of memory" in bombed["error"]
    assert bombed["attempts"] == 1, "not retried"
    assert done["status"] == "done"
    # Without the bound the page holds 6 GiB; with it, Chromium stays within its base (the
    # same two jobs with a calm page) plus the bound, give or take a sample's noise.
    assert peak_mb < base_mb + BOUND_MB + 100, (base_mb, peak_mb)
    after = await submit(app, "<h1>after</h1><script>1</script>")
    assert (await final_state(app, after))["status"] == "done"


async def test_chromium_runs_unprivileged_with_its_sandbox(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(render_slots=1)
    job = await submit(app, "<h1>hi</h1>")
    assert (await final_state(app, job))["status"] == "done"
    async with app.http.get(app.url("/readyz")) as resp:
        browser = (await resp.json())["browser"]
    assert browser["engine"].startswith(("Chromium ", "headless shell "))
    assert browser["user"] != "root"
    processes = browser_processes(app.app[CHROMIUM].driver_pid)
    assert processes and all(process.uids().real != 0 for process in processes)
    if os.geteuid() == 0:
        # This kernel lets an unprivileged user make namespaces, so the sandbox must be on.
        assert browser["sandbox"] is True, browser


async def test_printing_stops_one_page_past_the_limit() -> None:
    renderer = ChromiumRenderer(policy=NetworkPolicy(), slots=1, max_pages=5)
    await renderer.start()
    try:
        pages = "".join(f'<p style="page-break-after: always">{i}</p>' for i in range(40))
        assert (await renderer.render(pages, parse({}), timeout_s=30)).pages == 6
        result = await renderer.render(pages, parse({"page_ranges": "10-"}), timeout_s=30)
        assert result.pages == 6
        short = await renderer.render("<p>one</p>", parse({}), timeout_s=30)
        assert short.pages == 1
    finally:
        await renderer.close()


async def test_a_document_far_past_the_page_limit_fails_before_chromium_paginates_it(
    start_app: Callable[..., Any],
) -> None:
    # Chromium paginates a whole document before it prints its first page: 2,000 pages take it
    # longer than this time limit, so a job that fails with the page limit, and not with a
    # timeout retried, was refused before printing.
    app: RunningApp = await start_app(render_slots=1, max_pages=50, render_timeout_s=10)
    lines = "{% for n in range(80000) %}<p>line {{ n }}</p>{% endfor %}"
    scripted = "<script>document.title = 'report'</script>" + lines  # a context of its own
    for body in (
        {"template": lines},
        {"template": scripted},
        {"template": lines, "options": {"format": "A3", "landscape": True, "scale": 0.5}},
    ):
        async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
            assert resp.status == 202, await resp.text()
            job = await final_state(app, (await resp.json())["id"])
        assert job["status"] == "failed" and job["attempts"] == 1, job
        assert job["error"] == LIMIT_50
    async with app.http.post(app.url("/v1/templates/preview"), json={"html": lines}) as resp:
        assert resp.status == 422 and (await resp.json())["detail"] == LIMIT_50
    # As long in HTML, within the limit: printed whole (about 40 pages).
    text = "".join(f"<p>paragraph {n} " + "lorem ipsum dolor sit amet " * 8 for n in range(600))
    job = await final_state(app, await submit(app, text))
    assert job["status"] == "done" and 30 < job["pages"] <= 50, job
    # Twice as long (about 80 pages) it is not, unless page ranges choose fewer pages; on a
    # stylesheet's own, larger page size, which Chromium shrinks onto the paper, it is (about
    # 40): that page is not measured as the options' paper.
    job = await final_state(app, await submit(app, text * 2))
    assert job["status"] == "failed" and job["error"] == LIMIT_50, job
    job = await final_state(app, await submit(app, text * 2, page_ranges="71-"))
    assert job["status"] == "done" and job["pages"] == 10, job
    job = await final_state(app, await submit(app, "<style>@page { size: A3 }</style>" + text * 2))
    assert job["status"] == "done" and 30 < job["pages"] <= 50, job


async def test_a_page_far_past_the_page_limit_fails_before_chromium_paginates_it() -> None:
    async def report(request: web.Request) -> web.Response:
        rows = "".join(
            f"<tr><td>{n}</td><td>row {n}</td></tr>" for n in range(int(request.query["rows"]))
        )
        return web.Response(text=f"<table>{rows}</table>", content_type="text/html")

    site = web.Application()
    site.router.add_get("/report", report)
    server = SiteServer(site, host="127.0.0.1")
    await server.start_server()
    renderer = ChromiumRenderer(policy=NetworkPolicy(["127.0.0.1"]), slots=1, max_pages=50)
    await renderer.start()
    try:
        long = PageUrl(f"http://127.0.0.1:{server.port}/report?rows=60000")  # 1,500 pages
        with pytest.raises(PageLimitError) as raised:
            await renderer.render(long, parse({}), timeout_s=30)
        assert str(raised.value) == LIMIT_50
        short = PageUrl(f"http://127.0.0.1:{server.port}/report?rows=100")
        assert (await renderer.render(short, parse({}), timeout_s=30)).pages == 3
    finally:
        await renderer.close()
        await server.close()


async def test_the_headless_shell_is_preferred_and_runs_scripts(
    start_app: Callable[..., Any],
) -> None:
    if shutil.which("chromium-headless-shell") is None:
        pytest.skip("Debian's chromium-headless-shell is not installed (make install installs it)")
    app: RunningApp = await start_app(render_slots=1)
    job_id = await submit(
        app,
        '<h1 id="t">static</h1><script>document.getElementById("t").textContent = '
        '"written by a script";</script>',
    )
    job = await final_state(app, job_id)
    assert job["status"] == "done"
    async with app.http.get(job["url"]) as resp:
        text = PdfReader(BytesIO(await resp.read())).pages[0].extract_text()
    assert "written by a script" in text
    async with app.http.get(app.url("/readyz")) as resp:
        engine = (await resp.json())["browser"]["engine"]
    assert engine.startswith("headless shell ") and "chromium-headless-shell" in engine
    async with app.http.get(app.url("/metrics")) as resp:
        assert f'pressroom_browser_info{{engine="{engine}"' in await resp.text()
