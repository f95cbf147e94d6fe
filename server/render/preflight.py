"""Preflight: what a printed PDF shows that its author would want to know, each finding of a
kind `fail_on` can make fatal: `overflow`, `missing_glyph`, `low_resolution_image`,
`broken_image`, `blank_page`.

Each kind is measured on what Chromium laid out and printed, not guessed from the HTML, in two
halves that cost one round trip to the page and one read of the PDF:

- in the page, once it is loaded and before it prints, one evaluate() (PAGE_FACTS): the
  document laid out at the width of the paper's printable area (its margins off, the options'
  scale applied; the root's width set for the measure and put back, as the page limit's
  measure does), which elements run past that width or have content cut off by their own box
  (overflow other than visible); which images failed to decode (naturalWidth 0: broken); the
  natural size of every other image, to name it in the PDF; and the text's characters beyond
  ASCII;
- in the PDF Chromium printed, read by PDFium (pypdfium2, Chromium's own PDF engine) in a
  thread: a page with no object drawn is blank; each image's pixels over its size on the paper
  give its DPI as printed (Chromium's shrink-to-fit included); and a character of the page's
  text that the PDF's text layer lacks was drawn by no font (Chromium draws .notdef boxes,
  which map to no character), unless an installed font has it (fontconfig; then it went
  missing in shaping, not for want of a font).

Findings are warnings on the job: a string that starts with its kind (`overflow: …`, kept in
the job's `warnings` as every other warning is) and a structured {kind, page, detail} in its
`preflight` list. Findings measured in the page have no page number (the layout measured is
not yet paginated); those read from the PDF have theirs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import shutil
import subprocess
import unicodedata
from typing import Any

import pypdfium2
from playwright.async_api import Page

from server.errors import PermanentError
from server.options import RenderOptions
from server.options.values import length_px
from server.render.images import PDFIUM

#: Elements named per kind at most, so that a table of a thousand cut cells says so once.
MAX_NAMED = 5
#: The widest an element may run past the printable width, in CSS pixels, before it counts:
#: sub-pixel layout rounds.
_SLACK_PX = 1
FC_TIMEOUT_S = 5
# One round trip: the facts the checks need from the laid-out page (see the module's text).
PAGE_FACTS = """([width, maxNamed, slack]) => {
  const root = document.documentElement;
  const body = document.body || root;
  const name = el => {
    let text = el.tagName.toLowerCase();
    if (el.id) return `${text}#${el.id}`;
    if (el.classList.length) text += "." + Array.from(el.classList).slice(0, 2).join(".");
    return text;
  };
  const shown = src => src.startsWith("data:") ? `${src.slice(0, 32)}...` : src.slice(0, 200);
  const images = [], broken = [];
  for (const image of document.images) {
    const src = image.currentSrc || image.getAttribute("src") || "";
    if (image.naturalWidth > 0) images.push([shown(src), image.naturalWidth, image.naturalHeight]);
    else if (image.complete && src && getComputedStyle(image).display !== "none")
      broken.push(shown(src));
  }
  const chars = Array.from(new Set(body.innerText.replace(/[\\x00-\\x7f]/g, ""))).join("");
  const before = root.style.width;
  root.style.width = `${width}px`;
  const left = root.getBoundingClientRect().left;
  const wide = root.scrollWidth;
  const past = [], clipped = [];
  const walker = document.createTreeWalker(body, NodeFilter.SHOW_ELEMENT);
  for (let el = walker.currentNode; el; el = walker.nextNode()) {
    const cutX = el.scrollWidth > el.clientWidth + slack;
    const cutY = el.scrollHeight > el.clientHeight + slack;
    if ((cutX || cutY) && el.clientWidth + el.clientHeight > 0 && clipped.length < maxNamed) {
      const style = getComputedStyle(el);
      if ((cutX && style.overflowX !== "visible") || (cutY && style.overflowY !== "visible"))
        clipped.push([name(el), el.scrollWidth, el.clientWidth, el.scrollHeight, el.clientHeight]);
    }
    if (wide > width + slack && past.length < maxNamed) {
      const right = el.getBoundingClientRect().right - left;
      if (right > width + slack && !past.some(([, , outer]) => outer.contains(el)))
        past.push([name(el), Math.round(right), el]);
    }
  }
  root.style.width = before;
  return { images, broken, chars, wide,
           past: past.map(([label, right]) => [label, right]), clipped };
}"""


@dataclasses.dataclass(frozen=True, slots=True)
class Finding:
    """One preflight warning: its kind, its page (1 is the first; None: measured in the page,
    before pagination) and what it found."""

    kind: str
    page: int | None
    detail: str

    def warning(self) -> str:
        """As the job's `warnings` list it: the kind first."""
        where = f" (page {self.page})" if self.page is not None else ""
        return f"{self.kind}{where}: {self.detail}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "page": self.page, "detail": self.detail}


