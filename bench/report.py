"""docs/performance.md from the results of `python -m bench`: bench/report.md.j2 filled with
the figures (its prose is in the template; what they led to, in docs/performance-notes.md).

python -m bench.report [RESULTS_JSON] [--out DIR]   # the report again from saved results
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jinja2

from bench import plots
from bench.plans import BEFORE, TODAY

Result = dict[str, Any]
HERE = Path(__file__).resolve().parent
#: Every full run keeps its figures here (without the raw samples), so that the committed
#: report can be rendered again from the template without running the benchmarks.
RESULTS = HERE / "results.json"
#: Lists longer than this (every latency of a run) are samples for the plots, not figures.
SAMPLES_OVER = 64


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
                    "-",
                    "information",
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
    if results.get("in_flight"):
        rows.append(in_flight_summary(results["in_flight"]))
    render = results.get("render")
    if render:
        for row in render["rows"]:
            pages = "1 page" if row["pages"] <= 1 else f"{row['pages']} pages"
            slots = f"{row['slots']} slot{'s' if row['slots'] > 1 else ''}"
            rows.append(
                [
                    f"P3 render ({row.get('engine', 'chromium')}): {pages}, {slots}",
                    f"{row['pressroom']:.1f} PDFs/s",
                    f"{row['raw']:.1f} PDFs/s (best raw Playwright loop)",
                    f"{row['ratio']:.2f}",
                    "≥ 0.9",
                    _verdict(row["ratio"] >= 0.9),
                ]
            )
    budget = results.get("budget")
    if budget:
        m = budget["median"]
        used = m["server"] + m["postgres"]
        rows.append(
            [
                f"P3 CPU per job outside Chromium, {_slots(budget['args']['slots'])}",
                f"{used:.2f} ms (server {m['server']:.2f}, PostgreSQL {m['postgres']:.2f})",
                _bare_floor(budget),
                "-",
                "≤ 2 ms",
                _verdict(used <= 2.0),
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
    if results.get("latency"):
        rows.append(latency_summary(results["latency"]))
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
    if results.get("writepath"):
        rows.append(writepath_summary(results["writepath"]))
    if results.get("dbcost"):
        rows.append(dbcost_summary(results["dbcost"]))
    if results.get("drain"):
        rows.append(drain_summary(results["drain"]))
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


def _span(values: list[float], digits: int = 2, *, sign: bool = False) -> str:
    """The range of `values` as "low to high" ("-" when there are none)."""
    if not values:
        return "-"
    form = f"{{:{'+' if sign else ''},.{digits}f}}"
    low, high = form.format(min(values)), form.format(max(values))
    return low if low == high else f"{low} to {high}"


def _in_flight_run(result: Result, round_: int, backlog: int, cap: str) -> Result:
    return next(
        r
        for r in result["runs"]
        if r["round"] == round_ and r["backlog"] == backlog and r["cap"] == cap
    )


def _in_flight_pairs(result: Result) -> list[tuple[Result, Result]]:
    """(background read, count per admission) for each round and backlog."""
    return [
        (r, _in_flight_run(result, r["round"], r["backlog"], "count"))
        for r in result["runs"]
        if r["cap"] == "background"
    ]


def in_flight_rows(result: Result) -> list[list[str]]:
    """p50 ms per backlog, each cell listing every round's figure."""
    rounds = sorted({r["round"] for r in result["runs"]})
    rows = []
    for backlog in sorted({r["backlog"] for r in result["runs"]}):
        label = "empty" if backlog == 0 else f"{backlog:,} queued"
        row = [f"{label}, round {' / '.join(str(n + 1) for n in rounds)}"]
        for measure in ("start", "answer"):
            for cap in ("background", "count"):
                p50s = [_in_flight_run(result, n, backlog, cap)[measure]["p50_ms"] for n in rounds]
                row.append(" / ".join(f"{p50:.2f}" for p50 in p50s))
        rows.append(row)
    return rows


def in_flight_spans(result: Result) -> dict[str, str]:
    """Ranges over the rounds and backlogs, in ms at p50: the background read's submit→start,
    and what the count per admission added to submit→start and to the 202 answer."""
    pairs = _in_flight_pairs(result)

    def added(measure: str) -> list[float]:
        return [c[measure]["p50_ms"] - b[measure]["p50_ms"] for b, c in pairs]

    return {
        "background_start": _span([b["start"]["p50_ms"] for b, _c in pairs]),
        "added_start": _span(added("start"), sign=True),
        "added_answer": _span(added("answer"), sign=True),
    }


