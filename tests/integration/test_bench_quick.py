"""`make bench` end to end at the smallest sizes: every benchmark runs and the report is whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTIONS = [
    "## Machine",
    "## Summary",
    "## Accept path (P1)",
    "## Queue path (P4)",
    "### The in-flight cap: a count per admission or the background read",
    "## Render path (P3)",
    "## Where a job's CPU goes (CPU budget)",
    "### The claim's and the done write's plans (0019)",
    "## Egress gate",
    "## Submit→PDF latency (one job at a time)",
    "## Mechanisms on and off (hand-off, claim-while-printing)",
    "## Soak (P6)",
    "## Push (Socket.IO, SSE)",
    "## Write path (a state change's side effects)",
    "## What a job costs PostgreSQL",
    "### On paper: a 16-core PostgreSQL",
    "### A drain with several worker processes, files in memory",
    "## Profile",
]
PLOTS = [
    "accept-latency.png",
    "queue-slots.png",
    "submit-start.png",
    "render-slots.png",
    "soak.png",
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(420)
def test_quick_bench_writes_the_whole_report(server_dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_QUICK": "1", "DATABASE_URL": server_dsn}
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--tiny", "--out", str(tmp_path)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]

    report = (tmp_path / "performance.md").read_text()
    for heading in SECTIONS:
        assert heading in report, f"{heading!r} missing from the report"
    assert "## Errors" not in report
    assert "Quick mode" in report  # quick figures are marked as such
    summary = (
        "P1 accept",
        "P4 queue",
        "P4 submit→start",
        "P4 in-flight cap",
        "P3 render",
        "P3 CPU per job outside Chromium",
        "Submit→PDF",
        "P6 soak",
        "Write path:",
        "What a job costs PostgreSQL:",
        "jobs, files in memory, best of",
    )
    for figure in summary:
        assert figure in report, f"no {figure} row in the summary"
    assert "PgQueuer" in report and "Procrastinate" in report
    assert "| PDFs/s |" in report and "(the bare service)" in report  # the budget's floor
    assert "The three ways wrote the same rows and notifications" in report
    if (ROOT / "bench" / "push.py").exists():
        assert "Push latency" in report and "Push fan-out" in report
    for plot in PLOTS:
        assert (tmp_path / plot).read_bytes().startswith(PNG_MAGIC), plot
        assert f"]({plot})" in report
    for flamegraph in ("profile-accept.svg", "profile-queue.svg"):
        assert b"<svg" in (tmp_path / flamegraph).read_bytes()[:2000]
    # A quick run writes only where it was told: the committed report stays as it is.
    assert str(tmp_path / "performance.md") in done.stdout
