"""PDF operations: the finishing steps select_pages, rotate, fill_form, flatten, metadata and
compress on PDFs the tests make (tests/pdfmaking.py), run in-line and through the API (the
`pdfs` source, the fields route, what is refused at submission, batches and combine), each
result read by libraries nobody here wrote: pikepdf (pages, rotation, fields, document
information, images), pypdfium2 (text in page order) and qpdf's own --check."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pikepdf
import pypdfium2
import pytest
from pikepdf.form import Form

from server.errors import PermanentError
from server.keys import POOL
from server.options import parse
from server.pdf import finishing
from server.pdf.join import Part
from tests.conftest import RunningApp
from tests.integration.test_batches import all_events, post_batch, read_until
from tests.pdfmaking import broken, encrypted, form_pdf, photo_pdf, text_pdf
from tests.pdfs import FakeRenderer, small_image
from tests.sse import collect

FORM_DATA = {
    "customer": {"name": "Ana Lima", "size": "M"},
    "accepted": True,
    "plans": ["basic", "pro"],
}
FILL = {
    "fields": {
        "customer": "customer.name",
        "agree": "accepted",
        "plan": "plans.1",
        "size": "customer.size",
    }
}


def page_texts(data: bytes) -> list[str]:
    """Each page's text, in page order, as PDFium reads it."""
    document = pypdfium2.PdfDocument(data)
    try:
        return [document[n].get_textpage().get_text_range().strip() for n in range(len(document))]
    finally:
        document.close()


def finish(options: dict[str, Any], pdf: bytes = b"", **work: Any) -> finishing.Finished:
    return finishing.run(finishing.Work(pdf, parse(options), **work))


