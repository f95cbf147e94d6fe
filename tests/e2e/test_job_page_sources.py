"""The dashboard knows the new sources, in real Chromium: the job page of an office, a docx and a
pdfs job says its source, its files and what its finishing did (the document information read
back from the finished PDF, compress's sizes before and after), as the job's JSON has them; and
the submit form takes finishing options as JSON, merged with its own, its errors beside it."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import pytest
from aiohttp import FormData
from playwright.async_api import Browser, Page
from pypdf import PdfReader
from yarl import URL

from tests.browser import browser  # noqa: F401 (fixture)
from tests.conftest import RunningApp
from tests.e2e.test_dashboard_submit import LIVE, choose, submit, upload
from tests.e2e.test_office import DOCX, finished, word
from tests.pdfmaking import text_pdf
from tests.pdfs import FakeRenderer

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # LibreOffice's start

WAIT_MS = 60_000


async def facts(page: Page) -> dict[str, str]:
    """The job page's facts, each name with its value's text (the outer list only)."""
    found: dict[str, str] = await page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll("#facts > dt")].map(
             (dt) => [dt.textContent, dt.nextElementSibling.textContent]))"""
    )
    return found


async def document_information(page: Page) -> dict[str, str]:
    found: dict[str, str] = await page.evaluate(
        """() => Object.fromEntries([...document.querySelectorAll("#finishing-metadata > dt")]
             .map((dt) => [dt.textContent, dt.nextElementSibling.textContent]))"""
    )
    return found


async def open_done(page: Page, app: RunningApp, job_id: str) -> None:
    await page.goto(app.url(f"/jobs/{job_id}"))
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)


async def shows_finishing(page: Page, job: dict[str, Any]) -> None:
    """The page shows the job's finishing as its JSON has it: every key of the document
    information with its value, and compress's two sizes."""
    report = job["finishing"]
    assert await document_information(page) == report["metadata"]
    sizes = page.locator("#finishing-compress")
    before, after = report["compress"]["bytes_before"], report["compress"]["bytes_after"]
    assert await sizes.get_attribute("data-before") == str(before)
    assert await sizes.get_attribute("data-after") == str(after)
    assert (await sizes.inner_text()).startswith(f"{before} → {after} bytes")


async def send(app: RunningApp, part: str, name: str, data: bytes, job: dict[str, Any]) -> Any:
    """A multipart job: the file as the part `part`, the job's fields beside it."""
    form = FormData()
    form.add_field(part, data, filename=name, content_type=DOCX)
    form.add_field("job", json.dumps(job), content_type="application/json")
    async with app.http.post(app.url("/v1/jobs"), data=form) as resp:
        return await finished(app, resp)