def in_flight_summary(result: Result) -> list[str]:
    """POST→start p50 per backlog (the median over the rounds), both ways."""
    backlogs = sorted({r["backlog"] for r in result["runs"]})

    def p50s(cap: str) -> str:
        mine = [r for r in result["runs"] if r["cap"] == cap]
        return " / ".join(
            f"{statistics.median(r['start']['p50_ms'] for r in mine if r['backlog'] == b):.2f}"
            for b in backlogs
        )

    queues = " / ".join("empty" if b == 0 else f"{b:,} queued" for b in backlogs)
    return [
        f"P4 in-flight cap at {result['cap']:,}: POST→start p50 ({queues})",
        f"{p50s('background')} ms (background read)",
        f"{p50s('count')} ms (one indexed count per admission)",
        "-",
        "-",
        "-",
    ]


def latency_rows(result: Result) -> list[list[str]]:
    """p50 and p99: the raw print, Pressroom's submit→job.done, what it adds, the target."""
    row, targets = result["row"], result["targets_added_ms"]
    return [
        [
            p,
            f"{row[f'raw_{p}']:.1f}",
            f"{row[p]:.1f}",
            f"{row[f'added_{p}']:+.1f}",
            f"≤ raw {p} + {targets[p]:g} ms",
            _verdict(row[f"added_{p}"] <= targets[p]),
            _bare_latency(row, p),
        ]
        for p in ("p50", "p99")
    ]


def _bare_latency(row: Result, p: str) -> str:
    if f"bare_{p}" not in row:
        return "-"
    return f"{row[f'bare_{p}']:.1f} ({row[f'bare_added_{p}']:+.1f})"


def latency_summary(result: Result) -> list[str]:
    row, targets = result["row"], result["targets_added_ms"]
    met = all(row[f"added_{p}"] <= targets[p] for p in ("p50", "p99"))
    return [
        "Submit→PDF, one job at a time on an idle server (POST to its `job.done`), p50 / p99",
        f"{row['p50']:.1f} / {row['p99']:.1f} ms",
        f"{row['raw_p50']:.1f} / {row['raw_p99']:.1f} ms (raw Playwright, one reused page)",
        f"{row['added_p50']:+.1f} / {row['added_p99']:+.1f} ms",
        f"p50 ≤ raw + {targets['p50']:g} ms, p99 ≤ raw p99 + {targets['p99']:g} ms",
        _verdict(met),
    ]


def mechanisms_rows(result: Result) -> list[list[str]]:
    """One row per configuration: PDFs/s and its ratio to the raw loop, latency one at a time."""
    raw = result["raw"]
    rows = [
        [
            row["config"],
            f"{row['pdfs_per_s']:.1f}",
            f"{row['ratio']:.2f}",
            f"{row['p50']:.1f} ({row['added_p50']:+.1f})",
            f"{row['p99']:.1f} ({row['added_p99']:+.1f})",
        ]
        for row in result["rows"]
    ]
    raw_cells = [f"{raw['pdfs_per_s']:.1f}", "1.00", f"{raw['p50']:.1f}", f"{raw['p99']:.1f}"]
    return [*rows, ["raw loop, print viewport", *raw_cells]]


def _latency_rounds(result: Result) -> str:
    """Each round's added p50 / p99, when there were several."""
    rounds = result["rounds"]
    if len(rounds) < 2:
        return ""
    return ", ".join(f"{r['added_p50']:+.1f} / {r['added_p99']:+.1f}" for r in rounds)


WRITEPATH_HEADER = [
    "measured",
    "webhook",
    "statement",
    "n",
    "before 0010",
    "0010 trigger",
    "ratio p50 / p99",
    "jobs triggers",
    "ratio p50 / p99",
]


def writepath_rows(result: Result) -> list[list[str]]:
    """Per statement, p50 / p99 ms for each way, and each later way's ratio to the first."""
    rows = []
    for row in result["rows"]:
        cells = [row["mode"], row["webhook"], row["statement"], str(row["before"]["n"])]
        for name in result["labels"]:
            s = row[name]
            cells.append(f"{s['p50_ms']:.3f} / {s['p99_ms']:.3f}")
            if name != "before":
                cells.append(f"{row[name + '_ratio_p50']:.2f} / {row[name + '_ratio_p99']:.2f}")
        rows.append(cells)
    return rows