def qpdf_check(data: bytes, tmp_path: Path) -> str:
    assert shutil.which("qpdf"), "qpdf is not installed: make install installs it"
    path = tmp_path / "checked.pdf"
    path.write_bytes(data)
    done = subprocess.run(["qpdf", "--check", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


# --- the steps, in-line ----------------------------------------------------------------------


def test_select_pages_keeps_the_order_given_and_rotate_turns_the_pages_chosen() -> None:
    five = text_pdf(["one", "two", "three", "four", "five"])
    done = finish(
        {"select_pages": "3, 1-2, 5-4, 1", "rotate": {"degrees": 90, "pages": "1,3"}}, five
    )
    assert page_texts(done.pdf) == ["three", "one", "two", "five", "four", "one"]
    assert done.pages == 6
    with pikepdf.open(io.BytesIO(done.pdf)) as pdf:
        assert [int(page.obj.get("/Rotate", 0)) for page in pdf.pages] == [90, 0, 90, 0, 0, 0]
    turned = finish({"rotate": {"degrees": -90}}, five)
    with pikepdf.open(io.BytesIO(turned.pdf)) as pdf:
        assert {int(page.Rotate) for page in pdf.pages} == {270}
    with pytest.raises(PermanentError, match=r"select_pages: page 6 is not in the document \(5"):
        finish({"select_pages": "2-6"}, five)


def test_a_form_is_filled_from_the_data_and_flattened_into_the_page() -> None:
    values = {"customer": "Ana Lima", "agree": True, "plan": "pro", "size": "M"}
    filled = finish({"fill_form": FILL}, form_pdf(), form_values=values)
    with pikepdf.open(io.BytesIO(filled.pdf)) as pdf:
        form = Form(pdf)
        assert form["customer"].value == "Ana Lima"
        assert form["agree"].checked is True
        assert form["plan"].value == "pro"
        assert [str(button.AS) for button in pdf.pages[0].Annots[3:]] == ["/Off", "/M", "/Off"]
    flat = finish({"fill_form": FILL, "flatten": True}, form_pdf(), form_values=values)
    with pikepdf.open(io.BytesIO(flat.pdf)) as pdf:
        assert "/AcroForm" not in pdf.Root
        assert "/Annots" not in pdf.pages[0].obj
    assert page_texts(flat.pdf) == ["Ana Lima pro"]


def test_a_field_the_form_lacks_or_a_value_it_cannot_take_fails_naming_it() -> None:
    with pytest.raises(PermanentError, match=r"no field 'nmae' \(its fields: customer, agree"):
        finish({"fill_form": {"fields": {"nmae": "x"}}}, form_pdf(), form_values={"nmae": "x"})
    with pytest.raises(PermanentError, match="'agree' is a checkbox: its value must be true"):
        finish({"fill_form": FILL}, form_pdf(), form_values={"agree": "yes"})
    with pytest.raises(PermanentError, match="'plan' takes one of basic, pro, not 'gold'"):
        finish({"fill_form": FILL}, form_pdf(), form_values={"plan": "gold"})
    with pytest.raises(PermanentError, match="'size' takes one of S, M, L, not 'XL'"):
        finish({"fill_form": FILL}, form_pdf(), form_values={"size": "XL"})


def test_metadata_sets_custom_keys_beside_the_standard_ones_and_reads_them_back() -> None:
    options = {"title": "Statement", "author": "Pressroom", "metadata": {"Department": "Sales"}}
    done = finish(options, text_pdf(["one"], title="old"))
    with pikepdf.open(io.BytesIO(done.pdf)) as pdf:
        assert str(pdf.docinfo["/Title"]) == "Statement"
        assert str(pdf.docinfo["/Author"]) == "Pressroom"
        assert str(pdf.docinfo["/Department"]) == "Sales"
    assert done.report["metadata"] == {
        "Title": "Statement",
        "Author": "Pressroom",
        "Department": "Sales",
    }


def test_compress_deduplicates_and_downsamples_images_into_a_smaller_valid_file(
    tmp_path: Path,
) -> None:
    photos = photo_pdf(3)  # 1600 x 1200 pixels on 4 x 3 inches: 400 dpi
    parts = (Part(photos, "first"), Part(photos, "again"))
    lossless = finish({"compress": {}}, parts=parts)
    downsampled = finish({"compress": {"image_dpi": 100}}, parts=parts)
    plain = finish({"title": "as joined"}, parts=parts)

    # The same photographs twice are stored once: half the size, every pixel kept.
    assert lossless.report["compress"]["bytes_before"] == pytest.approx(len(plain.pdf), rel=0.01)
    assert lossless.report["compress"]["bytes_after"] == len(lossless.pdf)
    assert len(lossless.pdf) < 0.55 * len(plain.pdf)
    with pikepdf.open(io.BytesIO(lossless.pdf)) as pdf:
        assert len(pdf.pages) == 6
        images = {
            image.objgen: (int(image.Width), int(image.Height))
            for page in pdf.pages
            for image in page.get_images().values()
        }
        assert sorted(images.values()) == [(1600, 1200)] * 3
    # At 100 dpi: 400 x 300 pixels each, a small part of the size.
    assert len(downsampled.pdf) < 0.1 * len(plain.pdf)
    with pikepdf.open(io.BytesIO(downsampled.pdf)) as pdf:
        sizes = [(int(i.Width), int(i.Height)) for p in pdf.pages for i in p.get_images().values()]
        assert sizes == [(400, 300)] * 6
        first = pdf.pages[0].get_images()["/image"]
        assert isinstance(first, pikepdf.Stream)
        decoded = pikepdf.PdfImage(first).as_pil_image()
        assert decoded.size == (400, 300)
    assert "No syntax or stream encoding errors" in qpdf_check(downsampled.pdf, tmp_path)


def test_uploaded_pdfs_join_with_an_outline_entry_each() -> None:
    parts = (
        Part(text_pdf(["a1", "a2"], title="Own title"), ""),
        Part(text_pdf(["b1"]), "annex"),
        Part(text_pdf(["c1"]), ""),
    )
    done = finish({}, parts=parts)
    assert page_texts(done.pdf) == ["a1", "a2", "b1", "c1"] and done.pages == 4
    with pikepdf.open(io.BytesIO(done.pdf)) as pdf, pdf.open_outline() as outline:
        pages = {page.obj.objgen: n for n, page in enumerate(pdf.pages)}
        opens = [item.destination for item in outline.root]
        firsts = [pages[where[0].objgen] for where in opens if isinstance(where, pikepdf.Array)]
        titles = [item.title for item in outline.root]
        assert list(zip(titles, firsts, strict=True)) == [
            ("Own title", 0),
            ("annex", 2),
            ("Document 3", 3),
        ]
    with pytest.raises(PermanentError, match=r"pdfs\[1\] \(annex\) is not a readable PDF"):
        finish({}, parts=(parts[0], Part(broken(text_pdf(["x"])), "annex")))


# --- through the API -------------------------------------------------------------------------


async def upload(app: RunningApp, data: bytes, kind: str = "application/pdf") -> str:
    async with app.http.post(
        app.url("/v1/assets"), data=io.BytesIO(data), headers={"Content-Type": kind}
    ) as resp:
        assert resp.status in (200, 201), await resp.text()
        asset_id: str = (await resp.json())["id"]
        return asset_id


async def submit(app: RunningApp, body: dict[str, Any]) -> tuple[int, Any]:
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        return resp.status, await resp.json()


async def run_job(app: RunningApp, body: dict[str, Any]) -> tuple[dict[str, Any], bytes | None]:
    status, job = await submit(app, body)
    assert status == 202, job
    messages = await collect(app.http, app.url(job["links"]["events"]), timeout_s=60)
    final: dict[str, Any] = messages[-1].json["job"]
    if final["status"] != "done":
        return final, None
    async with app.http.get(final["url"]) as resp:
        assert resp.status == 200
        return final, await resp.read()


def problems(body: dict[str, Any]) -> dict[str, str]:
    return {error["field"]: error["message"] for error in body["errors"]}


async def test_a_pdfs_job_merges_fills_flattens_and_reports_without_a_browser(
    api: RunningApp, fake_renderer: FakeRenderer
) -> None:
    form, annex = await upload(api, form_pdf()), await upload(api, text_pdf(["annex page"]))
    body = {
        "pdfs": ["contract.pdf", annex],
        "assets": {"contract.pdf": form},
        "data": FORM_DATA,
        "options": {
            "fill_form": FILL,
            "flatten": True,
            "title": "Contract 42",
            "metadata": {"Client": "Ana"},
            "compress": {},
        },
    }
    job, data = await run_job(api, body)
    assert data is not None, job["error"]
    assert fake_renderer.calls == []
    assert page_texts(data) == ["Ana Lima pro", "annex page"]
    assert job["pages"] == 2 and job["bytes"] == len(data)
    with pikepdf.open(io.BytesIO(data)) as pdf, pdf.open_outline() as outline:
        assert [item.title for item in outline.root] == ["contract", "Document 2"]
        assert "/AcroForm" not in pdf.Root
    report = job["finishing"]
    assert report["metadata"]["Title"] == "Contract 42" and report["metadata"]["Client"] == "Ana"
    assert report["compress"]["bytes_after"] == len(data)
    # The asset stays while a job may use it, and the same JSON is on GET.
    async with api.http.get(api.url(f"/v1/jobs/{job['id']}")) as resp:
        assert (await resp.json())["finishing"] == report


async def test_what_a_pdfs_job_cannot_use_is_refused_naming_it(api: RunningApp) -> None:
    plain = await upload(api, text_pdf(["one", "two"]))
    locked = await upload(api, encrypted(text_pdf(["secret"])))
    owner_only = await upload(api, encrypted(text_pdf(["restricted"]), user_password=""))
    noise = await upload(api, broken(text_pdf(["noise"])))
    form = await upload(api, form_pdf())
    png = await upload(api, small_image("png"), "image/png")
    cases: list[tuple[dict[str, Any], str, str]] = [
        ({"pdfs": [locked]}, "pdfs[0]", "is encrypted with a password: upload it without one"),
        ({"pdfs": [plain, owner_only]}, "pdfs[1]", "its owner restricts changes"),
        ({"pdfs": [noise]}, "pdfs[0]", "is not a PDF that can be read"),
        ({"pdfs": [png]}, "pdfs", "must be a PDF (application/pdf)"),
        ({"pdfs": ["missing.pdf"]}, "pdfs", "is neither an asset id nor a path of assets"),
        ({"pdfs": [plain], "template": "<p>x</p>"}, "pdfs", "give only one of template"),
        (
            {"pdfs": [plain], "options": {"format": "A5", "margin": "1cm"}},
            "pdfs",
            "options.format, options.margin cannot apply",
        ),
        (
            {"pdfs": [plain], "options": {"select_pages": "1,3"}},
            "options.select_pages",
            "page 3 is not in the document (2 pages)",
        ),
        (
            {"pdfs": [form], "data": {"n": 1}, "options": {"fill_form": {"fields": {"x": "n"}}}},
            "options.fill_form.fields.x",
            "the PDFs have no field 'x' (theirs: agree, customer, plan",
        ),
        (
            {"pdfs": [form], "options": {"fill_form": {"fields": {"customer": "who.name"}}}},
            "options.fill_form.fields.customer",
            "data has no 'who.name'",
        ),
        (
            {"pdfs": [plain], "options": {"select_pages": "2, 0-1"}},
            "options.select_pages",
            "must look like 3,1-2 or 2- (pages count from 1)",
        ),
        (
            {"pdfs": [plain], "options": {"rotate": {"degrees": 45}}},
            "options.rotate.degrees",
            "multiple of 90",
        ),
        (
            {"pdfs": [plain], "options": {"metadata": {"Title": "x"}}},
            "options.metadata.Title",
            "set options.title",
        ),
    ]
    for body, field, message in cases:
        status, answer = await submit(api, body)
        assert status == 422, (body, answer)
        assert answer["type"].endswith("/validation")
        found = problems(answer)
        assert any(f.startswith(field) and message in m for f, m in found.items()), (body, found)
        assert not any("object at 0x" in m for m in found.values()), found  # no Python repr
    assert await api.app[POOL].fetchval("SELECT count(*) FROM jobs") == 0


async def test_the_fields_route_lists_a_pdfs_form(api: RunningApp) -> None:
    form = await upload(api, form_pdf())
    async with api.http.get(api.url(f"/v1/assets/{form}/fields")) as resp:
        assert resp.status == 200
        listed = await resp.json()
    assert listed["pages"] == 1
    assert listed["fields"] == [
        {"name": "customer", "type": "text", "value": "", "options": [], "read_only": False},
        {"name": "agree", "type": "checkbox", "value": False, "options": [], "read_only": False},
        {
            "name": "plan",
            "type": "choice",
            "value": "basic",
            "options": ["basic", "pro"],
            "read_only": False,
        },
        {
            "name": "size",
            "type": "radio",
            "value": None,
            "options": ["S", "M", "L"],
            "read_only": False,
        },
    ]
    plain = await upload(api, text_pdf(["no form"]))
    async with api.http.get(api.url(f"/v1/assets/{plain}/fields")) as resp:
        assert resp.status == 200 and (await resp.json())["fields"] == []
    png = await upload(api, small_image("png"), "image/png")
    async with api.http.get(api.url(f"/v1/assets/{png}/fields")) as resp:
        assert resp.status == 409 and "only a PDF" in (await resp.json())["detail"]
    locked = await upload(api, encrypted(text_pdf(["secret"])))
    async with api.http.get(api.url(f"/v1/assets/{locked}/fields")) as resp:
        assert resp.status == 409 and "encrypted with a password" in (await resp.json())["detail"]
    async with api.http.get(api.url(f"/v1/assets/sha256:{'0' * 64}/fields")) as resp:
        assert resp.status == 404


async def test_an_html_job_goes_through_the_new_steps_and_a_missing_field_fails_it(
    api: RunningApp,
) -> None:
    # The fake renderer prints one page; select_pages repeats it, rotate turns the second.
    job, data = await run_job(
        api,
        {
            "template": "<p>x</p>",
            "options": {"select_pages": "1,1", "rotate": {"degrees": 180, "pages": "2"}},
        },
    )
    assert data is not None and job["pages"] == 2
    with pikepdf.open(io.BytesIO(data)) as pdf:
        assert [int(page.obj.get("/Rotate", 0)) for page in pdf.pages] == [0, 180]
    # A printed page has no form: the field is named when the job fails, and it is not retried.
    failed, _ = await run_job(
        api,
        {
            "template": "<p>x</p>",
            "data": {"n": 1},
            "options": {"fill_form": {"fields": {"total": "n"}}},
        },
    )
    assert failed["status"] == "failed" and failed["attempts"] == 1
    assert "fill_form: the PDF has no field 'total' (its fields: none)" in failed["error"]


async def test_a_batch_of_pdfs_items_is_combined(api: RunningApp) -> None:
    first = await upload(api, text_pdf(["first"]))
    second = await upload(api, text_pdf(["second a", "second b"]))
    items = [
        {"key": "one", "pdfs": [first]},
        {"key": "two", "pdfs": [second, first], "options": {"select_pages": "3,1"}},
    ]
    async with all_events(api) as stream:
        status, batch = await post_batch(api, {"items": items, "combine": True})
        assert status == 202, batch
        got = await read_until(
            stream, lambda m: m.event == "batch.done" and m.json["batch"]["id"] == batch["id"]
        )
    combined = got[-1].json["batch"]["combined"]
    assert combined["status"] == "done" and combined["pages"] == 3
    async with api.http.get(combined["url"]) as resp:
        data = await resp.read()
    assert page_texts(data) == ["first", "first", "second a"]
    status, refused = await post_batch(
        api, {"items": [{"key": "bad", "pdfs": [first], "options": {"select_pages": "4"}}]}
    )
    assert status == 422
    assert "items[0].options.select_pages" in problems(refused)


async def test_a_multipart_job_names_its_pdf_parts_by_file_name(api: RunningApp) -> None:
    form = aiohttp.FormData()
    form.add_field("terms.pdf", text_pdf(["terms"]), filename="terms.pdf")
    form.add_field("annex.pdf", text_pdf(["annex"]), filename="annex.pdf")
    form.add_field(
        "job", json.dumps({"pdfs": ["annex.pdf", "terms.pdf"]}), content_type="application/json"
    )
    async with api.http.post(api.url("/v1/jobs"), data=form) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    await collect(api.http, api.url(job["links"]["events"]), timeout_s=60)
    async with api.http.get(api.url(f"/v1/jobs/{job['id']}/pdf")) as resp:
        data = await resp.read()
    assert page_texts(data) == ["annex", "terms"]
    with pikepdf.open(io.BytesIO(data)) as pdf, pdf.open_outline() as outline:
        assert [item.title for item in outline.root] == ["annex", "terms"]
    # Without pdfs in the job part, a multipart body still needs its page.
    bare = aiohttp.FormData()
    bare.add_field("terms.pdf", text_pdf(["terms"]), filename="terms.pdf")
    async with api.http.post(api.url("/v1/jobs"), data=bare) as resp:
        assert resp.status == 422
        refused = problems(await resp.json())
    assert "or the job part's pdfs naming PDF parts" in refused["index.html"]
