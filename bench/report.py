"""docs/performance.md from the results of `python -m bench` (and the plots next to it).

python -m bench.report RESULTS_JSON [--out DIR]   # rewrite the report from saved results
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import plots

Result = dict[str, Any]

#: What was changed because of the profiles. Edit when a change lands; the report quotes it.
CHANGES = (
    "the tenant in-flight count, a query per submission that grew with the queue, became a "
    "count read at most every 0.5 s and counted up locally (`admission.InFlight`); asyncpg's "
    "full reset on every pool release (a round trip) became a rollback-only release, since no "
    "session state lives on pooled connections; renders that finish together are recorded "
    "done in one statement (`jobs.DoneRecorder`), as submissions already were (group commit); "
    "object keys are checked lexically instead of resolved on the event loop, and storage "
    "writes have a thread pool of their own; an event is encoded once per process for every "
    "SSE subscriber (fan-out to 10,000 subscribers went from 1.7 s to 0.54 s). Then JSON "
    "going out (asyncpg parameters, responses, SSE frames, size limits) moved to orjson, "
    "the NUL/surrogate walk over a request body runs only when the body holds such an "
    "escape, and a template already compiled is checked without a trip to a thread (the "
    "accept path went from 0.86 to 1.2-1.3 times raw asyncpg); the template sandbox weighs "
    "JSON values by exact type and caches short `%` formats (the 20-page invoice renders in "
    "11 ms instead of 19 ms), and a small template that finishes within 2 ms is rendered on "
    "the event loop instead of in a thread (the thread hop was a fifth of the template's "
    "cost); Chromium's memory (PSS, about 100 ms of kernel time) is read in the background at "
    "most every 30 s instead of under the render lock every 25 jobs. Then JSON coming in "
    "(request bodies, job data and event payloads from PostgreSQL) is read by orjson, with a "
    "walk over the result for a float that may stand for an integer beyond 64 bits, which "
    "is read again exactly (a body of the invoice: 43-52 µs to 27-31 µs; a regular "
    "expression looking for long digit runs, tried first, cost more than `json.loads` "
    "itself); the batch-progress trigger on the event log looks for a batched job before "
    "doing batch work (an event insert: about 110 to 50 µs inside PostgreSQL); default "
    "render options skip the walk over their fields. One change costs: every folder created "
    "for a PDF is now fsynced in its parent (one more fsync per job; a new name is only "
    "durable once its folder is). Still dominant and left: Python work per job (template, "
    "events, JSON, the thread hop of each file write) and the statements in PostgreSQL, on "
    "the same two cores. With the file's fsyncs skipped (an experiment, never an option) a "
    "drain of 5,000 jobs went from 710 to 819 jobs/s on this machine: the durable file is "
    "not what keeps the queue path far behind PgQueuer's empty handlers, the work each job "
    "does (its events, its template, its PDF) is. Then a trace of POST→start into an idle "
    "worker (timestamps at each step, one job every 50 ms) showed the insert statement "
    "(3.3 ms at that pace) between the request and the render, and the in-flight count's "
    "read in the path of every tenth request: a job handed to an idle worker now starts "
    "while its row commits, and a stale count far under the cap is read in the background "
    "(POST→start p50 5.2 to 1.9 ms, p99 8.2 to 2.8 ms; the 202 answer unchanged). A profile "
    "of one event fanned out to 10,000 SSE streams showed the hub's pass over the "
    "subscribers (an asyncio.Event set for each) and each stream's timeout scope around its "
    "wait: a waiting subscriber now holds a bare future and a timer (server CPU per such "
    "event about 0.6 s instead of 1.0-2.0 s in paired runs). A profile of the render path "
    "at two slots showed the server sending every job's `job.queued` and `job.running` to a "
    "client that waits only for results: the event streams now take a type filter "
    "(`?type=job.done,job.failed`), which the render benchmark's client uses; what it saves "
    "is within this host's run-to-run noise (the machine's CPU per PDF above raw Playwright "
    "at two slots measured 7.6 to 11.4 ms in runs with the filter, 8.7 to 9.2 ms without). "
    "Two more ideas were measured and not kept: starting a claimed job's render while its "
    "claim commits (no gain in submit→start, a slower drain: 941-1,163 against 1,282-1,418 "
    "jobs/s), and one flat folder of PDFs instead of a folder per job (more system time per "
    "durable write on this disk, not less). Then an account of the whole machine's CPU per "
    "one-page PDF at two slots, by process (Chromium with the processes it reaps, "
    "Playwright's driver, PostgreSQL, the server, the client), found Chromium's share the "
    "same in both loops, about a third of it in a print compositor process that Chromium "
    "starts for every `page.pdf()` (desktop Chromium composites every printed document out "
    "of process; no switch, `--disable-site-isolation-trials` included, changes that), and "
    "a layout and paint of the 1280x720 screen before printing that the PDF never uses: "
    "script-free slots now print from a one-pixel viewport (the same PDF bytes; the raw loop "
    "alone went from 42-45 to 46-50 PDFs/s at two slots with it, and Pressroom's ratio to "
    "the plain loop from 0.80-0.86 to 0.97-1.01). What Pressroom itself adds per one-page "
    "PDF at two slots stayed about 7 ms of CPU: the server 5.2 ms against raw Playwright's "
    "1.5 ms (HTTP, JSON, the template, the statements, the events, the file), PostgreSQL "
    "2.3 ms, the client 0.5 ms. Then the statements of that PostgreSQL share, counted per "
    "job and explained at 20,000 events, showed the hub's read of the log (two per job) "
    "reading the whole log on every call: its `held` check was bounded by a CTE's value, "
    "which no index scan can use, so each read cost more with every event kept; and the "
    "hub's start position was sorted by the bigint shown as `xid` instead of the column. "
    "Both are index scans now (a test holds every read of the log to that at 20,000 "
    "events), and the hub reads through a statement without the optional filters, whose "
    "plan PostgreSQL keeps instead of planning it again on every call (a read: 0.27 to "
    "0.14 ms). The queue drain went from 844 / 1,183 to 981 / 1,327 jobs/s at 16 / 64 slots "
    "in runs side by side. Then, on a slower machine (a raw commit p50 1.46 ms, p99 4.02 ms), "
    "a trace from the handler's first line to the renderer's call, one job every 50 ms, "
    "showed the slowest submissions each waiting about 1 ms between admission and insert: "
    "the background read of a stale in-flight count, started before the insert, ran first "
    "every tenth submission. It now starts once the job is inserted, and default options are "
    "known by identity rather than compared field by field (62 µs when the CPU's caches are "
    "cold, as they are for a request every 50 ms; a template that renders in 15 µs in a hot "
    "loop takes 170 µs then). The server's own part of POST→start went from p99 1.4-1.7 ms "
    "(max 2.2 ms) to p99 0.8 ms; the rest is the HTTP request between two processes, p50 1.3 "
    "ms and p99 2.2-2.6 ms on that machine, as the bare handler's figure shows. The same trace "
    "from the moment aiohttp received the request showed the slowest requests waiting 1-2 ms "
    "before the handler's first line: every 5 s the cached answer to whether API keys are "
    "required expired and a request read it again itself. The cached answers are now read "
    "again in the background every half of PRESSROOM_AUTH_CACHE_S (one statement for every "
    "key in use), still never older than that; with both changes, POST→start p99 in full "
    "runs on that machine: 3.61 ms before, 2.81 ms after (the bare handler's p99 2.32 and "
    "1.86 ms in the same runs)"
)

#: Readings of the profile: (path, frame text, least share in %, what it means). A sentence
#: is printed when that frame takes at least that share of the busy samples.
READINGS: list[tuple[str, str, float, str]] = [
    (
        "accept",
        "_check_in_flight (server/admission.py)",
        5,
        "Counting the tenant's queued and running jobs on every submission (the in-flight cap) "
        "is a second statement per request, and its cost grows with the queue.",
    ),
    (
        "accept",
        "create (server/jobs.py)",
        10,
        "Inserting the job (jobs.create): the statement, its commit and its NOTIFY; how many "
        "requests share one commit decides this share.",
    ),
    (
        "accept",
        "_SelectorSocketTransport.write",
        15,
        "Socket writes (responses to clients, queries to PostgreSQL): on loopback the kernel "
        "does the receiver's TCP work inside the sender's send().",
    ),
    (
        "accept",
        "JSONEncoder",
        5,
        "JSON encoding of the responses and of the job's data and options for asyncpg.",
    ),
    (
        "accept",
        "Connection.reset (asyncpg",
        3,
        "asyncpg resets every connection it takes back into the pool, a round trip per release.",
    ),
    (
        "queue",
        "_atomic_write (server/storage.py)",
        10,
        "Storing the PDF: a folder of its own synced in its parent, write, fsync of the file, "
        "rename, fsync of the folder, per job, in the storage's own pool of 32 threads (time "
        "in fsync counts as busy here, though it waits on the disk, not the CPU).",
    ),
    (
        "queue",
        "Hub._read_new (server/hub.py)",
        5,
        "The hub reads back every event row it is notified of and decodes its JSON payload, "
        "whether or not anyone subscribed.",
    ),
    (
        "queue",
        "_joinrealpath",
        3,
        "Path.resolve() of every object key on the event loop (LocalStorage._path).",
    ),
    (
        "queue",
        "finish_done (server/jobs.py)",
        5,
        "One statement and one commit per finished job: finishes are not batched the way "
        "claims are.",
    ),
    (
        "queue",
        "Connection.reset (asyncpg",
        3,
        "asyncpg resets every connection it takes back into the pool, a round trip per release.",
    ),
]


def _f(value: float, digits: int = 0) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _verdict(ok: bool) -> str:
    return "yes" if ok else "**no**"


def summary_rows(results: Result) -> list[list[str]]:
    rows: list[list[str]] = []
    accept = results.get("accept")
    if accept:
        ours, raw = accept["throughput"]["pressroom"], accept["throughput"]["raw"]
        rows.append(
            [
                "P1 accept: POST /v1/jobs, 32 clients",
                f"{_f(ours['rate'])} jobs/s",
                f"{_f(raw['rate'])} inserts/s (raw asyncpg, 16 connections)",
                f"{accept['ratio']:.2f}",
                "≥ 1.0",
                _verdict(accept["ratio"] >= 1.0),
            ]
        )
        ours, raw = accept["fixed_rate"]["pressroom"], accept["fixed_rate"]["raw"]
        rate = accept["args"]["rate"]
        rows.append(
            [
                f"P1 accept latency at {rate:g} req/s, p50 / p99",
                f"{ours['p50_ms']:.2f} / {ours['p99_ms']:.2f} ms",
                f"{raw['p50_ms']:.2f} / {raw['p99_ms']:.2f} ms",
                f"{ours['p99_ms'] / raw['p99_ms']:.2f} (p99)",
                "-",
                "-",
            ]
        )
    queue = results.get("queue")
    if queue:
        best = f"{_f(queue['pressroom_best'])} jobs/s ({queue['pressroom_best_slots']} slots)"
        if "pgqueuer_best" in queue:
            rows.append(
                [
                    f"P4 queue: drain {queue['args']['jobs']:,} jobs, no-op renderer",
                    best,
                    f"{_f(queue['pgqueuer_best'])} jobs/s "
                    f"(PgQueuer, {queue['pgqueuer_best_config']})",
                    f"{queue['ratio_pgqueuer']:.2f}",
                    "≥ 2.0",
                    _verdict(queue["ratio_pgqueuer"] >= 2),
                ]
            )
        if "procrastinate_best" in queue:
            rows.append(
                [
                    "P4 queue: same, against Procrastinate",
                    best,
                    f"{_f(queue['procrastinate_best'])} jobs/s (Procrastinate, "
                    f"{queue['procrastinate_best_config']})",
                    f"{queue['ratio_procrastinate']:.2f}",
                    "-",
                    "-",
                ]
            )
        if "file_floor" in queue:
            rows.append(
                [
                    "P4 queue: same, against the bare durable file write",
                    best,
                    f"{_f(queue['file_floor'])} files/s (folder, write, rename, each synced)",
                    f"{queue['ratio_file_floor']:.2f}",
                    "-",
                    "-",
                ]
            )
        every = f"one job / {queue['args']['interval_ms']:g} ms"
        commit = _floor(queue.get("commit_floor"), "one raw commit; the path has two")
        http = _floor(queue.get("http_floor"), "the same POSTs to a bare aiohttp handler")
        for key, what, baseline, target in (
            ("latency_http", "POST /v1/jobs to an idle worker (hand-off)", http, True),
            ("latency_http_answer", "the same POSTs answered 202 (job row committed)", "-", False),
            ("latency_http_queued", "the same POSTs through the queue (hand-off off)", "-", False),
            ("latency", "INSERT by another process (NOTIFY, claim)", commit, True),
        ):
            if key in queue:
                label = f"P4 submit→start: {what}, {every}"
                if key == "latency_http_answer":
                    label = f"P4 submit→202: {what[len('the same POSTs ') :]}, {every}"
                rows.append(_start_row(label, queue[key], baseline, target))
        if "latency_after_commit" in queue:
            rows.append(
                _start_row(
                    "P4 commit→start (the same jobs, from the submission's commit)",
                    queue["latency_after_commit"],
                    "-",
                    False,
                )
            )
    render = results.get("render")
    if render:
        for row in render["rows"]:
            pages = "1 page" if row["pages"] <= 1 else f"{row['pages']} pages"
            rows.append(
                [
                    f"P3 render: {pages}, {row['slots']} slot{'s' if row['slots'] > 1 else ''}",
                    f"{row['pressroom']:.1f} PDFs/s",
                    f"{row['raw']:.1f} PDFs/s (raw Playwright)",
                    f"{row['ratio']:.2f}",
                    "≥ 0.9",
                    _verdict(row["ratio"] >= 0.9),
                ]
            )
        same_viewport = _same_viewport_summary(render["rows"])
        if same_viewport:
            rows.append(
                [
                    "P3 render against raw Playwright printing from Pressroom's 1-pixel viewport",
                    "(the rows above)",
                    "raw Playwright, 1-pixel viewport",
                    same_viewport,
                    "-",
                    "-",
                ]
            )
    egress = results.get("egress")
    if egress:
        row = egress["row"]
        rows.append(
            [
                f"P3 render through the egress gate: the invoice with "
                f"{egress['args']['images'] + 1} subresources, {egress['args']['slots']} slots",
                f"{row['pressroom']:.1f} PDFs/s",
                f"{row['raw']:.1f} PDFs/s (raw Playwright, direct connections)",
                f"{row['ratio']:.2f}",
                "-",
                "-",
            ]
        )
    soak = results.get("soak")
    if soak:
        jobs = soak["samples"][-1]["jobs"]
        worst = max(soak["server_growth_pct"], soak["total_growth_pct"])
        rows.append(
            [
                f"P6 soak: {jobs:,} renders, memory growth from job {soak['from_job']:,}",
                f"server {soak['server_growth_pct']:+.1f} %, Chromium "
                f"{soak['chromium_growth_pct']:+.1f} %, total {soak['total_growth_pct']:+.1f} %",
                "-",
                "-",
                "< 10 %",
                _verdict(worst < 10),
            ]
        )
        clean = not soak["zombies"] and not soak["orphans"]
        rows.append(
            [
                "P6 soak: Chromium processes left at the end",
                f"{len(soak['zombies'])} zombies, {len(soak['orphans'])} orphans",
                "-",
                "-",
                "none",
                _verdict(clean),
            ]
        )
    if results.get("push"):
        rows += push_rows(results["push"])
    return rows


def _floor(lat: Result | None, what: str) -> str:
    return "-" if lat is None else f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} ms ({what})"


def _start_row(label: str, lat: Result, baseline: str, target: bool) -> list[str]:
    """A summary row for a submit→start latency, against `baseline` (its floor)."""
    return [
        f"{label}, p50 / p99",
        f"{lat['p50_ms']:.2f} / {lat['p99_ms']:.2f} ms",
        baseline,
        "-",
        "p99 < 3 ms" if target else "-",
        _verdict(lat["p99_ms"] < 3) if target else "-",
    ]


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _command(result: Result) -> str:
    return f"Command: `{result['command']}`"


def accept_section(accept: Result) -> str:
    args = accept["args"]
    rows = []
    for label, key in (("throughput, closed loop", "throughput"), ("fixed rate", "fixed_rate")):
        for who, name in (("pressroom", "Pressroom POST /v1/jobs"), ("raw", "raw asyncpg insert")):
            r = accept[key][who]
            rows.append(
                [
                    label,
                    name,
                    f"{r['requests']:,}",
                    f"{r['errors']:,}",
                    _f(r["rate"]),
                    f"{r['p50_ms']:.2f}",
                    f"{r['p90_ms']:.2f}",
                    f"{r['p99_ms']:.2f}",
                    f"{r['max_ms']:.1f}",
                ]
            )
    return "\n".join(
        [
            "## Accept path (P1)",
            "",
            f"Pressroom runs web only (`render_slots=0`, dev mode, no API key). Throughput: "
            f"{args['clients']} clients in a closed loop for {args['duration']:g} s. Latency: "
            f"requests leave on a fixed schedule of {args['rate']:g} per second (open loop; "
            "latency counted from the scheduled moment). The floor runs Pressroom's own insert "
            "statement (one job row, one `job.queued` event row, one NOTIFY, one transaction) "
            f"straight over asyncpg on {args['connections']} connections, with the same "
            f"{args['clients']} clients and the same schedule. Every figure gets a fresh database "
            "on the same server; the load comes from a separate process.",
            "",
            table(
                [
                    "load",
                    "what",
                    "requests",
                    "errors",
                    "per s",
                    "p50 ms",
                    "p90 ms",
                    "p99 ms",
                    "max ms",
                ],
                rows,
            ),
            "",
            _command(accept),
            "",
            "![Accept latency at a fixed rate](accept-latency.png)",
            "",
        ]
    )


def queue_section(queue: Result) -> str:
    rows = [["Pressroom", f"{slots} slots", _f(rate)] for slots, rate in queue["pressroom"].items()]
    for key, label in (("pgqueuer", "PgQueuer 'balanced'"), ("procrastinate", "Procrastinate")):
        rows += [[label, config, _f(rate)] for config, rate in queue.get(key, {}).items()]
    lat = queue["latency"]
    args = queue["args"]
    return "\n".join(
        [
            "## Queue path (P4)",
            "",
            f"{args['jobs']:,} jobs are inserted in one transaction while the workers are idle; "
            "the clock runs from that commit until the database has every job finished. Each "
            "system gets a fresh database on the same server and the same payload (a one-line "
            "template and its data). Pressroom's jobs go the whole way with a no-op renderer "
            "(claim with its `job.running` event, template rendered, a tiny PDF stored in the "
            "local folder, done with its `job.done` event); PgQueuer's and Procrastinate's run an "
            "empty handler. PgQueuer is installed with durability `balanced` (its queue table is "
            "logged, as Pressroom's is; its log tables are not) and tried with 1 to 5 queue "
            "managers (one connection each) and batch sizes 10 and 100, as its own drain "
            "benchmark does; "
            "Procrastinate with one worker at concurrency 10 and 50. The best of each is compared.",
            "",
            table(["system", "configuration", "jobs/s"], rows),
            "",
            "![Queue throughput against slots](queue-slots.png)",
            "",
            _file_floor(queue),
            _submit_over_http(queue),
            f"Submit→start from another process's INSERT: {lat['n']:,} jobs, one every "
            f"{args['interval_ms']:g} ms, inserted over a connection of their own (the way "
            "another process would), into an idle worker (4 slots) that learns of each by "
            "NOTIFY and claims it; from just before the INSERT to the moment the renderer is "
            f"called (same process, same clock): p50 {lat['p50_ms']:.2f} ms, p90 "
            f"{lat['p90_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms.",
            "",
            _commit_floor(queue),
            "![Submit to start latency](submit-start.png)",
            "",
            _command(queue),
            "",
        ]
    )


def _file_floor(queue: Result) -> str:
    if "file_floor" not in queue:
        return ""
    return (
        "The storage floor, in the same run: every finished job stores its PDF durably before "
        "it is recorded done. The bare write Pressroom's local storage does (a folder of its "
        "own, synced in its parent; write, fsync, rename, fsync of the folder) of "
        f"{queue['args']['jobs']:,} files "
        f"from {queue['file_threads']} plain threads with nothing else to do managed "
        f"{_f(queue['file_floor'])} files/s on this disk; Pressroom's best drain is "
        f"{queue['ratio_file_floor']:.2f} of that. No configuration of the queue can finish "
        "jobs faster than their files become durable, so twice PgQueuer's empty handlers "
        f"({_f(2 * queue['pgqueuer_best']) if 'pgqueuer_best' in queue else '-'} jobs/s) is "
        "out of reach here while the contract asks for a durable file per job.\n"
    )


def _submit_over_http(queue: Result) -> str:
    if "latency_http" not in queue:
        return ""
    http = queue["latency_http"]
    text = (
        "Before each latency figure below, a `CHECKPOINT` and a sync write out what the "
        "drains and the file floor left dirty, so the single durable commits timed here do "
        "not queue behind their writes. "
        f"Submit→start over HTTP: {http['n']:,} jobs, one every "
        f"{queue['args']['interval_ms']:g} ms, posted by a client in another process "
        "(`bench.submitter`) to a process with web and workers (4 slots) whose worker is idle, "
        "so each job is handed to it in the submission's own statement (no NOTIFY, no claim) "
        "and its render starts while that statement commits; from just before the POST to "
        "the moment the renderer is called (both processes read the machine's one monotonic "
        f"clock): p50 {http['p50_ms']:.2f} ms, p90 {http['p90_ms']:.2f} ms, p99 "
        f"{http['p99_ms']:.2f} ms, max {http['max_ms']:.2f} ms. The first jobs, which open the "
        "HTTP connection and prepare the statements, are not counted."
    )
    if "http_floor" in queue:
        bare = queue["http_floor"]
        text += (
            " The same client and schedule against a bare aiohttp handler that only reads the "
            f"JSON body: p50 {bare['p50_ms']:.2f} ms, p99 {bare['p99_ms']:.2f} ms; that much of "
            "the path is the HTTP request between two processes on this machine."
        )
    if "latency_http_answer" in queue:
        answer = queue["latency_http_answer"]
        text += (
            " Nothing of a render is stored or recorded before the job's row has committed "
            "(running, held by the worker), and the 202 answer waits for that commit: the "
            f"client had it after p50 {answer['p50_ms']:.2f} ms, p99 {answer['p99_ms']:.2f} ms."
        )
    return text + _through_the_queue(queue) + "\n"


def _through_the_queue(queue: Result) -> str:
    if "latency_http_queued" not in queue:
        return ""
    queued = queue["latency_http_queued"]
    return (
        " The same client against the same kind of process with `PRESSROOM_HAND_OFF=false` "
        "(each job queued, its NOTIFY heard by the worker, claimed in a statement and commit "
        f"of its own): p50 {queued['p50_ms']:.2f} ms, p90 {queued['p90_ms']:.2f} ms, p99 "
        f"{queued['p99_ms']:.2f} ms, max {queued['max_ms']:.2f} ms."
    )


def _commit_floor(queue: Result) -> str:
    if "commit_floor" not in queue:
        return ""
    after, floor = queue["latency_after_commit"], queue["commit_floor"]
    return (
        f"From the moment the submission's commit returned, the same jobs started in p50 "
        f"{after['p50_ms']:.2f} ms, p99 {after['p99_ms']:.2f} ms: the NOTIFY, the claim "
        "(one statement and its durable commit, with the `job.running` event) and the "
        "template. One durable commit alone, a one-row INSERT over raw asyncpg at the same "
        f"pace on the same server, took p50 {floor['p50_ms']:.2f} ms, p99 "
        f"{floor['p99_ms']:.2f} ms. Submit→start holds two durable commits (the submission "
        "and the claim), so its floor here is about twice that; the rest is the statements' "
        "own work (the job row and its indexes, the event row, NOTIFY) and Python. The "
        "claim's commit stays synchronous: its `job.running` event must not be lost.\n"
    )


def _pair(raw: float | None, ours: float | None) -> str:
    return "-" if raw is None or ours is None else f"{raw:.1f} / {ours:.1f}"


def _ratio_cell(row: Result) -> str:
    """The median ratio, and each round's when the row alternated several."""
    rounds = row.get("rounds", [])
    if len(rounds) < 2:
        return f"{row['ratio']:.2f}"
    each = ", ".join(f"{r['ratio']:.2f}" for r in rounds)
    return f"{row['ratio']:.2f} ({each})"


