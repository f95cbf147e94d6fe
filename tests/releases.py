"""The previous release of Pressroom, exported from git and run as real processes: the code just
before the newest migration landed (HEAD itself while a migration file is not committed yet),
with this venv's interpreter and its own tree first on the path."""

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

MIGRATIONS = "server/sql/migrations"
FULL_CLONE = "run it in a full clone (git clone without --depth), as CI does"


@dataclass(frozen=True)
class Release:
    commit: str
    why: str  # how it was chosen, for messages


def _git(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def _git_out(*args: str) -> str:
    done = _git(*args)
    if done.returncode != 0:
        pytest.fail(f"git {' '.join(args)} failed: {done.stderr.strip()}; {FULL_CLONE}")
    return done.stdout.strip()


def previous_release() -> Release:
    """The commit the upgrade starts from; fails (never skips) where git history cannot say."""
    if _git("rev-parse", "--git-dir").returncode != 0:
        pytest.fail(
            f"no git history at {ROOT}: the upgrade test exports the previous release "
            f"from it; {FULL_CLONE}"
        )
    uncommitted = [
        line[3:]
        for line in _git_out(
            "status", "--porcelain", "--untracked-files=all", "--", MIGRATIONS
        ).splitlines()
        if line.endswith(".sql") and line[:2] in ("??", "A ", "AM")
    ]
    if uncommitted:
        return Release(_git_out("rev-parse", "HEAD"), f"HEAD ({', '.join(uncommitted)} not yet)")
    committed = sorted(
        path for path in _git_out("ls-files", "--", f"{MIGRATIONS}/*.sql").splitlines()
    )
    if not committed:
        pytest.fail(f"git knows no migration in {MIGRATIONS}; {FULL_CLONE}")
    newest = committed[-1]
    added = _git_out("log", "--diff-filter=A", "--format=%H", "-1", "--", newest)
    shallow = _git_out("rev-parse", "--is-shallow-repository") == "true"
    if not added or _git("rev-parse", "--verify", "--quiet", f"{added}^{{commit}}").returncode:
        pytest.fail(
            f"git history lacks the commit before {newest} was added"
            f"{' (this is a shallow clone)' if shallow else ''}; {FULL_CLONE}"
        )
    parent = _git_out("rev-parse", f"{added}^")
    return Release(parent, f"the parent of {added[:12]}, which added {newest}")


@contextlib.contextmanager
def exported(release: Release) -> Iterator[Path]:
    """The release's tree in a temporary folder (`git archive`), removed afterwards."""
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", release.commit],
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


def imported_from(tree: Path) -> dict[str, str]:
    """What a child started as the release's processes are imports: the files of `server`,
    `pressroom` and `tests.timings`, and the newest migration that code knows."""
    probe = (
        "import json, server, pressroom, tests.timings; from server import sql; "
        "print(json.dumps({'server': server.__file__, 'pressroom': pressroom.__file__, "
        "'timings': tests.timings.__file__, 'newest': sql.migrations()[-1][0]}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tree,
        env={**os.environ, **tree_env(tree)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, str] = json.loads(done.stdout)
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
