"""HTML → PDF in one long-lived Chromium, with jobs kept apart and the network policed.

Isolation without a new browser context per job: pages without scripts print in reusable
slots, each a context of its own with JavaScript off and one page (nothing can write globals,
storage or cookies from script; cookies set by subresource responses are cleared after each
job, and concurrent jobs never share a cookie jar). A page with scripts gets a fresh context
of its own, closed after the job. What a job does in its slot is server/render/printing.py;
which browser runs, with which flags, is server/render/browsers.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Mapping
from typing import Any, Protocol

import psutil
from playwright.async_api import Browser, BrowserContext, Page, Playwright, async_playwright
from playwright.async_api import Error as PlaywrightError

from server.errors import PermanentError, TransientError
from server.netpolicy import NetworkPolicy
from server.options import RenderOptions
from server.render import preflight
from server.render.browsers import (
    CHROMIUM_ARGS,
    browser_memory_mb,
    browser_processes,
    child_pids,
    choose_chromium,
    renderer_pids,
)
from server.render.cgroups import Leaf, RenderCgroups
from server.render.dropuser import Launcher, launcher
from server.render.egress import Gate, Site, loads_relative
from server.render.preflight import Finding
from server.render.printing import PRINT_VIEWPORT, SCREEN_VIEWPORT, Slot, print_in
from server.render.sources import Document, PageUrl

log = logging.getLogger(__name__)

_PAGE_OBJECT = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")
CLOSE_TIMEOUT_S = 5.0
# Reading PSS walks every mapping of every Chromium process (about 50 ms of CPU with two
# slots busy): often enough to catch a browser growing past its mark, rarely enough to cost
# no throughput (at 5 s it was 1 % of a render benchmark's samples).
MEMORY_CHECK_INTERVAL_S = 30.0
# Chromium's caches grow over a long run: a fresh browser after this many jobs bounds that
# at one relaunch per thousand documents.
RECYCLE_AFTER_JOBS = 1000
# Several times what a browser of two slots settles at (about 410 MiB PSS in the soak of
# docs/performance.md), so only one that leaks or hoards is recycled for its memory.
MAX_RSS_MB = 1500


@dataclasses.dataclass(frozen=True, slots=True)
class RenderResult:
    data: bytes  # the PDF, or the image options.output asks for
    pages: int | None  # None for an image
    warnings: list[str]
    #: The preflight checks' findings (server/render/preflight.py), each in `warnings` too.
    preflight: list[Finding] = dataclasses.field(default_factory=list)


#: A job's files by the path its page names them with → (content type, bytes).
Assets = Mapping[str, tuple[str, bytes]]


class Renderer(Protocol):
    """Turns HTML (or a page it opens) into PDF or image bytes. Raises PermanentError or
    TransientError."""

    async def render(
        self,
        html: Document,
        options: RenderOptions,
        *,
        timeout_s: float,
        assets: Assets | None = None,
    ) -> RenderResult:
        """With `assets`, relative URLs in the page resolve to those files (and only those)."""
        ...

    async def check(self) -> None:
        """Raise when the renderer cannot take work (readiness)."""
        ...


def count_pages(pdf: bytes) -> int:
    """Page objects in a Chromium PDF (Skia writes no object streams, so they are plain text)."""
    return len(_PAGE_OBJECT.findall(pdf))


class ChromiumRenderer:
    """One Chromium per process, relaunched when it crashes and recycled after many jobs."""

    def __init__(
        self,
        *,
        policy: NetworkPolicy,
        slots: int,
        executable: str | None = None,
        user: str = "nobody",
        recycle_after_jobs: int = RECYCLE_AFTER_JOBS,
        max_rss_mb: int = MAX_RSS_MB,
        render_max_mb: int = 1024,
        max_pages: int | None = None,
        memory_check_interval_s: float = MEMORY_CHECK_INTERVAL_S,
    ) -> None:
        self._policy = policy
        self._render_max_mb = render_max_mb
        self._max_pages = max_pages
        self._user = user
        self._launcher: Launcher | None = None
        #: Chromium's sandbox is on (it is tried first; off where the kernel refuses it).
        self.sandbox = False
        #: The browser's version and executable, once launched (start log, /readyz, /metrics).
        self.engine = ""
        #: The engine a PDF's provenance names: the browser and its version, once launched.
        self.engine_version = ""
        self._cgroups: RenderCgroups | None = None
        self._stale_leaves: list[Leaf] = []
        self._slot_lock = asyncio.Lock()
        #: How renders are bounded in memory here, for the start log and /readyz.
        self.memory_bound = f"V8 heap only, {render_max_mb} MiB"
        self._slots = max(slots, 1)
        self._executable = executable
        self._recycle_after_jobs = recycle_after_jobs
        self._max_rss_mb = max_rss_mb
        self._memory_check_interval_s = memory_check_interval_s
        self._memory_checked_at = -math.inf
        self._memory_check: asyncio.Task[None] | None = None
        self._recycle_due = False
        self._suspect = False
        self._playwright: Playwright | None = None
        self._driver: int | None = None  # pid of Playwright's driver; None: not known
        self._browser: Browser | None = None
        self._generation = 0
        self._idle: list[Slot] = []
        # Chromium's own proxy setting: no page uses it (every context has a gate of its own),
        # only the browser's background requests, and no job needs those.
        self._browser_gate = Gate(None)
        self._lock = asyncio.Lock()
        self._inflight = 0
        self._drained = asyncio.Condition()
        self._jobs_on_browser = 0
        self.launches = 0

    @property
    def executable(self) -> str | None:
        return self._executable

    @property
    def user(self) -> str:
        """The user Chromium runs as."""
        return self._user

    def about(self) -> dict[str, str | bool]:
        """What runs the renders, for /readyz and /metrics."""
        return {
            "engine": self.engine,
            "user": self._user,
            "sandbox": self.sandbox,
            "memory_bound": self.memory_bound,
        }

    @property
    def driver_pid(self) -> int | None:
        """Playwright's driver process, below which this renderer's Chromium runs."""
        return self._driver

    async def start(self) -> None:
        # Playwright's driver is a child process of ours, and every Chromium this renderer
        # launches runs below it: knowing its pid scopes the memory reading and the kill of a
        # hung browser to this renderer's own. Should two renderers start at once, neither
        # knows which new child is its own and both fall back to every Chromium of the process.
        before = child_pids()
        self._playwright = await async_playwright().start()
        started = child_pids() - before
        self._driver = started.pop() if len(started) == 1 else None
        await self._browser_gate.start()
        self._cgroups, why = RenderCgroups.create(self._render_max_mb)
        if self._cgroups is not None:
            self.memory_bound = self._cgroups.description
        else:
            log.warning("renders are not bounded in memory beyond V8's heap: %s", why)
        await self._launch()

    async def close(self) -> None:
        if self._memory_check is not None:
            self._memory_check.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._memory_check
        await self._close_browser()
        await self._browser_gate.close()
        if self._cgroups is not None:
            self._cgroups.close()
        if self._launcher is not None:
            self._launcher.remove()
        if self._playwright is not None:
            await self._playwright.stop()
            self._playwright = None

    async def check(self) -> None:
        if self._browser is None or not self._browser.is_connected():
            raise TransientError("browser is not running")

    async def _launch(self) -> None:
        assert self._playwright is not None
        if self._executable is None:
            self._executable = choose_chromium(self._playwright.chromium.executable_path)
        if self._launcher is None:
            self._launcher, self._user = launcher(self._executable, self._user)
        options: dict[str, Any] = {
            "executable_path": self._executable if self._launcher is None else self._launcher.path,
            "args": [*CHROMIUM_ARGS, f"--js-flags=--max-old-space-size={self._render_max_mb}"],
            "proxy": {"server": self._browser_gate.url},
        }
        try:
            browser = await self._playwright.chromium.launch(chromium_sandbox=True, **options)
            self.sandbox = True
        except PlaywrightError as exc:
            log.warning("Chromium's sandbox is not available here: %s", _first_line(exc))
            browser = await self._playwright.chromium.launch(chromium_sandbox=False, **options)
            self.sandbox = False
        kind = "headless shell" if "headless" in os.path.basename(self._executable) else "Chromium"
        self.engine = f"{kind} {browser.version} ({self._executable})"
        self.engine_version = f"Chromium {browser.version}" + (
            " (headless shell)" if kind == "headless shell" else ""
        )
        self._browser = browser
        self._generation += 1
        self._idle = []
        self._jobs_on_browser = 0
        self._recycle_due = False
        self.launches += 1
        log.info(
            "browser launched (launch %s): %s as %s, sandbox %s, memory bound: %s",
            self.launches,
            self.engine,
            self._user,
            "on" if self.sandbox else "off",
            self.memory_bound,
        )

    async def _close_browser(self) -> None:
        browser, self._browser = self._browser, None
        idle, self._idle = self._idle, []
        for slot in idle:
            await slot.gate.close()
        if browser is None:
            return
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await browser.close()
        except (PlaywrightError, TimeoutError):
            # A hung browser does not close; kill it so no process is left behind.
            for process in browser_processes(self._driver):
                with contextlib.suppress(psutil.Error):
                    process.kill()

    async def _responsive(self) -> bool:
        """After a timeout: does the browser still answer at all?"""
        assert self._browser is not None
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                context = await self._browser.new_context()
                await context.close()
        except (PlaywrightError, TimeoutError):
            return False
        return True

    async def _ensure_browser(self) -> None:
        async with self._lock:
            if self._browser is not None and self._suspect:
                self._suspect = False
                if not await self._responsive():
                    log.warning("browser stopped answering; relaunching")
                    await self._close_browser()
            if self._browser is not None and self._browser.is_connected():
                if self._jobs_on_browser >= self._recycle_after_jobs:
                    self._recycle_due = True
                else:
                    self._maybe_check_memory()
                if not self._recycle_due:
                    return
                # Recycle: wait until the renders on this browser are done, then start afresh,
                # so a long-running process does not grow with Chromium's caches.
                async with self._drained:
                    await self._drained.wait_for(lambda: self._inflight == 0)
                log.info("recycling browser after %s jobs", self._jobs_on_browser)
            elif self._browser is not None:
                log.warning("browser disconnected; relaunching")
            await self._close_browser()
            await self._launch()

    def _maybe_check_memory(self) -> None:
        """Measure the browser in the background when the last reading is old enough. Reading
        PSS makes the kernel walk every mapping (about 100 ms for a browser of two dozen
        processes), so it never holds up a render and runs at most once per interval."""
        now = time.monotonic()
        if self._memory_check is not None:
            return
        if now - self._memory_checked_at < self._memory_check_interval_s:
            return
        self._memory_checked_at = now
        self._memory_check = asyncio.create_task(self._check_memory(self._generation))

    async def _check_memory(self, generation: int) -> None:
        try:
            used_mb = await asyncio.to_thread(browser_memory_mb, self._driver)
        except Exception:
            log.exception("could not measure the browser's memory")
            return
        finally:
            self._memory_check = None
        if used_mb > self._max_rss_mb and generation == self._generation:
            log.info("browser uses %.0f MiB, above %s MiB", used_mb, self._max_rss_mb)
            self._recycle_due = True  # the next render recycles it

    async def _new_slot(self, *, javascript: bool, user_agent: str | None = None) -> Slot:
        assert self._browser is not None
        viewport = SCREEN_VIEWPORT if javascript else PRINT_VIEWPORT
        gate = Gate(self._policy)
        await gate.start()
        try:
            context = await self._browser.new_context(
                java_script_enabled=javascript,
                viewport=viewport,
                proxy={"server": gate.url},
                user_agent=user_agent,
            )
        except BaseException:
            await gate.close()
            raise
        try:
            page, leaves = await self._new_page(context)
        except BaseException:
            await self._cleanup(context.close())
            await gate.close()
            raise
        slot = Slot(
            context=context,
            page=page,
            gate=gate,
            generation=self._generation,
            javascript=javascript,
            viewport=viewport,
            leaves=leaves,
        )
        gate.sink = slot.warnings.append
        return slot

    async def _new_page(self, context: BrowserContext) -> tuple[Page, list[Leaf]]:
        """A page, its renderer process moved into a memory cgroup of its own before it loads
        anything. The renderer is the one that appears while the page is made, so pages are
        made one at a time."""
        if self._cgroups is None:
            return await context.new_page(), []
        async with self._slot_lock:
            self._stale_leaves = [leaf for leaf in self._stale_leaves if not leaf.remove()]
            before = await asyncio.to_thread(renderer_pids, self._driver)
            page = await context.new_page()
            started = await asyncio.to_thread(renderer_pids, self._driver) - before
            if not started:
                log.warning("no renderer process appeared for a new page; it is not bounded")
            try:
                return page, [self._cgroups.confine(pid) for pid in started]
            except OSError as exc:
                # The page must not run unbounded: no slot rather than an unbounded one.
                await self._cleanup(page.close())
                raise TransientError(f"cannot bound the renderer's memory: {exc}") from None

    async def _drop_slot(self, slot: Slot) -> None:
        await self._cleanup(slot.context.close())
        await slot.gate.close()
        self._stale_leaves += [leaf for leaf in slot.leaves if not leaf.remove()]

    async def _cleanup(self, call: Awaitable[None]) -> bool:
        """Await a clean-up call into the browser for at most CLOSE_TIMEOUT_S; False when it
        failed or did not answer, and the browser is then checked before the next job. A
        render's time limit has fired by the time its clean-up runs: an unbounded call into a
        hung browser would hold the job, its lease renewed, for ever."""
        try:
            async with asyncio.timeout(CLOSE_TIMEOUT_S):
                await call
        except (PlaywrightError, TimeoutError):
            self._suspect = True
            return False
        return True

    @contextlib.asynccontextmanager
    async def _reused_slot(self) -> AsyncIterator[Slot]:
        slot = self._idle.pop() if self._idle else await self._new_slot(javascript=False)
        slot.warnings.clear()
        slot.gate.used = False
        healthy = False
        try:
            yield slot
            healthy = True
        finally:
            if slot.gate.used and not await self._cleanup(slot.context.clear_cookies()):
                healthy = False  # cookies that cannot be cleared must not reach the next job
            if (slot.served or slot.measured) and not await self._cleanup(_blank(slot.page)):
                # The next job's HTML is written into the page's document, whose images stay
                # available to it without a request: a job's files must not reach the next.
                # A long document laid out at the paper's width would be laid out once more
                # when the next job sets its viewport: it goes first.
                healthy = False
            slot.served = slot.measured = False
            if healthy and slot.generation == self._generation and not slot.page.is_closed():
                self._idle.append(slot)
            else:
                await self._drop_slot(slot)

    @contextlib.asynccontextmanager
    async def _private_slot(
        self, *, javascript: bool = True, user_agent: str | None = None
    ) -> AsyncIterator[Slot]:
        slot = await self._new_slot(javascript=javascript, user_agent=user_agent)
        try:
            yield slot
        finally:
            await self._drop_slot(slot)

    async def render(
        self,
        html: Document,
        options: RenderOptions,
        *,
        timeout_s: float,
        assets: Assets | None = None,
    ) -> RenderResult:
        """Print one document; TransientError on crash or timeout, PermanentError on bad input."""
        await self._ensure_browser()
        self._inflight += 1
        self._jobs_on_browser += 1
        site = None
        if isinstance(html, str) and (assets or loads_relative(html)):
            # Served by the gate, so that a relative URL with no asset is a failed request.
            site = Site(html.encode(), assets or {})
        try:
            async with asyncio.timeout(timeout_s):
                return await self._render(html, options, timeout_s, site)
        except TimeoutError:
            self._suspect = True
            raise TransientError(f"render timed out after {timeout_s:g} s") from None
        except PlaywrightError as exc:
            message = _first_line(exc)
            if self._browser is None or not self._browser.is_connected():
                raise TransientError(f"browser crashed during render: {message}") from None
            if "Printing failed" in message or "page range" in message.lower():
                raise PermanentError(f"the page cannot be printed: {message}") from None
            raise TransientError(f"render failed: {message}") from None
        finally:
            self._inflight -= 1
            async with self._drained:
                self._drained.notify_all()

    async def _render(
        self,
        html: Document,
        options: RenderOptions,
        timeout_s: float,
        site: Site | None,
    ) -> RenderResult:
        # A served page usually needs its scripts: they run unless the options say otherwise.
        if isinstance(html, PageUrl):
            javascript = options.javascript is not False
        else:
            javascript = options.needs_javascript(html)
        if javascript or options.user_agent is not None or isinstance(html, PageUrl):
            slots = self._private_slot(javascript=javascript, user_agent=options.user_agent)
        else:
            slots = self._reused_slot()
        async with slots as slot:
            slot.gate.site = site
            slot.served = site is not None
            slot.facts = None
            try:
                data = await print_in(
                    slot, html, options, timeout_s=timeout_s, max_pages=self._max_pages
                )
            except PlaywrightError:
                if slot.out_of_memory():
                    raise PermanentError(
                        f"the page needs more than {self._render_max_mb} MiB of memory "
                        "(PRESSROOM_RENDER_MAX_MB)"
                    ) from None
                raise
            finally:
                slot.gate.site = None
            pages = None if options.image else count_pages(data)
            warnings = list(dict.fromkeys(slot.warnings))  # a file asked for twice: once
            facts, slot.facts = slot.facts, None
        # Outside the slot: the page takes the next job while the PDF is checked. Its document
        # information, dates and provenance are the worker's to write, with the job's
        # finishing or in one pass of their own (server/pdf/provenance.py).
        found: list[Finding] = []
        if facts is not None:
            found = await preflight.check(data, facts, options)
            warnings += [finding.warning() for finding in found]
        return RenderResult(data=data, pages=pages, warnings=warnings, preflight=found)


async def _blank(page: Page) -> None:
    await page.goto("about:blank")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:500] if text else type(exc).__name__
