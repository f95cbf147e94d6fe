"""The CLI end to end: `python -m server serve` on a free port with real Chromium, and the
`pressroom` commands run against it as processes, on a terminal (a pseudo-terminal) and not."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import pty
import signal
import sys
from collections.abc import AsyncIterator
from io import BytesIO
from pathlib import Path

import asyncpg
import pytest
from pypdf import PdfReader

from pressroom.client import AsyncClient
from tests.e2e.test_render import pdf_text
from tests.processes import free_port

pytestmark = [pytest.mark.browser, pytest.mark.slow]

START_TIMEOUT_S = 90


@dataclasses.dataclass
class Server:
    url: str
    dsn: str
    env: dict[str, str]
    log: list[str]
    logged: asyncio.Event  # set at each line added to `log`


@dataclasses.dataclass
class Finished:
    code: int
    out: str
    err: str


@pytest.fixture
async def server(dsn: str, tmp_path: Path) -> AsyncIterator[Server]:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "server"),
        "PRESSROOM_HOST": "127.0.0.1",
        "PRESSROOM_PORT": str(port),
        "PRESSROOM_RENDER_SLOTS": "1",
        "PRESSROOM_LOG_LEVEL": "INFO",
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "serve",
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    assert proc.stderr is not None
    log: list[str] = []
    async with asyncio.timeout(START_TIMEOUT_S):
        while not any("Pressroom is ready" in line for line in log):
            line = await proc.stderr.readline()
            assert line, "the server stopped:\n" + "".join(log)
            log.append(line.decode(errors="replace"))

    async def drain() -> None:  # a full pipe would stall the server
        assert proc.stderr is not None
        while line := await proc.stderr.readline():
            log.append(line.decode(errors="replace"))
            logged.set()

    logged = asyncio.Event()
    drainer = asyncio.create_task(drain())
    client_env = {k: v for k, v in os.environ.items() if not k.startswith("PRESSROOM_")}
    yield Server(
        f"http://127.0.0.1:{port}",
        dsn,
        {**client_env, "PRESSROOM_URL": f"http://127.0.0.1:{port}"},
        log,
        logged,
    )
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(proc.wait(), 30)
    except TimeoutError:
        proc.kill()
        await proc.wait()
    drainer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await drainer


async def pressroom(server: Server, *args: str, cwd: Path | None = None) -> Finished:
    """Run `pressroom ARGS` with stdout and stderr as pipes (not a terminal)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        *args,
        env=server.env,
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 90)
    assert proc.returncode is not None
    return Finished(proc.returncode, out.decode(), err.decode())


def read_until_closed(fd: int) -> bytes:
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


async def pressroom_on_a_terminal(server: Server, *args: str) -> tuple[int, str]:
    """Run `pressroom ARGS` with stdout on a pseudo-terminal; returns what the terminal saw."""
    controller, terminal = pty.openpty()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        *args,
        env={**server.env, "COLUMNS": "160"},
        stdout=terminal,
        stderr=asyncio.subprocess.PIPE,
    )
    os.close(terminal)
    try:
        screen = await asyncio.to_thread(read_until_closed, controller)
        await asyncio.wait_for(proc.wait(), 90)
    finally:
        os.close(controller)
    assert proc.returncode is not None
    return proc.returncode, screen.decode()


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


async def test_submit_with_progress_on_a_terminal(server: Server, tmp_path: Path) -> None:
    template = write(tmp_path, "hello.html", "<h1>Hello {{name}}</h1>")
    data = write(tmp_path, "data.json", json.dumps({"name": "Ana"}))
    out = tmp_path / "hello.pdf"
    code, screen = await pressroom_on_a_terminal(
        server, "submit", str(template), "--data", str(data), "-o", "format=A5", "--out", str(out)
    )
    assert code == 0, screen
    # The live line is redrawn in place: carriage return + erase line, ending on a full bar.
    assert "\r\x1b[2K[" in screen
    assert "[########################] 100%  done" in screen
    assert f"saved {out} (1 page" in screen
    assert "Hello Ana" in pdf_text(out.read_bytes())
    assert not [name for name in os.listdir(tmp_path) if name.endswith(".part")]


