"""Render path: end-to-end PDFs/s through Pressroom against the best raw Playwright loop.

Both render the same invoice (20 lines, some CSS) in the same run, at the same concurrency,
on the same engine. The floor is the fastest loop a user could write for that document: one
browser, one reused page per slot in a context with JavaScript off, printing from the
one-pixel viewport Pressroom prints pages without scripts from, the HTML rendered ahead, then
`set_content` and `pdf` with Pressroom's PDF arguments and nothing else. Pressroom goes submit
over HTTP (a client in another process, bench.burst) → claim → template → render → store →
done event, read from the SSE stream.

A 20-page document (the invoice with 640 lines) is measured at the same slot counts, with
fewer documents (--docs * 2 / pages). Each engine of --engines (the headless shell and the
full chromium, from Debian's packages or PRESSROOM_CHROMIUM) is measured in turn. For each row
both are started once and warmed, then print the same --docs documents in --rounds alternating
rounds; the row reports the medians, so a drift of the machine's speed during the run (a
shared host) weighs on both alike.

Then each finishing step (bench.finishing) on the engine's plain output of the same documents:
PDFs/s and ms per page of the step alone, beside Chromium's own print.

    python -m bench.render [--docs N] [--slots 1,2,4] [--pages 1,20] [--rounds 5]
                           [--engines headless-shell,chromium] [--finish-docs 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import statistics
import time
from collections.abc import Iterator
from typing import Any

from aiohttp import ClientSession
from playwright.async_api import async_playwright

from bench import finishing
from bench.common import (
    INVOICE,
    QUICK,
    checkpoint,
    command,
    database,
    invoice_data,
    machine,
    machine_busy_s,
    postgres,
    run_module,
    running_app,
    submit_many,
    wait_done,
)
from server.options import RenderOptions
from server.render import templates
from server.render.chromium import CHROMIUM_ARGS, PRINT_VIEWPORT, choose_chromium

NAME = "bench.render"


class CpuClock:
    """CPU seconds spent inside a block: by this process (every thread, user and system) and
    by the whole machine (every process and the kernel, from /proc/stat; Linux only)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.machine_seconds: float | None = None
        self.client_seconds: float | None = None  # Pressroom's client process, when known

    def per(self, count: int) -> float:
        """Milliseconds of this process per item."""
        return self.seconds * 1000 / count

    def client_per(self, count: int) -> float | None:
        """Milliseconds of Pressroom's client process per item, when it said."""
        return None if self.client_seconds is None else self.client_seconds * 1000 / count

    def machine_per(self, count: int) -> float | None:
        """Milliseconds of the whole machine per item."""
        return None if self.machine_seconds is None else self.machine_seconds * 1000 / count


@contextlib.contextmanager
def cpu_clock() -> Iterator[CpuClock]:
    clock = CpuClock()
    before, machine_before = resource.getrusage(resource.RUSAGE_SELF), machine_busy_s()
    try:
        yield clock
    finally:
        after, machine_after = resource.getrusage(resource.RUSAGE_SELF), machine_busy_s()
        clock.seconds = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        if machine_before is not None and machine_after is not None:
            clock.machine_seconds = machine_after - machine_before


class RawLoop:
    """The floor: one browser, one reused page per slot (JavaScript off, the print viewport),
    documents taken from a shared queue, `set_content` then `pdf`, nothing else. Stays open
    across rounds. `executable`: the engine (None: the one Pressroom would choose)."""

    def __init__(self, slots: int, executable: str | None = None) -> None:
        self._slots = slots
        self._executable = executable
        self._stack = contextlib.AsyncExitStack()
        self._pages: list[Any] = []
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
        """One document printed on the page of `slot` (0 to slots - 1)."""
        return await self._print_on(self._pages[slot], html)

    async def _print_on(self, page: Any, html: str) -> bytes:
        await page.set_content(html, wait_until="load")
        pdf: bytes = await page.pdf(**self._pdf_args)
        return pdf

    async def _print(self, html: list[str], pages: list[Any]) -> None:
        queue: asyncio.Queue[str] = asyncio.Queue()
        for doc in html:
            queue.put_nowait(doc)

        async def loop(page: Any) -> None:
            while not queue.empty():
                await self._print_on(page, queue.get_nowait())

        await asyncio.gather(*(loop(p) for p in pages))

    async def warm(self, html: list[str]) -> None:
        """Fonts and caches: a page alone first, then every page at once."""
        await self._print(html[:2], self._pages[:1])
        await self._print(html[: self._slots * 2], self._pages)

    async def run(self, html: list[str]) -> tuple[float, CpuClock]:
        """PDFs per second, and the CPU it took (this process: Playwright's side of the pipe)."""
        with cpu_clock() as cpu:
            started = time.perf_counter()
            await self._print(html, self._pages)
            elapsed = time.perf_counter() - started
        return len(html) / elapsed, cpu


async def pressroom(base: str, docs: int, lines: int) -> tuple[float, CpuClock]:
    """PDFs per second end to end through the app at `base`: HTTP submit → done event; and the
    CPU it took (this process: the server alone). The client (bench.burst) submits the
    documents from a process of its own, follows the event stream until the last is done, and
    reads the machine's CPU over that span (its own start-up left out)."""
    with cpu_clock() as cpu:
        result = await run_module("bench.burst", base, "--docs", str(docs), "--lines", str(lines))
    cpu.machine_seconds = result["machine_cpu_s"]
    cpu.client_seconds = result["client_cpu_s"]
    return result["docs"] / result["seconds"], cpu


