"""The Office files a job may convert (Word, Excel, PowerPoint, OpenDocument, RTF), told apart
by their content, not their names: the members of an OOXML or ODF zip, the streams of an OLE
compound file (.doc, .xls, .ppt), RTF's opening. Imports nothing of the server."""

from __future__ import annotations

import dataclasses
import io
import re
import zipfile
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True, slots=True)
class Kind:
    """One accepted format."""

    extension: str
    content_type: str
    label: str


DOCX = Kind(
    ".docx",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "a Word document",
)
XLSX = Kind(
    ".xlsx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "an Excel workbook",
)
PPTX = Kind(
    ".pptx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation",
    "a PowerPoint presentation",
)
DOC = Kind(".doc", "application/msword", "a Word 97-2003 document")
XLS = Kind(".xls", "application/vnd.ms-excel", "an Excel 97-2003 workbook")
PPT = Kind(".ppt", "application/vnd.ms-powerpoint", "a PowerPoint 97-2003 presentation")
ODT = Kind(".odt", "application/vnd.oasis.opendocument.text", "an OpenDocument text")
ODS = Kind(".ods", "application/vnd.oasis.opendocument.spreadsheet", "an OpenDocument spreadsheet")
ODP = Kind(
    ".odp", "application/vnd.oasis.opendocument.presentation", "an OpenDocument presentation"
)
RTF = Kind(".rtf", "application/rtf", "a Rich Text document")
KINDS = (DOCX, DOC, ODT, RTF, XLSX, XLS, ODS, PPTX, PPT, ODP)
BY_TYPE: Mapping[str, Kind] = {kind.content_type: kind for kind in KINDS}
#: For the asset types (server/files/assets.py): each type with the extension that names it.
CONTENT_TYPES: Mapping[str, tuple[str, ...]] = {k.content_type: (k.extension,) for k in KINDS}
ALIASES: Mapping[str, str] = {"text/rtf": RTF.content_type}

#: OOXML: the content type [Content_Types].xml gives the main part.
_OOXML_MAIN = {
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml": DOCX,
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml": XLSX,
    "application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml": PPTX,
}
_OLE = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"
#: The stream an OLE file of each kind holds, as its directory entry names it.
_OLE_STREAMS = (
    ("WordDocument", DOC),
    ("Workbook", XLS),
    ("Book", XLS),
    ("PowerPoint Document", PPT),
)
_OVERRIDE = re.compile(rb'ContentType="([^"]+)"')


def accepted() -> str:
    """The accepted formats, for error messages."""
    return ", ".join(kind.extension for kind in KINDS)


def mismatch(data: bytes, kind: Kind) -> str | None:
    """Why bytes sent as `kind` are not that (what they are instead), None when they are."""
    found = detect(data)
    if found == kind:
        return None
    if found is None:
        return (
            f"is not {kind.label} ({kind.extension}) by its content; Office files may be "
            f"{accepted()}"
        )
    return (
        f"is {found.label} ({found.extension}) by its content, not {kind.label}: send it as "
        f"{found.content_type} or with a name ending {found.extension}"
    )


def detect(data: bytes) -> Kind | None:
    """The format of these bytes by their content, None for anything else."""
    if data.startswith(b"{\\rtf"):
        return RTF
    if data.startswith(_OLE):
        return _ole(data)
    if data.startswith(b"PK\x03\x04"):
        return _zipped(data)
    return None


def _zipped(data: bytes) -> Kind | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = set(archive.namelist())
            if "mimetype" in names:
                mimetype = archive.read("mimetype")[:100].decode("ascii", "replace").strip()
                found = BY_TYPE.get(mimetype)
                return found if found in (ODT, ODS, ODP) else None
            if "[Content_Types].xml" in names:
                types = archive.read("[Content_Types].xml")[: 1024 * 1024]
                for match in _OVERRIDE.finditer(types):
                    kind = _OOXML_MAIN.get(match.group(1).decode("ascii", "replace"))
                    if kind is not None:
                        return kind
    except (zipfile.BadZipFile, OSError, EOFError, KeyError, NotImplementedError):
        return None
    return None


def _ole(data: bytes) -> Kind | None:
    """An OLE compound file's kind by the streams its directory names: entries are 128 bytes at
    128-byte offsets past the 512-byte header, a UTF-16 name, its length, its type (2: stream)."""
    wanted = {name.encode("utf-16-le") + b"\0\0": kind for name, kind in _OLE_STREAMS}
    for offset in range(512, len(data) - 127, 128):
        entry = data[offset : offset + 128]
        if entry[66] != 2:
            continue
        size = int.from_bytes(entry[64:66], "little")
        kind = wanted.get(entry[:size])
        if kind is not None:
            return kind
    return None
