"""The cost of `compress` on an image-heavy PDF, and the bytes it saves: a 50-page file, each
page a photograph (JPEG, 2400 x 1800 pixels on 8 x 6 inches: 300 dpi) and the same logo
stored once per page (as merged files have it), through the finishing steps in-line (the code
a finishing process runs, server/pdf/finishing.py). The baseline, in the same run, is the same
file opened and written with no compress (a metadata step only); then compress without and
with downsampling. Each figure is the median of its rounds; the compressed file is checked
with `qpdf --check` when qpdf is installed.

    python -m bench.pdfops [--pages 50] [--rounds 3] [--dpi 150]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import pikepdf
from pikepdf import Dictionary, Name
from PIL import Image

from bench import common
from bench.common import QUICK
from server.options import parse
from server.pdf import finishing

PHOTO_PX = (2400, 1800)
PHOTO_PT = (576, 432)  # 8 x 6 inches


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.pdfops", description=__doc__)
    p.add_argument("--pages", type=int, default=10 if QUICK else 50)
    p.add_argument("--rounds", type=int, default=1 if QUICK else 3)
    p.add_argument("--dpi", type=int, default=150, help="image_dpi of the downsampling run")
    return p


def image_heavy(pages: int) -> bytes:
    """`pages` Letter pages, each a photograph and a logo (its own copy on every page)."""
    rng = random.Random(11)
    logo_image = Image.radial_gradient("L").resize((300, 150)).convert("RGB")
    pdf = pikepdf.new()
    for number in range(pages):
        photo = Image.blend(
            Image.linear_gradient("L").resize(PHOTO_PX).convert("RGB"),
            Image.effect_noise(PHOTO_PX, 30 + number % 7).convert("RGB"),
            0.3,
        )
        tint = Image.new("RGB", PHOTO_PX, (rng.randrange(256), rng.randrange(256), 96))
        encoded = io.BytesIO()
        Image.blend(photo, tint, 0.25).save(encoded, format="JPEG", quality=92)
        page = pdf.add_blank_page(page_size=(612, 792))
        jpeg = pikepdf.Stream(pdf, encoded.getvalue())
        jpeg.Type, jpeg.Subtype, jpeg.Filter = Name.XObject, Name.Image, Name.DCTDecode
        jpeg.Width, jpeg.Height, jpeg.BitsPerComponent = *PHOTO_PX, 8
        jpeg.ColorSpace = Name.DeviceRGB
        logo = pikepdf.Stream(pdf, logo_image.tobytes())  # raw, flate-compressed when saved
        logo.Type, logo.Subtype = Name.XObject, Name.Image
        logo.Width, logo.Height, logo.BitsPerComponent = *logo_image.size, 8
        logo.ColorSpace = Name.DeviceRGB
        page.Resources = Dictionary(XObject=Dictionary(Photo=jpeg, Logo=logo))
        page.Contents = pdf.make_stream(
            f"q {PHOTO_PT[0]} 0 0 {PHOTO_PT[1]} 18 200 cm /Photo Do Q "
            "q 144 0 0 72 18 700 cm /Logo Do Q".encode()
        )
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def timed(source: bytes, options: dict[str, object], rounds: int) -> tuple[float, bytes]:
    """The median seconds of `rounds` finishings of `source` with `options`, and the result."""
    seconds, result = [], b""
    for _ in range(rounds):
        started = time.perf_counter()
        result = finishing.run(finishing.Work(source, parse(options))).pdf
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def qpdf_check(data: bytes) -> str:
    if shutil.which("qpdf") is None:
        return "qpdf not installed"
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "compressed.pdf"
        path.write_bytes(data)
        done = subprocess.run(["qpdf", "--check", str(path)], capture_output=True, text=True)
    return "qpdf --check: ok" if done.returncode == 0 else f"qpdf --check: {done.stdout[-300:]}"


async def run(args: argparse.Namespace) -> None:
    source = await asyncio.to_thread(image_heavy, args.pages)
    mib = 1024 * 1024
    print(f"source: {args.pages} pages, {len(source) / mib:.1f} MiB")
    runs: list[tuple[str, dict[str, object]]] = [
        ("baseline (open + write, no compress)", {"metadata": {"Bench": "pdfops"}}),
        ("compress", {"compress": {}}),
        (f"compress, image_dpi {args.dpi}", {"compress": {"image_dpi": args.dpi}}),
    ]
    base_s = 0.0
    for label, options in runs:
        seconds, result = await asyncio.to_thread(timed, source, options, args.rounds)
        base_s = base_s or seconds
        saved = 1 - len(result) / len(source)
        print(
            f"{label}: {seconds:.2f} s ({seconds / base_s:.1f}x the baseline), "
            f"{len(result) / mib:.2f} MiB ({saved:.0%} saved)",
        )
        if "compress" in options:
            print(f"  {qpdf_check(result)}")


if __name__ == "__main__":
    common.main(parser, run)
