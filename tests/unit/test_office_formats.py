"""Office formats told by content: files made by python-docx, openpyxl and python-pptx, an
OpenDocument zip, RTF and OLE compound files are recognised whatever their names; anything
else (a zip of something else, a truncated file, text) is not; page ranges reach LibreOffice
in its own notation."""

from __future__ import annotations

import io
import zipfile

import docx
import openpyxl
import pptx
import pytest

from server.files import office_formats
from server.files.assets import Upload
from server.render.office import page_ranges


def saved(document: object) -> bytes:
    out = io.BytesIO()
    document.save(out)  # type: ignore[attr-defined]
    return out.getvalue()


def opendocument(mimetype: str) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as archive:
        archive.writestr("mimetype", mimetype)
        archive.writestr("content.xml", "<office:document-content/>")
    return out.getvalue()


def compound_file(stream: str) -> bytes:
    """The header and one directory sector of an OLE compound file naming `stream`."""
    header = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(504)
    name = stream.encode("utf-16-le") + b"\0\0"
    entry = name.ljust(64, b"\0") + len(name).to_bytes(2, "little") + b"\x02" + bytes(61)
    root = "Root Entry".encode("utf-16-le") + b"\0\0"
    first = root.ljust(64, b"\0") + len(root).to_bytes(2, "little") + b"\x05" + bytes(61)
    return header + first + entry + bytes(256)


@pytest.mark.parametrize(
    ("data", "kind"),
    [
        (saved(docx.Document()), office_formats.DOCX),
        (saved(openpyxl.Workbook()), office_formats.XLSX),
        (saved(pptx.Presentation()), office_formats.PPTX),
        (opendocument("application/vnd.oasis.opendocument.text"), office_formats.ODT),
        (opendocument("application/vnd.oasis.opendocument.spreadsheet"), office_formats.ODS),
        (opendocument("application/vnd.oasis.opendocument.presentation"), office_formats.ODP),
        (b"{\\rtf1\\ansi Hello\\par}", office_formats.RTF),
        (compound_file("WordDocument"), office_formats.DOC),
        (compound_file("Workbook"), office_formats.XLS),
        (compound_file("PowerPoint Document"), office_formats.PPT),
    ],
)
def test_each_format_is_told_by_its_content(data: bytes, kind: office_formats.Kind) -> None:
    assert office_formats.detect(data) == kind


def test_other_files_are_not_office_files() -> None:
    word = saved(docx.Document())
    other_zip = io.BytesIO()
    with zipfile.ZipFile(other_zip, "w") as archive:
        archive.writestr("[Content_Types].xml", '<Types><Override ContentType="text/plain"/>')
    for data in (
        b"%PDF-1.7\n",
        b"plain text",
        word[: len(word) // 2],  # cut short: its zip directory is gone
        other_zip.getvalue(),
        opendocument("application/vnd.oasis.opendocument.graphics"),
        compound_file("Something Else"),
    ):
        assert office_formats.detect(data) is None


def test_an_upload_must_be_what_its_type_says() -> None:
    slides = saved(pptx.Presentation())
    wrong = Upload("sha256:" + "0" * 64, slides, office_formats.DOCX.content_type)
    assert wrong.problem() == (
        "is a PowerPoint presentation (.pptx) by its content, not a Word document: send it as "
        f"{office_formats.PPTX.content_type} or with a name ending .pptx"
    )
    text = Upload("sha256:" + "0" * 64, b"hello", office_formats.XLSX.content_type)
    assert "Office files may be .docx, .doc, .odt, .rtf, .xlsx" in (text.problem() or "")
    right = Upload("sha256:" + "0" * 64, slides, office_formats.PPTX.content_type)
    assert right.problem() is None


def test_page_ranges_in_libreoffice_notation() -> None:
    assert page_ranges("1-3, 5") == "1-3;5"
    assert page_ranges("2") == "2"
    assert page_ranges("") == ""
