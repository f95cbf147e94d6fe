"""The dashboard's batches, templates and assets views in real Chromium, at 1280 px and 390 px:
a batch's progress moving live as its items finish (its page and the list), a failed item with
its error and job, the combined file's link; a template's versions, the difference between two,
the editor's live preview (updated after typing, an error beside the field for a broken
template) and saving a new version; the assets with what uses them."""

from __future__ import annotations

import asyncio
import io
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pikepdf
import pytest
from playwright.async_api import Browser, Page
from yarl import URL

from server.keys import POOL
from server.render.sources import Document
from tests.assetfiles import png
from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.e2e.test_dashboard_list import keep_screenshot
from tests.e2e.test_docx import one_line
from tests.e2e.test_job_page import no_sideways_scroll, texts
from tests.e2e.test_office import DOCX
from tests.pdfs import FakeRenderer
from tests.tenants import bearer, made

pytestmark = pytest.mark.browser

WAIT_MS = 20_000
WIDTHS = [1280, 390]
LIVE = "#conn[data-state=live]"


def page_text(html: Document) -> str:
    """What the fake renderer writes into each PDF: the page's text without its tags."""
    return re.sub(r"<[^>]+>", "", str(html)).strip()


class OneAtATime(FakeRenderer):
    """Each render waits until the test lets exactly one more finish."""

    def __init__(self) -> None:
        super().__init__(text_of=page_text)
        self.allowed = asyncio.Semaphore(0)

    async def render(self, html: Document, options: Any, **kwargs: Any) -> Any:
        self.started.set()
        await self.allowed.acquire()
        return await super().render(html, options, **kwargs)


async def open_page(browser: Browser, width: int) -> tuple[Page, list[str]]:  # noqa: F811
    page = await browser.new_page(
        viewport={"width": width, "height": 1000 if width > 500 else 844}, is_mobile=width < 500
    )
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    # A refused request is logged by the browser itself; a script's own error is not that.
    page.on(
        "console",
        lambda m: (
            errors.append(m.text)
            if m.type == "error" and not m.text.startswith("Failed to load resource")
            else None
        ),
    )
    return page, errors


async def post(app: RunningApp, path: str, body: Any) -> dict[str, Any]:
    async with app.http.post(app.url(path), json=body) as resp:
        answer: dict[str, Any] = await resp.json()
        assert resp.status in (200, 201, 202), answer
        return answer


def suffix(width: int) -> str:
    return f"{width}.png"