def _same_viewport_summary(rows: list[Result]) -> str:
    """Pressroom's ratios to the raw loop with the 1-pixel viewport, by length and slots."""
    parts = []
    for pages in sorted({r["pages"] for r in rows}):
        mine = sorted((r for r in rows if r["pages"] == pages), key=lambda r: r["slots"])
        if any(r.get("ratio_print") is None for r in mine):
            return ""
        slots = " / ".join(str(r["slots"]) for r in mine)
        ratios = " / ".join(f"{r['ratio_print']:.2f}" for r in mine)
        parts.append(f"{'1 page' if pages <= 1 else f'{pages} pages'}: {ratios} ({slots} slots)")
    return "; ".join(parts)


def _print_viewport_cell(row: Result) -> str:
    """The raw loop printing from Pressroom's one-pixel viewport, and Pressroom's ratio to it."""
    if row.get("raw_print") is None:
        return "-"
    return f"{row['raw_print']:.1f} ({row['ratio_print']:.2f})"


def render_section(render: Result) -> str:
    rows = [
        [
            str(r["pages"]),
            str(r["slots"]),
            str(r["docs"]),
            f"{r['raw']:.1f}",
            f"{r['pressroom']:.1f}",
            _ratio_cell(r),
            _print_viewport_cell(r),
            f"{r['raw_cpu_ms']:.1f} / {r['pressroom_cpu_ms']:.1f}" if "raw_cpu_ms" in r else "-",
            _pair(r.get("raw_machine_cpu_ms"), r.get("pressroom_machine_cpu_ms")),
        ]
        for r in render["rows"]
    ]
    return "\n".join(
        [
            "## Render path (P3)",
            "",
            "The same invoice through Pressroom end to end (HTTP submit → claim → Chromium → PDF "
            "stored → `job.done` on the event stream) and through a bare Playwright loop (one "
            "browser, one reused page per slot) at the same concurrency, in the same run. The "
            "20-page document is the invoice with 640 lines. For each row all are started "
            "once and warmed, then print the same documents in alternating rounds (raw, "
            "Pressroom, raw with the 1-pixel viewport, raw, …); the figures are the medians of "
            "the rounds, and the ratio cell lists every round's ratio, which shows how much the "
            "machine's speed moved. "
            "Pressroom's client (submit at 32 concurrent requests, then follow "
            "`/v1/events?type=job.done,job.failed` until the last `job.done`) runs in a process "
            "of its own, as a real client would. Before the rounds of each row, a `CHECKPOINT` "
            "writes out what the benchmarks before it left dirty on the shared PostgreSQL server.",
            "",
            table(
                [
                    "pages",
                    "slots",
                    "documents per round",
                    "raw Playwright PDFs/s",
                    "Pressroom PDFs/s",
                    "ratio",
                    "raw Playwright, 1-pixel viewport, PDFs/s (Pressroom's ratio to it)",
                    "CPU ms per PDF in the benchmark process, raw / Pressroom",
                    "CPU ms per PDF of the whole machine, raw / Pressroom",
                ],
                rows,
            ),
            "",
            "The CPU columns: what the benchmark process spent per PDF (every thread; for raw "
            "Playwright its side of the pipe to Chromium, for Pressroom the server), and what "
            "the whole machine spent per PDF (Chromium, PostgreSQL, the client, the kernel, "
            "everything; from /proc/stat). With more than one slot the "
            "two cores are busy throughout, so the ratio follows the machine's CPU per PDF: "
            "what Pressroom adds to each document (HTTP, JSON, the template, the statements "
            "and their durable commits in PostgreSQL, the fsync'd file, the events) is taken "
            "from Chromium. With one slot Chromium would wait between documents for the next "
            "job's claim (a statement and its durable commit) and its template, about 5 ms in "
            "every 50 ms document; by default the next job is claimed as soon as a quickly "
            "loaded page begins to print (`PRESSROOM_CLAIM_WHILE_PRINTING_S`). The figures are "
            "for the defaults.",
            "",
            "Pressroom prints pages without scripts from a viewport of one pixel: printing lays "
            "the document out again at the paper's width, so the PDF is the same bytes (a test "
            "checks it on a document of viewport units and width media queries), but Chromium "
            "is spared the layout and paint of a 1280x720 screen first. The raw loop the "
            "target is measured against uses Playwright's default viewport, as a loop written "
            "without that knowledge would; the column after the ratio is the same raw loop "
            "printing from the one-pixel viewport, in the same rounds, and Pressroom's ratio "
            "to that. Most of Chromium's CPU per one-page PDF is not in the page at all: every "
            "`page.pdf()` starts a print compositor process of its own (desktop Chromium "
            "composites every printed document out of process, and no switch turns that off), "
            "about a third of the machine's CPU per document here, for the raw loop and "
            "Pressroom alike.",
            "",
            "![Render throughput against slots](render-slots.png)",
            "",
            _command(render),
            "",
        ]
    )


