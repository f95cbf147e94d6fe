"""One job in its slot: the page set up for it (media, viewport), the document loaded and waited
for, then captured as the PDF or image its options ask for.

The reusable slots' pages have a viewport of one pixel. Printing lays the document out again
at the paper's width, so the screen viewport does not change the PDF (the same bytes save the
dates, tests/e2e/test_render.py), but Chromium then has almost nothing to lay out and paint
for the screen first: a one-page invoice costs about a tenth less CPU. A job that waits for a
selector to become visible gets Playwright's usual 1280x720 while it waits, since visibility
on screen is what it asks about; pages with scripts keep 1280x720 too, as scripts (charts,
say) may size themselves to the window before printing. An image output gets the viewport its
screenshot asks for (server/render/images.py takes it).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math

from playwright.async_api import BrowserContext, Page, ViewportSize

from server.errors import PageLimitError
from server.options import RenderOptions
from server.render import images, navigation, preflight
from server.render.cgroups import Leaf
from server.render.egress import DOCUMENT_URL, Gate
from server.render.sources import Document, PageUrl

PRINT_VIEWPORT: ViewportSize = {"width": 1, "height": 1}
SCREEN_VIEWPORT: ViewportSize = {"width": 1280, "height": 720}  # Playwright's default
# Chromium paginates the whole document before it prints the first page, even when the page
# ranges stop it one page past the limit, at a cost that grows faster than the page count
# (seconds for a thousand pages of text, and then the time limit or the memory bound). A document
# this long, in characters of HTML, is laid out at the paper's width first, and refused if its
# height alone passes the limit; a shorter one paginates in milliseconds and is only counted.
MEASURE_FROM_CHARS = 64 * 1024
# Chromium shrinks content wider than the paper, to half its size at most, to fit it on.
MAX_SHRINK = 2.0
# The document's height laid out at `width` CSS pixels (null: at its viewport's), and its width
# there; null when it is shorter than `skipBelow` at its viewport already, or a stylesheet sets
# the page's size, which is then not the options' paper (cross-origin ones cannot be read).
_MEASURE = """([width, skipBelow]) => {
  const root = document.documentElement;
  if (root.scrollHeight < skipBelow) return null;
  const rulesOf = sheet => { try { return sheet ? sheet.cssRules : []; } catch { return []; } };
  const sized = rules => Array.from(rules).some(rule =>
    rule instanceof CSSPageRule ? rule.style.getPropertyValue("size") !== "" :
    rule instanceof CSSImportRule ? sized(rulesOf(rule.styleSheet)) :
    rule.cssRules !== undefined && sized(rule.cssRules));
  if (Array.from(document.styleSheets).some(sheet => sized(rulesOf(sheet)))) return null;
  if (width === null) return [root.scrollHeight, root.scrollWidth];
  const before = root.style.width;
  root.style.width = `${width}px`;
  const found = [root.scrollHeight, root.scrollWidth];
  root.style.width = before;
  return found;
}"""


@dataclasses.dataclass(slots=True)
class Slot:
    """A page in its own context, with what the current job noted while it printed."""

    context: BrowserContext
    page: Page
    gate: Gate
    generation: int
    javascript: bool
    viewport: ViewportSize
    warnings: list[str] = dataclasses.field(default_factory=list)
    media: dict[str, str] = dataclasses.field(default_factory=dict)  # as emulated last
    leaves: list[Leaf] = dataclasses.field(default_factory=list)
    oom_kills: int = 0
    served: bool = False  # the page is at the gate's reserved origin (assets, relative URLs)
    measured: bool = False  # laid out at the paper's width for the page limit (_check_length)
    facts: preflight.PageFacts | None = None  # measured for the preflight checks, if they run

    def out_of_memory(self) -> bool:
        return sum(leaf.oom_kills() for leaf in self.leaves) > self.oom_kills


async def print_in(
    slot: Slot,
    html: Document,
    options: RenderOptions,
    *,
    timeout_s: float,
    max_pages: int | None,
) -> bytes:
    """The document as the bytes its options ask for, printed in `slot`'s page."""
    timeout_ms = timeout_s * 1000
    page = slot.page
    media = options.emulated_media()
    if slot.media != media:
        await page.emulate_media(**media)  # type: ignore[arg-type]
        slot.media = media
    scripts = slot.javascript or options.wait_for_selector
    long = max_pages is not None and _may_pass(html, options)
    viewport = images.viewport(options) or (SCREEN_VIEWPORT if scripts else PRINT_VIEWPORT)
    if long and not scripts:
        # Laid out at the paper's size from the start, to be measured (_check_length).
        width, height = options.paper_px()
        viewport = {"width": math.ceil(width), "height": math.ceil(height)}
        slot.measured = True
    if slot.viewport != viewport:
        await page.set_viewport_size(viewport)
        slot.viewport = viewport
    fail_on = options.fail_on
    # Listeners only where the source or the options need them (server/render/navigation.py).
    watch = None
    if isinstance(html, PageUrl) or fail_on.console_errors or fail_on.resource_errors:
        watch = navigation.Watch(page, options, slot.warnings)
    try:
        if isinstance(html, PageUrl):
            await navigation.open_url(
                page, html.url, options, timeout_ms=timeout_ms, warnings=slot.warnings
            )
            if options.css:
                await navigation.add_css(page, options.css)
            if options.title:
                # A header's or footer's `.title` prints the document's title (as with HTML).
                await page.evaluate("title => { document.title = title; }", options.title)
        else:
            await _open(page, html, options, timeout_ms, served=slot.served)
        # Without scripts, Chromium loads lazy images at once: there is nothing to scroll for.
        if options.lazy_load and slot.javascript:
            await navigation.scroll_to_end(page)
        if options.wait_for_selector:
            await page.wait_for_selector(options.wait_for_selector, timeout=timeout_ms)
        if options.wait_for_expression:
            await page.wait_for_function(options.wait_for_expression, timeout=timeout_ms)
        if options.wait_delay_ms:
            await asyncio.sleep(options.wait_delay_ms / 1000)
        if watch is not None:
            watch.check()
    finally:
        if watch is not None:
            watch.stop()
    if long:
        assert max_pages is not None
        await _check_length(
            page, options, max_pages, at_paper=not scripts, screen_first=isinstance(html, PageUrl)
        )
    if options.preflight_checks() is not None:
        # What the printed PDF cannot tell: the layout's widths, broken images, the text.
        slot.facts = await preflight.measure(page, options)
    return await images.capture(page, options, max_pages)


