"""The dashboard's submit form in real Chromium: each source (a stored template chosen from the
select, Markdown, a page served here, an Office file and a Word template made with python-docx,
two PDFs merged, with a thumbnail) ends as a done job in the list whose PDF says what was sent;
a refused field's error shows beside that field; on a phone the list comes first and the form
is one tap away."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import docx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer as SiteServer
from playwright.async_api import Browser, FilePayload, Page
from pypdf import PdfReader
from yarl import URL

from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.e2e.test_dashboard import pdf_text, row
from tests.e2e.test_dashboard_list import wait_count
from tests.integration.test_job_list import insert
from tests.pdfs import FakeRenderer, minimal_pdf

pytestmark = pytest.mark.browser

LIVE = "#conn[data-state=live]"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "dashboard"


def word(text: str) -> bytes:
    """A one-paragraph Word file, made by python-docx."""
    document = docx.Document()
    document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def upload(name: str, mime_type: str, data: bytes) -> FilePayload:
    """A file as the browser's file picker gives it."""
    return {"name": name, "mimeType": mime_type, "buffer": data}


@pytest.fixture
async def site() -> AsyncIterator[str]:
    """A page of a team's own app, on loopback: the URL a page_url job prints."""

    async def page(_request: web.Request) -> web.Response:
        html = "<html><body><h1>Order 77 from the shop</h1><p>Printed as served.</p></body></html>"
        return web.Response(text=html, content_type="text/html")

    app = web.Application()
    app.router.add_get("/order/77", page)
    server = SiteServer(app, host="127.0.0.1")
    await server.start_server()
    yield f"http://127.0.0.1:{server.port}/order/77"
    await server.close()


async def choose(page: Page, source: str) -> None:
    await page.check(f"#job-form input[name=source][value={source}]")


async def submit(page: Page) -> tuple[str, str]:
    """Submit the form; the new job's id and the request's content type."""
    async with page.expect_response(
        lambda r: r.request.method == "POST" and URL(r.url).path == "/v1/jobs"
    ) as answer:
        await page.click("#submit")
    response = await answer.value
    assert response.status == 202, await response.text()
    kind = await response.request.header_value("content-type") or ""
    job_id: str = (await response.json())["id"]
    return job_id, kind


async def done_pdf(page: Page, app: RunningApp, job_id: str) -> bytes:
    """Wait until the row says done, then fetch its file by the link the row offers."""
    link = row(job_id, "done") + " a.download"
    await page.wait_for_selector(link, timeout=120_000)
    href = await page.get_attribute(link, "href")
    assert href is not None
    async with app.http.get(href) as resp:
        assert resp.status == 200 and resp.content_type == "application/pdf"
        return await resp.read()


async def source_cell(page: Page, job_id: str) -> str:
    return await page.inner_text(row(job_id) + " .job-source")


async def keep_screenshot(page: Page, tmp_path: Path, name: str) -> None:
    shot = tmp_path / name
    await page.screenshot(path=str(shot))
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("DOC_SCREENSHOTS") == "1":
        shutil.copyfile(shot, SCREENSHOTS / name)