def egress_section(egress: Result) -> str:
    row, args = egress["row"], egress["args"]
    each = ", ".join(f"{r['ratio']:.2f}" for r in egress["rounds"])
    cost_ms = (1 / row["pressroom"] - 1 / row["raw"]) * 1000 * args["slots"]
    return "\n".join(
        [
            "## Egress gate",
            "",
            "Every connection Chromium opens for Pressroom goes through its egress gate (an HTTP "
            "proxy per render slot that checks the address it connects to). A template without "
            "subresources opens none, so the render path above pays nothing for it; this "
            f"measures a page that does: the invoice with a stylesheet and {args['images']} "
            "images from an allow-listed server on 127.0.0.1, each document's own URLs (nothing "
            "from Chromium's cache), printed by Pressroom's renderer and by a raw Playwright "
            "loop whose Chromium connects directly, in alternating rounds in one process.",
            "",
            table(
                [
                    "slots",
                    "documents per round",
                    "raw Playwright PDFs/s",
                    "Pressroom PDFs/s",
                    "ratio (every round)",
                    "ms per document and slot",
                ],
                [
                    [
                        str(args["slots"]),
                        str(args["docs"]),
                        f"{row['raw']:.1f}",
                        f"{row['pressroom']:.1f}",
                        f"{row['ratio']:.2f} ({each})",
                        f"{cost_ms:+.1f}",
                    ]
                ],
            ),
            "",
            _command(egress),
            "",
        ]
    )


