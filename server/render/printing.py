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

from playwright.async_api import BrowserContext, Page, ViewportSize

from server.options import RenderOptions
from server.render import images, navigation
from server.render.cgroups import Leaf
from server.render.egress import DOCUMENT_URL, Gate
from server.render.sources import Document, PageUrl

PRINT_VIEWPORT: ViewportSize = {"width": 1, "height": 1}
SCREEN_VIEWPORT: ViewportSize = {"width": 1280, "height": 720}  # Playwright's default


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
    viewport = images.viewport(options) or (SCREEN_VIEWPORT if scripts else PRINT_VIEWPORT)
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
    return await images.capture(page, options, max_pages)


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
