"""The join of a batch's PDFs: order, the outline (an entry per part, its own below it), links
within a part, and parts that are not PDFs; checked with pikepdf and pypdf."""

from __future__ import annotations

from pathlib import Path

import pikepdf
import pytest
from pypdf import PdfReader

from server.pdf.join import Part, UnreadablePart, join
from server.pipeline.combiner import JoinError, run_join
from tests.pdfs import minimal_pdf


def part(folder: Path, name: str, data: bytes) -> Part:
    path = folder / f"{name}.pdf"
    path.write_bytes(data)
    return Part(path, name)


def with_anchor_and_outline(folder: Path) -> Part:
    """Two pages: a link on the first goes by name (#end) to the second; an outline of two."""
    pdf = pikepdf.new()
    for _ in range(2):
        pdf.add_blank_page()
    end = pikepdf.Array([pdf.pages[1].obj, pikepdf.Name.Fit])
    pdf.Root.Dests = pikepdf.Dictionary({"/end": end})
    link = pikepdf.Dictionary(
        Type=pikepdf.Name.Annot,
        Subtype=pikepdf.Name.Link,
        Rect=[0, 0, 100, 100],
        Dest=pikepdf.Name("/end"),
    )
    pdf.pages[0].Annots = pdf.make_indirect(pikepdf.Array([pdf.make_indirect(link)]))
    with pdf.open_outline() as tree:
        chapter = pikepdf.OutlineItem("Chapter", 0)
        chapter.children.append(pikepdf.OutlineItem("End", 1))
        tree.root.append(chapter)
    path = folder / "anchored.pdf"
    pdf.save(path)
    return Part(path, "anchored")


def test_parts_in_order_with_an_entry_each_and_their_own_outline_below(tmp_path: Path) -> None:
    parts = [
        part(tmp_path, "first", minimal_pdf("one")),
        with_anchor_and_outline(tmp_path),
        part(tmp_path, "last", minimal_pdf("four")),
    ]
    out = tmp_path / "joined.pdf"
    assert join(parts, out, outline=True) == 4

    reader = PdfReader(out)
    assert [page.extract_text().strip() for page in reader.pages] == ["one", "", "", "four"]
    with pikepdf.open(out) as pdf:
        pages = {page.obj.objgen: n for n, page in enumerate(pdf.pages)}

        def shown(items: list[pikepdf.OutlineItem]) -> list[tuple[str, int, list[object]]]:
            return [(i.title, pages[i.destination[0].objgen], shown(i.children)) for i in items]

        with pdf.open_outline() as tree:
            assert shown(tree.root) == [
                ("first", 0, []),
                ("anchored", 1, [("Chapter", 1, [("End", 2, [])])]),
                ("last", 3, []),
            ]
        # The part's link by name still leads to its own second page.
        [link] = pdf.pages[1].Annots
        target = pdf.Root.Dests[str(link.Dest)]
        target = target.D if isinstance(target, pikepdf.Dictionary) else target
        assert pages[target[0].objgen] == 2


def test_without_the_outline_there_is_none(tmp_path: Path) -> None:
    parts = [with_anchor_and_outline(tmp_path), part(tmp_path, "b", minimal_pdf("b"))]
    out = tmp_path / "joined.pdf"
    assert join(parts, out, outline=False) == 3
    with pikepdf.open(out) as pdf:
        assert "/Outlines" not in pdf.Root


def test_a_part_that_is_not_a_pdf_is_named(tmp_path: Path) -> None:
    parts = [part(tmp_path, "fine", minimal_pdf()), part(tmp_path, "broken", b"<html>oops")]
    with pytest.raises(UnreadablePart, match="'broken' is not a readable PDF"):
        join(parts, tmp_path / "joined.pdf", outline=True)


async def test_the_child_process_says_which_part_and_that_trying_again_will_not_help(
    tmp_path: Path,
) -> None:
    good = [part(tmp_path, "a", minimal_pdf("a")), part(tmp_path, "b", minimal_pdf("b"))]
    pages, max_rss_kb = await run_join(good, tmp_path / "ok.pdf", outline=True, time_limit_s=60)
    assert pages == 2 and 10_000 < max_rss_kb < 500_000
    bad = [*good, part(tmp_path, "bad", b"%PDF-1.4 truncated")]
    with pytest.raises(JoinError) as failed:
        await run_join(bad, tmp_path / "no.pdf", outline=True, time_limit_s=60)
    assert str(failed.value).startswith("item 'bad' is not a readable PDF")
    assert not failed.value.retryable