async def test_submit_in_plain_lines_and_failures_exit_non_zero(
    server: Server, tmp_path: Path
) -> None:
    template = write(tmp_path, "hello.html", "<p>Hi {{name}}</p>")
    data = write(tmp_path, "data.json", json.dumps({"name": "Bo"}))
    out = tmp_path / "hi.pdf"
    done = await pressroom(server, "submit", str(template), "--data", str(data), "--out", str(out))
    assert done.code == 0, done.err
    assert "\r" not in done.out and "\x1b" not in done.out
    lines = done.out.splitlines()
    job_id = lines[0].split()[1]
    assert lines[:3] == [f"job {job_id} queued", f"job {job_id} running", f"job {job_id} done"]
    assert lines[3].startswith(f"saved {out} (1 page, ")
    assert "Hi Bo" in pdf_text(out.read_bytes())

    broken = write(tmp_path, "broken.html", "<p>{{ 1 // 0 }}</p>")
    failed = await pressroom(server, "submit", str(broken), "--wait")
    assert failed.code == 1
    assert "failed: template error: ZeroDivisionError" in failed.err
    assert failed.out.splitlines()[-1].split()[2] == "failed"

    queued = await pressroom(server, "submit", str(template), "--data", str(data))
    assert queued.code == 0 and len(queued.out.strip()) == 36  # the job id, for scripts

    usage = await pressroom(server, "submit", str(template), "-o", "scale=9")
    assert usage.code == 2 and "options.scale: must be between 0.1 and 2" in usage.err

    listed = await pressroom(server, "jobs")
    assert listed.code == 0
    assert job_id in listed.out and queued.out.strip() in listed.out
    assert "ZeroDivisionError" in listed.out

    async with AsyncClient(server.url) as client:
        await client.create_template(
            "greeting", "<p>Greetings {{name}}</p>", options={"format": "A6"}
        )
    stored = await pressroom(
        server, "submit", "--template-id", "greeting@1", "--data", str(data), "--out", str(out)
    )
    assert stored.code == 0, stored.err
    assert "Greetings Bo" in pdf_text(out.read_bytes())
    box = PdfReader(out).pages[0].mediabox
    assert round(float(box.width) * 25.4 / 72) == 105, "A6, from the stored template's options"


async def test_watch_follows_every_event(server: Server, tmp_path: Path) -> None:
    template = write(tmp_path, "w.html", "<p>watched</p>")
    submitted = await pressroom(server, "submit", str(template), "--wait")
    assert submitted.code == 0
    job_id = submitted.out.split()[1]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "watch",
        "--last-event-id",
        "0",  # from the oldest event kept
        env=server.env,
        stdout=asyncio.subprocess.PIPE,
        preexec_fn=as_from_a_terminal,
    )
    assert proc.stdout is not None
    seen: list[str] = []
    try:
        async with asyncio.timeout(30):
            while not any("job.done" in line for line in seen):
                seen.append((await proc.stdout.readline()).decode())
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            await asyncio.wait_for(proc.wait(), 15)
        except TimeoutError:
            # Seen in full runs of the suite and never alone: a Ctrl-C did not end watch, and
            # py-spy found it idle in its event loop, as if SIGINT never arrived (hence
            # as_from_a_terminal). Its signal masks and stacks go to stderr, which a failure
            # shows; a second Ctrl-C, as a user would press, must end it.
            stacks, state = await where_it_waits(proc.pid), signal_state(proc.pid)
            print(f"watch ignored SIGINT ({state}); it waited in:\n{stacks}", file=sys.stderr)
            proc.send_signal(signal.SIGINT)
            await asyncio.wait_for(proc.wait(), 15)
    assert [line.split()[1] for line in seen] == ["job.queued", "job.running", "job.done"]
    assert all(f"job {job_id}" in line for line in seen)
    assert proc.returncode == 0


