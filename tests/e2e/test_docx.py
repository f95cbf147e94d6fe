"""Word templates through real docxtpl and LibreOffice: .docx files made here with python-docx
whose text carries Jinja are filled with a job's data (a table row per item, a condition, a
header, an image from an asset) and converted; pypdf reads the text back and pikepdf finds the
image on the page. Stored DOCX templates keep versions and take data only; a Jinja syntax error
and a non-docx file are refused at submission, an endless loop fails the job for good with the
sandbox's message, and a batch item may be a Word template."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from typing import Any

import docx
import pikepdf
import pytest
from aiohttp import FormData
from PIL import Image

from server.files import office_formats
from tests.conftest import RunningApp
from tests.e2e.test_office import DOCX, convert, corrupt_word, finished, upload, workbook
from tests.e2e.test_render import pdf_text
from tests.integration.test_batches import all_events, post_batch, read_until
from tests.integration.test_combine import batch_done, download
from tests.pdfs import FakeRenderer

pytestmark = pytest.mark.slow  # each app starts its LibreOffice (about 2 s)


def saved(document: Any) -> bytes:
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def invoice(title: str = "Invoice") -> bytes:
    """A Word template: a header, a greeting, a table with a row per item, a condition."""
    document = docx.Document()
    document.sections[0].header.paragraphs[0].text = "{{ company }} - invoice {{ number }}"
    document.add_heading(title, level=1)
    document.add_paragraph("Dear {{ customer.name }},")
    table = document.add_table(rows=4, cols=2)
    table.rows[0].cells[0].text = "Item"
    table.rows[0].cells[1].text = "Quantity"
    table.rows[1].cells[0].text = "{%tr for item in items %}"
    table.rows[2].cells[0].text = "{{ item.name }}"
    table.rows[2].cells[1].text = "{{ item.qty }} pcs"
    table.rows[3].cells[0].text = "{%tr endfor %}"
    document.add_paragraph("{% if paid %}Paid in full, thank you.{% else %}Payment due.{% endif %}")
    return saved(document)


def one_line(text: str) -> bytes:
    document = docx.Document()
    document.add_paragraph(text)
    return saved(document)


def png(width: int, height: int) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


DATA = {
    "company": "Lighthouse Bay Ltd",
    "number": 42,
    "customer": {"name": "Ana Lima"},
    "items": [{"name": "Pens", "qty": 12}, {"name": "Ink & paper", "qty": 3}],
    "paid": True,
}


@pytest.fixture
async def word_app(start_app: Callable[..., Any]) -> RunningApp:
    # Chromium is not involved: the fake renderer would answer any HTML job.
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    return app


async def problem_of(resp: Any) -> dict[str, Any]:
    assert resp.status == 422, await resp.text()
    assert resp.content_type == "application/problem+json"
    problem: dict[str, Any] = await resp.json()
    return problem


def fields(problem: dict[str, Any]) -> dict[str, str]:
    return {error["field"]: error["message"] for error in problem["errors"]}


async def test_a_loop_fills_a_table_row_per_item_and_a_condition_chooses(
    word_app: RunningApp,
) -> None:
    asset = await upload(word_app, invoice(), DOCX)
    job, pdf = await convert(word_app, {"docx": asset, "data": DATA})
    assert pdf is not None, job["error"]
    text = pdf_text(pdf)
    assert "Lighthouse Bay Ltd - invoice 42" in text  # the header
    assert "Dear Ana Lima," in text
    assert "Pens" in text and "12 pcs" in text
    assert "Ink & paper" in text and "3 pcs" in text  # escaped into the XML, read back as is
    assert "{%" not in text and "item.name" not in text
    assert "Paid in full" in text and "Payment due" not in text
    assert job["pages"] == 1

    # The same file in a multipart part named docx; unpaid, three items.
    form = FormData()
    form.add_field("docx", invoice(), filename="invoice.docx")
    items = [{"name": f"Item {n}", "qty": n} for n in (1, 2, 3)]
    data = {**DATA, "paid": False, "items": items}
    form.add_field("job", json.dumps({"data": data}), content_type="application/json")
    async with word_app.http.post(word_app.url("/v1/jobs"), data=form) as resp:
        job, pdf = await finished(word_app, resp)
    assert pdf is not None, job["error"]
    text = pdf_text(pdf)
    assert all(f"Item {n}" in text and f"{n} pcs" in text for n in (1, 2, 3))
    assert "Pens" not in text
    assert "Payment due." in text and "Paid in full" not in text

    async with word_app.http.get(word_app.url("/v1/jobs")) as resp:
        listed = (await resp.json())["items"]
    assert {item["source"] for item in listed} == {"Word template"}


async def test_an_image_from_an_asset_is_placed_where_the_template_prints_it(
    word_app: RunningApp,
) -> None:
    template = await upload(word_app, one_line("Logo: {{ logo }} (ours)"), DOCX)
    logo = await upload(word_app, png(120, 60), "image/png")
    job, pdf = await convert(
        word_app, {"docx": template, "data": {"logo": {"image": logo, "width_mm": 40}}}
    )
    assert pdf is not None, job["error"]
    with pikepdf.open(io.BytesIO(pdf)) as document:
        page = document.pages[0]
        (image,) = page.get_images().values()
        assert (image.Width, image.Height) == (120, 60)
    assert "Logo:" in pdf_text(pdf) and "(ours)" in pdf_text(pdf)

    # Unknown, or not an image Word takes: refused naming the data path.
    css = await upload(word_app, b"p { color: red }", "text/css")
    body = {
        "docx": template,
        "data": {"logo": {"image": css}, "rows": [{"photo": {"image": "sha256:" + "a" * 64}}]},
    }
    async with word_app.http.post(word_app.url("/v1/jobs"), json=body) as resp:
        problem = fields(await problem_of(resp))
    assert "text/css" in problem["data.logo.image"]
    assert "no asset sha256:aaaa" in problem["data.rows[0].photo.image"]
    body = {"docx": template, "data": {"logo": {"image": logo, "width": 40}}}
    async with word_app.http.post(word_app.url("/v1/jobs"), json=body) as resp:
        problem = fields(await problem_of(resp))
    assert "'width' is not one" in problem["data.logo"]


async def test_a_stored_docx_template_keeps_versions_and_jobs_send_data_only(
    word_app: RunningApp,
) -> None:
    first = await upload(word_app, invoice("Invoice, first layout"), DOCX)
    second = await upload(word_app, invoice("Invoice, second layout"), DOCX)
    for asset in (first, second):
        body = {"name": "invoice", "docx": asset, "sample_data": DATA, "publish": True}
        async with word_app.http.post(word_app.url("/v1/templates"), json=body) as resp:
            assert resp.status == 201, await resp.text()
            stored = await resp.json()
    assert stored["version"] == 2 and stored["kind"] == "docx"
    assert stored["docx"] == second and stored["html"] is None
    async with word_app.http.get(word_app.url("/v1/templates/invoice@1")) as resp:
        shown = await resp.json()
    assert shown["kind"] == "docx" and shown["docx"] == first
    assert [v["version"] for v in shown["versions"]] == [1, 2]
    async with word_app.http.get(word_app.url(f"/v1/assets/{first}")) as resp:
        used = (await resp.json())["used_by"]["templates"]
    assert [(t["name"], t["version"], t["path"]) for t in used] == [
        ("invoice", 1, "invoice@1.docx")
    ]

    job, pdf = await convert(word_app, {"template_id": "invoice@1", "data": DATA})
    assert pdf is not None, job["error"]
    assert "first layout" in pdf_text(pdf) and "Dear Ana Lima," in pdf_text(pdf)
    unpaid = {**DATA, "paid": False}
    job, pdf = await convert(word_app, {"template_id": "invoice", "data": unpaid})
    assert pdf is not None, job["error"]
    assert "second layout" in pdf_text(pdf) and "Payment due." in pdf_text(pdf)

    # Its preview fills the sample data, as its jobs are filled.
    async with word_app.http.post(word_app.url("/v1/templates/invoice/preview")) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.content_type == "application/pdf"
        preview = await resp.read()
    assert "second layout" in pdf_text(preview) and "Paid in full" in pdf_text(preview)
    async with word_app.http.post(
        word_app.url("/v1/templates/invoice/preview"), json={"version": 1, "data": unpaid}
    ) as resp:
        assert resp.status == 200, await resp.text()
        assert "first layout" in pdf_text(await resp.read())

    # A template that runs into a missing value fails for good, naming its file.
    job, pdf = await convert(word_app, {"template_id": "invoice", "data": {"items": []}})
    assert pdf is None and job["status"] == "failed" and job["attempts"] == 1
    assert job["error"].startswith("invoice@2.docx: template error")
    assert "is undefined" in job["error"]


async def test_a_jinja_syntax_error_is_refused_naming_the_paragraph(
    word_app: RunningApp,
) -> None:
    broken = one_line("Dear {{ customer.name }, welcome")
    asset = await upload(word_app, broken, DOCX)
    async with word_app.http.post(word_app.url("/v1/jobs"), json={"docx": asset}) as resp:
        problem = fields(await problem_of(resp))
    message = problem["docx"]
    assert message.startswith(f"{asset}: template syntax error")
    assert "“Dear {{ customer.name }, welcome”" in message and "(its body)" in message

    form = FormData()
    form.add_field("docx", broken, filename="letters/welcome.docx")
    async with word_app.http.post(word_app.url("/v1/jobs"), data=form) as resp:
        problem = fields(await problem_of(resp))
    assert problem["docx"].startswith("letters/welcome.docx: template syntax error")

    body = {"name": "welcome", "docx": asset}
    async with word_app.http.post(word_app.url("/v1/templates"), json=body) as resp:
        problem = fields(await problem_of(resp))
    assert "template syntax error" in problem["docx"]


async def test_an_endless_loop_fails_for_good_with_the_sandbox_message(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, env={"PRESSROOM_RENDER_TIMEOUT_S": "2"}
    )
    loop = "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}"
    asset = await upload(app, one_line(f"Start {loop} end"), DOCX)
    job, pdf = await convert(app, {"docx": asset})
    assert pdf is None and job["status"] == "failed"
    assert job["attempts"] == 1, "not retried: another attempt would loop the same way"
    assert job["error"] == (
        f"{asset}: template limit: template rendering took longer than 2 s "
        "(an endless or very long loop?) (its body)"
    )


async def test_a_file_that_is_not_a_docx_is_refused(word_app: RunningApp) -> None:
    form = FormData()
    form.add_field("docx", workbook(), filename="sales.docx")
    async with word_app.http.post(word_app.url("/v1/jobs"), data=form) as resp:
        problem = fields(await problem_of(resp))
    assert "is an Excel workbook by its content" in problem["docx"]
    form = FormData()
    form.add_field("docx", b"plain text", filename="notes.docx")
    async with word_app.http.post(word_app.url("/v1/jobs"), data=form) as resp:
        assert "is not an Office file" in fields(await problem_of(resp))["docx"]
    form = FormData()
    form.add_field("docx", corrupt_word(), filename="minutes.docx")
    async with word_app.http.post(word_app.url("/v1/jobs"), data=form) as resp:
        problem = fields(await problem_of(resp))
    assert problem["docx"].startswith("minutes.docx cannot be read as a Word document")

    sheet = await upload(word_app, workbook(), office_formats.XLSX.content_type)
    async with word_app.http.post(word_app.url("/v1/jobs"), json={"docx": sheet}) as resp:
        problem = fields(await problem_of(resp))
    assert "not a Word document (.docx)" in problem["docx"]
    body = {"name": "sheet", "docx": sheet}
    async with word_app.http.post(word_app.url("/v1/templates"), json=body) as resp:
        assert "not a Word document (.docx)" in fields(await problem_of(resp))["docx"]
    word = await upload(word_app, invoice(), DOCX)
    body = {"docx": word, "options": {"output": "png"}}
    async with word_app.http.post(word_app.url("/v1/jobs"), json=body) as resp:
        assert "a Word template becomes a PDF" in fields(await problem_of(resp))["docx"]


async def test_a_batch_item_may_be_a_word_template(word_app: RunningApp) -> None:
    asset = await upload(word_app, invoice(), DOCX)
    items = [
        {"key": "invoice-42", "docx": asset, "data": DATA},
        {"key": "cover", "template": "<h1>Cover</h1>"},
    ]
    async with all_events(word_app) as stream:
        status, batch = await post_batch(word_app, {"items": items})
        assert status == 202, batch
        await read_until(stream, batch_done(batch["id"]), timeout_s=90)
    async with word_app.http.get(word_app.url(f"/v1/batches/{batch['id']}")) as resp:
        done = await resp.json()
    assert [item["status"] for item in done["items"]] == ["done", "done"], done["items"]
    text = pdf_text(await download(word_app, done["items"][0]["url"]))
    assert "Dear Ana Lima," in text and "Ink & paper" in text

    # An item whose template does not compile is named by its index.
    broken = await upload(word_app, one_line("{% if %}"), DOCX)
    status, problem = await post_batch(
        word_app, {"items": [{"key": "ok", "docx": asset}, {"key": "bad", "docx": broken}]}
    )
    assert status == 422
    assert "template syntax error" in fields(problem)["items[1].docx"]
