"""Finishing: what happens to a printed PDF (or a `pdfs` job's merged uploads) before it is
stored, in a fixed order, off the event loop.

The order (docs/documents.md, "Finishing"): the source (Chromium, with `tagged` and `outline`;
or the uploaded PDFs joined, server/pdf/join.py) → select_pages → rotate → fill_form → flatten →
metadata (server/pdf/docinfo.py) → stamp → attachments → Factur-X → PDF/A → compress → encrypt →
sign. Each step keeps what the ones before it made: pages are chosen and turned before
anything is drawn on them by number, a form is filled before it is flattened, the stamp is drawn
before PDF/A declares the fonts embedded (its own font is), attachments and the invoice exist
before PDF/A-3 lists them, compression rewrites what the steps before it added, encryption is
how the file is written, and the signature is an incremental update over the finished bytes.
The steps up to encrypt work on one pikepdf document, written once.

A job's steps run in a finishing process: CPU work that must not hold up the event loop, and
one that must not grow the server either (a process of its own is bounded by an address-space
limit and killed outright when it runs past the render time limit or the job is aborted). The
pool keeps one process per render slot: a job finishes while it holds its slot, so finishing
never runs more at once than renders do. A process that dies or hangs is replaced and the job
retried like a render that crashed; what the document or the options make impossible fails it.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
import io
import logging
import os
import pickle
import resource
import struct
import sys
import time
from pathlib import Path
from typing import Any

from server.errors import PermanentError, TransientError
from server.options import RenderOptions
from server.pdf.join import Part
from server.pdf.provenance import Provenance
from server.signkey import SigningKey

log = logging.getLogger(__name__)

#: Every step, in the order the steps run; the durations histogram names them so.
STEPS = (
    "join",
    "select_pages",
    "rotate",
    "fill_form",
    "flatten",
    "metadata",
    "stamp",
    "attachments",
    "facturx",
    "pdfa",
    "compress",
    "encrypt",
    "write",
    "sign",
)
_HEADER = struct.Struct("!Q")
#: What a finishing process takes above the memory of a render (PRESSROOM_RENDER_MAX_MB):
#: the interpreter and its libraries, mapped but mostly not resident.
BASE_ADDRESS_SPACE_MB = 1024
STOP_TIMEOUT_S = 2.0
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])


@dataclasses.dataclass(frozen=True, slots=True)
class Work:
    """One job's finishing: the printed PDF (or, for a `pdfs` job, the uploaded PDFs to join
    first), its options (with their passwords), the bytes of the assets they name (id →
    content type and bytes), the form's values from the job's data, and the signing key."""

    pdf: bytes
    options: RenderOptions
    contents: dict[str, tuple[str, bytes]] = dataclasses.field(default_factory=dict)
    signing: SigningKey | None = None
    parts: tuple[Part, ...] = ()
    form_values: dict[str, Any] = dataclasses.field(default_factory=dict)
    #: What made the PDF, for its XMP (server/pdf/provenance.py); None: none recorded.
    provenance: Provenance | None = None
    #: When each asset of `contents` was uploaded: an attachment's date (reproducible bytes).
    uploaded: dict[str, dt.datetime] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Finished:
    """The finished PDF, its pages, the seconds each step took, the finishing process's peak
    memory, and what the job shows of the finishing (its document information once metadata
    was set, the sizes before and after compress)."""

    pdf: bytes
    steps: dict[str, float]
    peak_rss_mb: float
    pages: int = 0
    report: dict[str, Any] = dataclasses.field(default_factory=dict)


def run(work: Work) -> Finished:
    """The steps the options ask for, in order (in a finishing process; also callable in-line
    by tests and benchmarks). PermanentError when the document or options make one impossible."""
    # Each step's library is imported when a job first needs it (fpdf2 and pyHanko take
    # seconds to import on a slow machine; a PDF/A job needs neither), before the clock starts.
    from server.pdf import archive, docinfo, provenance

    options = work.options
    if options.select_pages is not None or options.rotate is not None:
        from server.pdf import pages
    if options.fill_form is not None or options.flatten:
        from server.pdf import forms
    if options.compress is not None:
        from server.pdf import compress
    if options.stamp is not None:
        from server.pdf import stamps
    if options.facturx is not None:
        from server.pdf import invoices
    if options.encrypt is not None or options.sign is not None:
        from server.pdf import protect
    steps: dict[str, float] = {}
    clock = time.perf_counter()

    def took(step: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        steps[step] = now - clock
        clock = now

    report: dict[str, Any] = {}
    pdf = _opened(work)
    if work.parts:
        took("join")
    with pdf:
        if options.select_pages is not None:
            pages.select(pdf, options.select_pages)
            took("select_pages")
        if options.rotate is not None:
            pages.rotate(pdf, options.rotate)
            took("rotate")
        if options.fill_form is not None:
            forms.fill(pdf, work.form_values)
            took("fill_form")
        if options.flatten:
            forms.flatten(pdf)
            took("flatten")
        if info := options.document_info():
            docinfo.set_fields(pdf, info)  # a render leaves them to this pass
            report["metadata"] = docinfo.read(pdf)
            took("metadata")
        if options.stamp is not None:
            image = options.stamp.asset
            stamps.apply(pdf, options.stamp, work.contents[image][1] if image else None)
            took("stamp")
        if options.attachments:
            archive.attachments(pdf, options.attachments, work.contents, work.uploaded)
            took("attachments")
        if options.facturx is not None:
            xml = work.contents[options.facturx.xml][1]
            try:
                invoice = invoices.check(xml, options.facturx.profile)
            except PermanentError as exc:
                raise PermanentError(f"options.facturx.xml {exc}") from None
            archive.facturx(pdf, invoice, work.uploaded.get(options.facturx.xml))
            took("facturx")
        level = options.pdfa or ("3b" if options.facturx is not None else None)
        if work.provenance is not None:
            # Before PDF/A reads the metadata, after Factur-X wrote its XMP; signed over later.
            provenance.write(pdf, work.provenance, pdfa=level is not None)
        if level is not None:
            archive.pdfa(pdf, level)
            took("pdfa")
        saving = provenance.save_arguments(options)
        if options.compress is not None:
            before = io.BytesIO()
            pdf.save(before)
            report["compress"] = {"bytes_before": before.getbuffer().nbytes}
            del before
            compress.compress(pdf, options.compress)
            saving |= compress.save_arguments()
            took("compress")
        if options.sign is not None:
            protect.before_signing(pdf)
        count = len(pdf.pages)
        out = io.BytesIO()
        if options.encrypt is not None:
            pdf.save(out, encryption=protect.encryption(options.encrypt), **saving)
            took("encrypt")
        else:
            pdf.save(out, **saving)
            took("write")
    data = out.getvalue()
    del out
    if "compress" in report:
        report["compress"]["bytes_after"] = len(data)
    if options.sign is not None:
        if work.signing is None:
            raise PermanentError("sign: this server has no signing key (PRESSROOM_SIGNING_KEY)")
        owner = options.encrypt.owner_password if options.encrypt is not None else None
        data = protect.sign(data, options.sign, work.signing, owner)
        took("sign")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Finished(data, steps, peak_mb, count, report)


def _opened(work: Work) -> Any:
    """The document the steps work on: the printed PDF, or the uploaded PDFs joined in order
    with an outline entry each."""
    import pikepdf

    if not work.parts:
        try:
            return pikepdf.open(io.BytesIO(work.pdf))
        except pikepdf.PdfError as exc:
            raise PermanentError(f"the printed PDF cannot be read for finishing: {exc}") from None
    from server.pdf import join

    joined = pikepdf.new()
    try:
        join.add(joined, work.parts, outline=True)
    except join.UnreadablePart as exc:
        joined.close()
        index = work.parts.index(exc.part)
        name = exc.part.title or "untitled"
        raise PermanentError(f"pdfs[{index}] ({name}) is not a readable PDF: {exc.why}") from None
    return joined


# --- the finishing process ------------------------------------------------------------------


def _answer(work: Work) -> tuple[str, Any]:
    try:
        return "done", run(work)
    except PermanentError as exc:
        return "permanent", str(exc)
    except MemoryError:
        return "permanent", "finishing the PDF needs more memory than PRESSROOM_RENDER_MAX_MB"
    except Exception as exc:
        log.exception("finishing failed")
        return "error", f"{type(exc).__name__}: {exc}"


def serve(max_mb: int) -> None:
    """A finishing process: read work from stdin, answer on stdout, until stdin closes."""
    if max_mb > 0:
        limit = (max_mb + BASE_ADDRESS_SPACE_MB) * 1024 * 1024
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    reader = sys.stdin.buffer
    writer = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # a stray print must not break the pipe
    while header := reader.read(_HEADER.size):
        (size,) = _HEADER.unpack(header)
        work = pickle.loads(reader.read(size))
        del header
        answer = pickle.dumps(_answer(work), protocol=pickle.HIGHEST_PROTOCOL)
        del work
        writer.write(_HEADER.pack(len(answer)) + answer)
        writer.flush()


class _Process:
    """One finishing process and its pipes."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    @classmethod
    async def start(cls, max_mb: int) -> _Process:
        # The same server package as this process's, wherever the process was started from.
        paths = [_PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "server.pdf.finishing",
            str(max_mb),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)},
            limit=2**20,
        )
        return cls(process)

    async def call(self, work: Work) -> tuple[str, Any]:
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        blob = pickle.dumps(work, protocol=pickle.HIGHEST_PROTOCOL)
        stdin.write(_HEADER.pack(len(blob)))
        stdin.write(blob)
        del blob
        await stdin.drain()
        (size,) = _HEADER.unpack(await stdout.readexactly(_HEADER.size))
        answer: tuple[str, Any] = pickle.loads(await stdout.readexactly(size))
        return answer

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.kill()

    async def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                await self.process.wait()
        except TimeoutError:
            self.kill()
            await self.process.wait()


