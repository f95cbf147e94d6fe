"""Finishing steps: what each one costs on top of Chromium's plain output.

Chromium prints the benchmark invoice (1 page, and the 20-page one) once, with Pressroom's PDF
arguments; each finishing step then runs on those PDFs through the pool a worker uses (one
finishing process, started and warmed with one document first, so that loading a step's
library is not counted). A row gives the step's PDFs per second and milliseconds per page, and
Chromium's own print of the same document for scale. A few documents per step keep the run
short; the signing key is a throwaway one made here.

    python -m bench.finishing [--docs 4] [--pages 1,20]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import tempfile
import time
from pathlib import Path
from typing import Any

from playwright.async_api import async_playwright

from bench.common import INVOICE, QUICK, command, invoice_data, machine
from server import options
from server.pdf.finishing import FinishPool, Work
from server.render import templates
from server.render.chromium import CHROMIUM_ARGS, PRINT_VIEWPORT, choose_chromium, count_pages
from server.signkey import SigningKey

NAME = "bench.finishing"
XML = Path(__file__).resolve().parents[1] / "tests" / "files" / "factur-x-minimum.xml"


def _steps(xml_id: str) -> dict[str, dict[str, Any]]:
    """The options of each row: one step each, as a job would ask for it."""
    return {
        "stamp (text)": {"stamp": {"text": "PAID", "rotate": 30}},
        "attachments": {
            "attachments": [{"asset": xml_id, "name": "data.xml", "relationship": "Data"}]
        },
        "facturx (PDF/A-3b)": {"facturx": {"xml": xml_id}},
        "pdfa 2b": {"pdfa": "2b"},
        "encrypt": {"encrypt": {"owner_password": "bench-owner", "allow": ["print"]}},
        "sign (B-B)": {"sign": {"reason": "bench"}},
        "stamp + pdfa + sign": {"stamp": {"text": "PAID"}, "pdfa": "3b", "sign": {}},
    }


async def printed(docs: int, pages: int) -> tuple[list[bytes], float]:
    """Chromium's PDFs of `docs` invoices of about `pages` pages, and its ms per PDF."""
    lines = 20 if pages <= 1 else pages * 32
    html = [templates.render(INVOICE, invoice_data(n, lines)) for n in range(docs)]
    arguments = options.RenderOptions().pdf_arguments()
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(
            executable_path=choose_chromium(playwright.chromium.executable_path),
            args=list(CHROMIUM_ARGS),
        )
        context = await browser.new_context(java_script_enabled=False, viewport=PRINT_VIEWPORT)
        page = await context.new_page()
        await page.set_content(html[0])
        await page.pdf(**arguments)  # warm
        out = []
        started = time.perf_counter()
        for doc in html:
            await page.set_content(doc, wait_until="load")
            out.append(await page.pdf(**arguments))
        elapsed = time.perf_counter() - started
        await browser.close()
    return out, elapsed * 1000 / docs


def _key(folder: Path) -> SigningKey:
    from tests import testca  # a throwaway CA, made with cryptography as the tests make one

    made = testca.make(folder)
    return SigningKey(made.p12, made.password)


async def run_rows(docs: int, page_counts: list[int]) -> list[dict[str, Any]]:
    xml = XML.read_bytes()
    xml_id = "sha256:" + hashlib.sha256(xml).hexdigest()
    contents = {xml_id: ("application/xml", xml)}
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as folder:
        key = _key(Path(folder))
        for pages in page_counts:
            pdfs, print_ms = await printed(docs, pages)
            pages = count_pages(pdfs[0])  # what Chromium printed: the per-page figures use it
            rows.append(
                {
                    "step": "Chromium print (for scale)",
                    "pages": pages,
                    "docs": docs,
                    "pdfs_per_s": 1000 / print_ms,
                    "ms_per_page": print_ms / pages,
                    "bytes_ratio": 1.0,
                }
            )
            for step, raw in _steps(xml_id).items():
                chosen = options.parse(raw)
                pool = FinishPool(1, max_mb=1024)
                try:
                    await pool.run(Work(pdfs[0], chosen, contents, key), timeout_s=120)
                    started = time.perf_counter()
                    sizes = []
                    for pdf in pdfs:
                        done = await pool.run(Work(pdf, chosen, contents, key), timeout_s=120)
                        sizes.append(len(done.pdf) / len(pdf))
                    elapsed = time.perf_counter() - started
                finally:
                    await pool.close()
                rows.append(
                    {
                        "step": step,
                        "pages": pages,
                        "docs": docs,
                        "pdfs_per_s": docs / elapsed,
                        "ms_per_page": elapsed * 1000 / docs / pages,
                        "bytes_ratio": sum(sizes) / len(sizes),
                        "peak_rss_mb": done.peak_rss_mb,
                    }
                )
                print(
                    f"finishing {step:<22} pages≈{pages:>2}: {docs / elapsed:6.1f} PDFs/s, "
                    f"{elapsed * 1000 / docs / pages:6.1f} ms per page (Chromium prints at "
                    f"{print_ms / pages:.1f} ms per page); size x{rows[-1]['bytes_ratio']:.2f}",
                    flush=True,
                )
    return rows


async def run(args: argparse.Namespace) -> dict[str, Any]:
    pages = [int(p) for p in args.pages.split(",")]
    rows = await run_rows(args.docs, pages)
    return {
        "args": vars(args),
        "command": command(NAME, f"--docs {args.docs}", f"--pages {args.pages}"),
        "rows": rows,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=2 if QUICK else 4, help="per step")
    parser.add_argument("--pages", default="1,20", help="page counts, e.g. 1,20")
    return parser


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
