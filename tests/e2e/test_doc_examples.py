"""Every shell (```sh, ```bash) and Python (```python) example of README.md and docs/*.md runs as
written, against a live Pressroom of its page's own, as a reader would run it.

How a page is run:

- Its own `pressroom serve` (a subprocess, dev mode) on a free port, with its own database and
  data folder. The one substitution: `localhost:8080` and `127.0.0.1:8080` in an example's text
  become that port; the CLI and the Python client, which default to http://127.0.0.1:8080,
  find it in PRESSROOM_URL. `.venv/bin` is first on PATH, and DATABASE_URL and
  PRESSROOM_DATA_DIR are the server's, for the operator commands (`pressroom keys create`).
- The working folder is a fresh one that looks like a checkout to the examples: `.venv` (a
  link to this one) and a copy of docs/examples/, the files the examples use.
- The page's blocks run in order in one bash, so variables and `cd` carry over, each block
  under `set -euo pipefail`. A curl that gets an HTTP error fails its block (curl runs with
  `--fail-with-body --show-error`, where a reader would read the problem+json). A live stream
  (`/v1/events` without `wait=`), which a reader stops with Ctrl-C, is stopped after LIVE_S.
- A Python block runs with the venv's python, in that bash (its environment and folder),
  within BLOCK_S. A Python block that serves (`web.run_app(...)`) is started in the background
  once the block before it has run, awaited until it listens, and stopped with SIGINT after the
  page's last block; what it is sent (a webhook) is checked below.
- After each block, the jobs, combined batch files and webhook deliveries it made must end
  well: every job done without warnings, every join done, every delivery delivered. An example
  that fails fails the test with its page, its first line and its output.
- A block that cannot run here is marked in its page by `<!-- not run: REASON -->` on the line
  before it, and listed in NOT_RUN with the same reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from tests import testca
from tests.processes import PressroomProcess, free_port, wait_until

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
EXAMPLES = ROOT / "docs" / "examples"
LANGUAGES = {"sh": "sh", "bash": "sh", "python": "python"}
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>[\w+-]*)\s*$")
NOT_RUN_MARK = re.compile(r"^\s*<!-- not run: (?P<reason>.+?) -->\s*$")
ADDRESS = re.compile(r"\b(localhost|127\.0\.0\.1):8080\b")
PYTHON = ROOT / ".venv" / "bin" / "python"

BLOCK_S = 30.0  # one block
PYTHON_S = 25.0  # a Python block (its `timeout`, within BLOCK_S)
LIVE_S = 1  # a live stream, before it is stopped as by Ctrl-C
SETTLE_S = 30.0  # the jobs, joins and deliveries of one block

#: The blocks that do not run here, by page and first line, with why (as marked in the page).
NOT_RUN = {
    (
        "README.md",
        "make run    # installs what it needs, starts Pressroom; dashboard at http://127.0.0.1:8080",
    ): "starts Pressroom on port 8080 until stopped, and runs the whole suite",
    (
        "docs/cors.md",
        "PRESSROOM_CORS_ORIGINS=https://app.example.com,http://localhost:5173 pressroom serve",
    ): "starts a second Pressroom on port 8080, until stopped",
    (
        "docs/development.md",
        "make test          # the suite (unit, integration on real PostgreSQL, e2e on real "
        "Chromium)",
    ): "runs the whole suite, this test among it",
    (
        "docs/development.md",
        ".venv/bin/python -m bench.accept     # POST /v1/jobs: 32 clients, and p50/p99 at 500 "
        "req/s, vs a bare aiohttp handler running the same insert",
    ): "benchmarks take minutes each, on an idle machine",
    (
        "docs/documents.md",
        "# A page your app already serves: Chromium opens it, scripts on, and prints it.",
    ): "needs your app's page at https://app.example.com",
    (
        "docs/operations.md",
        "# AWS S3: credentials from the process's IAM role (EKS IRSA, ECS task role, EC2 instance",
    ): "needs a bucket of yours (AWS S3, R2 or MinIO)",
    (
        "docs/operations.md",
        "pressroom backup /var/backups/pressroom-2026-12-03     # while Pressroom runs on "
        ".pressroom/",
    ): "backs up the embedded default, and this page's server runs on DATABASE_URL "
    "(tests/e2e/test_backup.py runs both commands)",
    (
        "docs/operations.md",
        "# 1. The database (a physical base backup; with WAL archiving, point-in-time recovery "
        "too)",
    ): "needs a PostgreSQL and a bucket of yours",
    (
        "docs/reliability.md",
        ".venv/bin/python -m pytest tests/faults -q -s",
    ): "the fault tests, which the suite runs itself",
    (
        "docs/reliability.md",
        ".venv/bin/python -m pytest tests/faults/test_hosts.py tests/faults/test_failover.py -q -s",
    ): "the fault tests, which the suite runs itself",
}

#: What a page's server needs beyond the defaults: a local webhook receiver, a signing key.
ALLOW_LOCAL_WEBHOOKS = {"docs/webhooks.md"}
SIGNING = {"docs/documents.md"}

PRELUDE = f"""\
set -euo pipefail
curl() {{
  local arg
  for arg; do
    if [[ $arg == *"/v1/events"* && $arg != *"wait="* ]]; then
      command curl --fail-with-body --max-time {LIVE_S} "$@" || [[ $? == 28 ]]
      return
    fi
  done
  command curl --fail-with-body --show-error "$@"
}}
"""


@dataclasses.dataclass(frozen=True)
class Block:
    page: str  # relative to the repository
    line: int  # of the opening fence
    language: str  # "sh" or "python"
    code: str
    not_run: str | None  # the reason its marker gives

    @property
    def first_line(self) -> str:
        return next(line for line in self.code.splitlines() if line.strip())

    @property
    def serves(self) -> bool:
        return self.language == "python" and "run_app(" in self.code

    def where(self) -> str:
        return f"{self.page}:{self.line} ({self.first_line!r})"


def blocks(page: Path) -> list[Block]:
    """The page's sh, bash and python blocks, dedented, with the reason of a not-run marker."""
    found: list[Block] = []
    lines = page.read_text().splitlines()
    n = 0
    while n < len(lines):
        fence = FENCE.match(lines[n])
        if fence is None:
            n += 1
            continue
        end = next(i for i in range(n + 1, len(lines)) if lines[i].strip() == "```")
        language = LANGUAGES.get(fence["language"])
        if language is not None:
            indent = len(fence["indent"])
            code = "\n".join(line[indent:] for line in lines[n + 1 : end]) + "\n"
            marker = NOT_RUN_MARK.match(lines[n - 1]) if n else None
            reason = marker["reason"] if marker else None
            found.append(Block(str(page.relative_to(ROOT)), n + 1, language, code, reason))
        n = end + 1
    return found


