"""Where a job's CPU goes outside Chromium: per process from CPU counters, per stage from py-spy.

The real app (Chromium, local storage) runs in this process with --slots render slots; a client
in a process of its own (bench.burst) submits --docs styled one-page invoices over HTTP and
follows the event stream until the last is done, --rounds times. Before each, the best raw
loop (bench.render's floor) prints the same documents, and then the app's own renderer alone
(its render call from --slots loops, nothing around it), which splits what Pressroom adds into
the renderer's part and the service's. Around each round the CPU
counters of every process are read: this process (the server), PostgreSQL (the postmaster and
all its backends), Playwright's driver, Chromium (every process below the driver) and the
client. PostgreSQL's side also gives the writing transactions and WAL bytes per job. A last
round runs under py-spy, and its samples of this process are sorted into the stages of a job
(HTTP accept and validation, commit, claim, template, Playwright calls, store, done, event
fan-out, logging, the event loop and the PostgreSQL client's protocol); the stage shares
applied to the server's CPU per job give milliseconds per stage.

    python -m bench.budget [--docs 300] [--slots 2] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import asyncpg
import psutil
from aiohttp import ClientSession

from bench.bare import BareService
from bench.common import (
    INVOICE,
    QUICK,
    RENDER_TIMEOUT_S,
    checkpoint,
    command,
    database,
    invoice_data,
    machine,
    postgres,
    run_module,
    running_app,
    submit_many,
    wait_done,
)
from bench.profile import WAITING, record
from bench.render import RawLoop
from server.keys import CHROMIUM
from server.options import RenderOptions
from server.render import templates
from server.render.chromium import ChromiumRenderer

NAME = "bench.budget"
PROFILE_ROUNDS = 4  # the profiled round is this many rounds long

#: A sample belongs to the first stage (in this order) one of whose markers is in its stack.
#: py-spy frames read "function (path/file.py)"; the markers are substrings of them.
STAGES: list[tuple[str, tuple[str, ...]]] = [
    ("logging", ("(logging/",)),
    (
        "Playwright calls",
        ("(server/render/chromium.py)", "(server/pdf/docinfo.py)", "(playwright/"),
    ),
    ("template", ("(server/render/templates.py)", "(jinja2/")),
    ("store", ("(server/files/storage.py)", "(server/files/s3.py)")),
    ("commit", ("create (server/queue/jobs.py)", "GroupCommit", "(server/queue/admission.py)")),
    ("done", ("finish_done", "DoneRecorder")),
    ("claim", ("claim (server/queue/jobs.py)", "_claim_loop (server/pipeline/worker.py)")),
    (
        "event fan-out",
        (
            "(server/events/hub.py)",
            "(server/web/sse.py)",
            "(server/events/streams.py)",
            "(server/queue/listener.py)",
            "(server/web/sockets.py)",
        ),
    ),
    (
        "HTTP accept and validation",
        (
            "(server/web/jobs_api.py)",
            "(server/schemas/",
            "(server/web/common.py)",
            "(server/web/auth.py)",
            "(server/options/__init__.py)",
            "(server/jsontext.py)",
            "(pydantic",
            "(aiohttp/",
        ),
    ),
    ("worker, other", ("(server/pipeline/worker.py)",)),
    ("PostgreSQL client (asyncpg)", ("(asyncpg/",)),
]
OTHER = "event loop and other"


def tree_cpu_s(root: psutil.Process) -> float:
    """CPU seconds of `root` and everything below it, including what exited descendants left
    in their parents' children counters (so a process that ended between two reads keeps its
    time)."""
    total = 0.0
    for proc in [root, *root.children(recursive=True)]:
        try:
            t = proc.cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system + t.children_user + t.children_system
    return total


def own_cpu_s(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


class Counters:
    """The processes a job's CPU is spent in, read together."""

    def __init__(self, postmaster: psutil.Process, driver: psutil.Process) -> None:
        self.server = psutil.Process()
        self.postmaster = postmaster
        self.driver = driver

    def read(self) -> dict[str, float]:
        chromium = sum(tree_cpu_s(child) for child in self.driver.children())
        return {
            "server": own_cpu_s(self.server),
            "postgres": tree_cpu_s(self.postmaster),
            "driver": own_cpu_s(self.driver),
            "chromium": chromium,
        }


async def database_position(conn: asyncpg.Connection) -> tuple[int, int]:
    """The next transaction id to be assigned and the WAL position, neither moved by asking."""
    row = await conn.fetchrow(
        "SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xid,"
        " pg_current_wal_lsn() - '0/0'::pg_lsn AS wal"
    )
    return int(row["xid"]), int(row["wal"])