def soak_section(soak: Result) -> str:
    first, last = soak["samples"][0], soak["samples"][-1]
    base = next(s for s in soak["samples"] if s["jobs"] >= soak["from_job"])
    rows = [
        [
            label,
            f"{s['jobs']:,}",
            f"{s['server_mb']:.1f}",
            f"{s['chromium_mb']:.1f}",
            f"{s.get('chromium_pss_mb', float('nan')):.1f}",
            f"{s['total_mb']:.1f}",
        ]
        for label, s in (("start", first), ("growth measured from", base), ("end", last))
    ]
    return "\n".join(
        [
            "## Soak (P6)",
            "",
            f"{last['jobs']:,} renders in a row through one app with real Chromium "
            f"({soak['args']['slots']} slots), in batches of {soak['args']['every']}; after each "
            "batch the resident memory of the server process and of every Chromium process it "
            f"started is sampled. {soak['elapsed_s']:.0f} s in all ({soak['rate']:.1f} PDFs/s); "
            f"browser launches: {soak['browser_launches']} (the renderer recycles Chromium "
            "after a number of jobs or above a memory mark); distinct Chromium processes seen: "
            f"{soak['chromium_pids_seen']}.",
            "",
            table(
                [
                    "sample",
                    "jobs",
                    "server RSS MiB",
                    "Chromium RSS MiB (sum)",
                    "Chromium PSS MiB (sum)",
                    "server + Chromium RSS MiB",
                ],
                rows,
            ),
            "",
            f"Growth from job {soak['from_job']:,} to the end: server "
            f"{soak['server_growth_pct']:+.1f} %, Chromium RSS "
            f"{soak['chromium_growth_pct']:+.1f} %, "
            f"Chromium PSS {soak.get('chromium_pss_growth_pct', float('nan')):+.1f} %, total "
            f"{soak['total_growth_pct']:+.1f} %. Zombie processes at the end: "
            f"{len(soak['zombies'])}; Chromium processes still alive after the app stopped: "
            f"{len(soak['orphans'])}.",
            "",
            "RSS summed over Chromium's processes counts the pages they share once per process; "
            "PSS divides shared pages among them and is the better total.",
            "",
            "![Soak memory](soak.png)",
            "",
            _command(soak),
            "",
        ]
    )


