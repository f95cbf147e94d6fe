"""The egress gate's cost: a page that loads subresources, printed by Pressroom's renderer
(every connection through its gate) against a raw Playwright loop whose Chromium connects
directly, in the same process and alternating rounds.

The page is the invoice with a stylesheet and --images images from an allow-listed server on
127.0.0.1; the images differ per document (a query string), so nothing is answered from
Chromium's cache. A template without subresources opens no connection and pays nothing for
the gate: bench.render measures that case.

    python -m bench.egress [--docs N] [--images K] [--slots S] [--rounds R]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

from aiohttp import web

from bench.common import INVOICE, QUICK, command, invoice_data
from bench.render import RawLoop
from server.netpolicy import NetworkPolicy
from server.options import RenderOptions
from server.render import templates
from server.render.chromium import ChromiumRenderer

NAME = "bench.egress"
PNG = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c6360f8cfc0f01f0005000200d1c3c0"
    "5b0000000049454e44ae426082"
)


async def assets() -> tuple[web.AppRunner, str]:
    async def image(request: web.Request) -> web.Response:
        return web.Response(body=PNG, content_type="image/png")

    async def style(request: web.Request) -> web.Response:
        return web.Response(text="td { color: #222 }", content_type="text/css")

    app = web.Application()
    app.router.add_get("/img.png", image)
    app.router.add_get("/style.css", style)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}"


def documents(base: str, docs: int, images: int) -> list[str]:
    html = []
    for n in range(docs):
        links = f'<link rel="stylesheet" href="{base}/style.css?d={n}">'
        links += "".join(f'<img src="{base}/img.png?d={n}&i={i}">' for i in range(images))
        html.append(
            templates.render(INVOICE, invoice_data(n, 20)).replace("</h1>", "</h1>" + links)
        )
    return html


async def through_gate(renderer: ChromiumRenderer, html: list[str], slots: int) -> float:
    queue: asyncio.Queue[str] = asyncio.Queue()
    for doc in html:
        queue.put_nowait(doc)
    options = RenderOptions()

    async def loop() -> None:
        while not queue.empty():
            result = await renderer.render(queue.get_nowait(), options, timeout_s=60)
            assert not result.warnings, result.warnings

    started = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(slots)))
    return len(html) / (time.perf_counter() - started)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    runner, base = await assets()
    html = documents(base, args.docs, args.images)
    renderer = ChromiumRenderer(policy=NetworkPolicy(["127.0.0.1"]), slots=args.slots)
    await renderer.start()
    rounds: list[dict[str, float]] = []
    try:
        async with RawLoop(args.slots) as raw:
            await raw.warm(html)
            await through_gate(renderer, html[: args.slots * 2], args.slots)
            for _ in range(args.rounds):
                floor, _ = await raw.run(html)
                ours = await through_gate(renderer, html, args.slots)
                rounds.append({"raw": floor, "pressroom": ours, "ratio": ours / floor})
    finally:
        await renderer.close()
        await runner.cleanup()
    row = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    cost_ms = (1 / row["pressroom"] - 1 / row["raw"]) * 1000 * args.slots
    each = ", ".join(f"{r['ratio']:.2f}" for r in rounds)
    print(
        f"egress  slots={args.slots} docs={args.docs} subresources={args.images + 1}: raw "
        f"Playwright (direct) {row['raw']:.1f} PDF/s, Pressroom's renderer (gate) "
        f"{row['pressroom']:.1f} PDF/s, ratio {row['ratio']:.2f} (median of {args.rounds}: "
        f"{each}); about {cost_ms:.1f} ms more per "
        "document and slot",
        flush=True,
    )
    argv = ["--docs", args.docs, "--images", args.images, "--slots", args.slots]
    return {
        "command": command(NAME, *argv, "--rounds", args.rounds),
        "args": vars(args),
        "row": row,
        "rounds": rounds,
    }


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=20 if QUICK else 60)
    parser.add_argument("--images", type=int, default=10)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=2 if QUICK else 5)
    return parser


def main() -> None:
    print(json.dumps(asyncio.run(run(parser().parse_args())), indent=2))


if __name__ == "__main__":
    main()
