"""Office files through real LibreOffice: Word, Excel and PowerPoint files made here with
python-docx, openpyxl and python-pptx (readers no one here wrote) become PDFs whose text pypdf
reads back and whose pages pikepdf counts; the document's own title and author are kept unless
the options set them; page ranges, landscape and the outline apply, and finishing too; a wrong
type is refused at submission; a corrupt .docx fails for good naming the file; a LibreOffice
killed mid-conversion, or hung past the time limit, costs that job one attempt, and the next
conversion works."""

from __future__ import annotations

import asyncio
import io
import json
import os
import signal
import zipfile
from collections.abc import Callable
from typing import Any

import docx
import openpyxl
import pikepdf
import pptx
import psutil
import pytest
from aiohttp import FormData

from server.files import office_formats
from server.keys import WORKERS
from tests.conftest import RunningApp
from tests.e2e.test_render import pdf_text
from tests.pdfs import FakeRenderer
from tests.sse import collect

pytestmark = pytest.mark.slow  # each app starts its LibreOffice (about 2 s)

DOCX = office_formats.DOCX.content_type


def word(pages: int = 3, *, title: str = "Quarterly report", paragraphs: int = 1) -> bytes:
    document = docx.Document()
    document.core_properties.title = title
    document.core_properties.author = "Ada Lovelace"
    for page in range(1, pages + 1):
        document.add_heading(f"Chapter {page}", level=1)
        for _ in range(paragraphs):
            document.add_paragraph(f"Text of page {page}. " * 20)
        if page < pages:
            document.add_page_break()  # type: ignore[no-untyped-call]  # python-docx has no hint
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def workbook() -> bytes:
    book = openpyxl.Workbook()
    sheet = book.active
    assert sheet is not None
    sheet.title = "Sales"
    sheet.append(["Region", "Q1", "Q2", "Q3", "Q4"])
    for region, base in (("North", 120), ("South", 80), ("Lighthouse Bay", 42)):
        sheet.append([region, base, base + 5, base + 9, base + 14])
    sheet.column_dimensions["A"].width = 20  # else the next cell cuts "Lighthouse Bay" short
    out = io.BytesIO()
    book.save(out)
    return out.getvalue()


def slides() -> bytes:
    deck = pptx.Presentation()
    for number in (1, 2):
        slide = deck.slides.add_slide(deck.slide_layouts[1])
        assert slide.shapes.title is not None
        slide.shapes.title.text = f"Slide {number} of the pitch"
    out = io.BytesIO()
    deck.save(out)
    return out.getvalue()


def corrupt_word() -> bytes:
    """A .docx by its members, whose document part is not XML."""
    source = zipfile.ZipFile(io.BytesIO(word(1)))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        for name in source.namelist():
            broken = name == "word/document.xml"
            archive.writestr(name, b"<w:document not xml" if broken else source.read(name))
    return out.getvalue()


@pytest.fixture
async def office_app(start_app: Callable[..., Any]) -> RunningApp:
    # Chromium is not involved: the fake renderer would answer any HTML job.
    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    return app


async def upload(app: RunningApp, data: bytes, kind: str) -> str:
    async with app.http.post(
        app.url("/v1/assets"), data=data, headers={"Content-Type": kind}
    ) as resp:
        assert resp.status in (200, 201), await resp.text()
        asset_id: str = (await resp.json())["id"]
        return asset_id


async def finished(app: RunningApp, resp: Any) -> tuple[dict[str, Any], bytes | None]:
    assert resp.status == 202, await resp.text()
    job = await resp.json()
    messages = await collect(app.http, app.url(job["links"]["events"]), timeout_s=90)
    final: dict[str, Any] = messages[-1].json["job"]
    final["events"] = [m.event for m in messages]
    if final["status"] != "done":
        return final, None
    async with app.http.get(final["url"]) as pdf:
        assert pdf.status == 200
        return final, await pdf.read()