@pytest.mark.slow  # real Chromium and LibreOffice
@pytest.mark.timeout(420)
async def test_each_source_submitted_from_the_form_ends_done_in_the_list(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    site: str,
    tmp_path: Path,
) -> None:
    app: RunningApp = await start_app(render_slots=1, allow_hosts=("127.0.0.1",))
    for html in ("<h1>Invoice {{ n }} (first)</h1>", "<h1>Invoice {{ n }}, second edition</h1>"):
        body = {"name": "invoice", "html": html, "publish": True}
        async with app.http.post(app.url("/v1/templates"), json=body) as resp:
            assert resp.status == 201, await resp.text()
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)

    # A stored template, one version of it chosen from the select, with a thumbnail.
    await choose(page, "template_id")
    await page.wait_for_selector("#template-id option[value='invoice@1']", state="attached")
    labels = await page.eval_on_selector_all("#template-id option", "o => o.map(x => x.value)")
    assert labels == ["", "invoice", "invoice@2", "invoice@1"], labels
    await page.select_option("#template-id", "invoice@1")
    await page.fill("#data", '{"n": 7}')
    await page.check("#thumbnail")
    stored, kind = await submit(page)
    assert kind.startswith("application/json")
    assert "Invoice 7 (first)" in pdf_text(await done_pdf(page, app, stored))
    assert await source_cell(page, stored) == "invoice@1"
    picture = page.locator(row(stored) + " .job-thumb img")
    await page.wait_for_function("(img) => img.complete", arg=await picture.element_handle())
    assert await picture.evaluate("(img) => img.naturalWidth") == 200
    await page.uncheck("#thumbnail")

    # Markdown, Jinja2 first with the data.
    await choose(page, "markdown")
    await page.fill("#markdown", "# Notes for {{ client }}\n\n- [x] printed")
    await page.fill("#data", '{"client": "Ana"}')
    notes, _ = await submit(page)
    assert "Notes for Ana" in pdf_text(await done_pdf(page, app, notes))
    assert await source_cell(page, notes) == "Markdown"

    # A page the test serves, printed landscape.
    await choose(page, "page_url")
    assert await page.is_hidden("#data"), "a page has no data"
    await page.fill("#page-url", site)
    await page.check("#landscape")
    printed, _ = await submit(page)
    reader = PdfReader(io.BytesIO(await done_pdf(page, app, printed)))
    box = reader.pages[0].mediabox
    assert box.width > box.height, "landscape"
    assert "Order 77 from the shop" in pdf_text(await done_pdf(page, app, printed))
    assert await source_cell(page, printed) == "127.0.0.1"
    await page.uncheck("#landscape")

    # An Office file, sent as the part named office of a multipart body.
    await choose(page, "office")
    office = upload("report.docx", DOCX, word("Quarterly figures"))
    await page.set_input_files("#office", files=[office])
    converted, kind = await submit(page)
    assert kind.startswith("multipart/form-data")
    assert "Quarterly figures" in pdf_text(await done_pdf(page, app, converted))
    assert await source_cell(page, converted) == "Office"

    # A Word template, filled with the data.
    await choose(page, "docx")
    letter = upload("letter.docx", DOCX, word("Dear {{ name }},"))
    await page.set_input_files("#docx", files=[letter])
    await page.fill("#data", '{"name": "Ada Lovelace"}')
    filled, kind = await submit(page)
    assert kind.startswith("multipart/form-data")
    assert "Dear Ada Lovelace," in pdf_text(await done_pdf(page, app, filled))

    # Two PDFs merged in the order chosen, with a thumbnail.
    await choose(page, "pdfs")
    parts = [
        upload("terms.pdf", "application/pdf", minimal_pdf("Terms")),
        upload("annex.pdf", "application/pdf", minimal_pdf("Annex")),
    ]
    await page.set_input_files("#pdfs", files=parts)
    assert await page.inner_text("#pdfs-order") == "terms.pdf\nannex.pdf"
    assert await page.is_hidden("#format") and await page.is_visible("#thumbnail")
    await page.check("#thumbnail")
    merged, kind = await submit(page)
    assert kind.startswith("multipart/form-data")
    reader = PdfReader(io.BytesIO(await done_pdf(page, app, merged)))
    assert [p.extract_text().strip() for p in reader.pages] == ["Terms", "Annex"]
    assert await source_cell(page, merged) == "PDFs"
    await page.locator(row(merged) + " .job-thumb img").wait_for()

    async with app.http.get(app.url(f"/v1/jobs/{merged}")) as resp:
        job = await resp.json()
    assert job["options"].get("thumbnail") == {"width": 200}, job["options"]
    await wait_count(page, "done", 6)
    await keep_screenshot(page, tmp_path, "submit-1280.png")
    assert errors == []
    await page.close()