def push_rows(push: Result) -> list[list[str]]:
    """Summary rows from bench/push.py's JSON: push latency over NOTIFY, and fan-out."""
    data = push.get("result")
    if not data:
        return []
    sse, sio = data["sse"], data["socketio"]
    notify = data.get("notify_commit", data["notify_round_trip"])
    fan, targets = data["fan_out"], data.get("targets", {})
    over_ms = targets.get("p99_within_ms_of_notify", 5)
    worst = max(sse["p99_ms"], sio["p99_ms"]) - notify["p99_ms"]
    rows = [
        [
            f"Push latency, {sse['count']:,} events, p99",
            f"SSE {sse['p99_ms']:.2f} ms, Socket.IO {sio['p99_ms']:.2f} ms",
            f"{notify['p99_ms']:.2f} ms (raw LISTEN on the same commits)",
            f"+{worst:.2f} ms",
            f"within {over_ms:g} ms of NOTIFY",
            _verdict(worst <= over_ms),
        ]
    ]
    kb_target = targets.get("kb_per_idle_connection", 20)
    reach_target = targets.get("reach_all_ms", 1000)
    rows.append(
        [
            f"Push fan-out, {fan['subscribers']:,} SSE subscribers",
            f"{fan['kb_per_connection']:.1f} KB per idle connection; one event reaches all in "
            f"{fan['reach_all_ms']:,.0f} ms"
            + (
                f" (median of {len(fan['reach_all_rounds_ms'])})"
                if "reach_all_rounds_ms" in fan
                else ""
            ),
            "-",
            "-",
            f"≤ {kb_target:g} KB, ≤ {reach_target:,.0f} ms",
            _verdict(fan["kb_per_connection"] <= kb_target and fan["reach_all_ms"] <= reach_target),
        ]
    )
    return rows