def _may_pass(html: Document, options: RenderOptions) -> bool:
    """Whether the document may be long enough to pass the page limit, and can be measured:
    a PDF of all its pages (page ranges choose how many the PDF has: they are counted), on the
    options' paper (not a stylesheet's), from a page or a long HTML."""
    if options.image or options.prefer_css_page_size or options.page_ranges:
        return False
    return isinstance(html, PageUrl) or len(html) >= MEASURE_FROM_CHARS


async def _check_length(
    page: Page, options: RenderOptions, max_pages: int, *, at_paper: bool, screen_first: bool
) -> None:
    """PageLimitError, without printing, when the document laid out at the paper's width is
    taller than `max_pages` sheets, margins and page breaks not counted (so it has more pages
    still). `at_paper`: the page is at the paper's viewport already, whose width and height its
    media queries and vh units read as the print's do; otherwise (scripts may size themselves to
    the window) it keeps its own, and only its root is laid out at the paper's width for a moment.
    `screen_first`: a page of unknown length (page_url) is laid out again only when its screen
    layout is a good part of that height already."""
    width, height = options.paper_px()
    budget = max_pages * height
    at = None if at_paper else width
    found = await page.evaluate(_MEASURE, [at, budget / 4 if screen_first else 0])
    if found is None:
        return
    laid_out, wide = found
    shrink = min(max(wide / width, 1.0), MAX_SHRINK)
    if laid_out / shrink > budget:
        raise PageLimitError(max_pages)


async def _open(
    page: Page, html: str, options: RenderOptions, timeout_ms: float, *, served: bool
) -> None:
    """Load the document: written into the page (about:blank, nothing relative resolves), or,
    when its slot's gate serves it (a job with assets or relative URLs), opened at the gate's
    reserved origin, where relative URLs reach the job's files. Only those jobs pay for the
    navigation."""
    if served:
        await page.goto(DOCUMENT_URL, wait_until=options.wait_until, timeout=timeout_ms)
    else:
        await page.set_content(html, wait_until=options.wait_until, timeout=timeout_ms)
