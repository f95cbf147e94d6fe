"""Finished documents from real Chromium, each checked with a library nobody on the project
wrote: pikepdf (PDF/A metadata, output intent and profile, fonts, structure tree, outline,
attachments, encryption), pypdf (stamp text on every chosen page), factur-x (the invoice's XML
read back) and pyHanko's validator (the signature intact, valid and trusted against a CA the
test makes). The jobs of one test share one app, so its finishing processes start once."""

from __future__ import annotations

import asyncio
import io
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import facturx
import pikepdf
import pytest
from asn1crypto import x509 as asn1_x509
from cryptography.hazmat.primitives.serialization import Encoding
from pyhanko.pdf_utils.reader import PdfFileReader
from pyhanko.sign.validation import async_validate_pdf_signature
from pyhanko_certvalidator import ValidationContext
from pypdf import PdfReader

from tests import testca
from tests.conftest import RunningApp
from tests.e2e.test_render import render
from tests.pdfs import pdfa_problems, small_image

pytestmark = pytest.mark.browser

XML = (Path(__file__).parents[1] / "files" / "factur-x-minimum.xml").read_bytes()
SECTIONS = ("Summary", "Lines", "Terms")
DOCUMENT = (
    '<!doctype html><html lang="de"><head><title>Rechnung 42</title></head><body>'
    '<h1>Rechnung 42</h1><p>Zahlbar an <a href="https://example.com/pay">example.com</a></p>'
    + "".join(
        f'<h2 style="break-before: page">{name}</h2><p>Section {name}, total 120.00 EUR</p>'
        for name in SECTIONS
    )
    + "</body></html>"
)


async def signature_status(pdf: bytes, root: Any, password: str | None = None) -> Any:
    """pyHanko's verdict on the last signature, against `root` only (no fetching)."""
    reader = PdfFileReader(io.BytesIO(pdf), strict=False)
    if password is not None:
        reader.decrypt(password)
    [signature] = reader.embedded_signatures
    trust = asn1_x509.Certificate.load(root.public_bytes(Encoding.DER))
    return await async_validate_pdf_signature(
        signature, ValidationContext(trust_roots=[trust], allow_fetching=False)
    )


def outline_titles(pdf: pikepdf.Pdf) -> list[str]:
    titles: list[str] = []
    with pdf.open_outline() as outline:
        pending = list(outline.root)
        while pending:
            item = pending.pop(0)
            titles.append(item.title)
            pending[:0] = item.children
    return titles


def uri_links(pdf: pikepdf.Pdf) -> list[str]:
    return [
        str(annotation.A.URI)
        for page in pdf.pages
        for annotation in page.obj.get("/Annots", ())
        if annotation.get("/Subtype") == "/Link" and "/A" in annotation
    ]


@pytest.fixture
async def finishing_app(start_app: Callable[..., Any], tmp_path: Path) -> tuple[RunningApp, Any]:
    ca = testca.make(tmp_path)
    env = {"PRESSROOM_SIGNING_KEY": ca.p12, "PRESSROOM_SIGNING_KEY_PASSWORD": ca.password}
    app: RunningApp = await start_app(render_slots=2, env=env)
    return app, ca


async def upload(app: RunningApp, data: bytes, kind: str) -> str:
    async with app.http.post(
        app.url("/v1/assets"), data=data, headers={"Content-Type": kind}
    ) as resp:
        assert resp.status in (200, 201), await resp.text()
        asset_id: str = (await resp.json())["id"]
        return asset_id


