"""A memory bound per render: each render slot's Chromium renderer in a memory cgroup of its own.

The kernel enforces the bound: a page that needs more is killed the moment it does, and
nothing else in the browser is touched. cgroup v1 (the memory controller) and v2 both work,
below the cgroup this process runs in; where neither can be written (not root, no
delegation), `create` says why and renders are bounded by V8's heap limit only.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

PREFIX = "pressroom-"


@dataclass(frozen=True, slots=True)
class Leaf:
    """One renderer's cgroup."""

    path: Path
    version: int

    def oom_kills(self) -> int:
        """How many processes the kernel killed here for want of memory."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill":
                return int(value)
        return 0

    def remove(self) -> bool:
        """False while a process is still in it (a renderer takes a moment to exit)."""
        try:
            self.path.rmdir()
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return True


@dataclass(slots=True)
class RenderCgroups:
    """This process's folder of renderer cgroups, each bounded to `max_mb`."""

    root: Path
    version: int
    max_mb: int
    _made: int = 0

    @property
    def description(self) -> str:
        return f"cgroup v{self.version}, {self.max_mb} MiB per render"

    @classmethod
    def create(cls, max_mb: int, *, prefix: str = PREFIX) -> tuple[RenderCgroups | None, str]:
        """The folder (named `prefix` and this process's pid: Chromium's and LibreOffice's
        differ), or None and the reason no cgroup can be made here."""
        try:
            found = _own_memory_cgroup()
        except OSError as exc:
            return None, f"cannot read this process's cgroup: {exc}"
        if found is None:
            return None, "no cgroup memory controller is mounted"
        parent, version = found
        _remove_stale(parent, prefix)
        root = parent / f"{prefix}{os.getpid()}"
        try:
            root.mkdir(exist_ok=True)
            if version == 2:
                (root / "cgroup.subtree_control").write_text("+memory")
        except OSError as exc:
            with contextlib.suppress(OSError):
                root.rmdir()
            return None, f"cannot create a cgroup in {parent}: {exc.strerror or exc}"
        return cls(root, version, max_mb), ""

    def confine(self, pid: int) -> Leaf:
        """Move `pid` (a renderer, just started) into a new cgroup bounded to `max_mb`."""
        self._made += 1
        leaf = Leaf(self.root / f"render-{self._made}", self.version)
        leaf.path.mkdir()
        limit = str(self.max_mb * 1024 * 1024)
        if self.version == 1:
            (leaf.path / "memory.limit_in_bytes").write_text(limit)
            swap = leaf.path / "memory.memsw.limit_in_bytes"
            if swap.exists():  # memory and swap together: swap must not extend the bound
                swap.write_text(limit)
        else:
            (leaf.path / "memory.max").write_text(limit)
            with contextlib.suppress(OSError):
                (leaf.path / "memory.swap.max").write_text("0")
        (leaf.path / "cgroup.procs").write_text(str(pid))
        return leaf

    def close(self) -> None:
        """Remove every leaf (their processes are gone once the browser is) and the folder."""
        for child in self.root.glob("render-*"):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            self.root.rmdir()


def _own_memory_cgroup() -> tuple[Path, int] | None:
    """The folder of this process's memory cgroup and the cgroup version, if writable."""
    lines = Path("/proc/self/cgroup").read_text().splitlines()
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):
            mount = _mount_point(mounts, "cgroup", "memory")
            if mount is not None:
                return mount / path.lstrip("/"), 1
    for line in lines:
        if line.startswith("0::"):
            mount = _mount_point(mounts, "cgroup2", None)
            if mount is None:
                return None
            own = mount / line[3:].lstrip("/")
            available = (own / "cgroup.controllers").read_text().split()
            return (own, 2) if "memory" in available else None
    return None


def _mount_point(mounts: list[str], fstype: str, option: str | None) -> Path | None:
    for line in mounts:
        fields = line.split()
        separator = fields.index("-")
        if fields[separator + 1] != fstype:
            continue
        if option is None or option in fields[separator + 3].split(","):
            return Path(fields[4])
    return None


def _remove_stale(parent: Path, prefix: str) -> None:
    """Folders of earlier Pressroom processes that did not end cleanly."""
    for folder in parent.glob(f"{prefix}*"):
        pid = folder.name.removeprefix(prefix)
        if not pid.isdigit() or Path(f"/proc/{pid}").exists():
            continue
        for child in folder.glob("render-*"):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            folder.rmdir()