async def test_watch_into_a_reader_that_stops_ends_quietly(server: Server, tmp_path: Path) -> None:
    template = write(tmp_path, "w.html", "<p>watched</p>")
    assert (await pressroom(server, "submit", str(template), "--wait")).code == 0
    # `pressroom watch --last-event-id 0 | head -1`: the reader takes a line and leaves.
    read_end, write_end = os.pipe()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "watch",
        "--last-event-id",
        "0",
        env=server.env,
        stdout=write_end,
        stderr=asyncio.subprocess.PIPE,
    )
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        first = await asyncio.wait_for(asyncio.to_thread(reader.readline), 30)
    assert b"job.queued" in first
    # What comes next has no reader: the next line watch writes ends it.
    assert (await pressroom(server, "submit", str(template), "--wait")).code == 0
    _out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0
    assert err.decode() == "", "no traceback, no message: the reader chose to stop"


async def test_dev_mode_logs_where_the_webhook_secret_is_not_the_secret(
    server: Server, tmp_path: Path
) -> None:
    secret_file = tmp_path / "server" / "webhook_secret"
    secret = secret_file.read_text().strip()
    assert secret.startswith("whsec_")
    log = "".join(server.log)
    assert str(secret_file) in log
    assert secret not in log and secret.removeprefix("whsec_") not in log


