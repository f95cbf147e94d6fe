"""`pressroom backup` and `pressroom restore` on the embedded default: a backup made while
`pressroom serve` renders jobs restores into a new data folder with its jobs, events,
templates, assets, keys and files; a job is done in it only with its file; signed links and
tokens still verify, a stream resumes from its cursor with exactly the events after it, and the
jobs that were running finish. No file goes between the database copy and the files copy. A
backup that is incomplete, damaged or of another format, and a data folder that is not empty,
are refused with nothing changed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest
from yarl import URL

from server.cli import backup, restore
from server.files import assets
from server.files.storage import LocalStorage
from server.queue import db, retention
from server.queue.embedded import EmbeddedPostgres
from server.settings import Settings
from tests.processes import PressroomProcess, free_port, run_pressroom, wait_ready, wait_until
from tests.sse import Message, messages
from tests.tenants import bearer
from tests.timings import as_env

pytestmark = pytest.mark.slow

#: Leases run out soon after a process goes, and the rescuer looks often: a job that was
#: running in the backup is queued again soon after the restored server starts.
TIMINGS = as_env(LEASE_S=2, RESCUE_INTERVAL_S=0.5)
SLOW_JOBS = 8
DELAY_MS = 4000  # each slow job keeps its render slot this long: some run during the backup
STYLE = b"p { color: #123456 }"
WAITING = (
    "SELECT count(*) FROM pg_stat_activity "
    "WHERE query = $$" + backup.STILL_OPEN + "$$ AND pid <> pg_backend_pid()"
)


def embedded(data: Path, port: int | None = None) -> dict[str, str]:
    """The variables of a Pressroom on the embedded default in `data`, whatever this
    machine's DATABASE_URL or storage: a blank value is an unset one."""
    env = {"DATABASE_URL": "", "PRESSROOM_STORAGE": "", "PRESSROOM_DATA_DIR": str(data)}
    if port is not None:
        env["PRESSROOM_PORT"] = str(port)
    return env


@contextlib.asynccontextmanager
async def serving(command: str, env: dict[str, str], log: Path) -> AsyncIterator[str]:
    """`pressroom COMMAND` running and ready; its base URL."""
    server = PressroomProcess(command, {**env, **TIMINGS, "PRESSROOM_RENDER_SLOTS": "2"}, log)
    await server.start()
    try:
        base = f"http://127.0.0.1:{env['PRESSROOM_PORT']}"
        async with aiohttp.ClientSession() as http:
            await wait_ready(http, base)
        yield base
    finally:
        assert await server.stop() == 0, server.log()


@contextlib.asynccontextmanager
async def opened(cluster: Path) -> AsyncIterator[asyncpg.Connection]:
    """The cluster in `cluster` started by this process, and a connection to it."""
    server = EmbeddedPostgres(cluster)
    try:
        conn = await db.connect(await server.start())
        try:
            yield conn
        finally:
            await conn.close()
    finally:
        await server.stop()


async def answer(resp: aiohttp.ClientResponse, status: int) -> dict[str, object]:
    body: dict[str, object] = await resp.json(content_type=None)
    assert resp.status == status, body
    return body


async def submit(http: aiohttp.ClientSession, base: str, body: dict[str, object]) -> str:
    async with http.post(f"{base}/v1/jobs", json=body) as resp:
        return str((await answer(resp, 202))["id"])


async def until_running(http: aiohttp.ClientSession, base: str, job_id: str) -> None:
    async with asyncio.timeout(60), http.get(f"{base}/v1/jobs/{job_id}/events") as resp:
        async for message in messages(resp):
            if message.event == "job.running":
                return


async def resumed(
    http: aiohttp.ClientSession, url: str, cursor: str, jobs: set[str]
) -> list[Message]:
    """The events of the all-jobs stream after `cursor`, until each of `jobs` is done."""
    got: list[Message] = []
    waiting = set(jobs)
    async with asyncio.timeout(90), http.get(url, headers={"Last-Event-ID": cursor}) as resp:
        assert resp.status == 200, await resp.text()
        async for message in messages(resp):
            got.append(message)
            if message.event == "job.done":
                waiting.discard(message.json["job"]["id"])
            if not waiting:
                return got
    raise AssertionError(f"the stream ended before {sorted(waiting)} were done")


