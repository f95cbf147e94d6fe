"""What a LibreOffice process guarantees, on real LibreOffice: it is replaced after its number
of conversions and when its memory passes the bound, by one with a new pid and a new profile; a
conversion that needs more memory than PRESSROOM_RENDER_MAX_MB fails naming the setting; it
runs as PRESSROOM_CHROMIUM_USER when Pressroom is root (as Pressroom's own user otherwise),
always in a network namespace of its own with nothing but a loopback in it."""

from __future__ import annotations

import io
import logging
import os
import pwd
import struct
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import docx
import pytest
from docx.shared import Inches

from server.keys import WORKERS
from server.options import RenderOptions
from server.render.cgroups import RenderCgroups
from server.render.office import OfficePool, OfficeProcess
from tests.conftest import RunningApp
from tests.e2e.test_office import DOCX, convert, gone, upload, word
from tests.e2e.test_render import pdf_text
from tests.pdfs import FakeRenderer

pytestmark = pytest.mark.slow  # each pool starts its LibreOffice (about 3 s)

#: A bound LibreOffice starts and converts a page of text within (about 170 MiB here at its
#: peak), and far below what it needs to print a 12000 x 12000 picture (about 570 MiB).
SMALL_BOUND_MB = 320


@pytest.fixture
async def pools() -> AsyncIterator[Callable[..., OfficePool]]:
    """Pools made by the test, all closed at its end (their processes killed)."""
    made: list[OfficePool] = []

    def make(**kwargs: Any) -> OfficePool:
        made.append(OfficePool(1, **kwargs))
        return made[-1]

    yield make
    for pool in made:
        await pool.close()


async def to_pdf(pool: OfficePool, text: str) -> str:
    document = docx.Document()
    document.add_paragraph(text)
    out = io.BytesIO()
    document.save(out)
    converted = await pool.convert(out.getvalue(), "note.docx", RenderOptions(), timeout_s=60)
    return pdf_text(converted.pdf)


def profile_of(process: OfficeProcess) -> Path:
    """The user profile soffice.bin was started with, as its command line says."""
    arguments = Path(f"/proc/{process.soffice_pid}/cmdline").read_bytes().split(b"\0")
    (found,) = [a for a in arguments if a.startswith(b"-env:UserInstallation=file://")]
    return Path(found.decode().removeprefix("-env:UserInstallation=file://"))


def ids(pid: int) -> tuple[set[int], set[int]]:
    """The real, effective, saved and filesystem uids and gids of `pid`, as the kernel has them."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines()
    )
    return {int(n) for n in fields["Uid"].split()}, {int(n) for n in fields["Gid"].split()}


def interfaces(pid: int) -> list[str]:
    """The network interfaces of `pid`'s network namespace."""
    lines = Path(f"/proc/{pid}/net/dev").read_text().splitlines()[2:]  # two header lines
    return [line.split(":", 1)[0].strip() for line in lines]