@pytest.mark.timeout(150)
@pytest.mark.parametrize("width", WIDTHS)
async def test_a_batch_moves_live_as_its_items_finish_then_offers_its_combined_file(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    width: int,
    tmp_path: Path,
) -> None:
    renderer = OneAtATime()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    items = [
        {"key": f"statement-{who}", "template": "<p>Statement of {{who}}</p>", "data": {"who": who}}
        for who in ("ana", "bo", "cy")
    ]
    failing = await post(
        app,
        "/v1/batches",
        {"items": [{"key": "broken", "template": "<p>{{ 1 // 0 }}</p>"}, *items[:1]]},
    )
    renderer.allowed.release()  # its good item
    batch = await post(app, "/v1/batches", {"items": items[1:], "combine": True})

    listing, list_errors = await open_page(browser, width)
    await listing.goto(app.url("/batches"))
    await listing.wait_for_selector(LIVE, timeout=WAIT_MS)
    row = f"tr.batch[data-batch-id='{batch['id']}']"
    await listing.wait_for_selector(row, timeout=WAIT_MS)
    assert await listing.eval_on_selector_all(
        "tr.batch", "rows => rows.map(r => r.dataset.batchId)"
    ) == [batch["id"], failing["id"]], "newest first"
    assert await listing.inner_text(f"{row} .meter-text") == "0 %"

    page, errors = await open_page(browser, width)
    await page.goto(app.url(f"/batches/{batch['id']}"))
    await page.wait_for_selector(LIVE, timeout=WAIT_MS)
    assert await page.inner_text("#batch-id") == batch["id"]
    assert await page.inner_text("#batch-percent") == "0 %"
    assert await page.get_attribute("#combined", "data-status") == "pending"

    # One item finishes: the page and the list move, each from the stream alone.
    renderer.allowed.release()
    await page.wait_for_function(
        "document.getElementById('batch-percent').textContent === '50 %'", timeout=WAIT_MS
    )
    await listing.wait_for_function(
        f"document.querySelector(\"{row} .meter-text\").textContent === '50 %'", timeout=WAIT_MS
    )
    assert await page.get_attribute("#batch-progress", "aria-valuenow") == "50"
    assert await page.get_attribute("#batch-counts li[data-state=done]", "data-n") == "1"
    await no_sideways_scroll(listing)
    await keep_screenshot(listing, tmp_path, f"batches-{suffix(width)}")

    renderer.allowed.release()
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    await page.wait_for_selector("#combined-link", timeout=WAIT_MS)
    assert await page.inner_text("#batch-percent") == "100 %"
    assert await page.get_attribute("#combined", "data-status") == "done"
    href = await page.get_attribute("#combined-link", "href")
    assert href is not None
    async with app.http.get(href) as resp:
        assert resp.status == 200 and resp.content_type == "application/pdf"
        combined = await resp.read()
    with pikepdf.open(io.BytesIO(combined)) as pdf:
        assert len(pdf.pages) == 2
    assert re.search(r"Pages\s+2\b", await page.inner_text("#combined"))
    assert await page.is_visible("#failures-empty")
    assert await texts(page, "#items tr.item td:nth-child(3)") == ["done", "done"]
    await no_sideways_scroll(page)
    await keep_screenshot(page, tmp_path, f"batch-{suffix(width)}")
    await listing.wait_for_selector(f"{row}[data-status=done]", timeout=WAIT_MS)

    # The batch with a failed item: its error, and a link to its job's page.
    await page.goto(app.url(f"/batches/{failing['id']}"))
    failure = "#failures li.failure[data-key=broken]"
    await page.wait_for_selector(failure, timeout=WAIT_MS)
    assert "ZeroDivisionError" in await page.inner_text(f"{failure} .error-text")
    job_href = await page.get_attribute(f"{failure} a.job-link", "href")
    [broken] = [i for i in failing["items"] if i["key"] == "broken"]
    assert job_href == f"/jobs/{broken['job_id']}"
    assert await page.inner_text("#combined") == "This batch asked for no combined file (combine)."
    await page.click(f"{failure} a.job-link")
    await page.wait_for_selector("body[data-status=failed]", timeout=WAIT_MS)
    assert errors == [] and list_errors == []


