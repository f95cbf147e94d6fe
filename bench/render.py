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
from bench.common import QUICK, checkpoint, database, postgres, run_module, running_app
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
        self._slots = slots
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
        for _ in range(self._slots):
            context = await browser.new_context(java_script_enabled=False, viewport=PRINT_VIEWPORT)
            self._pages.append(await context.new_page())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def slots(self) -> int:
        return self._slots

    async def pdf(self, slot: int, html: str) -> bytes:
        """One document printed on page `slot` (the bare service's render, bench/bare.py)."""
        return await self._pdf(self._pages[slot], html)

    async def _pdf(self, page: Page, html: str) -> bytes:
        await page.set_content(html, wait_until="load")
        return await page.pdf(**self._pdf_args)

    async def _print(self, html: list[str], pages: list[Page]) -> None:
        queue = list(reversed(html))

        async def loop(page: Page) -> None:
            while queue:
                await self._pdf(page, queue.pop())

        await asyncio.gather(*(loop(p) for p in pages))

    async def warm(self, html: list[str]) -> None:
        """Fonts and caches: a page alone first, then every page at once."""
        await self._print(html[:2], self._pages[:1])
        await self._print(html[: self._slots * 2], self._pages)

    async def run(self, html: list[str]) -> tuple[float, float]:
        """PDFs per second, and this process's CPU milliseconds per PDF."""
        cpu, started = cpu_s(), time.perf_counter()
        await self._print(html, self._pages)
        elapsed = time.perf_counter() - started
        return len(html) / elapsed, (cpu_s() - cpu) * 1000 / len(html)


async def pressroom(
    base: str, docs: int, lines: int, options: dict[str, Any] | None = None
) -> tuple[float, float]:
    """PDFs per second end to end through the app at `base` (the jobs with `options`), submitted
    and followed by a client in a process of its own; and this process's (the server's) CPU
    milliseconds per PDF."""
    cpu = cpu_s()
    given = [f"--options={json.dumps(options)}"] if options else []
    seconds = await run_module(
        "bench.clients", "burst", base, f"--docs={docs}", f"--lines={lines}", *given
    )
    return docs / seconds, (cpu_s() - cpu) * 1000 / docs


async def off_and_on(
    switch: otlp.Tracing, base: str, docs: int, lines: int, *, on_first: bool
) -> dict[str, tuple[float, float]]:
    """Pressroom with tracing off and on (`pressroom` of each), in that order or the other."""
    measured = {}
    for side in ("on", "off") if on_first else ("off", "on"):
        if side == "on":
            switch.on()
        try:
            measured[side] = await pressroom(base, docs, lines)
        finally:
            switch.off()
    return measured


async def row(
    engine: str,
    pages: int,
    docs: int,
    slots: int,
    rounds: int,
    *,
    traced: bool = False,
    preflight: bool = False,
) -> dict[str, Any]:
    """The raw loop and Pressroom, each started once and warmed, print the same documents in
    `rounds` alternating rounds; pairs close in time share the drift of a shared host. `traced`:
    Pressroom with tracing on too, in each round."""
    lines = 20 if pages <= 1 else pages * 32  # about 32 table lines fill an A4 page
    html = [templates.render(INVOICE, invoice_data(n, lines)) for n in range(docs)]
    pairs = []
    on_off: list[float] = []
    cpu_on_off: list[float] = []
    checked: list[float] = []
    cpu_checked: list[float] = []
    async with (
        RawLoop(slots, engine) as raw,
        database() as dsn,
        running_app(dsn, render_slots=slots, chromium=engine) as (base, _app),
        otlp.receiving() if traced else contextlib.nullcontext() as switch,
    ):
        await raw.warm(html)
        await burst(base, slots * 2, lines)
        await checkpoint(dsn)
        for n in range(rounds):
            raw_rate, raw_cpu = await raw.run(html)
            if switch is None:
                ours, ours_cpu = await pressroom(base, docs, lines)
            else:
                sides = await off_and_on(switch, base, docs, lines, on_first=n % 2 == 1)
                (ours, ours_cpu), (traced_rate, traced_cpu) = sides["off"], sides["on"]
                on_off.append(traced_rate / ours)
                cpu_on_off.append(traced_cpu / ours_cpu)
            if preflight:
                # The plain run of this round, then one with the checks: or the other way round.
                checks = await pressroom(base, docs, lines, {"preflight": True})
                if n % 2 == 1:
                    ours, ours_cpu = await pressroom(base, docs, lines)
                checked.append(checks[0] / ours)
                cpu_checked.append(checks[1] / ours_cpu)
            pairs.append((raw_rate, ours, ours / raw_rate, raw_cpu, ours_cpu))
    raw_rate, ours, ratio, raw_cpu, ours_cpu = (
        statistics.median(p) for p in zip(*pairs, strict=True)
    )
    name = "headless shell" if "headless" in os.path.basename(engine) else "chromium"
    each = ", ".join(f"{pair[2]:.2f}" for pair in pairs)
    print(
        f"render  {name}, {pages} page(s), {slots} slot(s), {docs} docs: raw Playwright "
        f"{raw_rate:6.1f} PDFs/s, Pressroom {ours:6.1f} PDFs/s, ratio {ratio:.2f} ({each}); "
        f"CPU ms per PDF here, raw {raw_cpu:.1f} / Pressroom {ours_cpu:.1f}",
        flush=True,
    )
    if preflight:
        print(
            f"render  {name}, {pages} page(s), {slots} slot(s), {docs} docs: preflight on/off "
            f"{otlp.spread(checked)} PDFs/s, {otlp.spread(cpu_checked)} CPU per PDF",
            flush=True,
        )
    if switch is not None:
        print(
            f"render  {name}, {pages} page(s), {slots} slot(s), {docs} docs: tracing on/off "
            f"{otlp.spread(on_off)} PDFs/s, {otlp.spread(cpu_on_off)} CPU per PDF; "
            f"{switch.spans} spans in {switch.traces} traces received",
            flush=True,
        )
    return {
        "tracing_on_off": statistics.median(on_off) if on_off else None,
        "preflight_on_off": statistics.median(checked) if checked else None,
        "engine": name,
        "pages": pages,
        "slots": slots,
        "raw": raw_rate,
        "pressroom": ours,
        "ratio": ratio,
    }


def engines(names: str) -> list[str]:
    """Executables for --engines; `default` is the one Pressroom would choose here."""
    found = []
    for name in names.split(","):
        if name == "default":
            found.append(os.environ.get("PRESSROOM_CHROMIUM") or choose_chromium(""))
            continue
        path = shutil.which(ENGINES[name])
        if path is None:
            raise RuntimeError(f"--engines {name}: {ENGINES[name]} is not installed")
        found.append(path)
    return found


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every page count at every slot count on every engine; longer documents, fewer docs."""
    slot_counts = [int(s) for s in args.slots.split(",")]
    rows = []
    async with postgres():
        for engine in engines(args.engines):
            for pages in (int(p) for p in args.pages.split(",")):
                docs = (
                    args.docs if pages <= 1 else max(2 * max(slot_counts), args.docs * 2 // pages)
                )
                for slots in slot_counts:
                    rows.append(
                        await row(
                            engine,
                            pages,
                            docs,
                            slots,
                            args.rounds,
                            traced=args.tracing,
                            preflight=args.preflight,
                        )
                    )
    return {"rows": rows}


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
