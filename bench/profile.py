"""Profiles (py-spy) of the accept path and the queue path under load.

Accept: the app web only, 32 clients posting jobs from a child process. Queue: the app with
a no-op renderer and 16 slots draining a bulk-inserted backlog. py-spy samples this process
(the server) twice per path: once to a flamegraph SVG for people, once to raw collapsed
stacks that are summed up here (where the CPU time goes, by function) and then dropped.

    python -m bench.profile [--duration S] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import QUICK, command, database, machine, postgres, run_module, running_app
from bench.noop import NoopRenderer
from bench.queue import SETTLE_S, payload
from server.keys import WORKERS
from server.queue import db, jobs
from server.queue.jobs import NewJob

NAME = "bench.profile"
BACKLOG_PER_S = 5000


def py_spy() -> str:
    found = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(found).exists():
        raise RuntimeError("py-spy is not installed: pip install -e '.[bench]'")
    return found


async def record(output: Path, fmt: str, duration_s: float, *, gil: bool = False) -> None:
    """Sample this process for `duration_s` seconds into `output`; with `gil`, only the
    thread holding the GIL (Python's CPU, not threads blocked in a system call)."""
    proc = await asyncio.create_subprocess_exec(
        py_spy(),
        "record",
        "--pid",
        str(os.getpid()),
        "--duration",
        str(max(1, round(duration_s))),
        "--rate",
        "200",
        "--nolineno",
        "--format",
        fmt,
        "--output",
        str(output),
        *(["--gil"] if gil else []),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"py-spy failed: {err.decode().strip()[-500:]}")


# Leaves that are a thread waiting, not working: the event loop in epoll, idle pool threads,
# the child watcher of the benchmark's own subprocesses. py-spy does not always call them idle.
WAITING = (
    "EpollSelector.select (selectors.py)",
    "_worker (concurrent/futures/thread.py)",
    "ThreadedChildWatcher._do_waitpid",
    "Condition.wait (threading.py)",
)


def summarize(raw: Path, top: int = 12) -> dict[str, Any]:
    """Where the busy samples of collapsed stacks went: by leaf (self) and by function
    (inclusive); shares are of the samples in which a thread was working, not waiting."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = waiting = 0
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f.strip() for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        if frames[-1].startswith(WAITING):
            waiting += count
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count

    def share(counter: collections.Counter[str], keep: Any) -> list[tuple[str, float]]:
        rows = [
            (frame, n / max(total, 1) * 100) for frame, n in counter.most_common() if keep(frame)
        ]
        return rows[:top]

    return {
        "samples": total,
        "waiting_samples": waiting,
        "self": share(own, lambda f: True),
        "server_inclusive": share(inclusive, lambda f: "(server/" in f),
        "libraries_inclusive": share(
            inclusive, lambda f: any(lib in f for lib in ("(asyncpg/", "(aiohttp/", "(jinja2/"))
        ),
    }


async def accept(out: Path, raw: Path, duration_s: float) -> dict[str, Any]:
    async with database() as dsn, running_app(dsn, render_slots=0) as (base, _app):
        load = asyncio.create_task(
            run_module(
                "bench.load",
                "http",
                "--url",
                base,
                "--mode",
                "closed",
                "--concurrency",
                "32",
                "--duration",
                str(2 * duration_s + 2),
                "--warmup",
                "1",
            )
        )
        await asyncio.sleep(1.5)  # past the load generator's warm-up
        await record(out / "profile-accept.svg", "flamegraph", duration_s)
        await record(raw / "profile-accept.txt", "raw", duration_s)
        result: dict[str, Any] = await load
    return {"requests_per_s": result["rate"], **summarize(raw / "profile-accept.txt")}


async def queue(out: Path, raw: Path, duration_s: float, slots: int) -> dict[str, Any]:
    async with database(migrated=True) as dsn:
        overrides: dict[str, Any] = {"render_slots": slots, "renderer_factory": NoopRenderer}
        async with running_app(dsn, run_web=False, **overrides) as (_base, app):
            await asyncio.sleep(SETTLE_S)
            conn = await db.connect(dsn)
            workers = app[WORKERS]
            rates = []
            try:
                for fmt, path in (
                    ("flamegraph", out / "profile-queue.svg"),
                    ("raw", raw / "profile-queue.txt"),
                ):
                    # Enough backlog to stay busy for the whole recording; the rest is dropped.
                    count = int(BACKLOG_PER_S * duration_s)
                    new = [
                        NewJob(
                            tenant="default", options={}, metadata={}, max_attempts=3, **payload(n)
                        )
                        for n in range(count)
                    ]
                    before = workers.rendered
                    await jobs.create(conn, new)
                    started = time.perf_counter()
                    await record(path, fmt, duration_s)
                    rates.append((workers.rendered - before) / (time.perf_counter() - started))
                    await conn.execute("DELETE FROM jobs WHERE status = 'queued'")
            finally:
                await conn.close()
    return {"jobs_per_s": rates[-1], **summarize(raw / "profile-queue.txt")}


async def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    await asyncio.to_thread(out.mkdir, parents=True, exist_ok=True)
    raw = Path(tempfile.mkdtemp(prefix="pressroom-profile-raw-"))  # summed up below, not kept
    async with postgres():
        accept_profile = await accept(out, raw, args.duration)
        queue_profile = await queue(out, raw, args.duration, args.slots)
    result = {
        "args": vars(args),
        "command": command(NAME, f"--duration {args.duration:g}", f"--slots {args.slots}"),
        "accept": accept_profile,
        "queue": queue_profile,
    }
    print_result(result)
    return result


def print_result(result: dict[str, Any]) -> None:
    for path in ("accept", "queue"):
        profile = result[path]
        print(f"profile {path}: {profile['samples']} samples; top self frames:", flush=True)
        for frame, pct in profile["self"][:6]:
            print(f"profile   {pct:5.1f} %  {frame}", flush=True)
        print(f"profile {path}: top server functions (inclusive):", flush=True)
        for frame, pct in profile["server_inclusive"][:6]:
            print(f"profile   {pct:5.1f} %  {frame}", flush=True)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--duration", type=float, default=3 if QUICK else 10)
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--out", default=None, help="where the flamegraph SVGs go")
    return parser


def main() -> None:
    args = parser().parse_args()
    if args.out is None:
        args.out = tempfile.mkdtemp(prefix="pressroom-profile-")
    print(f"machine: {machine()}")
    asyncio.run(run(args))
    print(f"profiles written to {args.out}")


if __name__ == "__main__":
    main()