async def convert(app: RunningApp, body: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        return await finished(app, resp)


async def multipart(
    app: RunningApp, filename: str, data: bytes, job: dict[str, Any] | None = None
) -> Any:
    form = FormData()
    form.add_field("office", data, filename=filename)
    if job is not None:
        form.add_field("job", json.dumps(job), content_type="application/json")
    return app.http.post(app.url("/v1/jobs"), data=form)


def gone(pid: int) -> bool:
    """Whether the process has exited (a zombie not yet reaped by its new parent counts)."""
    try:
        return bool(psutil.Process(pid).status() == psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return True


def info(pdf: bytes) -> tuple[int, dict[str, str], int]:
    """Pages, document information and outline entries, as pikepdf reads them."""
    with pikepdf.open(io.BytesIO(pdf)) as document:
        fields = {str(k): str(v) for k, v in document.docinfo.items()}
        with document.open_outline() as outline:
            entries = len(outline.root)
        return len(document.pages), fields, entries


async def test_word_excel_powerpoint_and_rtf_become_pdfs(office_app: RunningApp) -> None:
    asset = await upload(office_app, word(), DOCX)
    job, pdf = await convert(office_app, {"office": asset})
    assert pdf is not None, job["error"]
    pages, fields, _ = info(pdf)
    assert job["pages"] == pages == 3
    text = pdf_text(pdf)
    assert "Chapter 1" in text and "Text of page 3" in text
    assert fields["/Title"] == "Quarterly report" and fields["/Author"] == "Ada Lovelace"

    async with await multipart(office_app, "sales.xlsx", workbook()) as resp:
        job, pdf = await finished(office_app, resp)
    assert pdf is not None, job["error"]
    assert "Lighthouse Bay" in pdf_text(pdf) and job["pages"] == 1

    async with await multipart(office_app, "decks/pitch.pptx", slides()) as resp:
        job, pdf = await finished(office_app, resp)
    assert pdf is not None, job["error"]
    assert info(pdf)[0] == 2 and "Slide 2 of the pitch" in pdf_text(pdf)

    async with await multipart(office_app, "letter.rtf", b"{\\rtf1\\ansi Dear Ana,\\par}") as resp:
        job, pdf = await finished(office_app, resp)
    assert pdf is not None, job["error"]
    assert "Dear Ana," in pdf_text(pdf)
    # One LibreOffice did all four.
    assert office_app.app[WORKERS].office.started == 1


async def test_page_ranges_outline_landscape_metadata_and_finishing_apply(
    office_app: RunningApp,
) -> None:
    asset = await upload(office_app, word(4), DOCX)
    job, pdf = await convert(
        office_app,
        {"office": asset, "options": {"page_ranges": "2-3", "outline": True, "title": "Mine"}},
    )
    assert pdf is not None, job["error"]
    pages, fields, entries = info(pdf)
    assert pages == job["pages"] == 2
    assert "Chapter 2" in pdf_text(pdf) and "Chapter 1" not in pdf_text(pdf)
    assert entries >= 2, "the headings of the pages printed are bookmarks"
    assert fields["/Title"] == "Mine" and fields["/Author"] == "Ada Lovelace"
    _, plain = await convert(office_app, {"office": asset})
    assert plain is not None and info(plain)[2] == 0, "no outline unless asked"

    sheet = await upload(office_app, workbook(), office_formats.XLSX.content_type)
    for landscape in (False, True):
        job, pdf = await convert(office_app, {"office": sheet, "options": {"landscape": landscape}})
        assert pdf is not None, job["error"]
        with pikepdf.open(io.BytesIO(pdf)) as document:
            box = document.pages[0].mediabox
            assert (float(box[2]) > float(box[3])) is landscape

    job, pdf = await convert(
        office_app,
        {"office": asset, "options": {"encrypt": {"owner_password": "own", "user_password": "u"}}},
    )
    assert pdf is not None, job["error"]
    with pytest.raises(pikepdf.PasswordError):
        pikepdf.open(io.BytesIO(pdf))
    with pikepdf.open(io.BytesIO(pdf), password="u") as document:
        assert document.is_encrypted and len(document.pages) == 4


async def test_a_wrong_type_is_refused_at_submission(office_app: RunningApp) -> None:
    async with await multipart(office_app, "notes.docx", b"just some text, not Word") as resp:
        assert resp.status == 422
        problem = await resp.json()
    assert resp.content_type == "application/problem+json"
    assert ".docx, .doc, .odt, .rtf, .xlsx, .xls, .ods, .pptx, .ppt, .odp" in str(problem)

    # Sent as Word, but a PowerPoint by its content: the upload says what it is.
    async with office_app.http.post(
        office_app.url("/v1/assets"), data=slides(), headers={"Content-Type": DOCX}
    ) as resp:
        assert resp.status == 422
        assert "a PowerPoint presentation (.pptx) by its content" in await resp.text()

    pdf_asset = await upload(
        office_app,
        (await convert(office_app, {"office": await upload(office_app, word(1), DOCX)}))[1] or b"",
        "application/pdf",
    )
    async with office_app.http.post(office_app.url("/v1/jobs"), json={"office": pdf_asset}) as resp:
        assert resp.status == 422
        text = await resp.text()
    assert "is application/pdf, not an Office file" in text and ".pptx" in text

    asset = await upload(office_app, word(1), DOCX)
    async with office_app.http.post(
        office_app.url("/v1/jobs"), json={"office": asset, "options": {"output": "png"}}
    ) as resp:
        assert resp.status == 422
        assert "an Office file becomes a PDF" in await resp.text()
    async with office_app.http.post(
        office_app.url("/v1/jobs"), json={"office": asset, "markdown": "# two sources"}
    ) as resp:
        assert resp.status == 422
        assert "give only one of" in await resp.text()


async def test_a_corrupt_docx_fails_for_good_naming_the_file(office_app: RunningApp) -> None:
    async with await multipart(office_app, "board-minutes.docx", corrupt_word()) as resp:
        job, pdf = await finished(office_app, resp)
    assert pdf is None and job["status"] == "failed"
    assert job["attempts"] == 1, "not retried: another attempt would fail the same way"
    assert "board-minutes.docx" in job["error"] and "LibreOffice cannot convert" in job["error"]
    # The process that refused it converts the next one.
    _, pdf = await convert(office_app, {"office": await upload(office_app, word(1), DOCX)})
    assert pdf is not None and office_app.app[WORKERS].office.started == 1


async def test_a_libreoffice_killed_mid_conversion_costs_one_attempt(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(
        renderer=FakeRenderer(),
        render_slots=1,
        env={"PRESSROOM_RETRY_BASE_S": "0.1", "PRESSROOM_RETRY_MAX_S": "0.2"},
    )
    office = app.app[WORKERS].office
    long = await upload(app, word(60, paragraphs=12), DOCX)
    async with app.http.post(app.url("/v1/jobs"), json={"office": long}) as resp:
        assert resp.status == 202
        job_id = (await resp.json())["id"]
    await asyncio.wait_for(office.converting.wait(), timeout=60)
    (process,) = office.processes()
    os.kill(process.soffice_pid, signal.SIGKILL)
    messages = await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"), timeout_s=120)
    final = messages[-1].json["job"]
    assert [m.event for m in messages] == [
        "job.queued",
        "job.running",
        "job.retrying",
        "job.running",
        "job.done",
    ], final["errors"]
    assert final["attempts"] == 2 and final["pages"] > 60
    assert "LibreOffice crashed converting" in final["errors"][0]["error"]
    assert office.started == 2 and office.replaced == 1
    # And the next conversion works, on the fresh process.
    _, pdf = await convert(app, {"office": await upload(app, word(1), DOCX)})
    assert pdf is not None and office.started == 2


async def test_a_libreoffice_hung_past_the_time_limit_is_replaced(
    start_app: Callable[..., Any],
) -> None:
    app: RunningApp = await start_app(
        renderer=FakeRenderer(),
        render_slots=1,
        env={
            "PRESSROOM_RENDER_TIMEOUT_S": "4",
            "PRESSROOM_RETRY_BASE_S": "0.1",
            "PRESSROOM_RETRY_MAX_S": "0.2",
        },
    )
    office = app.app[WORKERS].office
    asset = await upload(app, word(20, paragraphs=6), DOCX)
    async with app.http.post(app.url("/v1/jobs"), json={"office": asset}) as resp:
        assert resp.status == 202
        job_id = (await resp.json())["id"]
    await asyncio.wait_for(office.converting.wait(), timeout=60)
    (process,) = office.processes()
    os.kill(process.soffice_pid, signal.SIGSTOP)  # alive, and answering nothing
    messages = await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"), timeout_s=120)
    final = messages[-1].json["job"]
    assert [m.event for m in messages][-3:] == ["job.retrying", "job.running", "job.done"]
    assert "LibreOffice did not convert sha256:" in final["errors"][0]["error"]
    assert "within 4 s" in final["errors"][0]["error"]
    assert office.replaced == 1 and office.started == 2
    assert gone(process.soffice_pid), "the hung one was killed"
