"""Render path: PDFs/s through Pressroom end to end against the best raw Playwright loop, on
each engine, in the same run.

Both print the same invoice (20 table lines; with --pages 20, 640 lines) at the same
concurrency on the same engine. The raw loop is the fastest a user could write for that
document: one browser, one reused page per slot in a context with JavaScript off, printing
from the one-pixel viewport Pressroom prints pages without scripts from, the HTML rendered
ahead, then `set_content` and `pdf` with Pressroom's PDF arguments. Pressroom goes HTTP submit
(a client in a process of its own) → claim → template → Chromium → file stored → `job.done`
on the event stream. For each row both are started once and warmed, then print the same
documents in --rounds alternating rounds; the row gives the medians and each round's ratio.
The CPU figures are this process's per PDF: Playwright's side of the pipe for the raw loop,
the whole server for Pressroom. With --tracing, each round also runs Pressroom with tracing on
(server/tracing.py: the request's span, the attempt's and its steps', exported over OTLP/HTTP to
a receiver on loopback, bench/otlp.py), off and on in alternating order; the row adds the
ratios on/off. With --preflight, each round also runs Pressroom's jobs with `"preflight": true`
(server/render/preflight.py), off and on in alternating order; the row adds the ratios on/off.

    python -m bench.render [--docs 150] [--slots 1,2,4] [--pages 1,20] [--rounds 5]
                           [--engines headless-shell,chromium] [--tracing] [--preflight]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import shutil
import statistics
import time
from typing import Any

from playwright.async_api import Page, async_playwright

from bench import common, otlp
from bench.clients import INVOICE, burst, invoice_data
from bench.common import QUICK, checkpoint, database, postgres, run_client, running_app
from server.options import RenderOptions
from server.render import templates
from server.render.browsers import CHROMIUM_ARGS, choose_chromium
from server.render.printing import PRINT_VIEWPORT

#: The engines --engines names, by the Debian command each is.
ENGINES = {"headless-shell": "chromium-headless-shell", "chromium": "chromium"}


def cpu_s() -> float:
    """CPU seconds of this process so far (every thread, user and system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RawLoop:
    """The floor: one browser, one reused page per slot (JavaScript off, the print viewport),
    documents taken from a shared queue, `set_content` then `pdf`, nothing else. Stays open
    across rounds. `executable`: the engine (None: the one Pressroom would choose)."""

    def __init__(self, slots: int, executable: str | None = None) -> None:
        self.slots = slots
        self._executable = executable
        self._stack = contextlib.AsyncExitStack()
        self._pages: list[Page] = []
        self._pdf_args = RenderOptions().pdf_arguments()

    async def __aenter__(self) -> RawLoop:
        playwright = await self._stack.enter_async_context(async_playwright())
        # A launch that fails for want of Playwright's own build leaves its profile folder
        # behind: choose the executable first.
        browser = await playwright.chromium.launch(
            executable_path=self._executable
            or os.environ.get("PRESSROOM_CHROMIUM")
            or choose_chromium(playwright.chromium.executable_path),
            args=list(CHROMIUM_ARGS),
        )
        self._stack.push_async_callback(browser.close)
        for _ in range(self.slots):
            context = await browser.new_context(java_script_enabled=False, viewport=PRINT_VIEWPORT)
            self._pages.append(await context.new_page())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def pdf(self, slot: int, html: str) -> bytes:
        """One document printed on page `slot` (the bare service's render, bench/bare.py)."""
        page = self._pages[slot]
        await page.set_content(html, wait_until="load")
        return await page.pdf(**self._pdf_args)

    async def _print(self, html: list[str], slots: int) -> None:
        """The documents printed on the first `slots` pages, each taking the next one left."""
        queue = list(reversed(html))

        async def loop(slot: int) -> None:
            while queue:
                await self.pdf(slot, queue.pop())

        await asyncio.gather(*(loop(slot) for slot in range(slots)))

    async def warm(self, html: list[str]) -> None:
        """Fonts and caches: a page alone first, then every page at once."""
        await self._print(html[:2], 1)
        await self._print(html[: self.slots * 2], self.slots)

    async def run(self, html: list[str]) -> tuple[float, float]:
        """PDFs per second, and this process's CPU milliseconds per PDF."""
        cpu, started = cpu_s(), time.perf_counter()
        await self._print(html, self.slots)
        elapsed = time.perf_counter() - started
        return len(html) / elapsed, (cpu_s() - cpu) * 1000 / len(html)


async def pressroom(
    base: str, docs: int, lines: int, options: dict[str, Any] | None = None
) -> tuple[float, float]:
    """PDFs per second end to end through the app at `base` (the jobs with `options`), submitted
    and followed by a client process; and this process's (the server's) CPU ms per PDF."""
    cpu = cpu_s()
    given = [f"--options={json.dumps(options)}"] if options else []
    seconds = await run_client("burst", base, f"--docs={docs}", f"--lines={lines}", *given)
    return docs / seconds, (cpu_s() - cpu) * 1000 / docs


async def row(engine: str, pages: int, docs: int, slots: int, args: argparse.Namespace) -> None:
    """The raw loop and Pressroom, each started once and warmed, print the same documents in
    --rounds alternating rounds; pairs close in time share the drift of a shared host. With
    --tracing, Pressroom with tracing on too, in each round; with --preflight, with preflight."""
    lines = 20 if pages <= 1 else pages * 32  # about 32 table lines fill an A4 page
    html = [templates.render(INVOICE, invoice_data(n, lines)) for n in range(docs)]
    pairs = []
    traced: list[tuple[float, float]] = []  # on/off of PDFs/s and of CPU per PDF, by round
    checked: list[tuple[float, float]] = []
    async with (
        RawLoop(slots, engine) as raw,
        database() as dsn,
        running_app(dsn, render_slots=slots, chromium=engine) as (base, _app),
        otlp.receiving() if args.tracing else contextlib.nullcontext() as switch,
    ):
        await raw.warm(html)
        await burst(base, slots * 2, lines)
        await checkpoint(dsn)
        for n in range(args.rounds):
            raw_rate, raw_cpu = await raw.run(html)
            if switch is None:
                ours, ours_cpu = await pressroom(base, docs, lines)
            else:
                sides = await switch.off_and_on(n, lambda: pressroom(base, docs, lines))
                (ours, ours_cpu), (traced_rate, traced_cpu) = sides["off"], sides["on"]
                traced.append((traced_rate / ours, traced_cpu / ours_cpu))
            if args.preflight:
                # The plain run of this round, then one with the checks: or the other way round.
                checks = await pressroom(base, docs, lines, {"preflight": True})
                if n % 2 == 1:
                    ours, ours_cpu = await pressroom(base, docs, lines)
                checked.append((checks[0] / ours, checks[1] / ours_cpu))
            pairs.append((raw_rate, ours, ours / raw_rate, raw_cpu, ours_cpu))
    raw_rate, ours, ratio, raw_cpu, ours_cpu = (
        statistics.median(p) for p in zip(*pairs, strict=True)
    )
    name = "headless shell" if "headless" in os.path.basename(engine) else "chromium"
    each = ", ".join(f"{pair[2]:.2f}" for pair in pairs)
    head = f"render  {name}, {pages} page(s), {slots} slot(s), {docs} docs:"
    print(
        f"{head} raw Playwright {raw_rate:6.1f} PDFs/s, Pressroom {ours:6.1f} PDFs/s, ratio "
        f"{ratio:.2f} ({each}); CPU ms per PDF here, raw {raw_cpu:.1f} / Pressroom {ours_cpu:.1f}",
    )
    if args.preflight:
        print(f"{head} preflight {on_off(checked)}")
    if switch is not None:
        print(
            f"{head} tracing {on_off(traced)}; {switch.spans} spans in {switch.traces} traces "
            "received"
        )


def on_off(ratios: list[tuple[float, float]]) -> str:
    """Ratios on/off of PDFs/s and of CPU per PDF, by round, as a row prints them."""
    rates, cpu = zip(*ratios, strict=True)
    return f"on/off {otlp.spread(rates)} PDFs/s, {otlp.spread(cpu)} CPU per PDF"


def executable(engine: str) -> str:
    """The executable of one of --engines; `default` is the one Pressroom would choose here."""
    if engine == "default":
        return os.environ.get("PRESSROOM_CHROMIUM") or choose_chromium("")
    if (path := shutil.which(ENGINES[engine])) is None:
        raise RuntimeError(f"--engines {engine}: {ENGINES[engine]} is not installed")
    return path


async def run(args: argparse.Namespace) -> None:
    """Every page count at every slot count on every engine; longer documents, fewer docs."""
    slot_counts = [int(s) for s in args.slots.split(",")]
    fewest = 2 * max(slot_counts)  # documents of a row: two a slot at least
    async with postgres():
        for engine in [executable(name) for name in args.engines.split(",")]:
            for pages in (int(p) for p in args.pages.split(",")):
                docs = args.docs if pages <= 1 else max(fewest, args.docs * 2 // pages)
                for slots in slot_counts:
                    await row(engine, pages, docs, slots, args)


def parser() -> argparse.ArgumentParser:
    parser = common.arguments(__doc__)
    parser.add_argument("--docs", type=int, default=20 if QUICK else 150, help="per round")
    parser.add_argument("--slots", default="1,2" if QUICK else "1,2,4")
    parser.add_argument("--pages", default="1,20", help="page counts, e.g. 1,20")
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 5)
    parser.add_argument(
        "--engines",
        default="default" if QUICK else "headless-shell,chromium",
        help="headless-shell, chromium, default (the one Pressroom chooses here)",
    )
    parser.add_argument(
        "--tracing", action="store_true", help="Pressroom with tracing on too, in each round"
    )
    parser.add_argument(
        "--preflight", action="store_true", help="Pressroom with preflight on too, in each round"
    )
    return parser


if __name__ == "__main__":
    common.main(parser, run)