RUN_PAGES = [page for page in PAGES if any(b.not_run is None for b in blocks(page))]


def test_the_blocks_not_run_are_marked_and_listed() -> None:
    marked = {(b.page, b.first_line): b.not_run for p in PAGES for b in blocks(p) if b.not_run}
    assert marked == NOT_RUN


class ExampleFailed(Exception):
    pass


class Session:
    """A page's bash, fed one block at a time; each block's output (stdout and stderr, as a
    terminal shows them) is what came before the marker the block is followed by."""

    def __init__(self, cwd: Path, env: dict[str, str], scripts: Path) -> None:
        self.cwd, self.env, self.scripts = cwd, env, scripts
        self.marker = f"@@example-{uuid.uuid4().hex}@@"
        self.proc: asyncio.subprocess.Process | None = None
        self.pending = b""
        self.pwd = str(cwd)  # the shell's folder after the last block

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            "bash",
            "--noprofile",
            "--norc",
            cwd=self.cwd,
            env=self.env,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        await self._send(PRELUDE)

    async def _send(self, commands: str) -> str:
        """Run these commands; what they printed. The marker line printed after them also
        says where the shell is (self.pwd)."""
        assert self.proc is not None and self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(f"{commands}\nprintf '\\n%s %s\\n' {self.marker} \"$PWD\"\n".encode())
        await self.proc.stdin.drain()
        buffer = self.pending
        end = self.marker.encode()
        try:
            async with asyncio.timeout(BLOCK_S):
                while end not in buffer:
                    chunk = await self.proc.stdout.read(65536)
                    if not chunk:
                        code = await self.proc.wait()
                        raise ExampleFailed(f"exit status {code}\n{_text(buffer)}")
                    buffer += chunk
        except TimeoutError:
            self.kill()
            raise ExampleFailed(f"no end after {BLOCK_S:g} s\n{_text(buffer)}") from None
        printed, _, rest = buffer.partition(end)
        line, _, self.pending = rest.partition(b"\n")
        self.pwd = line.decode().strip()
        return _text(printed.removesuffix(b"\n"))

    async def run(self, block: Block, number: int) -> str:
        script = self.scripts / f"{number}.{'py' if block.language == 'python' else 'sh'}"
        script.write_text(block.code)
        if block.language == "python":
            return await self._send(f"timeout {PYTHON_S:g} {PYTHON} {script} </dev/null")
        return await self._send(f"source {script} </dev/null")

    async def environment(self) -> dict[str, str]:
        """The shell's exported variables, as a program it started would see them."""
        dump = self.scripts / "environment"
        await self._send(f"env -0 > {dump}")
        pairs = dump.read_bytes().decode().split("\0")
        return dict(pair.split("=", 1) for pair in pairs if "=" in pair)

    def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            os.killpg(self.proc.pid, signal.SIGKILL)

    async def close(self) -> None:
        self.kill()
        if self.proc is not None:
            await self.proc.wait()