async def test_the_job_page_shows_the_source_files_and_finishing_of_each_new_source(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    finishing: dict[str, Any] = {"compress": {}}
    office, _ = await send(
        app,
        "office",
        "report.docx",
        word(2, title="Quarterly report"),
        {"options": {**finishing, "metadata": {"Department": "Finance"}}},
    )
    letter, _ = await send(
        app,
        "docx",
        "letter.docx",
        word(1, title="Letter to {{ name }}"),
        {"data": {"name": "Ana"}, "options": {**finishing, "author": "Pressroom"}},
    )
    pdfs: list[str] = []
    for text in ("Terms", "Annex"):
        async with app.http.post(
            app.url("/v1/assets"),
            data=text_pdf([text]),
            headers={"Content-Type": "application/pdf"},
        ) as resp:
            pdfs.append((await resp.json())["id"])
    body = {
        "pdfs": ["terms.pdf", pdfs[1]],
        "assets": {"terms.pdf": pdfs[0]},
        "options": {**finishing, "title": "Contract 42", "metadata": {"Department": "Sales"}},
    }
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        merged, _ = await finished(app, resp)
    for job in (office, letter, merged):
        assert job["status"] == "done", job

    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    await open_done(page, app, office["id"])
    shown = await facts(page)
    assert shown["Source"] == "Office file"
    assert shown["Files"].startswith("report.docx (sha256:"), shown
    await shows_finishing(page, office)
    information = await document_information(page)
    assert information["Title"] == "Quarterly report", "the document's own title, kept"
    assert information["Department"] == "Finance"

    await open_done(page, app, letter["id"])
    shown = await facts(page)
    assert shown["Source"] == "Word template" and shown["Files"].startswith("letter.docx (")
    await shows_finishing(page, letter)
    information = await document_information(page)
    assert information["Title"] == "Letter to Ana" and information["Author"] == "Pressroom"

    await open_done(page, app, merged["id"])
    shown = await facts(page)
    assert shown["Source"] == "PDFs"
    assert shown["Files"] == f"terms.pdf ({pdfs[0][:19]}…), {pdfs[1]}", shown
    await shows_finishing(page, merged)
    information = await document_information(page)
    assert information["Title"] == "Contract 42" and information["Department"] == "Sales"
    assert errors == []
    await page.close()


async def test_the_form_sends_finishing_options_given_as_json_and_shows_their_errors(
    start_app: Callable[..., Any],
    browser: Browser,  # noqa: F811
) -> None:
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    page = await browser.new_page(viewport={"width": 1280, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    await page.goto(app.url("/"))
    await page.wait_for_selector(LIVE)
    await choose(page, "pdfs")
    files = [
        upload("terms.pdf", "application/pdf", text_pdf(["Terms"])),
        upload("annex.pdf", "application/pdf", text_pdf(["Annex"])),
    ]
    await page.set_input_files("#pdfs", files=files)
    assert await page.is_visible("#options-json")

    # Not JSON, or not an object: said beside the field, and nothing is sent.
    for text, said in (("{select_pages", "Invalid JSON"), ("[1]", "must be a JSON object")):
        await page.fill("#options-json", text)
        await page.click("#submit")
        assert said in await page.inner_text("#options-json-error")
        assert await page.get_attribute("#options-json", "aria-invalid") == "true"
    async with app.http.get(app.url("/v1/jobs")) as resp:
        assert (await resp.json())["items"] == [], "nothing was sent"

    # An option the server refuses: its message beside the field, naming the option.
    await page.fill("#options-json", '{"rotate": {"degrees": 45}}')
    async with page.expect_response(
        lambda r: r.request.method == "POST" and URL(r.url).path == "/v1/jobs"
    ) as answer:
        await page.click("#submit")
    assert (await answer.value).status == 422
    await page.wait_for_selector("#options-json-error:not([hidden])")
    said = await page.inner_text("#options-json-error")
    assert said.startswith("options.rotate.degrees: ") and "multiple of 90" in said, said

    # Finishing options, merged with the form's own (the thumbnail).
    options = {"select_pages": "2,1", "metadata": {"Department": "Sales"}, "compress": {}}
    await page.fill("#options-json", json.dumps(options))
    assert await page.is_hidden("#options-json-error"), "typing clears the error"
    await page.check("#thumbnail")
    job_id, kind = await submit(page)
    assert kind.startswith("multipart/form-data")
    await page.click(f"#form-status a[href='/jobs/{job_id}']")
    await page.wait_for_selector("body[data-status=done]", timeout=WAIT_MS)
    async with app.http.get(app.url(f"/v1/jobs/{job_id}")) as resp:
        job = await resp.json()
    assert job["options"] == {**options, "thumbnail": {"width": 200}}, job["options"]
    async with app.http.get(job["url"]) as resp:
        pages = PdfReader(io.BytesIO(await resp.read())).pages
        assert [p.extract_text().strip() for p in pages] == ["Annex", "Terms"]
    await shows_finishing(page, job)
    assert (await document_information(page))["Department"] == "Sales"
    assert errors == []
    await page.close()
