"""PDF operations on real Chromium prints and on uploaded PDFs, through every existing step:
a printed invoice re-ordered, turned, described and compressed; uploaded PDFs (one of them a
Chromium print, one a form) merged, filled, flattened, stamped, made PDF/A and signed, or
encrypted. Read back with pikepdf, pypdfium2 and pyHanko's validator."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pikepdf
import pytest

from tests import testca
from tests.conftest import RunningApp
from tests.e2e.test_finishing import outline_titles, signature_status
from tests.e2e.test_render import render
from tests.integration.test_pdf_operations import FILL, FORM_DATA, page_texts, upload
from tests.pdfmaking import form_pdf, photo_pdf
from tests.pdfs import pdfa_problems

pytestmark = pytest.mark.browser

PAGES = "".join(
    f'<h1 style="break-before: page">Part {n}</h1><p>Section {n} text</p>' for n in (1, 2, 3)
)


@pytest.fixture
async def signing_app(start_app: Callable[..., Any], tmp_path: Path) -> tuple[RunningApp, Any]:
    ca = testca.make(tmp_path)
    env = {"PRESSROOM_SIGNING_KEY": ca.p12, "PRESSROOM_SIGNING_KEY_PASSWORD": ca.password}
    app: RunningApp = await start_app(render_slots=2, env=env)
    return app, ca


async def test_a_printed_pdf_goes_through_the_new_steps_before_the_old_ones(
    signing_app: tuple[RunningApp, Any],
) -> None:
    app, ca = signing_app
    options = {
        "title": "Parts",
        "metadata": {"Department": "Archive"},
        "select_pages": "3,1",
        "rotate": {"degrees": 90, "pages": "2"},
        "stamp": {"text": "COPY", "pages": "1"},
        "pdfa": "2b",
        "compress": {},
        "sign": {"reason": "archived"},
    }
    job, data = await render(app, {"template": PAGES, "options": options})
    assert data is not None, job["error"]
    assert job["pages"] == 2
    texts = page_texts(data)
    assert "Part 3" in texts[0] and "COPY" in texts[0] and "Part 1" in texts[1]
    assert pdfa_problems(data, 2) == []
    with pikepdf.open(io.BytesIO(data)) as pdf:
        assert [int(page.obj.get("/Rotate", 0)) for page in pdf.pages] == [0, 90]
        assert str(pdf.docinfo["/Department"]) == "Archive"
        assert str(pdf.docinfo["/Title"]) == "Parts"
    report = job["finishing"]
    assert report["metadata"]["Department"] == "Archive"
    assert report["compress"]["bytes_after"] <= report["compress"]["bytes_before"]
    status = await signature_status(data, ca.root)
    assert status.intact and status.valid and status.trusted, status.pretty_print_details()


async def test_uploaded_pdfs_are_merged_filled_and_finished_as_any_pdf(
    signing_app: tuple[RunningApp, Any],
) -> None:
    app, ca = signing_app
    printed, printed_pdf = await render(app, {"template": PAGES, "options": {"title": "Guide"}})
    assert printed_pdf is not None, printed["error"]
    guide, form, photos = (
        await upload(app, printed_pdf),
        await upload(app, form_pdf()),
        await upload(app, photo_pdf(2, pixels=(800, 600))),
    )
    archived = {
        "pdfs": [guide, photos],
        "options": {
            "stamp": {"text": "FILED", "pages": "1"},
            "pdfa": "3b",
            "compress": {"image_dpi": 96},
            "sign": {"reason": "filed"},
        },
    }
    job, data = await render(app, archived)
    assert data is not None, job["error"]
    assert job["pages"] == 5
    texts = page_texts(data)
    assert "Part 1" in texts[0] and "FILED" in texts[0] and "FILED" not in texts[1]
    assert pdfa_problems(data, 3) == []
    with pikepdf.open(io.BytesIO(data)) as pdf:
        # The print's own title names its entry; the photographs have none.
        assert outline_titles(pdf) == ["Guide", "Document 2"]
        sizes = {
            (int(image.Width), int(image.Height))
            for page in pdf.pages[3:]
            for image in page.get_images().values()
        }
        assert sizes == {(384, 288)}  # 800 x 600 on 4 x 3 inches (200 dpi), at 96 dpi
    report = job["finishing"]["compress"]
    assert report["bytes_after"] < report["bytes_before"] / 2
    status = await signature_status(data, ca.root)
    assert status.intact and status.valid and status.trusted, status.pretty_print_details()

    filled = {
        "pdfs": ["form.pdf", guide],
        "assets": {"form.pdf": form},
        "data": FORM_DATA,
        "options": {"fill_form": FILL, "flatten": True, "sign": {"reason": "signed up"}},
    }
    job, data = await render(app, filled)
    assert data is not None, job["error"]
    assert page_texts(data)[0] == "Ana Lima pro"
    with pikepdf.open(io.BytesIO(data)) as pdf:
        assert outline_titles(pdf) == ["form", "Guide"]
        # Only the signature's own field is left: the filled ones are page content now.
        assert [str(f.T) for f in pdf.Root.AcroForm.Fields] == ["Signature"]
    status = await signature_status(data, ca.root)
    assert status.intact and status.valid and status.trusted, status.pretty_print_details()

    # A form filled in Helvetica, which is not embedded, cannot become a PDF/A.
    failed, _ = await render(app, {**filled, "options": {"fill_form": FILL, "pdfa": "2b"}})
    assert failed["status"] == "failed" and failed["attempts"] == 1
    assert "pdfa: the font Helvetica (page 1) is not embedded" in failed["error"]

    protected, locked = await render(
        app,
        {
            "pdfs": [guide],
            "options": {
                "select_pages": "2-3",
                "encrypt": {"user_password": "open-1", "owner_password": "own-2"},
            },
        },
    )
    assert locked is not None, protected["error"]
    with pytest.raises(pikepdf.PasswordError):
        pikepdf.open(io.BytesIO(locked))
    with pikepdf.open(io.BytesIO(locked), password="open-1") as pdf:
        assert len(pdf.pages) == 2