def as_from_a_terminal() -> None:
    """In the child before it starts: SIGINT as a shell gives it (handled, not blocked), not as
    the test's worker process may have left it; a blocked or ignored SIGINT is inherited."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_state(pid: int) -> str:
    """The signal masks of process `pid` (blocked, ignored, caught), from /proc."""
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return ", ".join(line for line in lines if line.startswith(("SigBlk", "SigIgn", "SigCgt")))


async def where_it_waits(pid: int) -> str:
    """The Python stacks of process `pid` (py-spy dump), for the test's stderr."""
    spy = Path(sys.executable).with_name("py-spy")
    dump = await asyncio.create_subprocess_exec(
        str(spy),
        "dump",
        "--pid",
        str(pid),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await dump.communicate()
    return out.decode(errors="replace")


def write_manifest(folder: Path, count: int) -> Path:
    write(folder, "invoice.html", "<h1>{{title}}</h1>" + "<p>line</p>" * 40)
    entries = [
        {"id": f"invoice-{n:02d}", "html": "invoice.html", "data": {"title": f"Invoice {n:02d}"}}
        for n in range(count)
    ]
    return write(folder, "manifest.json", json.dumps(entries))


async def test_batch_killed_halfway_resumes_without_submitting_twice(
    server: Server, tmp_path: Path
) -> None:
    manifest = write_manifest(tmp_path, 8)
    outdir = tmp_path / "out"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "server",
        "batch",
        str(manifest),
        str(outdir),
        env=server.env,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    saved_before: list[str] = []
    async with asyncio.timeout(60):
        while len(saved_before) < 3:
            line = (await proc.stdout.readline()).decode()
            assert line, "the batch ended before it was killed"
            if line.startswith("saved "):
                saved_before.append(line.split()[1])
    proc.send_signal(signal.SIGKILL)
    await proc.wait()

    state = json.loads((outdir / ".pressroom-batch.json").read_text())
    assert len(state["items"]) == 8, "accepted jobs are recorded before waiting"
    kept = {key: os.stat(outdir / f"{key}.pdf").st_ino for key in saved_before}
    assert all(state["items"][key]["saved"] for key in saved_before)

    again = await pressroom(server, "batch", str(manifest), str(outdir))
    assert again.code == 0, again.err
    first_line, last_line = again.out.splitlines()[0], again.out.splitlines()[-1]
    assert first_line.startswith(f"batch {state['batch_id']}: 8 documents, ")
    assert int(first_line.split(", ")[1].split()[0]) >= 3
    assert last_line == f"8 saved, 0 failed, in {outdir}"

    conn = await asyncpg.connect(server.dsn)
    try:
        assert await conn.fetchval("SELECT count(*) FROM jobs") == 8, "no job submitted twice"
        assert await conn.fetchval("SELECT count(*) FROM batches") == 1
    finally:
        await conn.close()
    pdfs = sorted(p.name for p in outdir.iterdir() if p.name != ".pressroom-batch.json")
    assert pdfs == [f"invoice-{n:02d}.pdf" for n in range(8)]
    for n, name in enumerate(pdfs):
        data = (outdir / name).read_bytes()
        assert data.startswith(b"%PDF-")
        assert len(PdfReader(BytesIO(data)).pages) >= 1
        assert f"Invoice {n:02d}" in pdf_text(data)
    # What was saved before the kill was not downloaded again.
    assert {key: os.stat(outdir / f"{key}.pdf").st_ino for key in saved_before} == kept

    third = await pressroom(server, "batch", str(manifest), str(outdir))
    assert third.code == 0 and "8 documents, 8 already saved" in third.out


async def test_batch_combine_writes_one_pdf_in_manifest_order(
    server: Server, tmp_path: Path
) -> None:
    manifest = write_manifest(tmp_path, 3)
    outdir, combined = tmp_path / "out", tmp_path / "all-invoices.pdf"
    done = await pressroom(server, "batch", str(manifest), str(outdir), "--combine", str(combined))
    assert done.code == 0, done.err
    assert f"saved the combined PDF -> {combined}" in done.out

    joined = PdfReader(combined)
    items = [PdfReader(outdir / f"invoice-{n:02d}.pdf") for n in range(3)]
    assert len(joined.pages) == sum(len(item.pages) for item in items)
    # Chromium's pages, as the items have them, one item after the other.
    texts = [page.extract_text() for page in joined.pages]
    assert texts == [page.extract_text() for item in items for page in item.pages]
    assert [n for n, text in enumerate(texts) if "Invoice" in text] == [
        sum(len(item.pages) for item in items[:n]) for n in range(3)
    ]
    outline = [entry for entry in joined.outline if not isinstance(entry, list)]
    assert [entry.title for entry in outline] == ["invoice-00", "invoice-01", "invoice-02"]
    firsts = [joined.get_destination_page_number(entry) for entry in outline]
    assert firsts == [sum(len(item.pages) for item in items[:n]) for n in range(3)]

    again = await pressroom(server, "batch", str(manifest), str(outdir), "--combine", str(combined))
    assert again.code == 0, again.err
    assert "3 documents, 3 already saved" in again.out and "combined" not in again.out


async def test_batch_lists_failed_items_and_exits_non_zero(server: Server, tmp_path: Path) -> None:
    write(tmp_path, "good.html", "<p>{{word}}</p>")
    write(tmp_path, "bad.html", "<p>{{ word.missing.deeper }}</p>")
    manifest = write(
        tmp_path,
        "manifest.json",
        json.dumps(
            [
                {"id": "good", "html": "good.html", "data": {"word": "fine"}},
                {"id": "bad", "html": "bad.html", "data": {"word": "x"}},
            ]
        ),
    )
    outdir = tmp_path / "out"
    code, screen = await pressroom_on_a_terminal(server, "batch", str(manifest), str(outdir))
    assert code == 1, screen
    assert "[########################] 100%  1/2 saved, 1 failed" in screen
    assert "failed bad: template error" in screen
    assert sorted(p.name for p in outdir.glob("*.pdf")) == ["good.pdf"]
    # The key with other content is refused by the server; the run says which and stops.
    write(tmp_path, "good.html", "<p>{{word}}!</p>")
    refused = await pressroom(server, "batch", str(manifest), str(outdir))
    assert refused.code == 2 and "'good' was already used with different content" in refused.err


async def test_serve_answers_a_request_it_cannot_parse_with_problem_json(server: Server) -> None:
    port = int(server.url.rsplit(":", 1)[1])
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /v1/jobs HTTP/1.1\r\nHost: p\r\nContent-Length: 5\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    )
    async with asyncio.timeout(10):
        answer = await reader.read()
    writer.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 400 ") and b"application/problem+json" in head, head
    assert json.loads(body)["type"].endswith("/malformed-request")
    async with asyncio.timeout(10):
        while True:
            server.logged.clear()  # before looking, so a line added meanwhile still wakes us
            if any("refused a malformed HTTP request" in line for line in server.log):
                break
            await server.logged.wait()
    [line] = [line for line in server.log if "malformed HTTP request" in line]
    assert " WARNING server.web.protocol: " in line and "Traceback" not in "".join(server.log)
