"""Retention: old finished jobs lose their files and rows; recent and unfinished ones stay."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

import pytest

from server.errors import PermanentError
from server.keys import POOL, STORAGE
from server.queue import retention
from tests.conftest import RunningApp
from tests.integration import test_s3_storage as s3
from tests.pdfs import FakeRenderer, minimal_pdf, page_contents
from tests.sse import collect

# moto's S3 server, a fresh bucket per test and the AWS SDK's variables that lead to it,
# shared with test_s3_storage.
admin = s3.admin
aws_env = s3.aws_env
bucket = s3.bucket
moto_endpoint = s3.moto_endpoint

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


@pytest.fixture(params=["local", "s3"])
def storage_env(request: pytest.FixtureRequest) -> dict[str, str]:
    if request.param == "local":
        return {}
    request.getfixturevalue("aws_env")
    return {"PRESSROOM_STORAGE": f"s3://{request.getfixturevalue('bucket')}"}


async def run_job(api: RunningApp, **fields: Any) -> dict[str, Any]:
    async with api.http.post(api.url("/v1/jobs"), json={**SEED, **fields}) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
    if "run_at" not in fields:
        await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"))
    return job


async def status_of(api: RunningApp, job_id: str) -> int:
    async with api.http.get(api.url(f"/v1/jobs/{job_id}")) as resp:
        return resp.status


async def stored(api: RunningApp, key: str) -> bool:
    try:
        await api.app[STORAGE].get(key)
    except FileNotFoundError:
        return False
    return True


async def test_old_finished_jobs_are_deleted_with_every_file(
    start_app: Callable[..., Any], storage_env: dict[str, str]
) -> None:
    renderer = FakeRenderer()
    api: RunningApp = await start_app(renderer=renderer, render_slots=1, env=storage_env)
    old_done = await run_job(api)
    old_image = await run_job(api, options={"output": "webp"})
    old_thumbnail = await run_job(api, options={"thumbnail": {"width": 32}})
    renderer.fail_with = PermanentError("cannot print")
    old_failed = await run_job(api)
    renderer.fail_with = None
    recent = await run_job(api)
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(days=1)).isoformat()
    old_queued = await run_job(api, run_at=later)
    pool, storage = api.app[POOL], api.app[STORAGE]
    # A file an earlier, abandoned attempt left behind (a worker that died after storing it).
    await storage.put(f"default/{old_done['id']}/2.pdf", minimal_pdf(), filename="x.pdf")
    thumbnails = [f"default/{old_thumbnail['id']}/{n}-thumbnail.png" for n in (1, 2)]
    png = await storage.get(thumbnails[0])
    await storage.put(thumbnails[1], png, filename="x.png", content_type="image/png")
    if not storage_env:
        # And the temp file of a write to it killed midway (server/files/storage.py names them so).
        folder = api.app[STORAGE].root / "default" / old_done["id"]  # type: ignore[attr-defined]
        (folder / ".3.pdf.4242.1.tmp").write_bytes(b"%PDF-half")
    old_ids = [old_done["id"], old_image["id"], old_thumbnail["id"], old_failed["id"]]
    old_ids.append(old_queued["id"])
    await pool.execute(
        "UPDATE jobs SET created_at = now() - interval '40 days',"
        " finished_at = CASE WHEN finished_at IS NULL THEN NULL"
        " ELSE now() - interval '31 days' END WHERE id = ANY($1::uuid[])",
        old_ids,
    )

    deleted = await retention.sweep(pool, storage, older_than_days=30)

    assert deleted == 4
    assert await status_of(api, old_done["id"]) == 404
    assert await status_of(api, old_failed["id"]) == 404
    assert not await stored(api, f"default/{old_done['id']}/1.pdf")
    assert not await stored(api, f"default/{old_done['id']}/2.pdf")
    assert not await stored(api, f"default/{old_image['id']}/1.webp")
    assert not await stored(api, f"default/{old_thumbnail['id']}/1.pdf")
    for key in thumbnails:
        assert not await stored(api, key)
    assert await status_of(api, old_queued["id"]) == 200  # not finished: never deleted
    assert await status_of(api, recent["id"]) == 200
    assert await stored(api, f"default/{recent['id']}/1.pdf")
    async with api.http.get(api.url(f"/v1/jobs/{recent['id']}/pdf")) as resp:
        assert resp.status == 200
        assert page_contents(await resp.read()) == page_contents(minimal_pdf())
    # Their events are the log's: it drops them with their partition, once that is older than
    # the log keeps events (no longer than jobs are kept), not with a DELETE per event here.
    events_of = "SELECT count(*) FROM job_events WHERE job_id = ANY($1::uuid[])"
    assert await pool.fetchval(events_of, old_ids[:4]) > 0
    await pool.execute("UPDATE job_events SET created_at = now() - interval '31 days'")
    keep_s = 30 * 86400
    await retention.extend_log(pool, stretch_s=retention.stretch_s(keep_s))
    assert await retention.prune_log(pool, keep_s=keep_s)
    assert await pool.fetchval(events_of, old_ids[:4]) == 0
    if not storage_env:
        folder = api.app[STORAGE].root / "default"  # type: ignore[attr-defined]
        assert sorted(p.name for p in folder.iterdir()) == sorted([recent["id"]])
    assert await retention.sweep(pool, storage, older_than_days=30) == 0


async def test_only_one_process_sweeps_at_a_time(
    start_app: Callable[..., Any], storage_env: dict[str, str]
) -> None:
    api: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1, env=storage_env)
    job = await run_job(api)
    pool, storage = api.app[POOL], api.app[STORAGE]
    await pool.execute("UPDATE jobs SET finished_at = now() - interval '2 days'")

    async with pool.acquire() as other:
        await other.execute("SELECT pg_advisory_lock($1)", retention.RETENTION_LOCK)
        try:
            assert await retention.sweep(pool, storage, older_than_days=1) is None
            assert await status_of(api, job["id"]) == 200
        finally:
            await other.execute("SELECT pg_advisory_unlock($1)", retention.RETENTION_LOCK)

    assert await retention.sweep(pool, storage, older_than_days=1) == 1
    assert await status_of(api, job["id"]) == 404
    assert not await stored(api, f"default/{job['id']}/1.pdf")
