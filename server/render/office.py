"""Office documents to PDF: long-lived headless LibreOffice processes, reused across jobs.

Each process is the converter script (server/render/office_convert.py, run by the system Python
that has Debian's python3-uno) with its soffice.bin below it, talking JSON lines over stdin and
stdout. Both run unprivileged (PRESSROOM_CHROMIUM_USER when Pressroom is root), in a network
namespace of their own with no route anywhere (`unshare --net`), in a memory cgroup bounded to
PRESSROOM_RENDER_MAX_MB, each with its own user profile. A conversion is bounded by the job's
render time limit; a process that crashes, hangs or passes its limits is killed (its whole
process group) and the next conversion starts a fresh one; every process is also replaced after
RESTART_AFTER conversions, as LibreOffice grows with use. Processes start on the first Office
job, one per render slot at most: a server that never sees one pays nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import io
import itertools
import json
import logging
import os
import pwd
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pikepdf
import psutil

from server.errors import PermanentError, TransientError
from server.files import office_formats
from server.options import RenderOptions
from server.render.cgroups import Leaf, RenderCgroups

log = logging.getLogger(__name__)

SOFFICE = "/usr/lib/libreoffice/program/soffice.bin"
#: Debian's python3-uno is built for this interpreter.
PYTHON = "/usr/bin/python3"
CONVERTER = Path(__file__).with_name("office_convert.py")
PACKAGES = "libreoffice-writer-nogui libreoffice-calc-nogui libreoffice-impress-nogui python3-uno"
#: Conversions before a process is replaced (Gotenberg restarts LibreOffice the same way).
RESTART_AFTER = 100
#: A process whose resident memory passes this after a conversion is replaced.
MAX_RSS_MB = 1000
#: A start makes its process's user profile: about 3 s here, within this bound.
START_TIMEOUT_S = 60.0
PREFIX = "pressroom-office-"


@dataclasses.dataclass(frozen=True, slots=True)
class Converted:
    pdf: bytes
    pages: int


def page_ranges(ranges: str) -> str:
    """Pressroom's page ranges (1-3, 5) as LibreOffice's PageRange reads them (1-3;5)."""
    return ";".join(part.strip() for part in ranges.split(",") if part.strip())


class OfficeProcess:
    """One converter and its soffice.bin."""

    def __init__(self, process: asyncio.subprocess.Process, folder: Path, leaf: Leaf | None):
        self._process = process
        self._folder = folder
        self._leaf = leaf
        self.soffice_pid = 0
        self.conversions = 0
        self._names = itertools.count(1)

    @property
    def pid(self) -> int:
        return self._process.pid

    @classmethod
    async def start(
        cls, command: list[str], folder: Path, cgroups: RenderCgroups | None
    ) -> OfficeProcess:
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/bin:/bin", "HOME": str(folder), "LANG": "C.UTF-8"},
            cwd=folder,
            start_new_session=True,  # one process group: a kill takes soffice.bin with it
            limit=1024 * 1024,
        )
        leaf = None
        if cgroups is not None:
            try:
                # Before the setup line: soffice.bin, started after it, is born inside.
                leaf = cgroups.confine(process.pid)
            except OSError as exc:
                _kill(process.pid)
                raise TransientError(f"cannot bound LibreOffice's memory: {exc}") from None
        office = cls(process, folder, leaf)
        setup = {
            "soffice": SOFFICE,
            "profile": str(folder / "profile"),
            "pipe": folder.name,
            "start_timeout_s": START_TIMEOUT_S,
        }
        try:
            async with asyncio.timeout(START_TIMEOUT_S + 5):
                ready = await office._ask(setup)
        except (TimeoutError, _Gone) as exc:
            why = await office._stderr() or str(exc) or "it did not answer"
            await office.stop()
            raise TransientError(f"LibreOffice did not start: {why}") from None
        if not ready.get("ready"):
            await office.stop()
            raise TransientError(f"LibreOffice did not start: {ready.get('error')}")
        office.soffice_pid = int(ready["pid"])
        return office

    async def _ask(self, message: dict[str, Any]) -> dict[str, Any]:
        assert self._process.stdin is not None and self._process.stdout is not None
        try:
            self._process.stdin.write(json.dumps(message).encode() + b"\n")
            await self._process.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            raise _Gone("the converter has exited") from None
        line = await self._process.stdout.readline()
        if not line:
            raise _Gone("the converter has exited")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def _stderr(self) -> str:
        if self._process.returncode is None or self._process.stderr is None:
            return ""
        with contextlib.suppress(Exception):
            text = (await self._process.stderr.read(4096)).decode(errors="replace").strip()
            return text.splitlines()[-1] if text else ""
        return ""

    async def convert(self, data: bytes, extension: str, options: RenderOptions) -> bytes:
        """The PDF LibreOffice makes of `data`; _Gone when the process died doing it,
        _Refused when LibreOffice cannot read the document."""
        number = next(self._names)
        source = self._folder / f"in-{number}{extension}"
        target = self._folder / f"out-{number}.pdf"
        await asyncio.to_thread(source.write_bytes, data)
        try:
            answer = await self._ask(
                {
                    "input": str(source),
                    "output": str(target),
                    "page_ranges": page_ranges(options.page_ranges),
                    "landscape": options.landscape,
                    "bookmarks": options.outline,
                }
            )
            self.conversions += 1
            if not answer.get("ok"):
                if answer.get("crashed"):
                    raise _Gone(str(answer.get("error")))
                raise _Refused(str(answer.get("error")))
            return await asyncio.to_thread(target.read_bytes)
        finally:
            source.unlink(missing_ok=True)
            target.unlink(missing_ok=True)

    def rss_mb(self) -> float:
        """Resident memory of the converter and soffice.bin together."""
        total = 0
        with contextlib.suppress(psutil.Error):
            for pid in (self.pid, self.soffice_pid):
                if pid:
                    total += psutil.Process(pid).memory_info().rss
        return total / (1024 * 1024)

    def oom_killed(self) -> bool:
        return self._leaf is not None and self._leaf.oom_kills() > 0

    async def stop(self) -> None:
        """Kill the process group and remove its folder (its profile with it)."""
        _kill(self._process.pid)
        with contextlib.suppress(ProcessLookupError):
            await self._process.wait()
        if self._process.stdin is not None:
            self._process.stdin.close()
        if self._leaf is not None:
            for _ in range(50):
                if self._leaf.remove():
                    break
                await asyncio.sleep(0.02)
        await asyncio.to_thread(shutil.rmtree, self._folder, True)


class _Gone(Exception):
    """The process died (or crashed inside LibreOffice) during a request."""


class _Refused(Exception):
    """LibreOffice could not read or print the document."""


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class OfficePool:
    """Up to `size` LibreOffice processes, each converting one document at a time."""

    def __init__(
        self,
        size: int,
        *,
        user: str = "nobody",
        max_mb: int = 1024,
        restart_after: int = RESTART_AFTER,
        max_rss_mb: int = MAX_RSS_MB,
    ) -> None:
        self._size = max(size, 1)
        self._user = user
        self._max_mb = max_mb
        self._restart_after = restart_after
        self._max_rss_mb = max_rss_mb
        self._free = asyncio.Semaphore(self._size)
        self._idle: list[OfficeProcess] = []
        self._running: set[OfficeProcess] = set()
        self._cgroups: RenderCgroups | None = None
        self._cgroups_tried = False
        self._uid: tuple[int, int] | None = None
        #: Processes started, and those replaced (crash, hang, memory, or RESTART_AFTER).
        self.started = 0
        self.replaced = 0
        #: Set while a LibreOffice holds a document (its process started): what a caller that
        #: must act mid-conversion (a test killing it) waits on.
        self.converting = asyncio.Event()

    def processes(self) -> list[OfficeProcess]:
        """The processes alive now, busy or idle (tests and the benchmark read their pids)."""
        return [*self._idle, *self._running]

    async def convert(
        self, data: bytes, name: str, options: RenderOptions, *, timeout_s: float
    ) -> Converted:
        """The PDF of the Office file `name` (its bytes `data`), with the options' page ranges,
        landscape and outline, and its own title and author unless the options set them.
        PermanentError when LibreOffice cannot read it; TransientError when its process
        crashed, hung or ran out of memory (a fresh one takes the next conversion)."""
        kind = office_formats.detect(data)
        if kind is None:
            raise PermanentError(f"{name} is not {office_formats.accepted()}")
        async with self._free:
            office = await self._take()
            self._running.add(office)
            healthy = False
            try:
                self.converting.set()
                async with asyncio.timeout(timeout_s):
                    pdf = await office.convert(data, kind.extension, options)
                healthy = True
            except TimeoutError:
                raise TransientError(
                    f"LibreOffice did not convert {name} within {timeout_s:g} s"
                ) from None
            except _Gone as exc:
                if office.oom_killed():
                    raise PermanentError(
                        f"LibreOffice ran out of memory converting {name} (the bound is "
                        f"{self._max_mb} MiB, PRESSROOM_RENDER_MAX_MB)"
                    ) from None
                raise TransientError(f"LibreOffice crashed converting {name}: {exc}") from None
            except _Refused as exc:
                healthy = True
                raise PermanentError(
                    f"LibreOffice cannot convert {name} ({kind.label}): {exc}"
                ) from None
            finally:
                if not self._running - {office}:
                    self.converting.clear()
                self._running.discard(office)
                await self._give_back(office, healthy)
        return Converted(pdf, await asyncio.to_thread(_pages, pdf, name))

    async def _take(self) -> OfficeProcess:
        if self._idle:
            return self._idle.pop()
        command, folder = self._prepare()
        office = await OfficeProcess.start(command, folder, self._memory_bound())
        self.started += 1
        log.info("LibreOffice started (pid %s, soffice.bin %s)", office.pid, office.soffice_pid)
        return office

    async def _give_back(self, office: OfficeProcess, healthy: bool) -> None:
        worn = office.conversions >= self._restart_after
        if healthy and not worn and office.rss_mb() <= self._max_rss_mb:
            self._idle.append(office)
            return
        self.replaced += 1
        await office.stop()

    def _memory_bound(self) -> RenderCgroups | None:
        if not self._cgroups_tried:
            self._cgroups_tried = True
            self._cgroups, why = RenderCgroups.create(self._max_mb, prefix=PREFIX)
            if self._cgroups is None:
                log.warning("LibreOffice is not bounded in memory: %s", why)
        return self._cgroups

    def _prepare(self) -> tuple[list[str], Path]:
        """The command that starts a converter, unprivileged and without network, and its
        folder (home, profile, the files it converts)."""
        for path, what in ((SOFFICE, "LibreOffice"), (PYTHON, "Python 3")):
            if not os.access(path, os.X_OK):
                raise PermanentError(
                    f"{what} is not installed on this server ({path}): install {PACKAGES} "
                    "(make install does)"
                )
        unshare = shutil.which("unshare")
        if unshare is None:
            raise PermanentError("Office conversions need unshare (util-linux) on this server")
        folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        command = [unshare, "--net"]
        if os.geteuid() == 0:
            uid, gid = self._user_ids()
            os.chown(folder, uid, gid)
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                raise PermanentError("running as root needs setpriv (util-linux) for LibreOffice")
            command += ["--", setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        else:
            command += ["--map-current-user"]
        command += ["--", PYTHON, str(CONVERTER)]
        return command, folder

    def _user_ids(self) -> tuple[int, int]:
        if self._uid is None:
            try:
                entry = pwd.getpwnam(self._user)
            except KeyError:
                raise PermanentError(
                    f"PRESSROOM_CHROMIUM_USER {self._user!r} is not a user here"
                ) from None
            if entry.pw_uid == 0:
                raise PermanentError("PRESSROOM_CHROMIUM_USER must not be root")
            self._uid = (entry.pw_uid, entry.pw_gid)
        return self._uid

    async def close(self) -> None:
        """Stop every process (none is converting: the render slots have stopped)."""
        for office in [*self._idle, *self._running]:
            await office.stop()
        self._idle.clear()
        self._running.clear()
        if self._cgroups is not None:
            self._cgroups.close()


def _pages(pdf: bytes, name: str) -> int:
    try:
        with pikepdf.open(io.BytesIO(pdf)) as document:
            return len(document.pages)
    except pikepdf.PdfError as exc:
        raise PermanentError(f"LibreOffice made no readable PDF of {name}: {exc}") from None
