"""A PDF with no finishing step gets its document information and provenance as an incremental
update when its cross-reference section allows one (server/pdf/update.py), and is written whole
otherwise; both read back the same, with qpdf, pikepdf and pypdf, and depend on the inputs
alone."""

from __future__ import annotations

import io
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pikepdf
import pypdf
import pytest

from server.options import parse
from server.pdf import provenance
from server.pdf.update import Updatable

MADE = provenance.Provenance(
    pressroom="1.2.3",
    engine="Chromium 140",
    template="invoice@3",
    data_sha256="ab" * 32,
    assets={"logo.png": "cd" * 32},
    finishing=[],
)
PRINTED = "D:20261204011649+00'00'"


def printed(at: str = PRINTED, *, streams: bool = False, title: str | None = None) -> bytes:
    """A one-page PDF as Chromium writes one: a classic cross-reference table (or, `streams`,
    a cross-reference stream) and the time of printing in its document information."""
    pdf = pikepdf.new()
    pdf.add_blank_page(page_size=(595, 842))
    pdf.docinfo["/Creator"] = "Chromium"
    pdf.docinfo["/CreationDate"] = at
    pdf.docinfo["/ModDate"] = at
    if title is not None:
        pdf.docinfo["/Title"] = title
    out = io.BytesIO()
    mode = pikepdf.ObjectStreamMode.generate if streams else pikepdf.ObjectStreamMode.disable
    pdf.save(out, object_stream_mode=mode, static_id=True)
    return out.getvalue()


def checked(data: bytes, tmp_path: Path) -> dict[str, Any]:
    """What the file says, once qpdf finds nothing wrong with it and pypdf reads it."""
    path = tmp_path / "out.pdf"
    path.write_bytes(data)
    qpdf = shutil.which("qpdf")
    assert qpdf is not None, "qpdf is installed by make install"
    run = subprocess.run([qpdf, "--check", str(path)], capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert len(pypdf.PdfReader(io.BytesIO(data)).pages) == 1
    with pikepdf.open(io.BytesIO(data)) as document:
        return {
            "info": {str(k): str(v) for k, v in document.docinfo.items()},
            "xmp": provenance.read(document),
            "ids": len(document.trailer.ID),
        }


def test_a_printed_file_is_updated_in_place_and_depends_on_its_inputs_alone(
    tmp_path: Path,
) -> None:
    options = parse({"title": "Facture n° 7 — 東京", "author": "Ana Lima"})
    first = provenance.sealed(printed(), options, MADE)
    again = provenance.sealed(printed("D:20270101120000+01'00'"), options, MADE)
    assert first == again, "the dates of printing leave no trace"
    original = printed()
    assert Updatable.of(original) is not None
    blanked = original.replace(PRINTED.encode(), b" " * len(PRINTED))
    assert first.startswith(blanked), "appended: the printed bytes stay where they were"
    assert b"/Prev " in first[len(blanked) :]
    shown = checked(first, tmp_path)
    assert shown["info"] == {
        "/Creator": "Chromium",
        "/Title": "Facture n° 7 — 東京",
        "/Author": "Ana Lima",
    }
    assert shown["xmp"] == {
        "Version": "1.2.3",
        "Engine": "Chromium 140",
        "Template": "invoice@3",
        "DataSHA256": "ab" * 32,
        "Assets": ["logo.png " + "cd" * 32],
    }
    assert shown["ids"] == 2
    other = provenance.sealed(printed(), parse({"title": "Another"}), MADE)
    with pikepdf.open(io.BytesIO(other)) as one, pikepdf.open(io.BytesIO(first)) as two:
        assert one.trailer.ID[0] != two.trailer.ID[0], "the ID is a digest of the contents"


@pytest.mark.parametrize(
    "source",
    [
        pytest.param(lambda: printed(streams=True), id="a cross-reference stream"),
        pytest.param(lambda: provenance.sealed(printed(), parse({}), MADE), id="an update already"),
        pytest.param(lambda: printed(title="Date (of issue)"), id="a title that says Date"),
    ],
)
def test_a_file_that_cannot_be_updated_so_is_written_whole_alike(
    source: Callable[[], bytes], tmp_path: Path
) -> None:
    data = source()
    sealed = provenance.sealed(data, parse({"title": "T"}), MADE)
    assert not sealed.startswith(data[:-200]), "written whole"
    shown = checked(sealed, tmp_path)
    assert shown["info"]["/Title"] == "T"
    assert "/CreationDate" not in shown["info"] and "/ModDate" not in shown["info"]
    assert shown["xmp"]["Engine"] == "Chromium 140"