async def test_a_refused_field_shows_its_error_beside_that_field(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=0)
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)

    async def refused(error_box: str) -> str:
        async with page.expect_response(
            lambda r: r.request.method == "POST" and URL(r.url).path == "/v1/jobs"
        ) as answer:
            await page.click("#submit")
        assert (await answer.value).status == 422
        await page.wait_for_selector(f"{error_box}:not([hidden])")
        text: str = await page.inner_text(error_box)
        return text

    # The server's 422 for a page URL it will not open: beside the URL.
    await choose(page, "page_url")
    await page.fill("#page-url", "file:///etc/passwd")
    assert "http or https" in await refused("#page-url-error")
    assert await page.get_attribute("#page-url", "aria-invalid") == "true"
    assert await page.is_visible("#form-problem")

    # A multipart body's file that is not an Office file: beside the file input.
    await choose(page, "office")
    text_file = upload("notes.txt", "text/plain", b"just text")
    await page.set_input_files("#office", files=[text_file])
    assert "not an Office file" in await refused("#office-error")
    assert await page.is_hidden("#page-url-error"), "another source's error is gone"

    # A file of the PDFs that is not one: named by its file name, beside the PDFs' input.
    await choose(page, "pdfs")
    not_pdf = upload("scan.pdf", "application/pdf", b"not a PDF at all")
    await page.set_input_files(
        "#pdfs", files=[upload("terms.pdf", "application/pdf", minimal_pdf()), not_pdf]
    )
    assert "scan.pdf is not a PDF" in await refused("#pdfs-error")

    # Markdown whose Jinja2 does not parse: beside the Markdown.
    await choose(page, "markdown")
    await page.fill("#markdown", "# {% if %}")
    assert await refused("#markdown-error")

    # Caught before sending: no stored template to choose, data that is not JSON.
    await choose(page, "template_id")
    await page.wait_for_selector("#template-id option:text('No stored templates yet')",
                                 state="attached")  # fmt: skip
    await page.click("#submit")
    assert "Choose a stored template" in await page.inner_text("#template-id-error")
    await choose(page, "template")
    await page.fill("#data", "{not json")
    await page.click("#submit")
    assert "Invalid JSON" in await page.inner_text("#data-error")
    async with app.http.get(app.url("/v1/jobs")) as resp:
        assert (await resp.json())["items"] == [], "no refused job was made"
    await page.close()


async def test_on_a_phone_the_list_comes_first_and_the_form_is_one_tap_away(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
    pool: Any,
    tmp_path: Path,
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    await insert(pool, 12, "done")
    page = await browser.new_page(
        viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True
    )
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)
    await page.wait_for_function("document.querySelectorAll('#jobs tr.job').length === 12")
    # The first screen is the list: its rows, and none of the form.
    first_row = await page.locator("#jobs tr.job").first.bounding_box()
    assert first_row is not None and first_row["y"] + first_row["height"] <= 844
    assert await page.is_hidden("#job-form"), "the form is folded"
    summary = await page.locator("#new-job > summary").bounding_box()
    assert summary is not None and summary["y"] > 844, "below the list"

    # One tap: the form opens where the screen is, and works.
    await page.tap("#new-job-link")
    await page.wait_for_selector("#job-form", state="visible")
    source_box = await page.locator("#job-form .sources").bounding_box()
    assert source_box is not None and 0 <= source_box["y"] < 844
    await choose(page, "markdown")  # as it comes: an invoice from the data as it comes
    await keep_screenshot(page, tmp_path, "submit-390.png")
    job_id, _ = await submit(page)
    await page.wait_for_selector(row(job_id, "done") + " a.download")
    overflow = await page.evaluate(
        "document.documentElement.scrollWidth - document.documentElement.clientWidth"
    )
    assert overflow <= 0, f"the page scrolls sideways by {overflow}px"
    await page.close()