def writepath_spans(result: Result) -> dict[str, str]:
    """Ranges of the p50 figures the reading of bench/writepath.py quotes."""

    def pick(mode: str, *, one: bool, heartbeat: bool) -> list[Result]:
        return [
            r
            for r in result["rows"]
            if r["mode"] == mode
            and (r["jobs"] == 1) == one
            and (r["sql"] == "heartbeat") == heartbeat
        ]

    def ratios(rows: list[Result], way: str = "trigger") -> str:
        return _span([r[f"{way}_ratio_p50"] for r in rows])

    server, client = result["modes"]["server"], result["modes"]["client"]
    one = pick(server, one=True, heartbeat=False)
    heartbeats = pick(server, one=True, heartbeat=True)
    batch_heartbeats = pick(server, one=False, heartbeat=True)
    return {
        "one": ratios(one),
        "one_before_ms": _span([r["before"]["p50_ms"] for r in one]),
        "one_trigger_ms": _span([r["trigger"]["p50_ms"] for r in one]),
        "heartbeat": ratios(heartbeats),
        "client_ms": _span(
            [r["before"]["p50_ms"] for r in pick(client, one=True, heartbeat=False)], 1
        ),
        "batch": ratios(pick(server, one=False, heartbeat=False)),
        "batch_heartbeat": ratios(batch_heartbeats),
        "jobs_trigger_heartbeat": ratios(heartbeats + batch_heartbeats, "jobs_trigger"),
    }


def writepath_summary(result: Result) -> list[str]:
    spans = writepath_spans(result)
    return [
        "Write path: one-job state changes with the job_events trigger (0010), server "
        "execution p50",
        f"{spans['one_trigger_ms']} ms",
        f"{spans['one_before_ms']} ms (each statement writing its side effects, before 0010)",
        f"{spans['one']} (the heartbeat, the same statement: {spans['heartbeat']})",
        "-",
        "-",
    ]


DBCOST_SYSTEMS = ("pressroom", "pgqueuer", "procrastinate")
#: What each limit of bench/dbcost.py's estimate is called in the report.
LIMIT_NAMES = {"cpu": "PostgreSQL's CPU", "notify": "the NOTIFY lock", "vacuum": "autovacuum"}


def dbcost_summary(result: Result) -> list[str]:
    ours, theirs = result["pressroom"], result["pgqueuer"]
    return [
        "What a job costs PostgreSQL: CPU ms / commits / WAL bytes per job (to its webhook)",
        f"{ours['cpu_ms']:.2f} ms / {ours['commits']:.2f} / {_f(ours['wal_bytes'])} B",
        f"{theirs['cpu_ms']:.2f} ms / {theirs['commits']:.2f} / {_f(theirs['wal_bytes'])} B "
        "(PgQueuer, an empty job)",
        f"{ours['cpu_ms'] / theirs['cpu_ms']:.2f} (CPU)",
        "-",
        "information",
    ]


def dbcost_rows(result: Result) -> list[list[str]]:
    return [
        [label, *(_f(result[s][key], digits) for s in DBCOST_SYSTEMS)]
        for key, label, digits in result["figures"]
    ]


def dbcost_statement_rows(result: Result, system: str, key: str) -> list[list[str]]:
    """A system's statements by execution time ("top") or by WAL ("top_wal"), per job."""
    return [
        [
            f"{s['exec_ms']:.3f}",
            _f(s["wal_bytes"]),
            f"{s['calls']:.2f}",
            "top" if s["toplevel"] else "nested",
            f"`{s['block']}`" if s.get("block") else "-",
            "`" + _cut(s["query"], 80).replace("|", "\\|") + "`",
        ]
        for s in result[system][key]
    ]


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def dbcost_estimate_rows(result: Result) -> list[list[str]]:
    e = {s: result["estimate"][s] for s in DBCOST_SYSTEMS}
    cores, fast = result["cores"], result["fast_flush_ms"]
    notify_per_s = result["ceiling"]["notify_per_s"]

    def row(label: str, key: str) -> list[str]:
        return [label, *(_f(e[s][key]) for s in DBCOST_SYSTEMS)]

    def first(label: str, suffix: str) -> list[str]:
        return [
            label,
            *(
                f"**{LIMIT_NAMES[e[s]['first' + suffix]]}, {_f(e[s]['rate' + suffix])}**"
                for s in DBCOST_SYSTEMS
            ),
        ]

    def at(label: str, suffix: str) -> list[str]:
        return [
            label,
            *(
                f"{_f(e[s]['commits_per_s' + suffix])} "
                f"({_f(e[s]['write_transactions_per_s' + suffix])} writing), "
                f"{e[s]['wal_mb_per_s' + suffix]:.1f} MB/s"
                for s in DBCOST_SYSTEMS
            ),
        ]

    return [
        row(f"CPU: {_f(cores * 1000)} CPU ms/s ({cores} cores) / PostgreSQL CPU ms per job", "cpu"),
        row(f"(execution alone: {_f(cores * 1000)} / execution ms per job)", "exec"),
        row(
            f"NOTIFY lock, this disk: {_f(notify_per_s)} / notifying transactions per job", "notify"
        ),
        row(
            f"NOTIFY lock, a {fast:g} ms flush: {_f(1000 / fast)} / notifying transactions per job",
            "notify_fast",
        ),
        row("autovacuum: 1,000 / VACUUM s per 1,000 jobs", "vacuum"),
        first("breaks first, this disk", ""),
        at("there: commits/s (writing), WAL", ""),
        first(f"breaks first, a {fast:g} ms flush", "_fast"),
        at("there: commits/s (writing), WAL", "_fast"),
    ]