def push_section(push: Result | None) -> str:
    lines = ["## Push (Socket.IO, SSE)", ""]
    if push is None:
        lines += [
            "Not measured in this run (no `bench/push.py`, or left out with --only).",
            "",
        ]
        return "\n".join(lines)
    lines += [
        "From `bench/push.py`: a committed state change to an SSE and a Socket.IO client of a "
        "`pressroom web` process, each timed from the moment the committing statement is "
        "sent, next to a raw asyncpg LISTEN connection hearing the NOTIFY of the same commits "
        "(the baseline: what PostgreSQL takes, commit included) and `SELECT pg_notify` alone; "
        "then events fanned out to many idle SSE subscribers, one at a time (the subscribers "
        "are bare sockets in the benchmark's process, the lightest client there is, since they "
        "share the two cores with the server; five events, the median reported). What it "
        "printed:",
        "",
        "\n".join(
            line for line in push["output"].rstrip().splitlines() if not line.startswith("(")
        ).rstrip(),
        "",
        f"Command: `{push['command']}`",
        "",
    ]
    return "\n".join(lines)


def _frames(rows: list[list[Any]]) -> str:
    return table(["share of busy samples", "frame"], [[f"{p:.1f} %", f"`{f}`"] for f, p in rows])


def profile_section(profile: Result) -> str:
    parts = [
        "## Profile",
        "",
        "py-spy sampled the server process at 200 Hz while it was under load: the accept path "
        f"with 32 clients posting jobs ({profile['accept']['requests_per_s']:.0f} requests/s "
        "while sampled), the queue path draining a backlog with a no-op renderer and "
        f"{profile['args']['slots']} slots ({profile['queue']['jobs_per_s']:.0f} jobs/s while "
        "sampled). Flamegraphs: [accept](profile-accept.svg), [queue](profile-queue.svg). "
        "Shares below are of the samples in which a thread was working (a thread waiting in "
        "epoll or an idle pool thread is left out).",
        "",
    ]
    for path in ("accept", "queue"):
        data = profile[path]
        parts += [
            f"### {path.capitalize()} path: {data['samples']:,} busy samples",
            "",
            "Where the time is spent (own time, by function):",
            "",
            _frames(data["self"][:8]),
            "",
            "Pressroom functions (inclusive: the function and what it calls):",
            "",
            _frames(data["server_inclusive"][:8]),
            "",
        ]
        found = readings(path, data)
        if found:
            parts += ["What dominates:", ""] + [f"- {s}" for s in found] + [""]
    parts += [f"**Changed because of it:** {CHANGES}", "", _command(profile), ""]
    return "\n".join(parts)