@dataclasses.dataclass(frozen=True, slots=True)
class PageFacts:
    """What PAGE_FACTS measured, and the width it measured at (CSS pixels)."""

    width_px: float
    images: list[tuple[str, int, int]]
    broken: list[str]
    chars: str
    wide_px: float
    past: list[tuple[str, float]]
    clipped: list[tuple[str, int, int, int, int]]


def printable_width_px(options: RenderOptions) -> float:
    """The width the page is laid out at for print: the paper's, less its side margins, in
    CSS pixels of the page (the options' scale applied)."""
    paper_px, _ = options.paper_px()
    margin = options.pdf_arguments()["margin"]
    sides = length_px(margin["left"]) + length_px(margin["right"])
    return paper_px - sides / options.scale


async def measure(page: Page, options: RenderOptions) -> PageFacts:
    """The facts of the loaded page, in one round trip (PAGE_FACTS)."""
    width = printable_width_px(options)
    found = await page.evaluate(PAGE_FACTS, [width, MAX_NAMED, _SLACK_PX])
    return PageFacts(
        width_px=width,
        images=[(src, int(w), int(h)) for src, w, h in found["images"]],
        broken=list(found["broken"]),
        chars=found["chars"],
        wide_px=float(found["wide"]),
        past=[(label, float(right)) for label, right in found["past"]],
        clipped=[tuple(item) for item in found["clipped"]],
    )


def page_findings(facts: PageFacts) -> list[Finding]:
    """overflow and broken_image, from the page's facts."""
    found: list[Finding] = []
    if facts.past:
        # Chromium shrinks a page wider than the paper to fit, to half its size at most, and
        # cuts off what is wider still.
        shrink = facts.width_px / facts.wide_px
        how = (
            f"printed at {shrink:.0%} of its size"
            if shrink >= 0.5
            else "printed at 50% of its size and cut off at the right"
        )
        names = ", ".join(f"{label} ({right:.0f} px)" for label, right in facts.past)
        found.append(
            Finding(
                "overflow",
                None,
                f"runs past the page's printable width of {facts.width_px:.0f} px: {names}; "
                f"the page is {facts.wide_px:.0f} px wide, {how}",
            )
        )
    for label, scroll_w, client_w, scroll_h, client_h in facts.clipped:
        cut = []
        if scroll_w > client_w + _SLACK_PX:
            cut.append(f"{scroll_w} px of content in {client_w} px of width")
        if scroll_h > client_h + _SLACK_PX:
            cut.append(f"{scroll_h} px of content in {client_h} px of height")
        found.append(Finding("overflow", None, f"{label} cuts off its content: {', '.join(cut)}"))
    for src in facts.broken:
        found.append(Finding("broken_image", None, f"the image {src} cannot be shown"))
    return found


@dataclasses.dataclass(frozen=True, slots=True)
class _Printed:
    """What PDFium read of the PDF: each page's object count and images (pixels, DPI), and
    the text layer's characters."""

    objects: list[int]
    images: list[list[tuple[int, int, float]]]
    chars: set[str]