def drain_rows(result: Result) -> list[list[str]]:
    return [
        [
            str(r["processes"]),
            _f(r["pressroom"]),
            _f(r["pgqueuer"]),
            f"{r['pressroom'] / r['pgqueuer']:.2f}",
        ]
        for r in result["rows"]
    ]


def drain_summary(result: Result) -> list[str]:
    best = max(result["rows"], key=lambda r: r["pressroom"])
    processes = _plural(best["processes"], "worker process", "worker processes")
    return [
        f"Drain {result['args']['jobs']:,} jobs, files in memory, best of "
        f"{result['args']['processes']} processes",
        f"{_f(best['pressroom'])} jobs/s ({processes})",
        f"{_f(best['pgqueuer'])} jobs/s (PgQueuer, {best['processes']} processes)",
        f"{best['pressroom'] / best['pgqueuer']:.2f}",
        "-",
        "information",
    ]


def _plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


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
    fans = ((fan, "SSE"), (data.get("fan_out_socketio"), "Socket.IO websocket"))
    for fan, name in fans:
        if not fan:
            continue
        rows.append(
            [
                f"Push fan-out, {fan['subscribers']:,} {name} subscribers",
                f"{fan['kb_per_connection']:.1f} KB per idle connection; one event reaches all "
                f"in {fan['reach_all_ms']:,.0f} ms"
                + (
                    f" (median of {len(fan['reach_all_rounds_ms'])})"
                    if "reach_all_rounds_ms" in fan
                    else ""
                ),
                "-",
                "-",
                f"≤ {kb_target:g} KB, ≤ {reach_target:,.0f} ms",
                _verdict(
                    fan["kb_per_connection"] <= kb_target and fan["reach_all_ms"] <= reach_target
                ),
            ]
        )
    return rows


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _frames(rows: list[list[Any]]) -> str:
    return table(["share of busy samples", "frame"], [[f"{p:.1f} %", f"`{f}`"] for f, p in rows])


def _share_of(data: Result, text: str) -> float:
    """The largest share (%) of a frame whose name contains `text`, own or inclusive."""
    rows = data["self"] + data["server_inclusive"] + data["libraries_inclusive"]
    return max((pct for frame, pct in rows if text in frame), default=0.0)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f} %"


def accept_rows(accept: Result) -> list[list[str]]:
    rows = []
    for label, key in (("throughput, closed loop", "throughput"), ("fixed rate", "fixed_rate")):
        for who, name in (("pressroom", "Pressroom POST /v1/jobs"), ("raw", "raw asyncpg insert")):
            r = accept[key][who]
            rows.append(
                [label, name, f"{r['requests']:,}", f"{r['errors']:,}", _f(r["rate"])]
                + [f"{r[k]:.2f}" for k in ("p50_ms", "p90_ms", "p99_ms")]
                + [f"{r['max_ms']:.1f}"]
            )
    return rows


def queue_rows(queue: Result) -> list[list[str]]:
    rows = [["Pressroom", f"{slots} slots", _f(rate)] for slots, rate in queue["pressroom"].items()]
    for key, label in (("pgqueuer", "PgQueuer 'balanced'"), ("procrastinate", "Procrastinate")):
        rows += [[label, config, _f(rate)] for config, rate in queue.get(key, {}).items()]
    return rows