class FinishPool:
    """Finishing processes, started when a job first needs one and kept for the next."""

    def __init__(self, size: int, *, max_mb: int) -> None:
        self._size = max(size, 1)
        self._max_mb = max_mb
        self._idle: list[_Process] = []
        self._busy: set[_Process] = set()
        self._slots = asyncio.Semaphore(self._size)
        self.started = 0

    async def run(self, work: Work, *, timeout_s: float) -> Finished:
        """`work` finished in a process of the pool within `timeout_s`; TransientError when the
        process died or ran out of time (it is killed), PermanentError when the document or
        the options make a step impossible."""
        async with self._slots:
            process = self._idle.pop() if self._idle else await self._start()
            self._busy.add(process)
            kept = False
            try:
                async with asyncio.timeout(timeout_s):
                    kind, value = await process.call(work)
                kept = True
            except TimeoutError:
                raise TransientError(f"finishing timed out after {timeout_s:g} s") from None
            except (asyncio.IncompleteReadError, ConnectionError, OSError) as exc:
                raise TransientError(f"the finishing process stopped: {exc!r}") from None
            finally:
                self._busy.discard(process)
                if kept:
                    self._idle.append(process)
                else:
                    process.kill()  # cut off mid-work (a timeout, an abort): never reused
                    await asyncio.shield(process.process.wait())
        if kind == "done":
            finished: Finished = value
            return finished
        if kind == "permanent":
            raise PermanentError(value)
        raise TransientError(f"finishing failed: {value}")

    async def _start(self) -> _Process:
        self.started += 1
        return await _Process.start(self._max_mb)

    async def close(self) -> None:
        for process in self._busy:
            process.kill()
        idle, self._idle = self._idle, []
        await asyncio.gather(*(process.stop() for process in idle))


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    # The module under its own name, so that what it answers unpickles as server.pdf.finishing's.
    from server.pdf import finishing

    finishing.serve(int(sys.argv[1]) if len(sys.argv) > 1 else 0)
