"""PNG plots for docs/performance.md (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib import ticker

DPI = 110


def _cdf(ax: Any, values: list[float], label: str) -> None:
    ordered = sorted(values)
    n = len(ordered)
    ax.plot(ordered, [(i + 1) / n for i in range(n)], label=label)


def latency(path: Path, title: str, series: dict[str, list[float]], unit: str = "ms") -> None:
    """A histogram and a CDF of each series of latencies, side by side."""
    fig, (hist, cdf) = plt.subplots(1, 2, figsize=(10, 3.8))
    top = max((sorted(v)[int(len(v) * 0.995) - 1] for v in series.values() if v), default=1)
    for label, values in series.items():
        if not values:
            continue
        clipped = [min(v, top) for v in values]
        hist.hist(clipped, bins=60, alpha=0.55, label=label)
        _cdf(cdf, values, label)
    hist.set_xlabel(f"latency ({unit}), clipped at p99.5")
    hist.set_ylabel("requests")
    cdf.set_xscale("log")
    cdf.xaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    cdf.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _pos: f"{value:g}"))
    cdf.xaxis.set_minor_formatter(ticker.NullFormatter())
    cdf.set_xlabel(f"latency ({unit}, log scale)")
    cdf.set_ylabel("fraction at or below")
    cdf.axhline(0.99, color="grey", linewidth=0.6, linestyle=":")
    cdf.axhline(0.5, color="grey", linewidth=0.6, linestyle=":")
    for ax in (hist, cdf):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def render_slots(path: Path, rows: list[dict[str, Any]]) -> None:
    """PDFs per second against render slots, Pressroom and the best raw Playwright loop; a
    panel per engine and length."""
    panels = sorted({(r.get("engine", "chromium"), r["pages"]) for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8), squeeze=False)
    for ax, (engine, pages) in zip(axes.flat, panels, strict=True):
        mine = sorted(
            (r for r in rows if (r.get("engine", "chromium"), r["pages"]) == (engine, pages)),
            key=lambda r: r["slots"],
        )
        slots = [r["slots"] for r in mine]
        ax.plot(slots, [r["pressroom"] for r in mine], marker="o", label="Pressroom")
        ax.plot(slots, [r["raw"] for r in mine], marker="s", linestyle="--", label="raw loop")
        ax.set_xticks(slots)
        ax.set_xlabel("render slots")
        ax.set_ylabel("PDFs per second")
        ax.set_ylim(bottom=0)
        length = "1-page invoice" if pages <= 1 else f"{pages}-page invoice"
        ax.set_title(f"{engine}: {length}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Render throughput against render slots")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def queue_slots(path: Path, result: dict[str, Any]) -> None:
    """Jobs per second against slots for Pressroom, with the peers' best as lines."""
    fig, ax = plt.subplots(figsize=(7, 4))
    ours = result["pressroom"]
    slots = sorted(int(s) for s in ours)
    ax.plot(slots, [ours[str(s)] for s in slots], marker="o", label="Pressroom (no-op renderer)")
    peers = (
        ("pgqueuer", "PgQueuer", "tab:orange"),
        ("procrastinate", "Procrastinate", "tab:green"),
    )
    for key, label, color in peers:
        if f"{key}_best" in result:
            best = result[f"{key}_best"]
            config = result[f"{key}_best_config"]
            ax.axhline(best, linestyle="--", color=color, label=f"{label} best ({config})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(slots, [str(s) for s in slots])
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _pos: f"{value:,.0f}"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("render slots (Pressroom)")
    ax.set_ylabel("jobs per second (log scale)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    ax.set_title("Draining a queue with a no-op renderer")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def soak(path: Path, result: dict[str, Any]) -> None:
    """Resident memory against jobs done: the server, Chromium (RSS and PSS)."""
    samples = result["samples"]
    jobs = [s["jobs"] for s in samples]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(jobs, [s["server_mb"] for s in samples], marker=".", label="server (RSS)")
    ax.plot(jobs, [s["chromium_mb"] for s in samples], marker=".", label="Chromium (sum of RSS)")
    if all("chromium_pss_mb" in s for s in samples):
        ax.plot(
            jobs, [s["chromium_pss_mb"] for s in samples], marker=".", label="Chromium (sum of PSS)"
        )
    ax.axvline(result["from_job"], color="grey", linestyle=":", label="growth measured from")
    ax.set_xlabel("jobs done")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Soak: resident memory while rendering")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)


def fan_out(path: Path, rows: list[dict[str, Any]], targets: dict[str, Any]) -> None:
    """One event to every idle subscriber (median, and the rounds' range) and the server's
    memory per idle connection, against subscribers, per transport."""
    fig, (reach, memory) = plt.subplots(1, 2, figsize=(10, 3.8))
    for transport, label, marker in (("sse", "SSE", "o"), ("socketio", "Socket.IO websocket", "s")):
        mine = sorted(
            (r for r in rows if r["transport"] == transport), key=lambda r: r["subscribers"]
        )
        if not mine:
            continue
        counts = [r["subscribers"] for r in mine]
        medians = [r["reach_all_ms"] for r in mine]
        low = [m - min(r["reach_all_rounds_ms"]) for m, r in zip(medians, mine, strict=True)]
        high = [max(r["reach_all_rounds_ms"]) - m for m, r in zip(medians, mine, strict=True)]
        reach.errorbar(counts, medians, yerr=[low, high], marker=marker, capsize=3, label=label)
        memory.plot(counts, [r["kb_per_connection"] for r in mine], marker=marker, label=label)
    reach.axhline(targets["reach_all_ms"], color="grey", linestyle=":", label="target")
    memory.axhline(
        targets["kb_per_idle_connection"], color="grey", linestyle=":", label="SSE target"
    )
    reach.set_ylabel("one event to all, ms (median; range of rounds)")
    memory.set_ylabel("server RSS per idle connection, KB")
    for ax in (reach, memory):
        ax.set_xlabel("idle subscribers in one process")
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda value, _pos: f"{value:,.0f}"))
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("Fan-out to idle subscribers of one process")
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
