"""Many workers in several processes share one queue: each job is rendered exactly once."""

from __future__ import annotations

from pathlib import Path

import asyncpg
import pytest

from server.queue import jobs
from server.queue.jobs import NewJob
from tests.processes import PressroomProcess, wait_until
from tests.timings import as_env

pytestmark = [pytest.mark.browser, pytest.mark.slow]

JOBS = 200


@pytest.mark.timeout(300)
async def test_200_jobs_4_slots_2_processes_each_rendered_once(
    dsn: str, pool: asyncpg.Pool, tmp_path: Path
) -> None:
    env = {
        "DATABASE_URL": dsn,
        "PRESSROOM_DATA_DIR": str(tmp_path / "data"),
        "PRESSROOM_RENDER_SLOTS": "2",
        **as_env(POLL_INTERVAL_S=0.5),
    }
    workers = [PressroomProcess("worker", env, tmp_path / f"worker{i}.log") for i in range(2)]
    for worker in workers:
        await worker.start()
    try:
        await jobs.create(
            pool,
            [
                NewJob(
                    tenant="default",
                    template="<h1>Invoice {{ n }}</h1>",
                    data={"n": n},
                    options={},
                    metadata={},
                    max_attempts=3,
                )
                for n in range(JOBS)
            ],
        )
        await wait_until(
            dsn, "SELECT count(*) FROM jobs WHERE status = 'done'", JOBS, timeout_s=240
        )
    finally:
        for worker in workers:
            assert await worker.stop() == 0, worker.log()[-3000:]

    running = await pool.fetch(
        "SELECT job_id, count(*) AS n FROM job_events WHERE type = 'job.running' GROUP BY job_id"
    )
    assert len(running) == JOBS and all(row["n"] == 1 for row in running)
    files = list((tmp_path / "data" / "files" / "default").glob("*/*.pdf"))
    assert len(files) == JOBS
    assert len({f.parent.name for f in files}) == JOBS, "one file per job"
    assert all(f.read_bytes().startswith(b"%PDF-") for f in files)
    both_worked = [w for w in workers if "job done" in w.log()]
    assert len(both_worked) == 2, "both processes took jobs"