def stages(raw: Path) -> dict[str, float]:
    """Shares (0 to 1) of this process's busy samples by stage."""
    counts: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        frames = [f.strip() for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames or frames[-1].startswith(WAITING):
            continue
        joined = ";".join(frames)
        stage = next((name for name, marks in STAGES if any(m in joined for m in marks)), OTHER)
        counts[stage] += int(count_text)
    total = sum(counts.values()) or 1
    return {name: counts[name] / total for name in [*(n for n, _ in STAGES), OTHER]}


async def raw_round(raw: RawLoop, counters: Counters, html: list[str]) -> dict[str, float]:
    """The floor's CPU per document by process: this process (the loop's side of the pipe),
    its driver and its Chromium."""
    before = counters.read()
    rate, _ = await raw.run(html)
    after = counters.read()
    per = {k: (after[k] - before[k]) * 1000 / len(html) for k in ("server", "driver", "chromium")}
    return {"pdfs_per_s": rate, **per}


async def renderer_round(
    renderer: ChromiumRenderer, counters: Counters, html: list[str], slots: int
) -> dict[str, float]:
    """Pressroom's own renderer (the app's, idle between rounds) printing the same documents
    from `slots` loops, with nothing around it: no HTTP, queue, file or event. What it adds
    to the raw loop is the renderer's; what Pressroom adds beyond it is the service's."""
    queue = list(reversed(html))
    options = RenderOptions()

    async def loop() -> None:
        while queue:
            await renderer.render(queue.pop(), options, timeout_s=RENDER_TIMEOUT_S)

    before, started = counters.read(), time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(slots)))
    elapsed, after = time.perf_counter() - started, counters.read()
    per = {k: (after[k] - before[k]) * 1000 / len(html) for k in ("server", "driver", "chromium")}
    return {"pdfs_per_s": len(html) / elapsed, **per}


