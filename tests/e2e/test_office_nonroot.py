"""LibreOffice as a Pressroom that is not root starts it (the container's and the systemd unit's
case): an OfficePool in a child process run as an unprivileged user converts a Word file made
with python-docx, and its LibreOffice is that user, in a user and network namespace of its own
(`unshare --net --map-current-user`), where nothing, not even loopback, answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_office import gone, word
from tests.e2e.test_office_process import ids, interfaces
from tests.e2e.test_render import pdf_text

pytestmark = pytest.mark.slow  # the child starts its LibreOffice (about 3 s)

ROOT = Path(__file__).resolve().parents[2]
#: The unprivileged user the child runs as when the suite runs as root.
USER = "nobody"
WAIT_S = 120.0
#: The child: one conversion through OfficePool (the non-root branch of its _prepare, since
#: the child is not root), then the pids of its LibreOffice on one JSON line, kept alive until
#: the test has looked at them (a line on stdin), then closed.
CHILD = """
import asyncio, json, os, sys
from pathlib import Path
from server.options import RenderOptions
from server.render.office import OfficePool

async def main(folder: Path) -> None:
    pool = OfficePool(1)
    data = (folder / "letter.docx").read_bytes()
    converted = await pool.convert(data, "letter.docx", RenderOptions(), timeout_s=60)
    (folder / "letter.pdf").write_bytes(converted.pdf)
    [office] = pool.processes()
    print(json.dumps({"euid": os.geteuid(), "pages": converted.pages, "converter": office.pid,
                      "soffice": office.soffice_pid}), flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    await pool.close()

asyncio.run(main(Path(sys.argv[1])))
"""


def leftovers(folder: Path) -> list[Path]:
    """The LibreOffice folders (home, profile) left in the child's temporary folder."""
    return list(folder.glob("pressroom-office-*"))


def reachable_by_others(path: Path) -> bool:
    """Whether a user who is neither the owner nor in the group may run `path`."""
    real = path.resolve()
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in (real, *real.parents))


def interpreter() -> str:
    """This Python, if any user may run it; else the system's of the same version (the venv's
    is under /root here, which only root may enter), given the venv's libraries by path."""
    if os.geteuid() != 0 or reachable_by_others(Path(sys.executable)):
        return sys.executable
    system = "/usr/bin/python3"
    version = subprocess.run(
        [system, "-c", "import sys; print(*sys.version_info[:2])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert version == [str(n) for n in sys.version_info[:2]], (
        f"{system} is Python {'.'.join(version)}: the venv's compiled libraries need "
        f"{sys.version_info[0]}.{sys.version_info[1]}"
    )
    return system


@pytest.fixture
def folder() -> Iterator[Path]:
    """The child's home and temporary folder, which it owns (pytest's are root's alone)."""
    made = Path(tempfile.mkdtemp(prefix="pressroom-nonroot-"))
    if os.geteuid() == 0:
        entry = pwd.getpwnam(USER)
        os.chown(made, entry.pw_uid, entry.pw_gid)
    yield made
    shutil.rmtree(made, ignore_errors=True)


@pytest.fixture
async def listening() -> AsyncIterator[int]:
    """A port on this host's loopback that accepts connections."""

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(accept, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()
    await server.wait_closed()


def routes(pid: int) -> list[str]:
    """The routes of `pid`'s network namespace (IPv4), without the header line."""
    return Path(f"/proc/{pid}/net/route").read_text().splitlines()[1:]


def connects(port: int, *, inside: int | None = None) -> subprocess.CompletedProcess[str]:
    """Connect to 127.0.0.1:port from this host's network, or from the network namespace of the
    process `inside`."""
    enter = []
    if inside is not None:
        enter = ["nsenter", f"--target={inside}", "--net"]
        if os.geteuid() != 0:  # its namespace belongs to the user namespace we made it in
            enter += ["--user", "--preserve-credentials"]
        enter.append("--")
    code = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5).close()"
    return subprocess.run(
        [*enter, "/usr/bin/python3", "-c", code], capture_output=True, text=True, check=False
    )


async def test_libreoffice_of_a_pressroom_that_is_not_root_converts_without_network(
    folder: Path, listening: int
) -> None:
    (folder / "letter.docx").write_bytes(word(2, title="A letter"))
    run_as: list[str] = []
    expected = (os.geteuid(), os.getegid())
    if os.geteuid() == 0:
        entry = pwd.getpwnam(USER)
        expected = (entry.pw_uid, entry.pw_gid)
        run_as = ["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}"]
        run_as += ["--clear-groups", "--"]
    libraries = [str(ROOT), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]
    env = {
        "PATH": "/usr/bin:/bin",
        "HOME": str(folder),
        "TMPDIR": str(folder),
        "LANG": "C.UTF-8",
        "PYTHONPATH": os.pathsep.join(dict.fromkeys(libraries)),
    }
    child = await asyncio.create_subprocess_exec(
        *run_as,
        interpreter(),
        "-c",
        CHILD,
        str(folder),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=folder,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None and child.stderr is not None
    started: dict[str, Any] = {}
    try:
        async with asyncio.timeout(WAIT_S):
            line = await child.stdout.readline()
        if not line:
            raise AssertionError((await child.stderr.read()).decode(errors="replace"))
        started = json.loads(line)
        assert started["euid"] == expected[0] != 0, "the child is not root: the branch tested"

        # The PDF comes back, its text as written.
        assert started["pages"] == 2
        text = pdf_text((folder / "letter.pdf").read_bytes())
        assert "Text of page 1." in text and "Text of page 2." in text, text

        own_user_ns = os.readlink(f"/proc/{child.pid}/ns/user")
        own_net_ns = os.readlink(f"/proc/{child.pid}/ns/net")
        for pid in (started["converter"], started["soffice"]):
            # The unprivileged user, as the kernel has it, in a user namespace of its own
            # (--map-current-user: the root branch makes none) and a network namespace too.
            assert ids(pid) == ({expected[0]}, {expected[1]}), f"pid {pid} runs as {ids(pid)}"
            assert os.readlink(f"/proc/{pid}/ns/user") != own_user_ns
            assert os.readlink(f"/proc/{pid}/ns/net") != own_net_ns
            assert interfaces(pid) == ["lo"]
            assert routes(pid) == [], "no route anywhere"
        # What listens on this host's loopback answers here, and nothing from LibreOffice's.
        assert (await asyncio.to_thread(connects, listening)).returncode == 0
        refused = await asyncio.to_thread(connects, listening, inside=started["soffice"])
        assert refused.returncode != 0
        assert "Network is unreachable" in refused.stderr, refused.stderr

        [made] = leftovers(folder)  # in the folder its user may write, as TMPDIR says
        assert made.owner() == pwd.getpwuid(expected[0]).pw_name
        child.stdin.write(b"close\n")
        await child.stdin.drain()
        async with asyncio.timeout(WAIT_S):
            assert await child.wait() == 0, (await child.stderr.read()).decode()
        assert gone(started["converter"]) and gone(started["soffice"])
        assert leftovers(folder) == [], "its folder and profile are removed with it"
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
        if started and not gone(started["converter"]):  # its own process group, soffice in it
            with contextlib.suppress(ProcessLookupError):
                os.killpg(started["converter"], signal.SIGKILL)
