"""Reproducible PDFs and their provenance, on real Chromium: the same job twice gives the same
bytes; the XMP, read back with pikepdf, says what made the PDF, as the job's JSON does; a
PDF/A stays one by the project's checks; a signature covers the provenance."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pikepdf
import pytest
from pyhanko.sign.validation import SignatureCoverageLevel

from server.pdf import provenance
from tests import testca
from tests.conftest import RunningApp
from tests.e2e.test_finishing import signature_status, upload
from tests.e2e.test_render import render
from tests.pdfs import pdfa_problems, small_image

pytestmark = pytest.mark.browser

DATA = {"n": 42, "client": {"name": "Ana", "city": "Lisboa"}}
HTML = '<h1>Invoice {{ n }}</h1><p>for {{ client.name }}</p><img src="img/logo.png">'


@pytest.fixture
async def signing_app(start_app: Callable[..., Any], tmp_path: Path) -> tuple[RunningApp, Any]:
    ca = testca.make(tmp_path)
    env = {"PRESSROOM_SIGNING_KEY": ca.p12, "PRESSROOM_SIGNING_KEY_PASSWORD": ca.password}
    app: RunningApp = await start_app(render_slots=2, env=env)
    return app, ca


def xmp(pdf: bytes) -> dict[str, Any]:
    with pikepdf.open(io.BytesIO(pdf)) as document:
        return provenance.read(document)


async def test_the_same_job_twice_gives_the_same_bytes_and_says_what_made_them(
    signing_app: tuple[RunningApp, Any],
) -> None:
    app, _ = signing_app
    logo = await upload(app, small_image("png", (60, 20)), "image/png")
    body = {
        "template": HTML,
        "data": DATA,
        "assets": {"img/logo.png": logo},
        "options": {"title": "Invoice 42", "author": "Pressroom"},
    }
    # The same data written another way (key order, spacing) is the same data.
    again = {**body, "data": json.loads(json.dumps(DATA, indent=2, sort_keys=True))}
    (first, one), (second, two) = await asyncio.gather(render(app, body), render(app, again))
    assert one is not None and two is not None, (first["error"], second["error"])
    assert hashlib.sha256(one).hexdigest() == hashlib.sha256(two).hexdigest()
    assert first["id"] != second["id"]

    with pikepdf.open(io.BytesIO(one)) as pdf:
        assert "/CreationDate" not in pdf.docinfo and "/ModDate" not in pdf.docinfo
        assert str(pdf.docinfo["/Title"]) == "Invoice 42"
        assert len(pdf.trailer.ID) == 2
    digest = hashlib.sha256(
        json.dumps(DATA, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()
    made = first["provenance"]
    assert made == second["provenance"]
    assert made["data_sha256"] == digest
    assert made["assets"] == {"img/logo.png": logo}
    assert made["engine"].startswith("Chromium ") and made["pressroom"]
    assert made["template"] is None and made["finishing"] == ["metadata"]
    assert xmp(one) == {
        "Version": made["pressroom"],
        "Engine": made["engine"],
        "DataSHA256": digest,
        "Assets": [f"img/logo.png {logo}"],
        "Finishing": ["metadata"],
    }
    # Other data: another PDF.
    other, three = await render(app, {**body, "data": {**DATA, "n": 43}})
    assert three is not None and three != one
    assert other["provenance"]["data_sha256"] != digest


async def test_a_pdfa_with_its_provenance_stays_pdfa_and_a_signature_covers_it(
    signing_app: tuple[RunningApp, Any],
) -> None:
    app, ca = signing_app
    options: dict[str, Any] = {"pdfa": "3b", "stamp": {"text": "PAID"}, "tagged": True}
    signed = {**options, "sign": {"reason": "issued"}}
    (archived_job, archived), (_, again), (signed_job, signed_pdf) = await asyncio.gather(
        *(
            render(app, {"template": "<h1>Invoice {{ n }}</h1>", "data": {"n": 7}, "options": o})
            for o in (options, options, signed)
        )
    )
    assert archived is not None and again is not None and signed_pdf is not None
    assert archived == again, "PDF/A with a stamp is reproducible too"
    assert pdfa_problems(archived, 3) == []
    steps = ["stamp", "pdfa"]
    assert xmp(archived)["Finishing"] == archived_job["provenance"]["finishing"] == steps
    with pikepdf.open(io.BytesIO(archived)) as pdf:
        packet = pdf.Root.Metadata.read_bytes().decode()
        meta = pdf.open_metadata()
        assert meta["pdfaid:part"] == "3"
    # PDF/A declares every property outside its standard schemas in an extension schema.
    assert f"<pdfaSchema:namespaceURI>{provenance.NAMESPACE}</pdfaSchema:namespaceURI>" in packet
    for name in provenance.PROPERTIES:
        assert f"<pdfaProperty:name>{name}</pdfaProperty:name>" in packet

    assert pdfa_problems(signed_pdf, 3) == []
    assert xmp(signed_pdf)["Finishing"] == [*steps, "sign"]
    assert signed_job["provenance"]["finishing"] == [*steps, "sign"]
    status = await signature_status(signed_pdf, ca.root)
    assert status.intact and status.valid and status.trusted, status.pretty_print_details()
    # The signature covers the whole file but itself, the XMP with the provenance included.
    assert status.coverage == SignatureCoverageLevel.ENTIRE_FILE
    with pikepdf.open(io.BytesIO(signed_pdf)) as pdf:
        packet = pdf.Root.Metadata.read_bytes()
    assert signed_pdf.index(packet) < signed_pdf.rindex(b"/ByteRange")


async def test_a_factur_x_invoice_keeps_its_own_xmp_beside_the_provenance(
    signing_app: tuple[RunningApp, Any],
) -> None:
    app, _ = signing_app
    xml, order = await asyncio.gather(
        upload(
            app,
            (Path(__file__).parents[1] / "files" / "factur-x-minimum.xml").read_bytes(),
            "application/xml",
        ),
        upload(app, b'{"order": 42}', "application/json"),
    )
    attached = [{"asset": order, "name": "order.json", "relationship": "Supplement"}]
    body = {
        "template": "<h1>Invoice</h1>",
        "options": {"facturx": {"xml": xml}, "attachments": attached},
    }
    # One after the other: two Factur-X checks at once can fail to load the XSD (lxml).
    job, data = await render(app, body)
    _, again = await render(app, body)
    assert data is not None, job["error"]
    # Each embedded file is dated when its asset was uploaded: the same bytes again.
    assert data == again
    assert pdfa_problems(data, 3) == []
    assert xmp(data)["Assets"] == [
        f"options.attachments[0].asset {order}",
        f"options.facturx.xml {xml}",
    ]
    assert job["provenance"]["finishing"] == ["attachments", "facturx", "pdfa"]
    with pikepdf.open(io.BytesIO(data)) as pdf:
        meta = pdf.open_metadata()
        assert meta["{urn:factur-x:pdfa:CrossIndustryDocument:invoice:1p0#}DocumentType"] == (
            "INVOICE"
        )
        assert "xmp:CreateDate" not in meta


async def test_a_stored_template_is_named_by_its_version(
    signing_app: tuple[RunningApp, Any],
) -> None:
    app, _ = signing_app
    for html in ("<h1>Note {{ n }}</h1>", "<h1>Note {{ n }}, second version</h1>"):
        body = {"name": "note", "html": html}
        async with app.http.post(app.url("/v1/templates"), json=body) as resp:
            assert resp.status in (200, 201), await resp.text()
    (first, one), (second, two) = await asyncio.gather(
        render(app, {"template_id": "note@1", "data": {"n": 1}}),
        render(app, {"template_id": "note@2", "data": {"n": 1}}),
    )
    assert one is not None and two is not None, (first["error"], second["error"])
    assert first["provenance"]["template"] == "note@1" == xmp(one)["Template"]
    assert second["provenance"]["template"] == "note@2" == xmp(two)["Template"]
    assert first["provenance"]["data_sha256"] == second["provenance"]["data_sha256"]