@pytest.mark.browser
@pytest.mark.timeout(300)
async def test_a_backup_made_while_jobs_render_restores_them_whole(tmp_path: Path) -> None:
    env = embedded(tmp_path / "data", free_port())
    code, key, err = await run_pressroom(env, "keys", "create", "--tenant", "acme")
    assert code == 0, err
    auth = bearer(key.strip())
    saved = tmp_path / "backup"
    async with (
        serving("serve", env, tmp_path / "serve.log") as base,
        aiohttp.ClientSession(headers=auth) as http,
    ):
        async with http.post(
            f"{base}/v1/assets", data=STYLE, headers={"Content-Type": "text/css"}
        ) as resp:
            asset_id = str((await answer(resp, 201))["id"])
        template = {
            "name": "note",
            "html": '<link rel="stylesheet" href="style.css"><p>{{ n }}',
            "publish": True,
        }
        async with http.post(f"{base}/v1/templates", json=template) as resp:
            await answer(resp, 201)
        first = await submit(
            http, base, {"template_id": "note", "data": {"n": 0}, "assets": {"style.css": asset_id}}
        )
        async with http.get(f"{base}/v1/jobs/{first}/events") as resp:
            history = [message async for message in messages(resp)]
        assert history[-1].event == "job.done"
        cursor = str(history[-1].id)  # where a client's stream stood at the backup
        async with http.get(f"{base}/v1/jobs/{first}") as resp:
            link = str((await answer(resp, 200))["url"])
        async with aiohttp.request("GET", link) as resp:
            assert resp.status == 200
            pdf = await resp.read()
        async with http.post(f"{base}/v1/tokens", json={}) as resp:
            token = str((await answer(resp, 200))["token"])
        slow = [
            await submit(
                http,
                base,
                {
                    "template": "<p>{{ n }}</p>",
                    "data": {"n": n},
                    "options": {"wait_delay_ms": DELAY_MS},
                },
            )
            for n in range(1, SLOW_JOBS + 1)
        ]
        await until_running(http, base, slow[0])
        code, out, err = await run_pressroom(env, "backup", str(saved))
        assert (code, err) == (0, ""), err
        assert out.startswith(f"backed up Pressroom to {saved}: {SLOW_JOBS + 1} jobs (")

    data = tmp_path / "restored"
    restored = embedded(data, free_port())
    code, out, err = await run_pressroom(restored, "restore", str(saved))
    assert (code, err) == (0, ""), err
    assert f"into {data}: {SLOW_JOBS + 1} jobs" in out

    # What the backup holds, before any process runs on it.
    async with opened(data / "postgres") as conn:
        held = {
            str(row["id"]): row
            for row in await conn.fetch("SELECT id, status, object_key, bytes, attempts FROM jobs")
        }
        after_cursor = [
            str(row["id"])
            for row in await conn.fetch(
                "SELECT id FROM job_events WHERE (xid, id) > "
                "(SELECT xid, id FROM job_events WHERE id = $1) ORDER BY xid, id",
                int(cursor),
            )
        ]
        next_id = int(await conn.fetchval("SELECT job_events_next_id()"))
    # The ids from the backup's next one on were the lost installation's, and are never given
    # out again: the restored server's begin past them, and a cursor among them is reset.
    assert next_id > restore.LOST_EVENT_IDS
    lost_cursor = str(next_id - restore.LOST_EVENT_IDS + 2)
    assert set(held) == {first, *slow}
    assert held[first]["status"] == "done"
    running = [job for job in slow if held[job]["status"] == "running"]
    assert running, {job: held[job]["status"] for job in slow}
    for job, row in held.items():
        if row["status"] == "done":
            assert (data / "files" / row["object_key"]).stat().st_size == row["bytes"], job

    async with (
        serving("serve", restored, tmp_path / "restored.log") as base,
        aiohttp.ClientSession(headers=auth) as http,
    ):
        # The link signed before the backup, on the restored server.
        async with aiohttp.request("GET", f"{base}{URL(link).path_qs}") as resp:
            assert resp.status == 200
            assert await resp.read() == pdf
        async with http.get(f"{base}/v1/templates/note") as resp:
            await answer(resp, 200)
        async with http.get(f"{base}/v1/assets/{asset_id}/content") as resp:
            assert (resp.status, await resp.read()) == (200, STYLE)

        # A client that had read up to the cursor resumes, with the token it had.
        async with aiohttp.ClientSession() as browser:
            got = await resumed(browser, f"{base}/v1/events?token={token}", cursor, set(slow))
        ids = [message.id for message in got]
        assert len(ids) == len(set(ids)), "no event twice"
        assert ids[: len(after_cursor)] == after_cursor, "the backup's events after the cursor"
        newest = max(int(event_id) for event_id in [cursor, *after_cursor])
        assert all(int(str(event_id)) > newest for event_id in ids[len(after_cursor) :])
        assert all(int(str(event_id)) >= next_id for event_id in ids[len(after_cursor) :])
        async with (
            aiohttp.ClientSession() as browser,
            browser.get(
                f"{base}/v1/events?token={token}", headers={"Last-Event-ID": lost_cursor}
            ) as resp,
        ):
            assert resp.status == 200
            reset = await anext(messages(resp))
        assert (reset.event, reset.json["code"]) == ("reset", "pruned"), reset

        for job in slow:
            async with http.get(f"{base}/v1/jobs/{job}") as resp:
                now = await answer(resp, 200)
            assert now["status"] == "done"
            if job in running:  # rescued once its lease ran out, and run again
                assert int(str(now["attempts"])) == held[job]["attempts"] + 1
            async with http.get(f"{base}/v1/jobs/{job}/pdf") as resp:
                assert resp.status == 200
                assert (await resp.read()).startswith(b"%PDF-")