@pytest.mark.timeout(150)
@pytest.mark.parametrize("width", WIDTHS)
async def test_a_templates_versions_their_difference_and_the_editors_live_preview(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    width: int,
    tmp_path: Path,
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(text_of=page_text), render_slots=1)
    first = {
        "name": "invoice",
        "html": "<h1>Invoice</h1>\n<p>For {{customer}}</p>\n<p>Thank you.</p>",
        "options": {"format": "A5"},
        "sample_data": {"customer": "Sample Co"},
    }
    await post(app, "/v1/templates", first)
    second = {
        **first,
        "html": "<h1>Invoice</h1>\n<p>Billed to {{customer}}</p>\n<p>Thank you.</p>",
        "sample_data": {"customer": "Acme Ltd"},
    }
    await post(app, "/v1/templates", second)
    await post(app, "/v1/templates", {"name": "letter", "html": "<p>Dear {{who}}</p>"})

    page, errors = await open_page(browser, width)
    previews: list[str] = []
    page.on("request", lambda r: previews.append(r.url) if r.url.endswith("/preview") else None)
    await page.goto(app.url("/templates"))
    await page.wait_for_selector("tr.template[data-name=invoice]", timeout=WAIT_MS)
    assert await texts(page, "tr.template td:first-child") == ["invoice", "letter"]
    await keep_screenshot(page, tmp_path, f"templates-{suffix(width)}")
    await page.click("tr.template[data-name=invoice] a")
    await page.wait_for_url(app.url("/templates/invoice"))

    # The versions, newest first, and the difference from the one before (the default).
    await page.wait_for_selector("tr.version[data-version='1']", timeout=WAIT_MS)
    versions = await page.eval_on_selector_all("tr.version", "rs => rs.map(r => r.dataset.version)")
    assert versions == ["2", "1"]
    html_diff = "#diff [data-part=html]"
    await page.wait_for_selector(f"{html_diff} .diff", timeout=WAIT_MS)
    assert await texts(page, f"{html_diff} li.line-removed .text") == ["<p>For {{customer}}</p>"]
    assert await texts(page, f"{html_diff} li.line-added .text") == [
        "<p>Billed to {{customer}}</p>"
    ]
    assert "the same" in await page.inner_text("#diff [data-part=options] h3")
    assert await texts(page, "#diff [data-part=sample-data] li.line-added .text") == [
        '"customer": "Acme Ltd"'
    ]
    # Any two versions: the same one twice differs nowhere.
    await page.select_option("#diff-from", "2")
    await page.wait_for_function(
        "!document.querySelector('#diff [data-part=html] .diff')", timeout=WAIT_MS
    )

    # The editor starts from the latest version, its preview rendered from the sample data.
    await page.wait_for_selector("#preview[data-state=shown]", timeout=WAIT_MS)
    assert await page.input_value("#edit-html") == second["html"]
    assert "Billed to Acme Ltd" in await preview_text(page)
    assert "1 page" in await page.inner_text("#preview-status")
    shown = await page.get_attribute("#preview", "data-seq")

    # Typing: one preview once the typing stops, not one per key.
    requests_before = len(previews)
    await page.fill("#edit-html", "<h1>Receipt</h1>\n<p>Paid by ")
    await page.locator("#edit-html").press_sequentially("{{customer}}</p>", delay=15)
    await page.wait_for_function(
        f"document.getElementById('preview').dataset.seq !== '{shown}' && "
        "document.getElementById('preview').dataset.state === 'shown'",
        timeout=WAIT_MS,
    )
    assert "Paid by Acme Ltd" in await preview_text(page)
    assert len(previews) - requests_before <= 3, previews

    # A broken template: the error beside the HTML, the last good preview kept.
    await page.fill("#edit-html", "<p>{{ customer </p>")
    await page.wait_for_selector("#edit-html-error:not([hidden])", timeout=WAIT_MS)
    assert "template" in (await page.inner_text("#edit-html-error")).lower()
    assert await page.get_attribute("#edit-html", "aria-invalid") == "true"
    assert await page.get_attribute("#preview", "data-state") == "error"
    # Sample data that is no JSON is told beside its field, and nothing is sent.
    await page.fill("#edit-html", "<p>Receipt for {{customer}}</p>")
    await page.fill("#edit-data", '{"customer": ')
    await page.wait_for_selector("#edit-data-error:not([hidden])", timeout=WAIT_MS)
    await page.fill("#edit-data", '{"customer": "Bo"}')
    await page.wait_for_function(
        "document.getElementById('preview').dataset.state === 'shown'", timeout=WAIT_MS
    )
    assert "Receipt for Bo" in await preview_text(page)
    assert await page.is_hidden("#edit-html-error") and await page.is_hidden("#edit-data-error")
    await no_sideways_scroll(page)
    await page.select_option("#diff-from", "1")
    await page.wait_for_selector(f"{html_diff} .diff", timeout=WAIT_MS)
    await keep_screenshot(page, tmp_path, f"template-{suffix(width)}", "html")

    # Save as new version: stored as version 3, with the version's options, listed first.
    await page.click("#save")
    await page.wait_for_function(
        "document.getElementById('save-status').textContent === 'Saved as version 3.'",
        timeout=WAIT_MS,
    )
    assert await page.eval_on_selector_all(
        "tr.version", "rs => rs.map(r => r.dataset.version)"
    ) == ["3", "2", "1"]
    async with app.http.get(app.url("/v1/templates/invoice@3")) as resp:
        stored = await resp.json()
    assert stored["html"] == "<p>Receipt for {{customer}}</p>"
    assert stored["sample_data"] == {"customer": "Bo"}
    assert stored["options"]["format"] == "A5"
    assert errors == [], errors


async def preview_text(page: Page) -> str:
    """The text of the PDF the preview pane shows (read back from its blob: URL)."""
    text: str = await page.evaluate(
        "fetch(document.getElementById('preview-frame').src).then(r => r.text())"
    )
    assert text.startswith("%PDF-")
    return text


