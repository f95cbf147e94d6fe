"""One batch of every kind of source, on real Chromium and LibreOffice: an HTML template, Markdown,
a Word file (made with python-docx) and uploaded PDFs, each signed, joined into one signed PDF
whose pages, outline entries and text pypdf reads back part by part. pyHanko's validator checks
each item's signature on the item's PDF, and the combined file's own, the only one it holds (the
items' signatures cover their own files, and would show broken in it)."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import docx
import pikepdf
import pytest
from pypdf import PdfReader

from tests import testca
from tests.conftest import RunningApp
from tests.e2e.test_finishing import signature_status
from tests.e2e.test_office import DOCX, upload
from tests.integration.test_batches import all_events, post_batch, read_until
from tests.integration.test_combine import batch_done, download, outline_of
from tests.pdfmaking import text_pdf

pytestmark = [pytest.mark.browser, pytest.mark.slow]  # Chromium, and LibreOffice's start


def report() -> bytes:
    """A two-page Word report."""
    document = docx.Document()
    document.core_properties.title = "Field report"
    document.add_heading("Field report", level=1)
    document.add_paragraph("Soil samples from the north plot.")
    document.add_page_break()  # type: ignore[no-untyped-call]  # python-docx has no hint
    document.add_paragraph("Soil samples from the south plot.")
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def page_texts(data: bytes) -> list[str]:
    return [" ".join(page.extract_text().split()) for page in PdfReader(io.BytesIO(data)).pages]


async def test_a_batch_of_html_markdown_office_and_pdfs_items_is_joined_into_one_pdf(
    start_app: Callable[..., Any], tmp_path: Path
) -> None:
    ca = testca.make(tmp_path)
    app: RunningApp = await start_app(
        render_slots=2,
        env={"PRESSROOM_SIGNING_KEY": ca.p12, "PRESSROOM_SIGNING_KEY_PASSWORD": ca.password},
    )
    office = await upload(app, report(), DOCX)
    scans = await upload(
        app, text_pdf(["Scanned receipt 1", "Scanned receipt 2"]), "application/pdf"
    )
    signed = {"sign": {"reason": "issued"}}
    items = [
        {
            "key": "cover",
            "template": "<h1>Cover for {{client}}</h1>",
            "data": {"client": "Ana Lima"},
            "options": signed,
        },
        {"key": "notes", "markdown": "# Notes\n\nThe *site visit* went well.", "options": signed},
        {"key": "report", "office": office, "options": signed},
        {"key": "receipts", "pdfs": [scans], "options": signed},
    ]
    async with all_events(app) as stream:
        status, batch = await post_batch(
            app, {"combine": {"sign": {"reason": "combined", "field": "Batch"}}, "items": items}
        )
        assert status == 202, batch
        await read_until(stream, batch_done(batch["id"]), timeout_s=180)
    async with app.http.get(app.url(f"/v1/batches/{batch['id']}")) as resp:
        done = await resp.json()
    assert done["status"] == "done", done
    assert [item["status"] for item in done["items"]] == ["done"] * 4, done["items"]
    assert [item["pages"] for item in done["items"]] == [1, 1, 2, 2]
    combined = done["combined"]
    assert combined["status"] == "done" and combined["pages"] == 6, combined
    assert combined["signed"] is True

    data = await download(app, combined["url"])
    texts = page_texts(data)
    assert len(texts) == 6
    assert texts[0] == "Cover for Ana Lima"
    assert texts[1] == "Notes The site visit went well."
    assert "Field report" in texts[2] and "north plot" in texts[2]
    assert "south plot" in texts[3] and "north plot" not in texts[3]
    assert texts[4:] == ["Scanned receipt 1", "Scanned receipt 2"]
    # One entry per item, titled by its key, at its first page; the receipts keep the entry
    # their `pdfs` merge gave the uploaded file ("Document 1": it has no name or title).
    assert outline_of(data) == [
        ("cover", 0, []),
        ("notes", 1, []),
        ("report", 2, []),
        ("receipts", 4, ["Document 1"]),
    ]

    for item in done["items"]:
        status_ = await signature_status(await download(app, item["url"]), ca.root)
        assert status_.intact and status_.valid and status_.trusted, (
            item["key"],
            status_.pretty_print_details(),
        )
    status_ = await signature_status(data, ca.root)
    assert status_.intact and status_.valid and status_.trusted, status_.pretty_print_details()
    with pikepdf.open(io.BytesIO(data)) as pdf:
        fields = [str(field.T) for field in pdf.Root.AcroForm.Fields]
        widgets = [
            str(annot.get("/T", ""))
            for page in pdf.pages
            for annot in page.obj.get("/Annots", ())
            if annot.get("/FT") == pikepdf.Name.Sig
        ]
    assert fields == ["Batch"], fields
    assert widgets == ["Batch"], widgets