def readings(path: str, data: Result) -> list[str]:
    shares: dict[str, float] = {}
    for frame, pct in data["self"] + data["server_inclusive"] + data["libraries_inclusive"]:
        shares[frame] = max(shares.get(frame, 0.0), pct)
    found = []
    for which, text, least, sentence in READINGS:
        if which != path:
            continue
        share = max((pct for frame, pct in shares.items() if text in frame), default=0.0)
        if share >= least:
            found.append(f"{sentence} ({share:.0f} % of busy samples)")
    return found


def markdown(results: Result) -> str:
    meta = results["meta"]
    quick = meta["quick"]
    head = [
        "# Performance",
        "",
        "Generated by `make bench` (`python -m bench`); do not edit by hand, edit "
        "`bench/report.py` and run it again. Every baseline (raw asyncpg, raw Playwright, "
        "PgQueuer, Procrastinate) was measured in the same run, on the same machine, against "
        "the same PostgreSQL server.",
        "",
    ]
    if quick:
        head += [
            "> **Quick mode (`BENCH_QUICK=1`)**: reduced sizes on a possibly busy machine. "
            "These figures are noisy and only show that the suite runs.",
            "",
        ]
    head += [
        "## Machine",
        "",
        f"- {meta['machine']}",
        f"- {meta['postgres']} ({meta['postgres_where']})",
        f"- Chromium: {meta['chromium']}",
        f"- Run at {meta['started_at']} (UTC), {meta['elapsed_s'] / 60:.1f} minutes in all",
        f"- Command: `{meta['command']}`",
        "",
        "## Summary",
        "",
        table(["figure", "Pressroom", "baseline", "ratio", "target", "met"], summary_rows(results)),
        "",
    ]
    sections = [
        accept_section(results["accept"]) if "accept" in results else "",
        queue_section(results["queue"]) if "queue" in results else "",
        render_section(results["render"]) if "render" in results else "",
        egress_section(results["egress"]) if "egress" in results else "",
        soak_section(results["soak"]) if "soak" in results else "",
        push_section(results.get("push")),
        profile_section(results["profile"]) if "profile" in results else "",
    ]
    failed = results.get("errors", {})
    if failed:
        sections.append("## Errors\n\nThese benchmarks failed in this run:\n")
        for name, trace in failed.items():
            last = trace.strip().splitlines()[-1]
            sections.append(f"- {name}: `{last}`")
        sections.append("")
    return "\n".join(head + [s for s in sections if s])