def _pair(raw: float | None, ours: float | None) -> str:
    return "-" if raw is None or ours is None else f"{raw:.1f} / {ours:.1f}"


def _ratio_cell(row: Result) -> str:
    """The median ratio, and each round's when the row alternated several."""
    rounds = row.get("rounds", [])
    if len(rounds) < 2:
        return f"{row['ratio']:.2f}"
    each = ", ".join(f"{r['ratio']:.2f}" for r in rounds)
    return f"{row['ratio']:.2f} ({each})"


def render_rows(render: Result) -> list[list[str]]:
    return [
        [
            r.get("engine", "chromium"),
            str(r["pages"]),
            str(r["slots"]),
            str(r["docs"]),
            f"{r['raw']:.1f}",
            f"{r['pressroom']:.1f}",
            _ratio_cell(r),
            f"{r['raw_cpu_ms']:.1f} / {r['pressroom_cpu_ms']:.1f}" if "raw_cpu_ms" in r else "-",
            _pair(r.get("raw_machine_cpu_ms"), r.get("pressroom_machine_cpu_ms")),
        ]
        for r in render["rows"]
    ]


def finishing_rows(render: Result) -> list[list[str]]:
    return [
        [
            r["step"],
            str(r["pages"]),
            str(r["docs"]),
            f"{r['pdfs_per_s']:.1f}",
            f"{r['ms_per_page']:.1f}",
            f"x{r['bytes_ratio']:.2f}",
        ]
        for r in render.get("finishing", [])
    ]


def egress_rows(egress: Result) -> list[list[str]]:
    row, args = egress["row"], egress["args"]
    each = ", ".join(f"{r['ratio']:.2f}" for r in egress["rounds"])
    cost_ms = (1 / row["pressroom"] - 1 / row["raw"]) * 1000 * args["slots"]
    return [
        [
            str(args["slots"]),
            str(args["docs"]),
            f"{row['raw']:.1f}",
            f"{row['pressroom']:.1f}",
            f"{row['ratio']:.2f} ({each})",
            f"{cost_ms:+.1f}",
        ]
    ]


def soak_rows(soak: Result) -> list[list[str]]:
    first, last = soak["samples"][0], soak["samples"][-1]
    base = next(s for s in soak["samples"] if s["jobs"] >= soak["from_job"])
    return [
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


def _push_output(push: Result) -> str:
    lines = push["output"].rstrip().splitlines()
    return "\n".join(line for line in lines if not line.startswith("(")).rstrip()


def _percentiles(lat: Result) -> str:
    return (
        f"p50 {lat['p50_ms']:.2f} ms, p90 {lat['p90_ms']:.2f} ms, "
        f"p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms"
    )


def _p50_p99(lat: Result) -> str:
    return f"p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms"


_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(HERE),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    extensions=["jinja2.ext.do"],
    autoescape=False,  # Markdown, not HTML
)
_ENV.filters.update(n=_f, pct=_pct, json=json.dumps)
_ENV.globals.update(
    table=table,
    frames=_frames,
    share_of=_share_of,
    percentiles=_percentiles,
    p50_p99=_p50_p99,
    writepath_header=WRITEPATH_HEADER,
)


def _bare_floor(budget: Result) -> str:
    bare = budget.get("bare")
    if not bare:
        return "-"
    return f"{bare['server'] + bare['postgres']:.2f} ms (the bare service)"


def _slots(count: int) -> str:
    return f"{count} slot{'s' if count != 1 else ''}"


def budget_rows(result: Result) -> list[list[str]]:
    """CPU per job by process: Pressroom's, the bare service's, Pressroom's renderer's alone
    and the raw loop's."""
    m, b = result["median"], result.get("bare", {})
    r, f = result.get("renderer", {}), result.get("floor", {})

    def cell(figures: Result, key: str, digits: int = 2) -> str:
        return f"{figures[key]:.{digits}f}" if key in figures else "-"

    def both(figures: Result) -> str:
        if "postgres" not in figures:
            return cell(figures, "server")
        return f"**{figures['server'] + figures['postgres']:.2f}**"

    def row(label: str, key: str, digits: int = 2) -> list[str]:
        return [label, *(cell(x, key, digits) for x in (m, b, r, f))]

    return [
        row("server (the service's process; the loop's own)", "server"),
        [*row("PostgreSQL (postmaster and backends)", "postgres")[:3], "-", "-"],
        ["server + PostgreSQL", both(m), both(b), cell(r, "server"), cell(f, "server")],
        row("Playwright's driver", "driver"),
        row("Chromium", "chromium"),
        [*row("client (its own process)", "client")[:3], "-", "-"],
        row("PDFs/s", "pdfs_per_s", 1),
    ]


