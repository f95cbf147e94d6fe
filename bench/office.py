"""Office PDFs per second and p50 latency for a 3-page DOCX, one document at a time: Pressroom's
long-lived LibreOffice (server/render/office.py, the process a render slot uses) against what a
user would pick instead, in the same run: `soffice --headless --convert-to pdf` per file, and
unoserver (a long-lived LibreOffice behind XML-RPC) when its package is installed (the bench
extra). Every LibreOffice runs as the same unprivileged user when this runs as root. Each
engine is warmed with one document first (its start is not counted; Pressroom's is printed).
Also printed: the resident memory of each LibreOffice after the run (a per-file soffice: the
largest any of them reached).

    python -m bench.office [--docs 20] [--peers soffice,unoserver]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import io
import os
import pwd
import resource
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from subprocess import DEVNULL
from typing import Any

import docx
import psutil

from bench import common
from bench.common import QUICK, free_port
from server.options import RenderOptions
from server.render import office

USER = "nobody"
#: The wrapper users call (it restarts LibreOffice on exit code 81).
SOFFICE = shutil.which("soffice") or "soffice"


def three_pages() -> bytes:
    document = docx.Document()
    document.core_properties.title = "Benchmark"
    for page in range(1, 4):
        document.add_heading(f"Section {page}", level=1)
        for _ in range(6):
            document.add_paragraph(f"Paragraph text of page {page}. " * 12)
        if page < 3:
            document.add_page_break()  # type: ignore[no-untyped-call]
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


def as_user() -> list[str]:
    """The prefix that runs a command as USER when this is root (nothing otherwise)."""
    if os.geteuid() != 0:
        return []
    entry = pwd.getpwnam(USER)
    return ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups"]


@contextlib.contextmanager
def folder() -> Iterator[Path]:
    """A temporary folder, USER's when this is root."""
    with tempfile.TemporaryDirectory(prefix="prb-office-", ignore_cleanup_errors=True) as path:
        if os.geteuid() == 0:
            entry = pwd.getpwnam(USER)
            os.chown(path, entry.pw_uid, entry.pw_gid)
        yield Path(path)


def figures(name: str, latencies_s: list[float], rss_mb: float) -> dict[str, Any]:
    """An engine's PDFs per second and median milliseconds, printed with its memory."""
    pdfs_per_s, p50_ms = len(latencies_s) / sum(latencies_s), statistics.median(latencies_s) * 1000
    print(
        f"  {name:<28} {pdfs_per_s:6.2f} PDFs/s   p50 {p50_ms:7.0f} ms   "
        f"LibreOffice RSS {rss_mb:5.0f} MiB"
    )
    return {"engine": name, "pdfs_per_s": pdfs_per_s, "p50_ms": p50_ms}


async def pressroom(data: bytes, docs: int) -> dict[str, Any]:
    pool = office.OfficePool(1)
    options = RenderOptions()

    async def convert() -> float:
        began = time.perf_counter()
        await pool.convert(data, "bench.docx", options, timeout_s=120)
        return time.perf_counter() - began

    try:
        print(f"  (Pressroom's first document, its LibreOffice starting: {await convert():.1f} s)")
        latencies = [await convert() for _ in range(docs)]
        (process,) = pool.processes()
        return figures("Pressroom (long-lived)", latencies, process.rss_mb())
    finally:
        await pool.close()


def per_file(data: bytes, docs: int) -> dict[str, Any]:
    with folder() as work:
        source = work / "bench.docx"
        source.write_bytes(data)
        os.chmod(source, 0o644)
        profile = f"-env:UserInstallation=file://{work}/profile"
        command = [*as_user(), SOFFICE, "--headless", profile, "--convert-to", "pdf"]
        command += ["--outdir", str(work), str(source)]
        environment = {"PATH": "/usr/bin:/bin", "HOME": str(work)}

        def once() -> float:
            began = time.perf_counter()
            subprocess.run(command, env=environment, check=True, capture_output=True)
            elapsed = time.perf_counter() - began
            assert (work / "bench.pdf").stat().st_size > 0
            (work / "bench.pdf").unlink()
            return elapsed

        once()  # the profile is made once, as a user's first run would
        latencies = [once() for _ in range(docs)]
        # ru_maxrss of children: the largest soffice any run reached (KiB on Linux).
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        return figures("soffice --convert-to per file", latencies, peak_mb)


def unoserver(data: bytes, docs: int) -> dict[str, Any] | None:
    spec = importlib.util.find_spec("unoserver")
    if spec is None or spec.origin is None:
        print("  unoserver: not installed (pip install unoserver, the bench extra); skipped")
        return None
    from unoserver.client import UnoClient

    # unoserver imports uno, which Debian builds for the system Python: that one runs it,
    # from a copy of the package.
    with folder() as work:
        package = Path(spec.origin).parent
        shutil.copytree(package, work / "lib" / "unoserver")
        for info in package.parent.glob("unoserver-*.dist-info"):  # it reads its version
            shutil.copytree(info, work / "lib" / info.name)
        port, uno_port = free_port(), free_port()
        script = (
            f"import sys; sys.path.insert(0, {str(work / 'lib')!r}); "
            "from unoserver.server import main; sys.exit(main())"
        )
        command = [*as_user(), office.PYTHON, "-c", script, "--interface=127.0.0.1"]
        command += [f"--port={port}", f"--uno-port={uno_port}", f"--executable={SOFFICE}"]
        command += [f"--user-installation={work}/profile"]
        env = {"PATH": "/usr/bin:/bin", "HOME": str(work)}
        server = subprocess.Popen(
            command, env=env, cwd=work, stdout=DEVNULL, stderr=DEVNULL, start_new_session=True
        )
        try:
            client = UnoClient(server="127.0.0.1", port=str(port), host_location="remote")

            def convert() -> float:
                began = time.perf_counter()
                pdf = client.convert(indata=data, convert_to="pdf")
                elapsed = time.perf_counter() - began
                assert pdf.startswith(b"%PDF")
                return elapsed

            deadline = time.monotonic() + 90
            while True:
                try:
                    convert()
                    break
                except (ConnectionError, OSError):
                    if time.monotonic() > deadline or server.poll() is not None:
                        print("  unoserver: did not start; skipped")
                        return None
                    time.sleep(0.2)
            latencies = [convert() for _ in range(docs)]
            children = psutil.Process(server.pid).children(recursive=True)
            rss = sum(p.memory_info().rss for p in children if p.name().startswith("soffice"))
            return figures("unoserver (long-lived)", latencies, rss / 2**20)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, 9)
            server.wait()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.office", description=__doc__)
    p.add_argument("--docs", type=int, default=5 if QUICK else 20)
    p.add_argument(
        "--peers", default="soffice,unoserver", help="the baselines run: soffice, unoserver"
    )
    return p


async def run(args: argparse.Namespace) -> None:
    data = three_pages()
    print(f"bench.office: a 3-page DOCX ({len(data)} bytes), {args.docs} documents each")
    ours = await pressroom(data, args.docs)
    chosen = args.peers.split(",")
    peers = [per_file(data, args.docs)] if "soffice" in chosen else []
    if "unoserver" in chosen and (other := unoserver(data, args.docs)) is not None:
        peers.append(other)
    for peer in peers:
        print(
            f"  Pressroom / {peer['engine']}: {ours['pdfs_per_s'] / peer['pdfs_per_s']:.1f}x "
            f"the PDFs per second, p50 {ours['p50_ms']:.0f} vs {peer['p50_ms']:.0f} ms",
        )


if __name__ == "__main__":
    common.main(parser, run)