async def test_no_file_goes_between_the_database_copy_and_the_files_copy(tmp_path: Path) -> None:
    env = embedded(tmp_path / "data", free_port())
    settings = Settings.from_env({**os.environ, **env})
    async with (
        serving("web", env, tmp_path / "web.log") as base,
        aiohttp.ClientSession() as http,
        db.server(settings) as dsn,
    ):
        uploaded = []
        for body in (b"p { color: red }", b"p { color: blue }"):
            async with http.post(
                f"{base}/v1/assets", data=body, headers={"Content-Type": "text/css"}
            ) as resp:
                uploaded.append(str((await answer(resp, 201))["id"]))
        kept, gone = uploaded
        # A finished job for retention's sweep to delete (nothing renders in `web`).
        job = await submit(http, base, {"template": "<p>x</p>"})
        async with http.post(f"{base}/v1/jobs/{job}/cancel") as resp:
            await answer(resp, 200)
        pool = await db.create_pool(dsn, min_size=1, max_size=2)
        storage = LocalStorage(settings.files_dir)
        # One asset is deleted by a transaction still open when the backup begins: the backup
        # waits for it to end, so its copy of the database no longer names the file.
        deleter = await db.connect(dsn)
        deleting = deleter.transaction()
        await deleting.start()
        await deleter.execute("DELETE FROM assets WHERE id = $1", gone)
        await storage.delete(assets.storage_key("default", gone))
        target = tmp_path / "backup"
        target.mkdir()
        copied = asyncio.Event()

        async def make() -> dict[str, backup.Entry]:
            async with backup.holding_deletions(dsn, settings.files_dir):
                await backup.copy_database(dsn, settings.data_dir / "postgres", target / "postgres")
                copied.set()
                await asked.wait()
                return await asyncio.to_thread(
                    backup.copy_files, settings.files_dir, target / "files"
                )

        asked = asyncio.Event()
        making = asyncio.create_task(make())
        try:
            await wait_until(dsn, WAITING, 1, timeout_s=30)  # its question: still open?
            assert not copied.is_set()
            await deleting.commit()
            await copied.wait()
            # Between the copies, deleting the other asset and sweeping are refused.
            async with http.delete(f"{base}/v1/assets/{kept}") as resp:
                problem = await answer(resp, 503)
            assert "a backup (pressroom backup) is copying the storage folder" in str(
                problem["detail"]
            )
            assert "Retry-After" in resp.headers
            assert await retention.sweep(pool, storage, older_than_days=0) is None
            asked.set()
            files = await making
        finally:
            making.cancel()
            await deleter.close()
        contents = await backup.read_cluster(target / "postgres")
        assert contents.missing(files) == []
        assert files[assets.storage_key("default", kept)][0] == len(b"p { color: red }")
        assert contents.counts["assets"] == 1 and contents.counts["jobs"] == 1

        # Once the backup is over, both go through.
        async with http.delete(f"{base}/v1/assets/{kept}") as resp:
            assert resp.status == 204
        assert await retention.sweep(pool, storage, older_than_days=0) == 1
        await pool.close()
        storage.close()


def linked_copy(source: Path, target: Path) -> Path:
    """A copy of a backup whose files are links to the original's (change one by `rewrite`)."""
    shutil.copytree(source, target, copy_function=os.link)
    return target


def rewrite(path: Path, data: bytes) -> None:
    path.unlink()  # the link, not the original's file
    path.write_bytes(data)


