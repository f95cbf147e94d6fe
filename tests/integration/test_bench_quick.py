"""The benchmarks run for real at their smallest sizes (`python -m bench --tiny`) and print
their figures against their baselines; one that breaks fails this test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# Two runs at once, with about the same CPU each, so both cores stay busy while a run waits
# on a child process, Chromium or PostgreSQL.
GROUPS = ["render,soak,pdfops,cost", "accept,queue,push,dashboard,office"]
# What each benchmark prints once it has its figures and its baseline's.
FIGURES = {
    "accept": "ratio p99",
    "queue": "the best of each: Pressroom",
    "render": "raw Playwright",
    "soak": "zombies 0, orphans 0",
    "push": "Socket.IO (websocket) subscribers",
    "office": "Pressroom / soffice --convert-to per file",
    "pdfops": "compress, image_dpi 150",
    "dashboard": "counts, channel",
    "cost": "Pressroom / bare:",
}


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.timeout(300)
def test_every_benchmark_runs_and_prints_its_figures(server_dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, "BENCH_QUICK": "1", "DATABASE_URL": server_dsn}
    # Each of the runs' dozen Python processes reads the server's modules from bytecode caches,
    # as under `make test` (Makefile), instead of compiling them again.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    logs = [tmp_path / f"bench-{n}.log" for n in range(len(GROUPS))]
    runs = []
    try:
        for group, log in zip(GROUPS, logs, strict=True):
            with log.open("w") as out:
                command = [sys.executable, "-m", "bench", "--tiny", "--only", group]
                # A session of its own: a run that hangs is killed with its Chromium and servers.
                runs.append(
                    subprocess.Popen(
                        command, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
                    )
                )
        for group, run, log in zip(GROUPS, runs, logs, strict=True):
            run.wait(timeout=280)
            assert run.returncode == 0, f"--only {group} failed:\n{log.read_text()[-4000:]}"
    finally:
        for run in runs:
            if run.poll() is None:
                os.killpg(run.pid, signal.SIGKILL)
                run.wait()
    output = "".join(log.read_text() for log in logs)
    for name, figure in FIGURES.items():
        assert f"== {name}:" in output, f"{name} did not run"
        assert figure in output, f"{name} printed no {figure!r}:\n{output[-4000:]}"
