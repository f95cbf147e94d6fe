"""`pressroom serve` raises its open-file limit to the hard one: every stream holds a socket."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_server_raises_its_soft_open_file_limit_to_the_hard_one() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    code = (
        "import resource; from server.cli import admin as cli; N = resource.RLIMIT_NOFILE; "
        "resource.setrlimit(N, (256, resource.getrlimit(N)[1])); "
        "cli.raise_open_files_limit(); print(resource.getrlimit(N)[0])"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    expected = hard if hard != resource.RLIM_INFINITY else None
    assert expected is None or int(out) == expected
    assert int(out) > 256