def blank_png(side: int) -> bytes:
    """A white RGB picture, side pixels square: a few hundred KiB that decode to side² x 3 bytes."""
    row = b"\0" + b"\xff" * (side * 3)  # filter byte, then the pixels
    packer = zlib.compressobj(9)
    chunks = [packer.compress(row * 500) for _ in range(side // 500)]
    chunks += [packer.compress(row * (side % 500)), packer.flush()]

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", b"".join(chunks))
        + chunk(b"IEND", b"")
    )


def poster() -> bytes:
    """A one-page Word file whose one picture LibreOffice must decode, 12000 px square."""
    document = docx.Document()
    document.add_paragraph("A poster")
    document.add_picture(io.BytesIO(blank_png(12000)), width=Inches(6))
    out = io.BytesIO()
    document.save(out)
    return out.getvalue()


async def test_a_process_is_replaced_after_its_number_of_conversions(
    pools: Callable[..., OfficePool],
) -> None:
    pool = pools(restart_after=2)
    assert "first" in await to_pdf(pool, "The first note")
    (first,) = pool.processes()
    first_profile = profile_of(first)
    assert first_profile.is_dir()
    assert "second" in await to_pdf(pool, "The second note")
    # Its second conversion was its last: it is gone, with its profile, before a third is asked.
    assert pool.processes() == [] and pool.replaced == 1
    assert gone(first.soffice_pid) and gone(first.pid)
    assert not first_profile.exists()

    assert "third" in await to_pdf(pool, "The third note")
    (second,) = pool.processes()
    assert pool.started == 2
    assert second.pid != first.pid and second.soffice_pid != first.soffice_pid
    assert profile_of(second) != first_profile and profile_of(second).is_dir()
    assert second.conversions == 1


async def test_a_process_over_its_memory_bound_is_replaced(
    pools: Callable[..., OfficePool],
) -> None:
    # LibreOffice holds some 160 MiB resident once it has converted a page: past 50.
    pool = pools(max_rss_mb=50)
    assert "heavy" in await to_pdf(pool, "A heavy note")
    assert pool.processes() == [] and pool.replaced == 1 and pool.started == 1
    assert "next" in await to_pdf(pool, "The next note")
    assert pool.started == 2

    kept = pools()  # the same conversions under the default bound keep their process
    await to_pdf(kept, "A light note")
    await to_pdf(kept, "Another one")
    assert kept.started == 1 and kept.replaced == 0 and len(kept.processes()) == 1


async def test_a_conversion_needing_more_than_the_memory_bound_fails_naming_the_setting(
    start_app: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    probe, why = RenderCgroups.create(SMALL_BOUND_MB, prefix="pressroom-probe-")
    if probe is not None:
        probe.close()
    caplog.set_level(logging.WARNING, logger="server.render.office")
    app: RunningApp = await start_app(
        renderer=FakeRenderer(),
        render_slots=1,
        env={"PRESSROOM_RENDER_MAX_MB": str(SMALL_BOUND_MB)},
    )
    office = app.app[WORKERS].office
    asset = await upload(app, poster(), DOCX)
    job, pdf = await convert(app, {"office": asset})
    if probe is None:
        # No cgroup can be written here: LibreOffice runs unbounded, and Pressroom says so.
        assert pdf is not None, job["error"]
        assert f"LibreOffice is not bounded in memory: {why}" in caplog.text
        return
    assert pdf is None and job["status"] == "failed"
    assert job["attempts"] == 1, "not retried: the same file needs the same memory"
    assert job["error"] == (
        f"LibreOffice ran out of memory converting {asset} "
        f"(the bound is {SMALL_BOUND_MB} MiB, PRESSROOM_RENDER_MAX_MB)"
    )
    # The bound holds smaller documents, on a fresh process.
    job, pdf = await convert(app, {"office": await upload(app, word(2), DOCX)})
    assert pdf is not None, job["error"]
    assert job["pages"] == 2 and office.started == 2 and office.replaced == 1


async def test_libreoffice_runs_unprivileged_and_without_network(
    start_app: Callable[..., Any],
) -> None:
    # Not the default user: the setting is what decides.
    user = "daemon" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, env={"PRESSROOM_CHROMIUM_USER": user}
    )
    job, pdf = await convert(app, {"office": await upload(app, word(1), DOCX)})
    assert pdf is not None, job["error"]
    (process,) = app.app[WORKERS].office.processes()
    entry = pwd.getpwnam(user)
    if os.geteuid() == 0:
        expected = ({entry.pw_uid}, {entry.pw_gid})
        assert entry.pw_uid != 0
    else:
        # Not root: LibreOffice runs as Pressroom's own user, which cannot hand it to another.
        expected = ({os.geteuid()}, {os.getegid()})
    for pid in (process.pid, process.soffice_pid):  # the converter and soffice.bin
        assert ids(pid) == expected, f"pid {pid} runs as {ids(pid)}"
        assert os.readlink(f"/proc/{pid}/ns/net") != os.readlink("/proc/self/ns/net")
        assert interfaces(pid) == ["lo"], "a namespace of its own, with no way out"
