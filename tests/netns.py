"""Hosts on a network, made on this machine with Linux network namespaces and veth pairs.

A switch namespace holds one bridge per segment; a host is a namespace with one veth per
segment it joins (named after the segment inside the host), whose other end is a port of
that segment's bridge. Addresses come from the benchmarking range 198.18.0.0/15 and exist in
these namespaces only: nothing is routed anywhere else, and the machine's own namespace gets
no address, route or device. The test process reaches the hosts through sockets made in a
client host (`Host.connector`); PostgreSQL is reached through its Unix socket as well.

Everything is named after the creating process's pid, so a run killed before its clean-up
leaves names that the next run recognises as orphans and removes (`remove_leftovers`).
Needs root (CAP_SYS_ADMIN) and iproute2; `unavailable()` says why not otherwise.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import ipaddress
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, TypeVar

import aiohttp
import pytest

T = TypeVar("T")

#: RFC 2544's range for benchmarking networks: never routed on the internet.
BENCH_RANGE = ipaddress.ip_network("198.18.0.0/15")
PREFIX = "prn"
CLONE_NEWNET = 0x40000000
IP_TIMEOUT_S = 10.0
KILL_TIMEOUT_S = 10.0
ROOT = Path(__file__).resolve().parents[1]

_counter = itertools.count()
_NAME = re.compile(rf"^{PREFIX}(\d+)[a-z]+-")


def unavailable() -> str | None:
    """Why this machine cannot make the hosts, or None when it can. As root (as in CI) nothing
    excuses them: the hosts' tests fail instead of skipping."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN); run the suite as root, as CI does"
    if shutil.which("ip") is None:
        pytest.fail("iproute2 (`ip`) is not installed: `make install` installs it as root")
    return None


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=IP_TIMEOUT_S)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def _namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _pids(namespace: str) -> list[int]:
    return [int(pid) for pid in ip("netns", "pids", namespace, check=False).split()]


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, killed and not yet reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def destroy_namespace(namespace: str) -> None:
    """SIGKILL every process in `namespace`, then delete it (its veths go with it)."""
    deadline = time.monotonic() + KILL_TIMEOUT_S
    while (pids := _pids(namespace)) and time.monotonic() < deadline:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)  # the kernel tears the processes down; nothing to wait on
    ip("netns", "delete", namespace, check=False)


