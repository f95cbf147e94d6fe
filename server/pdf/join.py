"""Join PDFs into one, in order, with one outline entry per part: the combined file of a batch.

Runs as a child process (`python -m server.pdf.join`), off Pressroom's event loop, so a join of
a thousand parts uses another core and its memory goes back to the system when it ends. It
imports nothing of the server: the child loads pikepdf (qpdf) and nothing else. The manifest
comes on stdin as JSON, `{"parts": [{"path", "title"}], "output", "outline"}`; the answer on
stdout, `{"pages", "max_rss_kb"}`. Exit status 0, or UNREADABLE when a part is not a PDF qpdf
can read (its title is named on stderr: the same parts would fail again), anything else for a
failure that may pass (no disk space, killed).

One part is open at a time: pikepdf copies a page with its streams' data as it is stored
(compressed, never decoded), so each part is closed once its pages are in, and memory holds
the output's objects until they are written (docs/decisions/014-batch-join-in-a-child-process.md).
"""

from __future__ import annotations

import io
import json
import resource
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pikepdf

#: The exit status of a join whose parts cannot be read: trying again would not help.
UNREADABLE = 3


@dataclass(frozen=True, slots=True)
class Part:
    """A PDF to join: a file, or its bytes (a `pdfs` job's uploads, in memory already), and
    the title of its outline entry (empty: the PDF's own title, else "Document N")."""

    path: Path | bytes
    title: str


def reason(exc: Exception) -> str:
    """What qpdf says is wrong, without the stream it names (for bytes read from memory, the
    repr of a BytesIO, which says nothing to whoever sent the file)."""
    text = str(exc)
    return text.partition(">: ")[2] or text if text.startswith("stream <") else text


class UnreadablePart(Exception):
    """A part is not a PDF qpdf can read."""

    def __init__(self, part: Part, why: str) -> None:
        super().__init__(f"{part.title!r} is not a readable PDF: {why}")
        self.part = part
        self.why = why


def join(parts: Sequence[Part], output: Path, *, outline: bool) -> int:
    """Write the parts' pages, in order, to `output`; with `outline`, one outline entry per
    part (its title, at its first page) holding the part's own outline, if it has one. What
    each part holds for its pages (named destinations of its links, form fields, layers, its
    outline) comes along with them (pikepdf's add_pages_from), but signatures. Returns the page
    count."""
    with pikepdf.new() as joined:
        add(joined, parts, outline=outline)
        joined.save(output)
        return len(joined.pages)


def add(joined: pikepdf.Pdf, parts: Sequence[Part], *, outline: bool) -> None:
    """The parts' pages appended to `joined`, in order, as join() writes them (a `pdfs` job's
    finishing continues with the document)."""
    firsts: list[int] = []
    titles: list[str] = []
    # The last top-level outline item once each part is in: the items after the one of
    # the part before are the part's own.
    lasts: list[tuple[int, int] | None] = []
    for number, part in enumerate(parts, start=1):
        firsts.append(len(joined.pages))
        opened = io.BytesIO(part.path) if isinstance(part.path, bytes) else part.path
        try:
            with pikepdf.open(opened) as source:
                own = source.docinfo.get("/Title") if not part.title else None
                joined.add_pages_from(source, outlines="preserve" if outline else "ignore")
        except pikepdf.PdfError as exc:
            raise UnreadablePart(part, reason(exc)) from None
        titles.append(part.title or (str(own) if own else "") or f"Document {number}")
        if outline:
            lasts.append(_last_top_level(joined))
    if outline:
        _outline_by_part(joined, titles, firsts, lasts)
    _drop_signatures(joined)


def _drop_signatures(pdf: pikepdf.Pdf) -> None:
    """The parts' signature fields, and their widgets, taken out: a signature covers the bytes
    of the file it was made in, so in a joined file every reader would show it broken. What is
    joined is signed anew, if at all (a job's `sign`, a batch's `combine.sign`)."""
    form = pdf.Root.get("/AcroForm")
    if not isinstance(form, pikepdf.Dictionary) or "/Fields" not in form:
        return
    dropped: set[tuple[int, int]] = set()
    kept = pikepdf.Array()
    for field in form.Fields:
        if field.get("/FT") == pikepdf.Name.Sig:
            dropped.add(field.objgen)
            dropped.update(kid.objgen for kid in field.get("/Kids", ()))
        else:
            kept.append(field)
    if not dropped:
        return
    form.Fields = kept
    if "/SigFlags" in form:
        del form["/SigFlags"]
    for page in pdf.pages:
        annots = page.obj.get("/Annots")
        if isinstance(annots, pikepdf.Array):
            page.obj.Annots = pikepdf.Array(
                annot for annot in annots if annot.objgen not in dropped
            )


def _last_top_level(pdf: pikepdf.Pdf) -> tuple[int, int] | None:
    outlines = pdf.Root.get("/Outlines")
    last = outlines.get("/Last") if isinstance(outlines, pikepdf.Dictionary) else None
    return last.objgen if isinstance(last, pikepdf.Dictionary) else None


def _outline_by_part(
    pdf: pikepdf.Pdf,
    titles: list[str],
    firsts: list[int],
    lasts: list[tuple[int, int] | None],
) -> None:
    """One top-level entry per part, at its first page, with the part's own items below it."""
    with pdf.open_outline() as tree:
        carried = iter(list(tree.root))
        entries = []
        previous: tuple[int, int] | None = None
        for title, first, last in zip(titles, firsts, lasts, strict=True):
            entry = pikepdf.OutlineItem(title, first)
            if last != previous:
                for item in carried:
                    entry.children.append(item)
                    if item.obj is not None and item.obj.objgen == last:
                        break
            previous = last
            entries.append(entry)
        tree.root[:] = entries
    pdf.Root.PageMode = pikepdf.Name.UseOutlines


def main() -> int:
    manifest = json.load(sys.stdin)
    parts = [Part(Path(part["path"]), part["title"]) for part in manifest["parts"]]
    try:
        pages = join(parts, Path(manifest["output"]), outline=manifest["outline"])
    except UnreadablePart as exc:
        print(exc, file=sys.stderr)
        return UNREADABLE
    json.dump({"pages": pages, "max_rss_kb": peak_rss_kb()}, sys.stdout)
    return 0


def peak_rss_kb() -> int:
    """This process's peak resident memory since it started: Linux's VmHWM (ru_maxrss would
    count the parent's pages this process shared between its fork and its exec)."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


if __name__ == "__main__":
    sys.exit(main())
