"""Which Chromium runs and how it is launched, and the processes it runs as: found, counted
and measured for the renderer (server/render/chromium.py), the tests and the benchmarks."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil

import psutil

log = logging.getLogger(__name__)

CHROMIUM_ARGS = (
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    # Everything leaves through a gate (server/render/egress.py). What a proxy cannot carry is off:
    # QUIC and WebRTC's UDP; and Chromium resolves no name itself (a proxied request needs
    # none), so DNS prefetch and anything that would bypass the gate find no address.
    "--disable-quic",
    # The full browser reads the first, the headless shell the second (each ignores the other).
    "--webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--force-webrtc-ip-handling-policy=disable_non_proxied_udp",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
    "--no-pings",
    # A job's frames share its renderer process, so one memory bound covers all of them
    # (jobs never share one: each context has processes of its own).
    "--disable-site-isolation-trials",
    "--disable-features=IsolateOrigins,site-per-process",
)
# After Playwright's own build (itself the headless shell), in this order: the headless shell
# prints what the full browser prints with about half its CPU; the full browser after it.
SYSTEM_CHROMIUM_NAMES = (
    "chromium-headless-shell",
    "chromium",
    "chromium-browser",
    "google-chrome",
    "google-chrome-stable",
)


def find_system_chromium() -> str | None:
    for name in SYSTEM_CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def choose_chromium(playwright_build: str) -> str:
    """Playwright's own Chromium when it is installed, else a system one."""
    if os.path.exists(playwright_build):
        return playwright_build
    found = find_system_chromium()
    if found is None:
        raise RuntimeError(
            "no Chromium found: run `make install` (Playwright's browser, else Debian's "
            "chromium-headless-shell or chromium) or set PRESSROOM_CHROMIUM"
        )
    log.info("Playwright's Chromium is not installed; using %s", found)
    return found


def browser_processes(driver: int | None = None) -> list[psutil.Process]:
    """Chromium processes started by this process (through Playwright's driver), or by one
    driver (its pid) only: those of one renderer when a process holds several."""
    found = []
    try:
        root = psutil.Process(driver if driver is not None else os.getpid())
        children = root.children(recursive=True)
    except psutil.Error:
        return []
    for child in children:
        try:
            name = child.name().lower()
        except psutil.Error:
            continue
        if "chrom" in name or "headless_shell" in name:
            found.append(child)
    return found


def browser_memory_mb(driver: int | None = None) -> float:
    """Memory of the Chromium processes of this process (or of one driver), in MiB: the sum of
    proportional set sizes, so pages the processes share are counted once (a sum of RSS counts
    them in each process and makes a browser with a few contexts look twice its size)."""
    total = 0
    for process in browser_processes(driver):
        try:
            info = process.memory_full_info()
        except psutil.Error:
            continue
        total += getattr(info, "pss", info.rss)
    return total / (1024 * 1024)


def renderer_pids(driver: int | None) -> set[int]:
    """Chromium's renderer processes (one per context here) below Playwright's driver."""
    found = set()
    for process in browser_processes(driver):
        with contextlib.suppress(psutil.Error):
            if "--type=renderer" in process.cmdline():
                found.add(process.pid)
    return found


def child_pids() -> set[int]:
    """This process's direct children (Playwright's driver is one of them)."""
    return {child.pid for child in psutil.Process(os.getpid()).children()}