async def test_every_finishing_step_keeps_what_the_steps_before_it_made(
    finishing_app: tuple[RunningApp, Any],
) -> None:
    app, ca = finishing_app
    data_file = json.dumps({"order": 42}).encode()
    xml, attachment, logo = await asyncio.gather(
        upload(app, XML, "application/xml"),
        upload(app, data_file, "application/json"),
        upload(app, small_image("png", (120, 40)), "image/png"),
    )
    archived = {
        "tagged": True,
        "outline": True,
        "pdfa": "2b",
        "title": "Rechnung 42",
        "author": "Pressroom",
        "stamp": {"text": "PAID", "pages": "1,3", "rotate": 30, "color": "#008000"},
    }
    invoice = {
        "tagged": True,
        "facturx": {"xml": xml},
        "attachments": [{"asset": attachment, "name": "order.json", "relationship": "Supplement"}],
        "stamp": {"asset": logo, "layer": "under", "opacity": 0.3},
        "sign": {"reason": "issued", "visible": {"page": 1, "box": [40, 40, 240, 100]}},
    }
    protected = {
        "outline": True,
        "stamp": {"text": "CONFIDENTIAL", "font_size": 30},
        "encrypt": {"user_password": "open-4d1e", "owner_password": "own-9b7c", "allow": ["print"]},
        "sign": {"location": "Berlin"},
    }
    jobs = await asyncio.gather(
        *(
            render(app, {"template": DOCUMENT, "options": options})
            for options in (archived, invoice, protected)
        )
    )
    for job, data in jobs:
        assert data is not None, job["error"]
    (_, archived_pdf), (_, invoice_pdf), (protected_job, protected_pdf) = jobs
    assert data is not None and archived_pdf is not None and invoice_pdf is not None
    assert protected_pdf is not None
    headings = ["Rechnung 42", *SECTIONS]

    # PDF/A-2b from a tagged Chromium PDF: the tags, language, outline and links stay.
    assert pdfa_problems(archived_pdf, 2) == []
    with pikepdf.open(io.BytesIO(archived_pdf)) as pdf:
        assert "/StructTreeRoot" in pdf.Root and pdf.Root.MarkInfo.Marked
        assert str(pdf.Root.Lang) == "de"
        assert outline_titles(pdf) == headings
        assert uri_links(pdf) == ["https://example.com/pay"]
        assert str(pdf.docinfo["/Author"]) == "Pressroom"
    pages = [page.extract_text() for page in PdfReader(io.BytesIO(archived_pdf)).pages]
    assert ["PAID" in text for text in pages] == [True, False, True, False]
    assert all("total 120.00 EUR" in text for text in pages[1:])

    # Factur-X: PDF/A-3b with the XML and an attachment, a watermark image, then signed.
    assert pdfa_problems(invoice_pdf, 3) == []
    flavor_name, xml_back = facturx.get_xml_from_pdf(invoice_pdf, check_xsd=True)
    assert (flavor_name, xml_back) == ("factur-x.xml", XML)
    with pikepdf.open(io.BytesIO(invoice_pdf)) as pdf:
        files = pdf.attachments
        assert files["order.json"].get_file().read_bytes() == data_file
        assert str(files["factur-x.xml"].obj.AFRelationship) == "/Data"
        assert str(files["order.json"].obj.AFRelationship) == "/Supplement"
        assert "/StructTreeRoot" in pdf.Root
        meta = pdf.open_metadata()
        assert meta["{urn:factur-x:pdfa:CrossIndustryDocument:invoice:1p0#}DocumentType"] == (
            "INVOICE"
        )
        stamp_form = next(
            xobject
            for name, xobject in pdf.pages[0].Resources.XObject.items()
            if name.startswith("/Stamp")
        )
        images = [x for x in stamp_form.Resources.XObject.values() if x.Subtype == "/Image"]
        assert [(int(i.Width), int(i.Height)) for i in images] == [(120, 40)]
    status = await signature_status(invoice_pdf, ca.root)
    assert status.intact and status.valid and status.trusted, status.pretty_print_details()
    assert "Section Lines" in PdfReader(io.BytesIO(invoice_pdf)).pages[2].extract_text()

    # Encrypted, then signed: the outline and the stamp stay; the signature opens with it.
    shown = json.dumps(protected_job)
    assert "own-9b7c" not in shown and "open-4d1e" not in shown
    with pytest.raises(pikepdf.PasswordError):
        pikepdf.open(io.BytesIO(protected_pdf))
    with pikepdf.open(io.BytesIO(protected_pdf), password="open-4d1e") as pdf:
        assert pdf.encryption.R == 6 and pdf.allow.print_lowres and not pdf.allow.extract
        assert outline_titles(pdf) == headings
    status = await signature_status(protected_pdf, ca.root, password="own-9b7c")
    assert status.intact and status.valid and status.trusted, status.pretty_print_details()
    reader = PdfReader(io.BytesIO(protected_pdf), password="open-4d1e")
    assert all("CONFIDENTIAL" in page.extract_text() for page in reader.pages)


@pytest.mark.slow
async def test_a_thousand_pages_through_pdfa_stamp_and_encrypt_within_the_time_limit(
    start_app: Callable[..., Any], record_property: Callable[[str, Any], None]
) -> None:
    timeout_s = 30
    app: RunningApp = await start_app(render_slots=1, render_timeout_s=timeout_s)
    page = '<p style="break-after: page">Statement line {{ i }}: 42.00 EUR</p>'
    html = "{% for i in range(1000) %}" + page + "{% endfor %}"
    options = {"pdfa": "3b", "stamp": {"text": "COPY", "rotate": 45}}
    started = time.perf_counter()
    job, data = await render(app, {"template": html, "options": options})
    assert data is not None, job["error"]
    archived_s = time.perf_counter() - started
    options = {"stamp": {"text": "COPY"}, "encrypt": {"owner_password": "own"}}
    job, encrypted = await render(app, {"template": html, "options": options})
    assert encrypted is not None, job["error"]
    assert job["pages"] == 1000
    async with app.http.get(app.url("/metrics")) as resp:
        metrics = await resp.text()
    peak_mb = float(re.search(r"^pressroom_finish_memory_peak_bytes (\S+)$", metrics, re.M)[1])
    peak_mb /= 1024 * 1024
    steps = {
        step: float(seconds)
        for step, seconds in re.findall(
            r'^pressroom_finish_duration_seconds_sum\{step="(\w+)"\} (\S+)$', metrics, re.M
        )
    }
    record_property("finishing_peak_memory_mb", round(peak_mb))
    record_property("finishing_seconds_by_step", steps)
    print(f"1000 pages: PDF/A job {archived_s:.1f} s; finishing {steps}; peak {peak_mb:.0f} MiB")
    assert sum(steps.values()) < timeout_s
    assert pdfa_problems(data, 3) == []
    assert len(PdfReader(io.BytesIO(data)).pages) == 1000
    assert "COPY" in PdfReader(io.BytesIO(data)).pages[999].extract_text()
    with pikepdf.open(io.BytesIO(encrypted)) as pdf:  # no user password: it opens
        assert pdf.is_encrypted and len(pdf.pages) == 1000
    assert peak_mb < 512
