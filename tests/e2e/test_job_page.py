"""The job page (/jobs/{id}) in real Chromium, at 1280 px and 390 px: a running job goes live to
done, its timeline with phases, its PDF in the browser's viewer from the signed URL, its webhook
deliveries with their status codes, and delivering one again; an attempt's warnings and its
finishing step, an image job's image, and a batch item's link to its batch."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from playwright.async_api import Browser, Page
from yarl import URL

from server.keys import POOL
from server.render.chromium import RenderResult
from tests.browser import browser  # noqa: F401 (fixture)
from tests.integration.test_webhooks import (  # noqa: F401 (fixtures)
    SECRET,
    Receiver,
    StartHooked,
    receiver,
    start_hooked,
    verify,
)
from tests.pdfs import FakeRenderer
from tests.tenants import bearer, made

pytestmark = pytest.mark.browser

WAIT_MS = 20_000
#: Where the docs' screenshots are written when DOC_SCREENSHOTS=1 (docs/dashboard.md).
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "dashboard"


async def no_sideways_scroll(page: Page) -> None:
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow} px"


async def texts(page: Page, selector: str) -> list[str]:
    found: list[str] = await page.eval_on_selector_all(
        selector, "nodes => nodes.map(n => n.textContent.trim())"
    )
    return found


@pytest.mark.timeout(120)
@pytest.mark.parametrize("width", [1280, 390])
async def test_a_running_job_goes_live_to_done_with_its_story(
    start_hooked: StartHooked,  # noqa: F811
    receiver: Receiver,  # noqa: F811
    browser: Browser,  # noqa: F811
    width: int,
    tmp_path: Path,
) -> None:
    receiver.script = [500]  # the first delivery fails, the retry is delivered
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    hooked = await start_hooked(renderer)
    options = {"thumbnail": {"width": 200}}
    job = await hooked.submit(receiver.url, data={"name": "Ana"}, options=options)
    await asyncio.wait_for(renderer.started.wait(), 10)
    errors: list[str] = []
    page = await browser.new_page(viewport={"width": width, "height": 900}, is_mobile=width < 500)
    page.on("pageerror", lambda error: errors.append(str(error)))

    await page.goto(hooked.app.url(f"/jobs/{job['id']}"))
    await page.wait_for_selector("body[data-status=running]", timeout=WAIT_MS)
    await page.wait_for_selector("#conn[data-state=live]", timeout=WAIT_MS)
    assert await page.inner_text("#job-id") == job["id"]
    assert await page.get_attribute("tr.attempt", "data-outcome") == "running"
    assert not await page.is_visible("#pdf")

    renderer.gate.set()  # the render ends: the page follows the stream to done
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    await page.wait_for_selector("#conn[data-state=ended]", timeout=WAIT_MS)
    types = await page.eval_on_selector_all("#timeline li", "ns => ns.map(n => n.dataset.type)")
    assert types == ["job.queued", "job.running", "job.done"]
    phases = await page.eval_on_selector_all("#phases li", "ns => ns.map(n => n.dataset.phase)")
    assert phases == ["queued", "running"]
    # The attempt's time in each step of its worker: a bar and the figures, inside the screen.
    steps = "tr.attempt-phases[data-attempt='1'] li.step"
    await page.wait_for_selector(steps, timeout=WAIT_MS)
    shown = await page.eval_on_selector_all(
        steps, "ns => ns.map(n => [n.dataset.step, Number(n.dataset.seconds), n.textContent])"
    )
    assert {"template", "render", "store"} <= {step for step, _, _ in shown}, shown
    assert all(seconds >= 0 and step in text for step, seconds, text in shown), shown
    visible = await page.locator("#attempts").locator("xpath=ancestor::div[1]").bounding_box()
    assert visible is not None
    for box in [await item.bounding_box() for item in await page.query_selector_all(steps)]:
        assert box is not None and box["width"] > 0, box
        right = visible["x"] + visible["width"]
        assert visible["x"] <= box["x"] and box["x"] + box["width"] <= right, (box, visible)
    assert await page.is_visible("tr.attempt-phases[data-attempt='1'] .step-bar")
    assert await page.inner_text("#progress-text") == "100 %"
    assert '"name": "Ana"' in await page.inner_text("#data")

    # The browser's own PDF viewer, from the job's signed URL; and the thumbnail.
    source = await page.get_attribute("iframe#pdf", "src")
    assert source is not None
    signed = URL(source)
    assert signed.path == f"/v1/jobs/{job['id']}/pdf" and "sig" in signed.query
    async with hooked.app.http.get(hooked.app.url(signed.path_qs)) as resp:
        assert resp.status == 200 and resp.content_type == "application/pdf"
        assert (await resp.read()).startswith(b"%PDF-")
    assert "sig=" in (await page.get_attribute("#thumbnail", "src") or "")

    # The delivery: refused once, then delivered; the page reads it again while it is pending.
    delivery = "li.delivery[data-status=delivered]"
    await page.wait_for_selector(delivery, timeout=WAIT_MS)
    codes = await page.eval_on_selector_all(
        f"{delivery} li.try", "ns => ns.map(n => n.dataset.statusCode)"
    )
    assert codes == ["500", "200"]
    await no_sideways_scroll(page)

    # Deliver again: the same message, signed, and its try shown.
    first = receiver.received[-1]
    await page.click(f"{delivery} button.redeliver")
    await page.wait_for_selector(
        "li.delivery[data-status=delivered] li.try:nth-child(3)", timeout=WAIT_MS
    )
    again = receiver.received[-1]
    assert len(receiver.received) == 3
    assert again.headers["webhook-id"] == first.headers["webhook-id"]
    assert verify(SECRET, again.headers, again.body)["type"] == "job.done"
    assert await texts(page, "li.try strong") == ["500", "200", "200"]
    assert await page.is_hidden("#notice")
    assert errors == []
    # What docs/dashboard/job-page.png (1280) and job-page-390.png show.
    name = "job-page.png" if width == 1280 else f"job-page-{width}.png"
    await page.screenshot(path=str(tmp_path / name), full_page=True)
    assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("DOC_SCREENSHOTS") == "1":
        shutil.copyfile(tmp_path / name, SCREENSHOTS / name)


async def test_an_unknown_job_says_so(
    start_hooked: StartHooked,  # noqa: F811
    browser: Browser,  # noqa: F811
) -> None:
    hooked = await start_hooked(FakeRenderer())
    page = await browser.new_page()
    await page.goto(hooked.app.url("/jobs/00000000-0000-0000-0000-000000000000"))
    await page.wait_for_selector("#notice:not([hidden])", timeout=WAIT_MS)
    assert "No job 00000000-0000-0000-0000-000000000000" in await page.inner_text("#notice")
    assert await page.get_attribute("#conn", "data-state") == "ended"


async def test_a_stored_template_job_and_a_pdfs_job_say_what_they_were_made_from(
    start_hooked: StartHooked,  # noqa: F811
    browser: Browser,  # noqa: F811
) -> None:
    from tests.integration.test_pdf_operations import run_job, upload
    from tests.pdfmaking import text_pdf

    hooked = await start_hooked(FakeRenderer())
    app = hooked.app
    template = {"name": "invoice", "html": "<p>{{ n }}</p>", "publish": True}
    async with app.http.post(app.url("/v1/templates"), json=template) as resp:
        assert resp.status == 201, await resp.text()
    printed, _ = await run_job(app, {"template_id": "invoice", "data": {"n": 1}})
    terms = await upload(app, text_pdf(["terms"]))
    merged, _ = await run_job(app, {"pdfs": ["terms.pdf"], "assets": {"terms.pdf": terms}})
    page = await browser.new_page()

    await page.goto(app.url(f"/jobs/{printed['id']}"))
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    assert "Template invoice@1" in await texts(page, "#facts dd")
    await page.click("a.template-link")
    await page.wait_for_url("**/templates/invoice", timeout=WAIT_MS)

    await page.goto(app.url(f"/jobs/{merged['id']}"))
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    facts = await texts(page, "#facts dd")
    assert "PDFs" in facts and f"terms.pdf ({terms[:19]}…)" in facts, facts


class Warns(FakeRenderer):
    """Every render notices something it does not fail on, as a preflight check would."""

    WARNING = "missing_glyph: no font has U+0950 (page 1)"

    async def render(self, html: Any, options: Any, **kwargs: Any) -> RenderResult:
        result = await super().render(html, options, **kwargs)
        return dataclasses.replace(result, warnings=[self.WARNING])


async def test_an_attempts_warnings_and_finishing_an_image_and_a_batch_item_are_shown(
    start_hooked: StartHooked,  # noqa: F811
    browser: Browser,  # noqa: F811
) -> None:
    from tests.integration.test_pdf_operations import run_job

    hooked = await start_hooked(Warns())
    app = hooked.app
    stamp = {"stamp": {"text": "PAID"}}  # a finishing step
    stamped, _ = await run_job(app, {"template": "<p>x</p>", "options": stamp})
    image, png = await run_job(app, {"template": "<p>x</p>", "options": {"output": "png"}})
    assert png is not None and png.startswith(b"\x89PNG")
    async with app.http.post(
        app.url("/v1/batches"), json={"items": [{"key": "march", "template": "<p>m</p>"}]}
    ) as resp:
        assert resp.status in (200, 201, 202), await resp.text()
        batch = await resp.json()
    [item] = batch["items"]
    await hooked.wait_final(item["job_id"])
    page = await browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    # The attempt's warning beside it, and the time of its finishing step (the stamp).
    await page.goto(app.url(f"/jobs/{stamped['id']}"))
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    assert await texts(page, "tr.attempt .attempt-notes .warning") == [Warns.WARNING]
    finishing = "tr.attempt-phases[data-attempt='1'] li.step[data-step=finishing]"
    assert await page.is_visible(finishing)
    assert float(await page.get_attribute(finishing, "data-seconds") or "-1") >= 0
    assert "finishing" in await page.inner_text(finishing)

    # An image job shows its image (from its signed URL), not a PDF frame.
    await page.goto(app.url(f"/jobs/{image['id']}"))
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    shown = page.locator("img#image")
    await shown.wait_for(timeout=WAIT_MS)
    await page.wait_for_function("img => img.complete", arg=await shown.element_handle())
    assert await shown.evaluate("img => img.naturalWidth") > 0
    assert URL(await shown.get_attribute("src") or "").path == f"/v1/jobs/{image['id']}/pdf"
    assert await page.locator("#pdf").count() == 0

    # A batch's item links to its batch's page.
    await page.goto(app.url(f"/jobs/{item['job_id']}"))
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    link = page.locator("a.batch-link")
    await link.wait_for(timeout=WAIT_MS)
    assert await link.get_attribute("href") == f"/batches/{batch['id']}"
    assert "march" in await link.inner_text()
    await link.click()
    await page.wait_for_url(f"**/batches/{batch['id']}", timeout=WAIT_MS)
    await page.wait_for_function(
        f"document.getElementById('batch-id').textContent === '{batch['id']}'", timeout=WAIT_MS
    )
    assert errors == []


async def test_with_keys_the_page_asks_the_key_once_and_streams_with_a_token(
    start_hooked: StartHooked,  # noqa: F811
    browser: Browser,  # noqa: F811
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    hooked = await start_hooked(renderer)
    app = hooked.app
    key, _ = await made(app.app[POOL], "acme")
    async with app.http.post(
        app.url("/v1/jobs"), json={"template": "<p>a</p>"}, headers=bearer(key)
    ) as resp:
        assert resp.status == 202, await resp.text()
        job_id = (await resp.json())["id"]
    await asyncio.wait_for(renderer.started.wait(), 10)

    context = await browser.new_context()
    page = await context.new_page()
    streams: list[URL] = []
    page.on("request", lambda r: streams.append(URL(r.url)) if "/events" in r.url else None)
    await page.goto(app.url(f"/jobs/{job_id}"))
    # Without a token the page asks for the key (static/session.js), then goes on with it.
    await page.wait_for_selector("dialog.key-dialog[open]", timeout=WAIT_MS)
    await page.fill("#key-dialog-input", key)
    await page.keyboard.press("Enter")
    await page.wait_for_selector("#conn[data-state=live]", timeout=WAIT_MS)
    renderer.gate.set()
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    assert streams and all("token" in url.query for url in streams), streams
    assert all(key not in str(url) for url in streams), "the key never goes in a URL"
    await context.close()