def write_plots(results: Result, out: Path) -> list[Path]:
    written: list[Path] = []

    def plot(name: str, draw: Callable[[Path], None]) -> None:
        draw(out / name)
        written.append(out / name)

    if "accept" in results:
        series = {
            "Pressroom POST /v1/jobs": results["accept"]["latencies_ms"]["pressroom"],
            "raw asyncpg insert": results["accept"]["latencies_ms"]["raw"],
        }
        rate = results["accept"]["args"]["rate"]
        plot(
            "accept-latency.png",
            lambda p: plots.latency(p, f"Accept latency at {rate:g} requests/s", series),
        )
    if "queue" in results:
        queue = results["queue"]
        plot("queue-slots.png", lambda p: plots.queue_slots(p, queue))
        starts = {"INSERT by another process (NOTIFY, claim)": queue["latencies_ms"]}
        if "latencies_http_queued_ms" in queue:
            starts = {"POST /v1/jobs, hand-off off": queue["latencies_http_queued_ms"], **starts}
        if "latencies_http_ms" in queue:
            starts = {"POST /v1/jobs (hand-off)": queue["latencies_http_ms"], **starts}
        plot(
            "submit-start.png",
            lambda p: plots.latency(p, "Submit → start, idle worker", starts),
        )
    if "render" in results:
        plot("render-slots.png", lambda p: plots.render_slots(p, results["render"]["rows"]))
    if "soak" in results:
        plot("soak.png", lambda p: plots.soak(p, results["soak"]))
    return written


def write(results: Result, out: Path) -> Path:
    """The plots and performance.md into `out`; returns the report's path."""
    out.mkdir(parents=True, exist_ok=True)
    write_plots(results, out)
    report = out / "performance.md"
    report.write_text(markdown(results))
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("results", help="results.json written by python -m bench")
    parser.add_argument("--out", default=None, help="folder for the report (default: beside it)")
    args = parser.parse_args()
    path = Path(args.results)
    out = Path(args.out) if args.out else path.parent
    print(write(json.loads(path.read_text()), out))


if __name__ == "__main__":
    main()