def plans_rows(result: Result) -> list[list[str]]:
    """The claim and the done write, before 0019 and today."""
    rows = []
    for name, ways in result["statements"].items():
        old, new, ratio = ways[BEFORE], ways[TODAY], ways["ratio"]
        rows.append(
            [
                f"`{name}`",
                f"{old['cpu_ms']:.3f} / {new['cpu_ms']:.3f}",
                f"{ratio['cpu_ms']:.2f}",
                f"{old['p50_ms']:.3f} / {new['p50_ms']:.3f}",
                f"{ratio['p50_ms']:.2f}",
            ]
        )
    return rows


def budget_stage_rows(result: Result) -> list[list[str]]:
    stages = sorted(result["stages"].items(), key=lambda kv: -kv[1])
    return [[name, f"{ms:.2f}"] for name, ms in stages]


def markdown(results: Result) -> str:
    """The report: bench/report.md.j2 with the figures of `results`."""
    sections: dict[str, Callable[[Result], list[list[str]]]] = {
        "accept": accept_rows,
        "queue": queue_rows,
        "render": render_rows,
        "egress": egress_rows,
        "soak": soak_rows,
        "in_flight": in_flight_rows,
        "latency": latency_rows,
        "mechanisms": mechanisms_rows,
        "writepath": writepath_rows,
        "budget": budget_rows,
        "plans": plans_rows,
        "dbcost": dbcost_rows,
        "drain": drain_rows,
    }
    context: dict[str, Any] = {
        "meta": results["meta"],
        "summary": summary_rows(results),
        "errors": results.get("errors", {}),
        "push": results.get("push"),
        "push_output": _push_output(results["push"]) if results.get("push") else "",
        "profile": results.get("profile"),
    }
    for name, rows in sections.items():
        context[name] = results.get(name)
        context[f"{name}_rows"] = rows(results[name]) if name in results else []
    if "in_flight" in results:
        context["in_flight_spans"] = in_flight_spans(results["in_flight"])
    if "latency" in results:
        context["latency_rounds"] = _latency_rounds(results["latency"])
    if "writepath" in results:
        context["writepath_spans"] = writepath_spans(results["writepath"])
    if "budget" in results:
        context["budget_stage_rows"] = budget_stage_rows(results["budget"])
    if "render" in results:
        context["finishing_rows"] = finishing_rows(results["render"])
    if "dbcost" in results:
        dbcost = results["dbcost"]
        context["dbcost_top_rows"] = dbcost_statement_rows(dbcost, "pressroom", "top")
        context["dbcost_wal_rows"] = dbcost_statement_rows(dbcost, "pressroom", "top_wal")
        context["dbcost_estimate_rows"] = dbcost_estimate_rows(dbcost)
        context["limit_names"] = LIMIT_NAMES
    text = _ENV.get_template("report.md.j2").render(context)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip() + "\n"


def figures(results: Result) -> Result:
    """`results` without the raw samples (long lists of numbers): what the report quotes."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            kept = {k: strip(v) for k, v in value.items() if not _samples(v)}
            return {k: v for k, v in kept.items() if v != {} or value[k] == {}}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return dict(strip(results))


def _samples(value: Any) -> bool:
    return (
        isinstance(value, list)
        and len(value) > SAMPLES_OVER
        and all(isinstance(v, int | float) for v in value)
    )


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
    """performance.md into `out`, and the plots when `results` holds the raw samples."""
    out.mkdir(parents=True, exist_ok=True)
    if _has_samples(results):
        write_plots(results, out)
    report = out / "performance.md"
    report.write_text(markdown(results))
    return report


def _has_samples(results: Result) -> bool:
    accept = results.get("accept")
    return accept is None or "latencies_ms" in accept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "results", nargs="?", default=str(RESULTS), help="a results.json of python -m bench"
    )
    parser.add_argument("--out", default=None, help="folder for the report (default: docs/)")
    args = parser.parse_args()
    out = Path(args.out) if args.out else HERE.parent / "docs"
    path = Path(args.results)
    if not path.exists():
        parser.exit(2, f"{path}: no results yet; `make bench` (a full run) writes them\n")
    print(write(json.loads(path.read_text()), out))


if __name__ == "__main__":
    main()
