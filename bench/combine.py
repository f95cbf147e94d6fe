"""Combined batches: one join of N items' PDFs (real Chromium invoices) as a batch's join runs
it, from the items in storage to the combined file in storage, with its time and memory.

Reports the join's wall time, the peak memory of the join process (what a join costs while it
runs, given back when it ends), how much the server process grew meanwhile (it holds one item
at a time per fetch, then the combined file while storing it), and the longest the event loop
was kept from a 10 ms ticker during the join (it runs no PDF code).

    python -m bench.combine [--items 200] [--lines 20] [--distinct 10]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import psutil
from playwright.async_api import async_playwright

from bench.common import INVOICE, invoice_data
from server.files.storage import LocalStorage
from server.pipeline.combiner import join_stored
from server.queue import combine
from server.render import templates


async def invoices(distinct: int, lines: int) -> list[bytes]:
    """`distinct` invoices printed by Chromium (Debian's headless shell), as the items' PDFs."""
    pdfs = []
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path="/usr/bin/chromium-headless-shell"
        )
        page = await browser.new_page()
        for n in range(distinct):
            html = await templates.render_async(INVOICE, invoice_data(n, lines), timeout_s=10)
            await page.set_content(html)
            pdfs.append(await page.pdf(format="A4", print_background=True))
        await browser.close()
    return pdfs


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--lines", type=int, default=20, help="invoice lines (40 a page)")
    parser.add_argument("--distinct", type=int, default=10, help="different PDFs among the items")
    args = parser.parse_args()
    pdfs = await invoices(args.distinct, args.lines)
    with tempfile.TemporaryDirectory(prefix="bench-combine-") as folder:
        storage = LocalStorage(Path(folder), "bench")
        items = []
        for n in range(args.items):
            key = f"bench/item-{n}/1.pdf"
            await storage.put(key, pdfs[n % len(pdfs)], filename="item.pdf")
            items.append(combine.Item(f"invoice-{n:04d}", "done", key))
        server = psutil.Process()
        before = peak = server.memory_info().rss
        worst_lag_s = 0.0
        joining = True

        async def watch() -> None:
            nonlocal peak, worst_lag_s
            while joining:
                started = time.perf_counter()
                await asyncio.sleep(0.01)
                worst_lag_s = max(worst_lag_s, time.perf_counter() - started - 0.01)
                peak = max(peak, server.memory_info().rss)

        watcher = asyncio.create_task(watch())
        started = time.perf_counter()
        joined = await join_stored(
            storage,
            items,
            "bench/joined.pdf",
            filename="joined.pdf",
            outline=True,
            time_limit_s=600,
        )
        took_s = time.perf_counter() - started
        joining = False
        await watcher
        storage.close()
    size = sum(len(pdfs[n % len(pdfs)]) for n in range(args.items))
    print(
        f"{args.items} items ({size / 2**20:.1f} MiB of PDFs) -> {joined.pages} pages, "
        f"{joined.size_bytes / 2**20:.1f} MiB in {took_s:.2f} s"
    )
    print(
        f"join process peak RSS {joined.max_rss_kb / 1024:.0f} MiB; server RSS "
        f"+{(peak - before) / 2**20:.0f} MiB at most; event loop lag at most "
        f"{worst_lag_s * 1000:.0f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