async def run_pages(
    docs: int, slot_counts: list[int], pages: int, rounds: int, engine: str
) -> list[dict[str, Any]]:
    """One row per slot count: the raw loop and Pressroom on `engine` (an executable), both
    started once and warmed, print the same documents in `rounds` alternating pairs; the row
    holds the medians and every round. Pairs close in time share the drift of a shared host's
    speed."""
    rows: list[dict[str, Any]] = []
    lines = 20 if pages <= 1 else pages * 32  # about 32 table lines fill an A4 page
    data = [invoice_data(n, lines) for n in range(docs)]
    html = [templates.render(INVOICE, d) for d in data]
    name = engine_name(engine)
    for slots in slot_counts:
        pairs: list[dict[str, Any]] = []
        async with (
            RawLoop(slots, engine) as raw,
            database() as dsn,
            running_app(dsn, render_slots=slots, chromium=engine) as (base, _app),
        ):
            await raw.warm(html)
            async with ClientSession() as session:
                bodies = [{"template": INVOICE, "data": d} for d in data[: slots * 2]]
                await wait_done(session, base, set(await submit_many(session, base, bodies, slots)))
            await checkpoint(dsn)
            for _ in range(rounds):
                floor, floor_cpu = await raw.run(html)
                ours, ours_cpu = await pressroom(base, docs, lines)
                pairs.append(
                    {
                        "raw": floor,
                        "pressroom": ours,
                        "ratio": ours / floor,
                        "raw_cpu_ms": floor_cpu.per(docs),
                        "pressroom_cpu_ms": ours_cpu.per(docs),
                        "raw_machine_cpu_ms": floor_cpu.machine_per(docs),
                        "pressroom_machine_cpu_ms": ours_cpu.machine_per(docs),
                        "client_cpu_ms": ours_cpu.client_per(docs),
                    }
                )
        row: dict[str, Any] = {
            "engine": name,
            "slots": slots,
            "docs": docs,
            "pages": pages,
            "rounds": pairs,
        }
        for key in pairs[0]:
            values = [pair[key] for pair in pairs]
            row[key] = None if None in values else statistics.median(values)
        rows.append(row)
        each = ", ".join(f"{pair['ratio']:.2f}" for pair in pairs)
        print(
            f"render  {name} slots={slots} docs={docs} pages≈{pages}: raw Playwright "
            f"{row['raw']:6.1f} PDF/s, Pressroom {row['pressroom']:6.1f} PDF/s, ratio "
            f"{row['ratio']:.2f} (median of {rounds}: {each}); CPU per PDF in this "
            f"process {row['raw_cpu_ms']:.1f} / {row['pressroom_cpu_ms']:.1f} ms, of the machine "
            f"{row['raw_machine_cpu_ms'] or float('nan'):.1f} / "
            f"{row['pressroom_machine_cpu_ms'] or float('nan'):.1f} ms",
            flush=True,
        )
    return rows


#: The engines --engines names, by the Debian command each is.
ENGINES = {"headless-shell": "chromium-headless-shell", "chromium": "chromium"}


def engine_name(executable: str) -> str:
    return "headless shell" if "headless" in os.path.basename(executable) else "chromium"


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
    """Every page count at every slot count; the longer documents get fewer docs."""
    slot_counts = [int(s) for s in args.slots.split(",")]
    rows: list[dict[str, Any]] = []
    async with postgres():
        for engine in engines(args.engines):
            for pages in [int(p) for p in args.pages.split(",")]:
                shorter = max(2 * max(slot_counts), args.docs * 2 // pages)
                docs = args.docs if pages <= 1 else shorter
                rows += await run_pages(docs, slot_counts, pages, args.rounds, engine)
    result = {"args": vars(args), "command": command(NAME, *_argv(args)), "rows": rows}
    if args.finish_docs > 0:
        page_counts = [int(p) for p in args.pages.split(",")]
        result["finishing"] = await finishing.run_rows(args.finish_docs, page_counts)
    return result


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=20 if QUICK else 150, help="per round")
    parser.add_argument("--slots", default="1,2" if QUICK else "1,2,4")
    parser.add_argument("--pages", default="1,20", help="page counts, e.g. 1,20")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1 if QUICK else 5,
        help="alternating raw/Pressroom pairs per row; the row reports their medians",
    )
    parser.add_argument(
        "--finish-docs",
        type=int,
        default=2 if QUICK else 4,
        help="documents per finishing step (bench.finishing; 0: none)",
    )
    parser.add_argument(
        "--engines",
        default="default" if QUICK else "headless-shell,chromium",
        help="headless-shell, chromium, default (what Pressroom chooses here)",
    )
    return parser


def _argv(args: argparse.Namespace) -> list[str]:
    return [
        f"--docs {args.docs}",
        f"--slots {args.slots}",
        f"--pages {args.pages}",
        f"--rounds {args.rounds}",
        f"--engines {args.engines}",
        f"--finish-docs {args.finish_docs}",
    ]


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
