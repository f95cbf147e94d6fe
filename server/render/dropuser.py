"""Chromium never runs as root: a launcher that hands the browser to an unprivileged user.

Playwright starts the executable it is given with the profile folder it made (owned by root,
mode 0700). When Pressroom runs as root, it gives Playwright this launcher instead: a short
script that passes the profile folder to the user, then execs Chromium through `setpriv` as
that user, with its file descriptors (Playwright's pipes) kept.
"""

from __future__ import annotations

import os
import pwd
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

PREFIX = "pressroom-chromium-"
_SCRIPT = """#!/bin/sh
# Written by Pressroom: runs Chromium as {user}, not as root.
for arg in "$@"; do
  case "$arg" in --user-data-dir=*) chown -R {uid}:{gid} "${{arg#--user-data-dir=}}" ;; esac
done
HOME={home} exec {setpriv} --reuid={uid} --regid={gid} --clear-groups -- {chromium} "$@"
"""


@dataclass(frozen=True, slots=True)
class Launcher:
    """An executable for Playwright that runs `chromium` as `user`."""

    path: str
    user: str
    folder: Path

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def launcher(chromium: str, user: str) -> tuple[Launcher | None, str]:
    """A launcher when this process is root (None otherwise), and the user Chromium runs as."""
    if os.geteuid() != 0:
        return None, pwd.getpwuid(os.geteuid()).pw_name
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(f"PRESSROOM_CHROMIUM_USER {user!r} is not a user here") from None
    if entry.pw_uid == 0:
        raise RuntimeError("PRESSROOM_CHROMIUM_USER must not be root")
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError("running as root needs setpriv (util-linux) to start Chromium")
    _remove_stale()
    folder = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
    folder.chmod(0o711)  # the user must reach its home below it (and read nothing else here)
    home = folder / "home"
    home.mkdir()
    os.chown(home, entry.pw_uid, entry.pw_gid)
    script = folder / "chromium"
    script.write_text(
        _SCRIPT.format(
            user=user,
            uid=entry.pw_uid,
            gid=entry.pw_gid,
            home=shlex.quote(str(home)),
            setpriv=shlex.quote(setpriv),
            chromium=shlex.quote(chromium),
        )
    )
    script.chmod(0o700)
    return Launcher(str(script), user, folder), user


def _remove_stale() -> None:
    """Launchers of Pressroom processes that ended without removing theirs (killed)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = folder.name.removeprefix(PREFIX).partition("-")[0]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(folder, ignore_errors=True)
