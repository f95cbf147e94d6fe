"""The previous release of Pressroom, exported from git and run as real processes: the commit
RELEASED names (or UPGRADE_FROM), with this venv's interpreter and its own tree first on the
path."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.processes import ROOT, PressroomProcess

FULL_CLONE = "run it in a full clone (git clone without --depth), as CI does"
#: A commit to upgrade from instead (the release you run, say): UPGRADE_FROM=abc1234.
FROM_VARIABLE = "UPGRADE_FROM"
#: The previous release: the newest commit released, whose CI passed. Moved on at each release,
#: so the test upgrades what operators run now, however many migrations came since, and never
#: from a commit on the way that no one ran.
RELEASED = "a5dacb3969330e01d34bae4fc313ddcb23311846"


@dataclass(frozen=True)
class Release:
    commit: str
    why: str  # how it was chosen, for messages


def _git(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)


def _git_out(root: Path, *args: str) -> str:
    done = _git(root, *args)
    if done.returncode != 0:
        pytest.fail(f"git {' '.join(args)} failed in {root}: {done.stderr.strip()}; {FULL_CLONE}")
    return done.stdout.strip()


def previous_release(root: Path = ROOT) -> Release:
    """The commit the upgrade starts from; fails (never skips) where git history cannot say."""
    if _git(root, "rev-parse", "--git-dir").returncode != 0:
        pytest.fail(
            f"no git history at {root}: the upgrade test exports the previous release "
            f"from it; {FULL_CLONE}"
        )
    chosen = os.environ.get(FROM_VARIABLE)
    if chosen:
        commit = _git_out(root, "rev-parse", "--verify", f"{chosen}^{{commit}}")
        return Release(commit, f"{chosen}, from {FROM_VARIABLE}")
    found = _git(root, "rev-parse", "--verify", "--quiet", f"{RELEASED}^{{commit}}")
    if found.returncode != 0:
        shallow = _git_out(root, "rev-parse", "--is-shallow-repository") == "true"
        pytest.fail(
            f"git history at {root} lacks the previous release {RELEASED[:12]}"
            f"{' (a shallow clone)' if shallow else ''}; {FULL_CLONE}"
        )
    return Release(RELEASED, f"the previous release, {RELEASED[:12]}")


@contextlib.contextmanager
def exported(release: Release, root: Path = ROOT) -> Iterator[Path]:
    """The release's tree in a temporary folder (`git archive`), removed afterwards."""
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "--format=tar", release.commit],
        capture_output=True,
        check=True,
    )
    with tempfile.TemporaryDirectory(prefix="pressroom-release-") as folder:
        tree = Path(folder)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(tree, filter="data")
        yield tree


def tree_env(tree: Path) -> dict[str, str]:
    """Variables that make `import server` and `import pressroom` resolve to `tree`: ahead of
    the venv's editable install of this checkout, whose finder comes after the path."""
    return {"PYTHONPATH": f"{tree}:{tree / 'clients' / 'python'}"}


async def imported_from(tree: Path) -> dict[str, str]:
    """What a child started as the release's processes are imports: the files of `server`,
    `pressroom` and `tests.timings`, and the newest migration that code knows."""
    probe = (
        "import json, server, pressroom, tests.timings; from server import sql; "
        "print(json.dumps({'server': server.__file__, 'pressroom': pressroom.__file__, "
        "'timings': tests.timings.__file__, 'newest': sql.migrations()[-1][0]}))"
    )
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        probe,
        cwd=tree,
        env={**os.environ, **tree_env(tree)},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await child.communicate()
    assert child.returncode == 0, err.decode()
    found: dict[str, str] = json.loads(out)
    return found


class ReleaseProcess(PressroomProcess):
    """A PressroomProcess of the exported release: run from its tree, its modules first."""

    def __init__(self, tree: Path, command: str, env: Mapping[str, str], log_path: Path) -> None:
        super().__init__(command, {**env, **tree_env(tree)}, log_path)
        self.tree = tree

    async def start(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "tests.timings",
                self.command,
                cwd=self.tree,
                env=self.env,
                stdout=log,
                stderr=log,
            )