@pytest.mark.timeout(120)
@pytest.mark.parametrize("width", WIDTHS)
async def test_the_assets_with_what_uses_them(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    width: int,
    tmp_path: Path,
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()  # jobs stay in flight while the page is read
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    uploaded = []
    for data in (png((200, 40, 40)), png((40, 40, 200), width=64, height=64)):
        async with app.http.post(
            app.url("/v1/assets"), data=data, headers={"Content-Type": "image/png"}
        ) as resp:
            assert resp.status == 201
            uploaded.append(await resp.json())
    logo, spare = uploaded
    mapped = {"img/logo.png": logo["id"]}
    await post(app, "/v1/templates", {"name": "invoice", "html": "<img src='img/logo.png'>",
                                      "assets": mapped})  # fmt: skip
    job = await post(app, "/v1/jobs", {"template": "<img src='img/logo.png'>", "assets": mapped})

    page, errors = await open_page(browser, width)
    await page.goto(app.url("/assets"))
    row = f"tr.asset[data-asset-id='{logo['id']}']"
    await page.wait_for_selector(row, timeout=WAIT_MS)
    assert await page.get_attribute(row, "data-template-versions") == "1"
    assert await page.get_attribute(row, "data-jobs-in-flight") == "1"
    assert await page.inner_text(f"{row} .template-users li") == "invoice@1 as img/logo.png"
    assert await page.get_attribute(f"{row} .template-users a", "href") == "/templates/invoice"
    assert await page.get_attribute(f"{row} .job-users a", "href") == f"/jobs/{job['id']}"
    assert "image/png" in await page.inner_text(row)
    assert f"{logo['size']} B" in await page.inner_text(row)
    other = f"tr.asset[data-asset-id='{spare['id']}']"
    assert await page.get_attribute(other, "data-jobs-in-flight") == "0"
    assert "stored of" in await page.inner_text("#quota")
    content = await page.get_attribute(f"{row} a.asset-link", "href")
    assert content is not None and URL(content).path == f"/v1/assets/{logo['id']}/content"
    await no_sideways_scroll(page)
    await keep_screenshot(page, tmp_path, f"assets-{suffix(width)}")
    renderer.gate.set()
    assert errors == [], errors


async def test_a_word_templates_version_shows_its_kind_and_no_html_editor(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(text_of=page_text), render_slots=1)
    await post(app, "/v1/templates", {"name": "letter", "html": "<p>Dear {{who}}</p>",
                                      "sample_data": {"who": "Ana"}})  # fmt: skip
    async with app.http.post(
        app.url("/v1/assets"), data=one_line("Dear {{ who }}"), headers={"Content-Type": DOCX}
    ) as resp:
        assert resp.status == 201
        word = (await resp.json())["id"]
    await post(app, "/v1/templates", {"name": "letter", "docx": word, "sample_data": {"who": "Bo"}})

    page, errors = await open_page(browser, 1280)
    await page.goto(app.url("/templates/letter"))
    await page.wait_for_selector("#docx-note:not([hidden])", timeout=WAIT_MS)
    assert await page.get_attribute("tr.version[data-version='2']", "data-kind") == "docx"
    assert await page.inner_text("tr.version[data-version='2'] .kind") == "DOCX"
    assert word in await page.inner_text("#docx-note")
    assert await page.is_hidden("#editor")
    html_diff = "#diff [data-part=html]"
    await page.wait_for_selector(f"{html_diff} .diff", timeout=WAIT_MS)
    assert await texts(page, f"{html_diff} li.line-added .text") == [f"(Word template {word})"]
    # The HTML version before it opens in the editor, with its preview.
    await page.click("tr.version[data-version='1'] button.edit-version")
    await page.wait_for_selector("#preview[data-state=shown]", timeout=WAIT_MS)
    assert await page.is_hidden("#docx-note")
    assert "Dear Ana" in await preview_text(page)
    assert errors == [], errors


@pytest.mark.timeout(120)
async def test_with_keys_the_views_ask_the_key_once_and_stream_with_a_token(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    renderer = OneAtATime()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1)
    key, _ = await made(app.app[POOL], "acme")
    async with app.http.post(
        app.url("/v1/batches"),
        json={"items": [{"key": "k-1", "template": "<p>one</p>"}]},
        headers=bearer(key),
    ) as resp:
        assert resp.status == 202, await resp.text()
        batch = await resp.json()

    context = await browser.new_context()
    page = await context.new_page()
    streams: list[URL] = []
    page.on("request", lambda r: streams.append(URL(r.url)) if "/events" in r.url else None)
    await page.goto(app.url(f"/batches/{batch['id']}"))
    # Without a token the page asks for the key (static/session.js), then goes on with it.
    await page.wait_for_selector("dialog.key-dialog[open]", timeout=WAIT_MS)
    await page.fill("#key-dialog-input", key)
    await page.keyboard.press("Enter")
    await page.wait_for_selector(LIVE, timeout=WAIT_MS)
    assert await page.inner_text("#batch-id") == batch["id"]
    renderer.allowed.release()
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    assert streams and all("token" in url.query for url in streams), streams
    assert all(key not in str(url) for url in streams), "the key never goes in a URL"
    # The tab keeps its token: the other views ask for nothing more.
    await page.goto(app.url("/assets"))
    await page.wait_for_selector("#assets-empty:not([hidden])", timeout=WAIT_MS)
    assert await page.is_hidden("#notice") and not await page.is_visible("dialog.key-dialog")
    await context.close()
