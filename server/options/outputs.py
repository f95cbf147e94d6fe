"""What a job's files are: the document (a PDF, or an image with options.output) and, when
asked, a PNG thumbnail of its first page; each with its content type, file extension and the
signature its bytes must start with before they are stored. Imports nothing of the server: the
option model and the client commands read it too."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, slots=True)
class Output:
    """One kind of file a job can produce."""

    name: str  # as options.output says it
    content_type: str
    extension: str

    def complete(self, data: bytes) -> bool:
        """Whether `data` starts (and, for a PDF, ends) as a whole file of this kind does."""
        if self.name == "pdf":
            return data.startswith(b"%PDF-") and b"%%EOF" in data[-1024:]
        if self.name == "png":
            return data.startswith(b"\x89PNG\r\n\x1a\n")
        if self.name == "jpeg":
            return data.startswith(b"\xff\xd8\xff")
        return data[:4] == b"RIFF" and data[8:12] == b"WEBP"


PDF = Output("pdf", "application/pdf", "pdf")
PNG = Output("png", "image/png", "png")
JPEG = Output("jpeg", "image/jpeg", "jpg")
WEBP = Output("webp", "image/webp", "webp")
OUTPUTS: Mapping[str, Output] = {output.name: output for output in (PDF, PNG, JPEG, WEBP)}
IMAGES = ("png", "jpeg", "webp")
_BY_TYPE = {output.content_type: output for output in OUTPUTS.values()}

#: A thumbnail is a PNG of the PDF's first page.
THUMBNAIL = PNG


def of(options: Mapping[str, Any]) -> Output:
    """The output a job's stored options (or its public JSON's `options`) ask for."""
    return OUTPUTS[options.get("output") or "pdf"]


def wants_thumbnail(options: Mapping[str, Any]) -> bool:
    """Whether a job's stored options ask for a thumbnail."""
    return options.get("thumbnail") is not None


def incomplete(data: bytes, content_type: str) -> str | None:
    """Why a file of this type is not whole (a truncated render, an error page, an upload that
    is not what it says), or None; files of other types are not Pressroom's to judge."""
    output = _BY_TYPE.get(content_type)
    if output is not None and not output.complete(data):
        return f"not a complete {output.name.upper()} file"
    return None