async def service_round(
    base: str, counters: Counters, conn: asyncpg.Connection, docs: int
) -> dict[str, float]:
    """One burst of `docs` invoices through the service at `base` (Pressroom or the bare
    service), from a client in a process of its own: CPU per job by process, PDFs/s, and
    PostgreSQL's writing transactions and WAL bytes per job."""
    before, (xid0, wal0) = counters.read(), await database_position(conn)
    result = await run_module("bench.burst", base, "--docs", str(docs))
    after, (xid1, wal1) = counters.read(), await database_position(conn)
    per = {k: (after[k] - before[k]) * 1000 / docs for k in after}
    per["client"] = result["client_cpu_s"] * 1000 / docs
    per["pdfs_per_s"] = docs / result["seconds"]
    per["transactions"] = (xid1 - xid0) / docs
    per["wal_bytes"] = (wal1 - wal0) / docs
    return per


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    rounds: list[dict[str, float]] = []
    bare: list[dict[str, float]] = []
    floor: list[dict[str, float]] = []
    alone: list[dict[str, float]] = []
    html = [templates.render(INVOICE, invoice_data(n)) for n in range(args.docs)]
    children = {p.pid for p in psutil.Process().children()}
    async with contextlib.AsyncExitStack() as stack:
        raw = await stack.enter_async_context(RawLoop(args.slots))
        await raw.warm(html)
        raw_driver = next(p for p in psutil.Process().children() if p.pid not in children)
        dsn = await stack.enter_async_context(database())
        # No browser recycle within the rounds: an exited Chromium takes its CPU counters with
        # it (a round once read a negative figure). A relaunch every 1,000 jobs, the default,
        # is one launch per 1,000 jobs; the rounds measure the jobs.
        app_running = running_app(dsn, render_slots=args.slots, browser_recycle_jobs=10**9)
        base, app = await stack.enter_async_context(app_running)
        bare_dsn = await stack.enter_async_context(database())
        bare_service = await stack.enter_async_context(BareService(bare_dsn, raw))
        await run_module("bench.burst", bare_service.base, "--docs", str(4 * args.slots))
        async with ClientSession() as session:
            bodies = [{"template": INVOICE, "data": invoice_data(n)} for n in range(4 * args.slots)]
            await wait_done(session, base, set(await submit_many(session, base, bodies, 8)))
        conn = await asyncpg.connect(dsn)
        try:
            backend = psutil.Process(await conn.fetchval("SELECT pg_backend_pid()"))
            driver_pid = app[CHROMIUM].driver_pid
            assert driver_pid is not None, "the renderer has no driver"
            counters = Counters(backend.parent() or backend, psutil.Process(driver_pid))
            raw_counters = Counters(backend.parent() or backend, raw_driver)
            await checkpoint(dsn)
            for _ in range(args.rounds):
                floor.append(await raw_round(raw, raw_counters, html))
                alone.append(await renderer_round(app[CHROMIUM], counters, html, args.slots))
                bare.append(await service_round(bare_service.base, raw_counters, conn, args.docs))
                rounds.append(await service_round(base, counters, conn, args.docs))
                for label, f in (("raw loop", floor[-1]), ("renderer alone", alone[-1])):
                    print(
                        f"budget  {label} {f['pdfs_per_s']:5.1f} PDF/s; CPU per document: its "
                        f"process {f['server']:.2f} ms, driver {f['driver']:.2f} ms, Chromium "
                        f"{f['chromium']:.2f} ms",
                        flush=True,
                    )
                for label, per in (("bare service", bare[-1]), ("Pressroom", rounds[-1])):
                    print(
                        f"budget  {label} {per['pdfs_per_s']:5.1f} PDF/s; CPU per job: server "
                        f"{per['server']:.2f} ms, PostgreSQL {per['postgres']:.2f} ms, driver "
                        f"{per['driver']:.2f} ms, Chromium {per['chromium']:.2f} ms, client "
                        f"{per['client']:.2f} ms; {per['transactions']:.2f} writing "
                        f"transactions, {per['wal_bytes']:.0f} WAL bytes",
                        flush=True,
                    )
            profiled = Path(tempfile.mkdtemp(prefix="pressroom-budget-")) / "server.txt"
            # Enough documents to sample for many seconds, since a job is a few ms of this process.
            docs = args.docs * PROFILE_ROUNDS
            burst = asyncio.create_task(run_module("bench.burst", base, "--docs", str(docs)))
            await asyncio.sleep(0.5)  # the client's start-up
            await record(profiled, "raw", docs / max(rounds[-1]["pdfs_per_s"], 1) * 0.8, gil=True)
            await burst
        finally:
            await conn.close()
    median = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    shares = stages(profiled)
    return {
        "median": median,
        "rounds": rounds,
        "floor": {k: statistics.median(r[k] for r in floor) for k in floor[0]},
        "renderer": {k: statistics.median(r[k] for r in alone) for k in alone[0]},
        "bare": {k: statistics.median(r[k] for r in bare) for k in bare[0]},
        "stages": {name: share * median["server"] for name, share in shares.items()},
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    async with postgres():
        result = await measure(args)
    result |= {"args": vars(args), "command": command(NAME, *_argv(args))}
    m = result["median"]
    print(
        f"budget  median of {args.rounds}: server + PostgreSQL "
        f"{m['server'] + m['postgres']:.2f} ms per job (server {m['server']:.2f}, "
        f"PostgreSQL {m['postgres']:.2f}); server by stage:",
        flush=True,
    )
    f, r, b = result["floor"], result["renderer"], result["bare"]
    print(
        f"budget  PDFs/s: renderer alone / raw loop {r['pdfs_per_s'] / f['pdfs_per_s']:.2f}, "
        f"Pressroom / renderer alone {m['pdfs_per_s'] / r['pdfs_per_s']:.2f}, "
        f"Pressroom / raw loop {m['pdfs_per_s'] / f['pdfs_per_s']:.2f}, "
        f"bare service / raw loop {b['pdfs_per_s'] / f['pdfs_per_s']:.2f}, "
        f"Pressroom / bare service {m['pdfs_per_s'] / b['pdfs_per_s']:.2f}; server + "
        f"PostgreSQL per job: bare service {b['server'] + b['postgres']:.2f} ms",
        flush=True,
    )
    for name, ms in sorted(result["stages"].items(), key=lambda kv: -kv[1]):
        print(f"budget    {ms:5.2f} ms  {name}", flush=True)
    return result


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--docs", type=int, default=60 if QUICK else 300)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1 if QUICK else 3)
    return parser


def _argv(args: argparse.Namespace) -> list[str]:
    return [f"--docs {args.docs}", f"--slots {args.slots}", f"--rounds {args.rounds}"]


def main() -> None:
    args = parser().parse_args()
    print(f"machine: {machine()}")
    asyncio.run(run(args))


if __name__ == "__main__":
    main()