def _text(data: bytes) -> str:
    return data.decode(errors="replace")


class Background:
    """A Python block that serves (a webhook receiver), started in the session's folder and
    environment, awaited until it listens and stopped as by Ctrl-C."""

    def __init__(self, block: Block, script: Path) -> None:
        self.block, self.script = block, script
        self.proc: asyncio.subprocess.Process | None = None
        self.output = b""

    async def start(self, cwd: str, env: dict[str, str]) -> None:
        self.script.write_text(self.block.code)
        self.proc = await asyncio.create_subprocess_exec(
            PYTHON,
            "-u",
            self.script,
            cwd=cwd,
            env=env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        assert self.proc.stdout is not None
        try:
            async with asyncio.timeout(BLOCK_S):
                while b"Running on" not in self.output:  # aiohttp's line once it listens
                    line = await self.proc.stdout.readline()
                    if not line:
                        raise ExampleFailed(f"it ended at its start\n{_text(self.output)}")
                    self.output += line
        except TimeoutError:
            said = _text(self.output)
            raise ExampleFailed(f"not listening after {BLOCK_S:g} s\n{said}") from None

    async def stop(self) -> str:
        if self.proc is None:
            return ""
        assert self.proc.stdout is not None
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(10):
                self.output += await self.proc.stdout.read()
                await self.proc.wait()
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        return _text(self.output)


UNSETTLED = """
SELECT (SELECT count(*) FROM jobs WHERE status IN ('queued', 'running'))
     + (SELECT count(*) FROM batch_combines WHERE status IN ('waiting', 'pending', 'running'))
     + (SELECT count(*) FROM webhook_deliveries WHERE status = 'pending')
"""
OUTCOMES = """
SELECT id::text AS id, 'job ' || id AS what,
       CASE WHEN status = 'done' AND warnings <> '[]' THEN 'done with warnings' ELSE status
       END AS status,
       coalesce(error, CASE WHEN warnings <> '[]' THEN warnings::text END) AS error
FROM jobs
UNION ALL
SELECT 'combined ' || batch_id, 'the combined PDF of batch ' || batch_id, status, error
FROM batch_combines
UNION ALL
SELECT id::text, type || ' webhook to ' || url, status,
       concat_ws(': ', last_status_code, last_error)
FROM webhook_deliveries
"""
WELL = {"done", "delivered"}


async def ended_badly(dsn: str, seen: set[str]) -> list[str]:
    """Once every job, join and delivery is over: those not in `seen` that ended badly (all of
    them are in `seen` afterwards)."""
    with contextlib.suppress(TimeoutError):  # what is still on its way is reported below
        await wait_until(dsn, UNSETTLED, 0, timeout_s=SETTLE_S)
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(OUTCOMES)
    finally:
        await conn.close()
    bad = [
        f"{row['what']} is {row['status']}" + (f": {row['error']}" if row["error"] else "")
        for row in rows
        if row["id"] not in seen and row["status"] not in WELL
    ]
    seen.update(row["id"] for row in rows)
    return bad


@contextlib.asynccontextmanager
async def pressroom(dsn: str, folder: Path, page: str) -> AsyncIterator[tuple[int, Path]]:
    """The page's own `pressroom serve`, ready: its port and data folder."""
    port, data = free_port(), folder / "data"
    env = {"DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": str(data), "PRESSROOM_PORT": str(port)}
    if page in ALLOW_LOCAL_WEBHOOKS:
        env["PRESSROOM_ALLOW_HOSTS"] = "127.0.0.1"
    if page in SIGNING:
        ca = testca.make(folder)
        env["PRESSROOM_SIGNING_KEY"] = str(ca.p12)
        env["PRESSROOM_SIGNING_KEY_PASSWORD"] = ca.password
    server = PressroomProcess("serve", env, folder / "serve.log")
    await server.start()
    try:
        async with aiohttp.ClientSession() as http:
            async with asyncio.timeout(60):
                while not await _ready(http, f"http://127.0.0.1:{port}/readyz"):
                    assert server.proc is not None and server.proc.returncode is None, server.log()
                    await asyncio.sleep(0.1)  # the process is starting: nothing to wait on
        yield port, data
    finally:
        await server.stop()


async def _ready(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as resp:
            return resp.status == 200
    except aiohttp.ClientError:
        return False


def workspace(folder: Path) -> Path:
    """A folder that looks like a checkout to the examples: .venv and docs/examples."""
    cwd = folder / "checkout"
    shutil.copytree(EXAMPLES, cwd / "docs" / "examples")
    (cwd / ".venv").symlink_to(ROOT / ".venv")
    return cwd


def page_env(dsn: str, data: Path, port: int) -> dict[str, str]:
    inherited = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("PRESSROOM_", "DATABASE_URL", "VIRTUAL_ENV", "PYTEST_"))
    }
    return {
        **inherited,
        "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(data),
        "PRESSROOM_URL": f"http://127.0.0.1:{port}",
    }