async def test_a_backup_that_is_not_whole_or_a_folder_that_is_not_empty_is_refused(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    env = embedded(data)
    code, _, err = await run_pressroom(env, "keys", "create", "--tenant", "acme")
    assert code == 0, err
    (data / "files" / "acme").mkdir(parents=True)
    (data / "files" / "acme" / "stray.pdf").write_bytes(b"%PDF-1.7 stray")
    saved = tmp_path / "backup"
    # Made with Pressroom stopped, too: the command starts the embedded server and stops it.
    code, out, err = await run_pressroom(env, "backup", str(saved))
    assert (code, err) == (0, ""), err
    assert "1 API key, 1 file (14 bytes)" in out
    manifest = json.loads((saved / "manifest.json").read_text())

    damaged = linked_copy(saved, tmp_path / "damaged")
    control = damaged / "postgres" / "global" / "pg_control"
    flipped = bytearray(control.read_bytes())
    flipped[100] ^= 0xFF
    rewrite(control, bytes(flipped))
    missing = linked_copy(saved, tmp_path / "missing")
    (missing / "files" / "acme" / "stray.pdf").unlink()
    unfinished = linked_copy(saved, tmp_path / "unfinished")
    (unfinished / "manifest.json").unlink()
    newer = linked_copy(saved, tmp_path / "newer")
    rewrite(newer / "manifest.json", json.dumps({**manifest, "version": 2}).encode())
    ahead = linked_copy(saved, tmp_path / "ahead")
    rewrite(ahead / "manifest.json", json.dumps({**manifest, "migration": "9999_x"}).encode())
    miscounted = linked_copy(saved, tmp_path / "miscounted")
    counts = {**manifest["counts"], "api_keys": 2}
    rewrite(miscounted / "manifest.json", json.dumps({**manifest, "counts": counts}).encode())
    refusals = {
        damaged: f"{damaged} is damaged: postgres/global/pg_control does not match manifest.json",
        missing: f"{missing} is incomplete: files/acme/stray.pdf is missing",
        unfinished: f"{unfinished} is not a complete backup: it has no manifest.json",
        newer: f"{newer} is a backup of format version 2, made by Pressroom",
        ahead: f"{ahead} holds a database at migration 9999_x, which this Pressroom",
        # Every file as listed, and yet not the database the manifest describes.
        miscounted: f"{miscounted} is damaged: its database differs: api_keys 1 (manifest.json: 2)",
    }
    into = tmp_path / "restored"
    for source, said in refusals.items():
        code, out, err = await run_pressroom(embedded(into), "restore", str(source))
        assert (code, out) == (1, ""), err
        assert err.startswith(f"pressroom: {said}") and err.count("\n") == 1, err
        assert not into.exists(), f"{source.name}: nothing is left behind"

    into.mkdir()
    (into / "notes.txt").write_text("mine")
    code, _, err = await run_pressroom(embedded(into), "restore", str(saved))
    assert code == 1
    assert err.startswith(f"pressroom: PRESSROOM_DATA_DIR={into} is not empty (it holds notes.txt)")
    assert [entry.name for entry in into.iterdir()] == ["notes.txt"]

    (into / "notes.txt").unlink()  # an empty folder is restored into
    code, out, err = await run_pressroom(embedded(into), "restore", str(saved))
    assert (code, err) == (0, ""), err
    assert (into / "files" / "acme" / "stray.pdf").read_bytes() == b"%PDF-1.7 stray"
    assert (into / "secret").read_text() == (data / "secret").read_text()
    code, out, err = await run_pressroom(embedded(into), "keys", "list")
    assert code == 0 and "\tacme\t" in out, err

    code, _, err = await run_pressroom(env, "backup", str(saved))
    assert (code, err) == (
        1,
        f"pressroom: {saved} exists and is not an empty folder: name a new one\n",
    )
    code, _, err = await run_pressroom(
        embedded(tmp_path / "nothing"), "backup", str(tmp_path / "b")
    )
    assert code == 1 and "holds no Pressroom database" in err
    assert not (tmp_path / "b").exists() and not (tmp_path / "nothing" / "postgres").exists()


@pytest.mark.parametrize(
    ("variable", "value", "names"),
    [
        (
            "DATABASE_URL",
            "postgresql://db.example.com/pressroom",
            "DATABASE_URL names a PostgreSQL",
        ),
        ("PRESSROOM_STORAGE", "s3://pressroom-files", "PRESSROOM_STORAGE=s3://pressroom-files"),
    ],
)
@pytest.mark.parametrize("command", ["backup", "restore"])
async def test_a_database_or_bucket_of_its_own_is_backed_up_its_own_way(
    tmp_path: Path, command: str, variable: str, value: str, names: str
) -> None:
    env = {**embedded(tmp_path / "data"), variable: value}
    code, out, err = await run_pressroom(env, command, str(tmp_path / "backup"))
    assert (code, out) == (2, "")
    assert err.startswith(f"pressroom: pressroom {command} covers the embedded default only")
    assert names in err and err.endswith("docs/operations.md#backup-and-restore describes\n")
    assert err.count("\n") == 1
    assert not (tmp_path / "backup").exists()
    assert not (tmp_path / "data" / "postgres").exists()
