"""`?type=…` on the event streams: an all-jobs stream of some event types only, replayed and
live, resumed by its own last event id without a gap; a job's stream of some types still ends
with the job."""

from __future__ import annotations

import asyncio
from typing import Any

from tests.conftest import RunningApp
from tests.sse import Message, collect, messages


async def finished_job(app: RunningApp, n: int) -> str:
    body = {"template": "<p>{{ n }}</p>", "data": {"n": n}}
    async with app.http.post(app.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job_id = str((await resp.json())["id"])
    await collect(app.http, app.url(f"/v1/jobs/{job_id}/events"))  # ends after job.done
    return job_id


def summary(seen: list[Message]) -> list[tuple[str, Any]]:
    return [(m.event, m.json["job"]["id"]) for m in seen]


async def test_a_filtered_stream_replays_and_streams_only_the_types_asked_for(
    api: RunningApp,
) -> None:
    first, second = await finished_job(api, 1), await finished_job(api, 2)

    replayed = await collect(api.http, api.url("/v1/events?last_event_id=0&type=job.done"), count=2)
    assert summary(replayed) == [("job.done", first), ("job.done", second)]
    both = await collect(
        api.http, api.url("/v1/events?last_event_id=0&type=job.queued,job.done"), count=4
    )
    assert summary(both) == [
        ("job.queued", first),
        ("job.done", first),
        ("job.queued", second),
        ("job.done", second),
    ]

    # Resumed after its first event, the filtered stream gives the next one of its types.
    resumed = await collect(
        api.http,
        api.url("/v1/events?type=job.done"),
        headers={"Last-Event-ID": replayed[0].id or ""},
        count=1,
    )
    assert summary(resumed) == [("job.done", second)]

    # Live: of a new job, only its job.done arrives (its queued and running are skipped).
    async with api.http.get(api.url("/v1/events?type=job.done&type=job.failed")) as resp:
        assert resp.status == 200
        third = asyncio.create_task(finished_job(api, 3))
        stream = messages(resp)
        live = await asyncio.wait_for(anext(stream), 10)
        assert summary([live]) == [("job.done", await third)]
        assert int(live.id or 0) > int(replayed[1].id or 0)


async def test_a_jobs_filtered_stream_sends_only_those_types_and_still_ends_with_the_job(
    api: RunningApp,
) -> None:
    job_id = await finished_job(api, 1)
    url = api.url(f"/v1/jobs/{job_id}/events")
    # collect() returns when the stream ends: it ends after job.done, sent or not.
    assert summary(await collect(api.http, url + "?type=job.running")) == [("job.running", job_id)]
    assert [m.event for m in await collect(api.http, url + "?type=job.queued,job.done")] == [
        "job.queued",
        "job.done",
    ]
