"""The system user PostgreSQL runs as when Pressroom runs as root: one function makes it, once,
however many threads and processes ask for it at the same time (server/queue/embedded.py)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from server.queue.embedded import ensure_run_as_user

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("useradd") is None,
    reason="makes a system user: as root, with useradd",
)

PROCESSES = 6
THREADS = 4
#: One process asking from THREADS threads at once; prints the uid each was given.
ASK = f"""
import pwd, sys, threading
from server.queue.embedded import ensure_run_as_user

name, uids, ready = sys.argv[1], [], threading.Barrier({THREADS})

def ask():
    ready.wait()
    uids.append(pwd.getpwnam(ensure_run_as_user(name)).pw_uid)

threads = [threading.Thread(target=ask) for _ in range({THREADS})]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(*uids)
"""


@pytest.fixture
def new_name() -> Iterator[str]:
    """A user name nobody has (the real one may be in use by the suite's servers)."""
    name = f"prt{uuid.uuid4().hex[:10]}"
    yield name
    subprocess.run(["userdel", name], check=False, capture_output=True)


def test_many_asking_at_once_make_one_user(new_name: str) -> None:
    with pytest.raises(KeyError):
        pwd.getpwnam(new_name)
    asking = [
        subprocess.Popen(
            [sys.executable, "-c", ASK, new_name],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    answers = [proc.communicate(timeout=60) for proc in asking]
    assert [proc.returncode for proc in asking] == [0] * PROCESSES, answers
    made = pwd.getpwnam(new_name)
    assert [out.split() for out, _ in answers] == [[str(made.pw_uid)] * THREADS] * PROCESSES
    # A system user with no home made for it.
    assert not Path(made.pw_dir).exists()

    # Asked again, it is the same user.
    assert ensure_run_as_user(new_name) == new_name
    assert pwd.getpwnam(new_name) == made
