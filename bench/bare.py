"""The bare service: the least a service of Pressroom's design can do per job, with the same
libraries, as the floor that Pressroom's own CPU per job is weighed against.

It speaks just enough of Pressroom's API for the benchmarks' clients (bench/clients.py's
`burst` and `one-at-a-time`): `POST /v1/jobs` answers 202 with the job's id, and
`GET /v1/events` streams `job.done` as Server-Sent Events. Behind them it keeps what DESIGN.md
asks of every job and nothing more:

- the job is committed to PostgreSQL before the 202, with its `job.queued` event;
- a render slot claims it with `FOR UPDATE SKIP LOCKED` and commits `job.running`;
- the template is rendered in Jinja's immutable sandbox (no limits of Pressroom's own);
- the PDF is printed on the raw loop's page (bench.render.RawLoop), so Chromium's work is
  the floor's, and written durably (a temporary file, fsync, rename, fsync of the folder);
- `job.done` is committed with the job's new state, while the slot claims and prints its
  next job (the file and the commit wait on fsyncs, not on the page);
- each of the three commits notifies with the event as its payload, and the stream is fed
  from those notifications alone (the bus any number of processes could share).

No authentication, no validation beyond the two fields, no retries, leases, cancellation,
metrics, logs or limits: a service that a user could not run, and the figure no real one
can beat with these libraries on this machine.

    python -m bench.bare DSN SLOTS    (on a free port, its URL printed, until stdin closes)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import uuid
from pathlib import Path

import asyncpg
import jinja2
from aiohttp import web
from jinja2.sandbox import ImmutableSandboxedEnvironment

from bench.common import execute, serving
from bench.render import RawLoop
from server.files.storage import fsync_folder
from server.queue.db import release_connection

CHANNEL = "bare_events"
SCHEMA = """
CREATE TABLE bare_jobs (
    id uuid PRIMARY KEY,
    status text NOT NULL,
    template text NOT NULL,
    data jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX bare_jobs_queued ON bare_jobs (created_at) WHERE status = 'queued';
CREATE TABLE bare_events (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL REFERENCES bare_jobs (id),
    type text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
"""
# Each state change and its event in one statement (one commit), notifying with the event.
INSERT = """
WITH job AS (
    INSERT INTO bare_jobs (id, status, template, data) VALUES ($1, 'queued', $2, $3::jsonb)
    RETURNING id
), event AS (
    INSERT INTO bare_events (job_id, type, payload) SELECT id, 'job.queued', $4::jsonb FROM job
)
SELECT pg_notify($5, json_build_object('type', 'job.queued', 'payload', $4::jsonb)::text)
"""
CLAIM = """
WITH picked AS (
    SELECT id FROM bare_jobs WHERE status = 'queued'
    ORDER BY created_at FOR UPDATE SKIP LOCKED LIMIT 1
), job AS (
    UPDATE bare_jobs j SET status = 'running' FROM picked WHERE j.id = picked.id
    RETURNING j.id, j.template, j.data
), event AS (
    INSERT INTO bare_events (job_id, type, payload)
    SELECT id, 'job.running', json_build_object('job', json_build_object('id', id)) FROM job
)
SELECT id, template, data::text AS data,
       pg_notify($1, json_build_object(
           'type', 'job.running', 'payload', json_build_object('job', json_build_object('id', id))
       )::text)
FROM job
"""
DONE = """
WITH job AS (
    UPDATE bare_jobs SET status = 'done' WHERE id = $1 RETURNING id
), event AS (
    INSERT INTO bare_events (job_id, type, payload) SELECT id, 'job.done', $2::jsonb FROM job
)
SELECT pg_notify($3, json_build_object('type', 'job.done', 'payload', $2::jsonb)::text)
"""


class BareService:
    """The bare service on a free port of 127.0.0.1, in this process, printing on `raw`'s
    pages (one render slot per page); `base` is its URL once entered."""

    def __init__(self, dsn: str, raw: RawLoop) -> None:
        self._dsn = dsn
        self._raw = raw
        self._env = ImmutableSandboxedEnvironment(autoescape=True, undefined=jinja2.StrictUndefined)
        self._templates: dict[str, jinja2.Template] = {}
        self._wake = asyncio.Event()
        self._streams: set[asyncio.Queue[bytes]] = set()
        self._folder = Path(tempfile.mkdtemp(prefix="pressroom-bare-"))
        self._stack = contextlib.AsyncExitStack()
        self.base = ""

    async def __aenter__(self) -> BareService:
        await execute(self._dsn, SCHEMA)
        # Released as Pressroom releases its connections: no reset round trip (server/queue/db.py).
        self._pool = await asyncpg.create_pool(
            self._dsn, min_size=2, max_size=4 + self._raw.slots, reset=release_connection
        )
        self._stack.push_async_callback(self._pool.close)
        listener = await asyncpg.connect(self._dsn)
        self._stack.push_async_callback(listener.close)
        await listener.add_listener(CHANNEL, self._notified)
        app = web.Application()
        app.router.add_post("/v1/jobs", self._submit)
        app.router.add_get("/v1/events", self._events)
        self.base = await self._stack.enter_async_context(serving(app))
        # Before the server stops: it would wait up to a minute for the open streams.
        self._stack.callback(self._end_streams)
        for slot in range(self._raw.slots):
            task = asyncio.create_task(self._slot(slot))
            self._stack.callback(task.cancel)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    async def _submit(self, request: web.Request) -> web.Response:
        body = await request.json()
        template, data = body.get("template"), body.get("data")
        if not isinstance(template, str) or not isinstance(data, dict):
            raise web.HTTPUnprocessableEntity(text="template (string) and data (object)")
        job_id = uuid.uuid4()
        event = json.dumps({"job": {"id": str(job_id), "status": "queued"}})
        await self._pool.execute(INSERT, job_id, template, json.dumps(data), event, CHANNEL)
        self._wake.set()
        return web.json_response({"id": str(job_id), "status": "queued"}, status=202)

    async def _slot(self, slot: int) -> None:
        finishing: asyncio.Task[None] | None = None
        while True:
            # Cleared before the claim: a submission committed after it sets it again.
            self._wake.clear()
            row = await self._pool.fetchrow(CLAIM, CHANNEL)
            if row is None:
                await self._wake.wait()
                continue
            template = self._templates.get(row["template"])
            if template is None:
                template = self._templates[row["template"]] = self._env.from_string(row["template"])
            pdf = await self._raw.pdf(slot, template.render(json.loads(row["data"])))
            # The file and the done commit wait on fsyncs, not on the page: the slot prints
            # its next job meanwhile (one job finishing per slot at most).
            if finishing is not None:
                await finishing
            finishing = asyncio.create_task(self._finish(row["id"], pdf))

    async def _finish(self, job_id: uuid.UUID, pdf: bytes) -> None:
        await asyncio.to_thread(_durable_write, self._folder / f"{job_id}.pdf", pdf)
        event = {"job": {"id": str(job_id), "status": "done", "bytes": len(pdf)}}
        await self._pool.execute(DONE, job_id, json.dumps(event), CHANNEL)

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        event = json.loads(payload)
        if event["type"] != "job.done":
            return  # the benchmarks' clients follow job.done (and job.failed, never sent here)
        frame = f"event: job.done\ndata: {json.dumps(event['payload'])}\n\n".encode()
        for stream in self._streams:
            stream.put_nowait(frame)

    async def _events(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        frames: asyncio.Queue[bytes] = asyncio.Queue()
        self._streams.add(frames)
        try:
            with contextlib.suppress(ConnectionResetError):  # the client went away
                while frame := await frames.get():
                    await response.write(frame)
        finally:
            self._streams.discard(frames)
        return response

    def _end_streams(self) -> None:
        for stream in self._streams:
            stream.put_nowait(b"")  # the end of the stream


def _durable_write(path: Path, data: bytes) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    fsync_folder(path.parent)


async def serve(dsn: str, slots: int) -> None:
    async with RawLoop(slots) as raw, BareService(dsn, raw) as bare:
        print(bare.base, flush=True)
        await asyncio.to_thread(sys.stdin.read)


if __name__ == "__main__":
    asyncio.run(serve(sys.argv[1], int(sys.argv[2])))
