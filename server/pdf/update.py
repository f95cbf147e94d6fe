"""Changed objects appended to a PDF as an incremental update (ISO 32000-1, 7.5.6): the file's
bytes stay as they are, followed by the new versions of some objects, a cross-reference
section for them alone and a trailer that points back at the file's own (/Prev).

Writing a one-page PDF again whole through qpdf takes about a millisecond of CPU; appending
three objects takes a tenth of that. Only a file whose one cross-reference section is a table
(Chromium's, LibreOffice's) can be updated so here; `Updatable.of` answers None for any other
(a cross-reference stream, earlier updates, encryption), and the caller writes it whole.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re

_STARTXREF = re.compile(rb"startxref\s+(\d+)\s+%%EOF\s*$")
_ENTRY = re.compile(rb"(\d{10}) (\d{5}) ([nf])")


@dataclasses.dataclass(frozen=True, slots=True)
class Updatable:
    """A PDF that can take an incremental update: its bytes, where its cross-reference table
    starts, and where each object of the table is (object number: offset, generation)."""

    pdf: bytes
    xref_at: int
    objects: dict[int, tuple[int, int]]

    @classmethod
    def of(cls, pdf: bytes) -> Updatable | None:
        found = _STARTXREF.search(pdf, max(0, len(pdf) - 1024))
        if found is None:
            return None
        at = int(found[1])
        trailer = pdf.find(b"trailer", at)
        if pdf[at : at + 4] != b"xref" or trailer < 0 or b"/Prev" in pdf[trailer:]:
            return None
        tokens = pdf[at + 4 : trailer].split()
        objects: dict[int, tuple[int, int]] = {}
        index = 0
        try:
            while index < len(tokens):
                first, count = int(tokens[index]), int(tokens[index + 1])
                index += 2
                for number in range(first, first + count):
                    entry = _ENTRY.fullmatch(b" ".join(tokens[index : index + 3]))
                    if entry is None:
                        return None
                    if entry[3] == b"n":
                        objects[number] = (int(entry[1]), int(entry[2]))
                    index += 3
        except (ValueError, IndexError):
            return None
        return cls(pdf, at, objects)

    def body(self, number: int) -> slice | None:
        """Where object `number`'s text is (from `N G obj` to its `endobj`), if it is where
        the table says."""
        offset, generation = self.objects.get(number, (-1, 0))
        if offset < 0 or not self.pdf.startswith(b"%d %d obj" % (number, generation), offset):
            return None
        end = self.pdf.find(b"endobj", offset)
        return slice(offset, end) if end > 0 else None

    def appended(self, pdf: bytes, changed: dict[int, bytes], trailer: dict[bytes, bytes]) -> bytes:
        """`pdf` (this file's bytes, or as many with some overwritten in place) with the new
        versions of the `changed` objects (number: their text, between `obj` and `endobj`),
        their cross-reference section, and a trailer of `trailer`'s entries (/Size, /Root,
        /Info…: their values as PDF text), /Prev and a document ID that is a digest of the
        file's contents (so the same contents, the same ID)."""
        out = bytearray(pdf if pdf.endswith(b"\n") else pdf + b"\n")
        offsets = {}
        for number, text in sorted(changed.items()):
            generation = self.objects.get(number, (0, 0))[1]
            offsets[number] = (len(out), generation)
            out += b"%d %d obj\n%s\nendobj\n" % (number, generation, text)
        xref_at = len(out)
        out += b"xref\n"
        for number, (offset, generation) in offsets.items():
            out += b"%d 1\n%010d %05d n \n" % (number, offset, generation)
        digest = hashlib.md5(out, usedforsecurity=False).hexdigest().encode()
        entries = b"".join(b"/%s %s " % (name, value) for name, value in trailer.items())
        out += b"trailer\n<<%s/Prev %d /ID [<%s> <%s>]>>\nstartxref\n%d\n%%%%EOF\n" % (
            entries,
            self.xref_at,
            digest,
            digest,
            xref_at,
        )
        return bytes(out)