async def run_page(
    page: Path, port: int, dsn: str, session: Session, servers: list[Background]
) -> int:
    """Run the page's blocks in order; how many ran. Raises ExampleFailed naming the block."""
    seen: set[str] = set()
    ran = 0
    for number, block in enumerate(blocks(page)):
        if block.not_run is not None:
            continue
        runnable = dataclasses.replace(block, code=ADDRESS.sub(rf"\1:{port}", block.code))
        output = ""
        try:
            if block.serves:
                servers.append(Background(runnable, session.scripts / f"{number}.py"))
                await servers[-1].start(session.pwd, await session.environment())
            else:
                output = await session.run(runnable, number)
        except ExampleFailed as exc:
            raise ExampleFailed(f"{block.where()} failed: {exc}") from None
        bad = await ended_badly(dsn, seen)
        if bad:
            raise ExampleFailed(f"{block.where()}: " + "\n".join(bad) + f"\n{output}")
        ran += 1
    return ran


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.parametrize("page", RUN_PAGES, ids=[str(p.relative_to(ROOT)) for p in RUN_PAGES])
async def test_the_examples_of_a_page_run_as_written(page: Path, dsn: str, tmp_path: Path) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    servers: list[Background] = []
    failure, ran = "", 0
    async with pressroom(dsn, tmp_path, str(page.relative_to(ROOT))) as (port, data):
        session = Session(workspace(tmp_path), page_env(dsn, data, port), scripts)
        try:
            await session.start()
            ran = await run_page(page, port, dsn, session, servers)
        except ExampleFailed as exc:
            failure = str(exc)
        finally:
            await session.close()
            served = [await server.stop() for server in servers]
    if failure:
        for server, output in zip(servers, served, strict=True):
            failure += f"\n{server.block.where()} printed:\n{output}"
        pytest.fail(failure, pytrace=False)
    assert ran