def remove_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs whose process is gone (killed before clean-up)."""
    removed = []
    for namespace in _namespaces():
        match = _NAME.match(namespace)
        if match and not _alive(int(match.group(1))):
            destroy_namespace(namespace)
            removed.append(namespace)
    return removed


def _enter(namespace: str) -> None:
    """Move the calling thread into `namespace`: sockets it makes from now on live there."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(f"/run/netns/{namespace}") as handle:
        if libc.setns(handle.fileno(), CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns into {namespace}")


class Host:
    """One machine of the network: a namespace, its addresses, the processes started in it."""

    def __init__(self, network: Network, name: str) -> None:
        self.network = network
        self.name = name
        self.namespace = f"{network.tag}-{name}"
        self.addresses: dict[str, str] = {}
        self.processes: list[subprocess.Popen[bytes]] = []
        self._thread: concurrent.futures.ThreadPoolExecutor | None = None

    def address(self, segment: str | None = None) -> str:
        """Its address on `segment` (or on its only segment)."""
        if segment is None:
            (only,) = self.addresses.values()
            return only
        return self.addresses[segment]

    def command(self, argv: Sequence[str], *, user: str | None = None) -> list[str]:
        """`argv` run inside this host, as `user` if given (runuser: PostgreSQL refuses root).
        nsenter enters the network namespace only; `ip netns exec` would also mount a sysfs of
        its own, hiding the cgroup file system Pressroom bounds Chromium's memory with."""
        run_as = ["runuser", "-u", user, "--"] if user else []
        return ["nsenter", f"--net=/run/netns/{self.namespace}", "--", *run_as, *argv]

    def run(self, argv: Sequence[str], *, user: str | None = None, timeout_s: float = 60) -> str:
        done = subprocess.run(
            self.command(argv, user=user), capture_output=True, text=True, timeout=timeout_s
        )
        if done.returncode != 0:
            raise RuntimeError(f"{self.name}: {' '.join(argv)}: {done.stderr.strip()[-2000:]}")
        return done.stdout

    def spawn(
        self,
        argv: Sequence[str],
        *,
        log: Path | None = None,
        env: Mapping[str, str] | None = None,
        stdout: int | IO[bytes] | None = None,
    ) -> subprocess.Popen[bytes]:
        out: Any = stdout
        handle = None
        if log is not None:
            handle = log.open("ab")
            out = handle
        try:
            process = subprocess.Popen(
                self.command(argv),
                stdout=out,
                stderr=handle if handle is not None else subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=ROOT,
            )
        finally:
            if handle is not None:
                handle.close()  # the child keeps its own copy of the descriptor
        self.processes.append(process)
        return process

    def kill_all(self) -> int:
        """SIGKILL every process on this host (a power cut); returns how many there were."""
        killed = 0
        deadline = time.monotonic() + KILL_TIMEOUT_S
        while (pids := _pids(self.namespace)) and time.monotonic() < deadline:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    killed += 1
            time.sleep(0.05)  # the kernel tears the processes down; nothing to wait on
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(KILL_TIMEOUT_S)
        self.processes = [p for p in self.processes if p.returncode is None]
        return killed

    def link(self, segment: str, *, up: bool) -> None:
        """Take this host's cable on `segment` out (or put it back) at the switch: its frames
        are then dropped silently, as with a cable pulled out of a switch port."""
        ip(
            "-n",
            self.network.switch,
            "link",
            "set",
            f"{self.name}-{segment}",
            "up" if up else "down",
        )

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` in a thread that lives in this host's namespace (its sockets are made here)."""
        if self._thread is None:
            self._thread = concurrent.futures.ThreadPoolExecutor(
                1,
                thread_name_prefix=f"netns-{self.name}",
                initializer=_enter,
                initargs=(self.namespace,),
            )
        return self._thread.submit(fn, *args).result()

    def _socket(self, addr_info: Any) -> socket.socket:
        family, kind, proto, _, _ = addr_info
        return self.call(socket.socket, family, kind, proto)

    def connector(self, **options: Any) -> aiohttp.TCPConnector:
        """An aiohttp connector whose connections start on this host."""
        return aiohttp.TCPConnector(socket_factory=self._socket, **options)

    def http_json(self, url: str, *, timeout_s: float = 5.0) -> tuple[int, Any]:
        """A blocking GET from this host: (status, decoded JSON body or None)."""

        def get() -> tuple[int, Any]:
            try:
                with urllib.request.urlopen(url, timeout=timeout_s) as resp:
                    return resp.status, json.loads(resp.read() or b"null")
            except urllib.error.HTTPError as exc:
                body = exc.read()
                try:
                    return exc.code, json.loads(body or b"null")
                except ValueError:
                    return exc.code, None

        return self.call(get)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)  # the thread holds the namespace alive
            self._thread = None


class Network:
    """Segments (bridges in a switch namespace) and the hosts plugged into them."""

    def __init__(self) -> None:
        self.tag = f"{PREFIX}{os.getpid()}{_letters(next(_counter))}"
        self.switch = f"{self.tag}-sw"
        self.segments: dict[str, ipaddress.IPv4Network] = {}
        self.hosts: dict[str, Host] = {}
        self._links: dict[str, subprocess.Popen[bytes]] = {}
        remove_leftovers()
        self._namespace(self.switch)
        self._switch = Host(self, "sw")

    def _namespace(self, name: str) -> None:
        ip("netns", "add", name)
        ip("-n", name, "link", "set", "lo", "up")

    def add_segment(self, name: str, cidr: str) -> None:
        network = ipaddress.ip_network(cidr)
        assert isinstance(network, ipaddress.IPv4Network) and network.subnet_of(BENCH_RANGE)
        self.segments[name] = network
        ip("-n", self.switch, "link", "add", name, "type", "bridge")
        ip("-n", self.switch, "link", "set", name, "up")

    def add_host(self, name: str, addresses: Mapping[str, str]) -> Host:
        """A host with a veth on each named segment, at the given address."""
        host = Host(self, name)
        self._namespace(host.namespace)
        self.hosts[name] = host
        for segment, address in addresses.items():
            port = f"{name}-{segment}"
            ip("-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", segment,
               "netns", host.namespace)  # fmt: skip
            ip("-n", self.switch, "link", "set", port, "master", segment, "up")
            self._address(host, segment, address)
        return host

    def add_slow_host(
        self, name: str, segment: str, address: str, *, delay_ms: float, loss: float
    ) -> Host:
        """A host whose only cable is tests/slowlink.py: clean until `impair(True)`, then
        frames towards the host are delayed by delay_ms and dropped with probability `loss`."""
        host = Host(self, name)
        self._namespace(host.namespace)
        self.hosts[name] = host
        port = f"{name}-{segment}"
        far = f"{name}-far"
        link = self._switch.spawn(
            [sys.executable, str(ROOT / "tests" / "slowlink.py"), port, far,
             "--delay-ms", str(delay_ms), "--loss", str(loss)],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert link.stdout is not None
        if link.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the slow link of {name} did not start")
        self._links[name] = link
        ip("-n", self.switch, "link", "set", port, "master", segment, "up")
        ip("-n", self.switch, "link", "set", far, "netns", host.namespace)
        ip("-n", host.namespace, "link", "set", far, "name", segment)
        self._address(host, segment, address)
        return host

    def impair(self, host: Host, on: bool) -> None:
        """Turn the delay and loss of `host`'s slow link on or off (waits until it took)."""
        link = self._links[host.name]
        assert link.stdout is not None
        link.send_signal(signal.SIGUSR1 if on else signal.SIGUSR2)
        line = link.stdout.readline().decode()
        if not line.startswith(f"impaired={on}"):
            raise RuntimeError(f"the slow link of {host.name} answered {line!r}")

    def _address(self, host: Host, segment: str, address: str) -> None:
        network = self.segments[segment]
        assert ipaddress.ip_address(address) in network
        ip("-n", host.namespace, "addr", "add", f"{address}/{network.prefixlen}", "dev", segment)
        ip("-n", host.namespace, "link", "set", segment, "up")
        host.addresses[segment] = address

    def close(self) -> None:
        """Kill every process and delete every namespace (veths and bridges go with them)."""
        for host in self.hosts.values():
            host.close()
            host.kill_all()
            ip("netns", "delete", host.namespace, check=False)
        self._switch.kill_all()  # the slow links
        for link in self._links.values():
            if link.stdout is not None:
                link.stdout.close()
        ip("netns", "delete", self.switch, check=False)
        self.hosts.clear()


def _letters(n: int) -> str:
    """0 → a, 25 → z, 26 → ba: a suffix with no digits, so the pid before it stays readable."""
    out = ""
    while True:
        n, r = divmod(n, 26)
        out = chr(ord("a") + r) + out
        if n == 0:
            return out


def wait_for(
    check: Callable[[], bool], *, timeout_s: float, what: str, every_s: float = 0.1
) -> None:
    """Poll `check` until it holds; a clear failure after timeout_s (for processes starting up,
    which signal nothing the test could wait on)."""
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} within {timeout_s:g} s")
        time.sleep(every_s)