def _read(pdf: bytes) -> _Printed:
    with PDFIUM:
        document = pypdfium2.PdfDocument(pdf)
        try:
            objects: list[int] = []
            images: list[list[tuple[int, int, float]]] = []
            chars: set[str] = set()
            for page in document:
                try:
                    count, shown = 0, []
                    for item in page.get_objects(max_depth=4):
                        count += 1
                        if item.type == pypdfium2.raw.FPDF_PAGEOBJ_IMAGE:
                            meta = item.get_metadata()
                            dpi = min(meta.horizontal_dpi, meta.vertical_dpi)
                            shown.append((int(meta.width), int(meta.height), float(dpi)))
                    objects.append(count)
                    images.append(shown)
                    text = page.get_textpage()
                    try:
                        chars.update(text.get_text_range())
                    finally:
                        text.close()
                finally:
                    page.close()
        finally:
            document.close()
    return _Printed(objects, images, chars)


def _drawn(char: str) -> bool:
    """Whether a character is one a font draws a glyph for (not a space, a control or a mark
    that joins the glyph before it)."""
    # Unassigned (Cn) here may be assigned in the browser's newer Unicode: it counts.
    category = unicodedata.category(char)
    return category[0] not in "ZM" and category not in ("Cc", "Cf", "Cs", "Co")


@functools.lru_cache(maxsize=4096)
def _installed_font_has(char: str) -> bool:
    """Whether an installed font (fontconfig, as Chromium finds its fallbacks) covers `char`;
    False when fontconfig cannot be asked (then the PDF's evidence alone counts)."""
    fc_list = shutil.which("fc-list")
    if fc_list is None:
        return False
    try:
        found = subprocess.run(
            [fc_list, f":charset={ord(char):x}", "family"],
            capture_output=True,
            timeout=FC_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return bool(found.stdout.strip())


def _named(char: str) -> str:
    name = unicodedata.name(char, "")
    return f"U+{ord(char):04X} {name} ({char})" if name else f"U+{ord(char):04X} ({char})"


def pdf_findings(pdf: bytes, facts: PageFacts, min_dpi: int) -> list[Finding]:
    """missing_glyph, low_resolution_image and blank_page, from the printed PDF (CPU work:
    call in a thread)."""
    printed = _read(pdf)
    found: list[Finding] = []
    absent = [c for c in facts.chars if _drawn(c) and c not in printed.chars]
    missing = [c for c in absent if not _installed_font_has(c)]
    if missing:
        named = ", ".join(_named(c) for c in missing[:20])
        more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
        found.append(
            Finding("missing_glyph", None, f"no installed or uploaded font draws {named}{more}")
        )
    by_size: dict[tuple[int, int], str] = {}
    for src, width, height in facts.images:
        by_size.setdefault((width, height), src)
    for number, shown in enumerate(printed.images, start=1):
        for width, height, dpi in shown:
            image = by_size.get((width, height))
            if image is None or dpi >= min_dpi:
                continue  # a CSS background, or Chromium's own broken-image icon: not named
            found.append(
                Finding(
                    "low_resolution_image",
                    number,
                    f"the image {image} ({width}x{height} px) is printed at {dpi:.0f} DPI, "
                    f"below {min_dpi}",
                )
            )
    for number, count in enumerate(printed.objects, start=1):
        if count == 0:
            found.append(Finding("blank_page", number, "nothing is drawn on the page"))
    return found


async def check(pdf: bytes, facts: PageFacts, options: RenderOptions) -> list[Finding]:
    """Every finding of the printed page; PermanentError on the first one of a kind that
    fail_on names."""
    settings = options.preflight_checks()
    assert settings is not None
    found = page_findings(facts)
    found += await asyncio.to_thread(pdf_findings, pdf, facts, settings.min_dpi)
    fatal = options.fail_on.preflight_kinds()
    for finding in found:
        if finding.kind in fatal:
            raise PreflightFailed(finding, found)
    return found


class PreflightFailed(PermanentError):
    """A finding of a kind fail_on names: the job fails at once, naming it."""

    def __init__(self, finding: Finding, found: list[Finding]) -> None:
        super().__init__(f"preflight found {finding.warning()}")
        self.finding = finding
        self.found = found
