"""Browser apps on another origin than Pressroom's, in real Chromium: /pressroom.js and the
official socket.io-client running the snippets of README.md and docs/streaming.md as written,
and a bare EventSource.
Each gets a job's events live, resumes across a restart without gap or duplicate, lets go of a
job's stream once it ends, renews its token without gap; a disallowed origin gets nothing."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import asyncpg
import jwt
import pytest
from playwright.async_api import Browser, Page, Request
from yarl import URL

from server import events
from server.access import apikeys
from server.keys import HUB
from server.queue import jobs
from tests.browser import (  # noqa: F401 (fixtures)
    FixedPortApp,
    SecondOrigin,
    browser,
    socketio_client_js,
)
from tests.conftest import RunningApp
from tests.newjobs import new_job
from tests.pdfs import FakeRenderer
from tests.processes import free_port, wait_until
from tests.sse import collect

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
#: Where the pages' scripts are written for users: the README and the streaming guide.
DOCS = (ROOT / "README.md", ROOT / "docs" / "streaming.md")
# The docs write Pressroom's origin as this; the pages get the test server's.
README_ORIGIN = "https://pdf.example.com"
TENANT, CHANNEL = "acme", "user-42"
SEED = {"template": "<p>{{ n }}</p>", "data": {"n": 1}, "channel": CHANNEL}
# Within this long of the browser's reconnect, a finished job holds no stream on the server.
RELEASED_WITHIN_S = 5.0
LOG_MAX = 10_000  # more events than a test makes

# A bare EventSource with a token from the app's backend: it reconnects by itself, with
# Last-Event-ID, and records what it was sent and when it gave up.
RAW_EVENTSOURCE = """
  window.closedEvents = [];
  window.gaveUp = null;
  (async () => {
    const { token } = await fetch("/api/pressroom-token").then((answer) => answer.json());
    const url = new URL(PATH, API);
    url.searchParams.set("token", token);
    const source = new EventSource(url);
    for (const type of ["job.queued", "job.running", "job.done"]) {
      source.addEventListener(type, (message) => showEvent(JSON.parse(message.data)));
    }
    source.addEventListener("closed", (message) => closedEvents.push(JSON.parse(message.data)));
    source.onerror = () => {
      if (source.readyState === EventSource.CLOSED) window.gaveUp = Date.now();
    };
  })();
"""

# The official client following one job: its subscription ends after the job's final event.
SOCKETIO_JOB = """
  window.acks = [];
  window.connectErrors = [];
  const socket = io(API, {
    auth: (send) => fetch("/api/pressroom-token").then((answer) => answer.json())
      .then(({ token }) => send({ token })),
    transports: ["websocket"],
  });
  socket.on("connect", () => socket.emit("subscribe", { job_id: JOB }, (ack) => acks.push(ack)));
  socket.on("connect_error", (error) => connectErrors.push(error.message));
  socket.on("job", (event) => showEvent(event));
"""


def readme_script(marker: str) -> str:
    """The body of the docs' one inline <script> (in an ```html block) that has `marker`."""
    text = "\n".join(path.read_text() for path in DOCS)
    blocks = re.findall(r"```html\n(.*?)```", text, flags=re.S)
    bodies = [
        body
        for block in blocks
        for body in re.findall(r"<script[^>]*>(.*?)</script>", block, flags=re.S)
        if marker in body
    ]
    assert len(bodies) == 1, f"the docs have {len(bodies)} inline scripts with {marker!r}"
    return bodies[0]


def with_constants(script: str, **constants: str) -> str:
    """`script` after `const NAME = "…";` lines for each constant."""
    lines = "".join(f"const {name} = {json.dumps(value)};\n" for name, value in constants.items())
    return "{\n" + lines + script + "\n}"  # a block: each page's constants stay its own


class Origins:
    """Pressroom on a port of its own, the app's server (SecondOrigin) on another, an API key
    of tenant acme for the app's backend, and the app's pages in Chromium."""

    def __init__(self, browser: Browser, spa: SecondOrigin, key: str) -> None:  # noqa: F811
        self.browser, self.spa, self.key = browser, spa, key
        self.api_url = ""
        self.pages: list[Page] = []
        self.errors: dict[str, list[str]] = {}  # script errors, by client

    def serve(self, api_url: str) -> None:
        self.api_url = self.spa.api_url = api_url

    async def open(
        self,
        client: str,
        script: str,
        *,
        module: bool = False,
        other: bool = False,
        watch: Callable[[Page], None] | None = None,
        **query: str,
    ) -> Page:
        """A page of the app (on its `other` origin: one Pressroom does not allow) running `script`
        with the README's origin replaced by Pressroom's, after socket.io-client for a classic
        script; `watch` is called first, to listen to the page from its first request."""
        page = await self.browser.new_page()
        self.pages.append(page)
        errors = self.errors.setdefault(client, [])
        page.on("pageerror", lambda error: errors.append(str(error)))
        if watch is not None:
            watch(page)
        await page.goto(self.spa.page(client, other=other, **query))
        if not module:
            await page.add_script_tag(url="/socket.io.min.js")
        code = script.replace(README_ORIGIN, self.api_url)
        await page.add_script_tag(content=code, type="module" if module else "")
        return page

    async def submit(self, http: Any) -> str:
        async with http.post(
            f"{self.api_url}/v1/jobs", json=SEED, headers={"Authorization": f"Bearer {self.key}"}
        ) as resp:
            assert resp.status == 202, await resp.text()
            job_id: str = (await resp.json())["id"]
            return job_id

    async def close(self) -> None:
        for page in self.pages:
            await page.close()


@pytest.fixture
async def origins(
    browser: Browser,  # noqa: F811
    socketio_client_js: Path,  # noqa: F811
    pool: asyncpg.Pool,
) -> AsyncIterator[Origins]:
    spa = await SecondOrigin(socketio_client_js).start()
    _row, key, _secret = await apikeys.create_key_and_tenant(pool, TENANT)
    spa.api_key = key
    spa.token_body = {"channel": CHANNEL}
    made = Origins(browser, spa, key)
    yield made
    await made.close()
    await spa.stop()
    assert not any(made.errors.values()), made.errors


def allowing(spa: SecondOrigin) -> dict[str, str]:
    """The settings' environment that allows the app's origin, and not its other one."""
    return {"PRESSROOM_CORS_ORIGINS": spa.origin()}


async def channel_log(pool: asyncpg.Pool) -> list[int]:
    found, held = await events.after(
        pool, events.START, tenant=TENANT, channel=CHANNEL, limit=LOG_MAX
    )
    assert len(found) < LOG_MAX and not held
    return [event.id for event in found]


async def received_ids(page: Page) -> list[int]:
    ids: list[int] = await page.evaluate("window.received.map((event) => event.event_id)")
    return ids


async def wait_received(page: Page, count: int, timeout_ms: float = 30_000) -> None:
    await page.wait_for_function(f"window.received.length >= {count}", timeout=timeout_ms)


class HubCounts:
    """The app's subscriptions by transport, and a wait on them woken by each subscribe and
    unsubscribe of its hub (the counts have no signal of their own)."""

    def __init__(self, app: Any) -> None:
        self.hub = app[HUB]
        self.changed = asyncio.Event()
        for name in ("subscribe", "unsubscribe"):
            setattr(self.hub, name, self._signalling(getattr(self.hub, name)))

    def _signalling(self, method: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = method(*args, **kwargs)
            self.changed.set()
            return result

        return call

    def now(self) -> dict[str, int]:
        counts: dict[str, int] = self.hub.subscribers_by_transport()
        return counts

    async def until(self, expected: dict[str, int], timeout_s: float) -> None:
        try:
            async with asyncio.timeout(timeout_s):
                while self.now() != expected:
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"not within {timeout_s} s: {expected}; {self.now()}") from None


NONE = {"sse": 0, "socketio": 0, "longpoll": 0}
THREE = {"sse": 2, "socketio": 1, "longpoll": 0}  # two EventSources and one Socket.IO client


def token_of(url: str) -> str:
    [token] = URL(url).query.getall("token")
    return token


async def new_job_while_down(pool: asyncpg.Pool, start_app: Callable[..., Any], dsn: str) -> None:
    """A job submitted and rendered while the web app is down, by a worker-only process."""
    [job] = await jobs.create(pool, [new_job(tenant=TENANT, channel=CHANNEL, max_attempts=1)])
    await start_app(renderer=FakeRenderer(), render_slots=1, run_web=False)
    await wait_until(dsn, f"SELECT status FROM jobs WHERE id = '{job['id']}'", "done", 30)


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_the_three_clients_follow_a_channel_live_across_a_restart(
    make_settings: Callable[..., Any],
    start_app: Callable[..., Any],
    origins: Origins,
    pool: asyncpg.Pool,
    dsn: str,
) -> None:
    port = free_port()
    settings = make_settings(port=port, render_slots=1, env=allowing(origins.spa))
    first = await FixedPortApp(settings, FakeRenderer()).start()
    second: FixedPortApp | None = None
    origins.serve(first.url(""))
    counts = HubCounts(first.app)
    try:
        module = await origins.open("module", readme_script("/pressroom.js"), module=True)
        sio = await origins.open("socketio", readme_script("io(PRESSROOM"))
        raw = await origins.open(
            "raw",
            with_constants(
                RAW_EVENTSOURCE, API=origins.api_url, PATH=f"/v1/events?channel={CHANNEL}"
            ),
        )
        # A channel's stream starts live: submit once all three listen.
        await counts.until(THREE, 15)
        await origins.submit(first.http)
        for page in (module, sio, raw):
            await wait_received(page, 3)

        await first.stop()
        # While Pressroom is down, a job is submitted and another process renders it.
        await new_job_while_down(pool, start_app, dsn)
        second = await FixedPortApp(settings, FakeRenderer()).start()
        last = await origins.submit(second.http)
        await wait_until(dsn, f"SELECT status FROM jobs WHERE id = '{last}'", "done", 30)
        log = await channel_log(pool)
        assert len(log) == 9, "three jobs, three events each"
        for page in (module, sio, raw):
            await wait_received(page, len(log), timeout_ms=60_000)
            assert await received_ids(page) == log, "no gap, no duplicate"
    finally:
        if second is not None:
            await second.stop()
        elif first.runner.server is not None:
            await first.stop()


async def test_each_client_lets_go_of_a_job_once_it_is_done(
    start_app: Callable[..., Any],
    origins: Origins,
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()  # the job stays running until the clients watch it
    app: RunningApp = await start_app(renderer=renderer, render_slots=1, env=allowing(origins.spa))
    origins.serve(app.url("").rstrip("/"))
    counts = HubCounts(app.app)
    job_id = await origins.submit(app.http)
    await renderer.started.wait()

    module = await origins.open("module", readme_script("/pressroom.js"), module=True, job=job_id)
    raw_path = f"/v1/jobs/{job_id}/events"
    statuses: list[int] = []
    raw = await origins.open(
        "raw",
        with_constants(RAW_EVENTSOURCE, API=origins.api_url, PATH=raw_path),
        watch=lambda page: page.on(
            "response", lambda r: statuses.append(r.status) if raw_path in r.url else None
        ),
    )
    sio = await origins.open(
        "socketio", with_constants(SOCKETIO_JOB, API=origins.api_url, JOB=job_id)
    )
    for page in (module, sio, raw):
        await wait_received(page, 2)  # queued and running: the job's history
    renderer.gate.set()
    for page in (module, sio, raw):
        await wait_received(page, 3)
        types = await page.evaluate("window.received.map((event) => event.type)")
        assert types == ["job.queued", "job.running", "job.done"]
    downloads = await module.evaluate("window.downloads")
    assert [job["status"] for job in downloads] == ["done"], "onDone, once"

    # The bare EventSource reconnects by itself after the stream ends; the 204 stops it.
    await raw.wait_for_function("window.gaveUp !== null", timeout=15_000)
    assert statuses == [200, 204]
    await counts.until(NONE, RELEASED_WITHIN_S)
    assert await sio.evaluate("window.acks") == [{"ok": True}]


async def test_a_disallowed_origin_gets_nothing(
    start_app: Callable[..., Any],
    origins: Origins,
) -> None:
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, env=allowing(origins.spa)
    )
    origins.serve(app.url("").rstrip("/"))
    job_id = await origins.submit(app.http)
    # The app's own server, on its origin that Pressroom does not allow.
    api, path = origins.api_url, f"/v1/jobs/{job_id}/events"
    raw = await origins.open("raw", with_constants(RAW_EVENTSOURCE, API=api, PATH=path), other=True)
    await raw.wait_for_function("window.gaveUp !== null")
    sio = await origins.open(
        "socketio", with_constants(SOCKETIO_JOB, API=api, JOB=job_id), other=True
    )
    await sio.wait_for_function("window.connectErrors.length > 0")
    refused = await raw.evaluate(
        """async ({ api, job }) => {
          const { token } = await fetch("/api/pressroom-token").then((answer) => answer.json());
          const outcome = async (load) => {
            try { await load(); return "allowed"; } catch (error) { return error.name; }
          };
          return {
            fetch: await outcome(() => fetch(`${api}/v1/jobs/${job}?token=${token}`)),
            module: await outcome(() => import(`${api}/pressroom.js`)),
          };
        }""",
        {"api": api, "job": job_id},
    )
    assert refused == {"fetch": "TypeError", "module": "TypeError"}
    assert await sio.evaluate("window.connectErrors") == ["origin not allowed"]
    for page in (raw, sio):
        assert await page.evaluate("window.received") == []
    # From the allowed origin the same job's stream does answer: the refusal was the origin's.
    allowed = await origins.open("raw", with_constants(RAW_EVENTSOURCE, API=api, PATH=path))
    await wait_received(allowed, 3)


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_tokens_expire_and_get_token_renews_them_without_gap(
    start_app: Callable[..., Any],
    origins: Origins,
    pool: asyncpg.Pool,
) -> None:
    ttl_s = 4
    origins.spa.token_body = {"channel": CHANNEL, "ttl_s": ttl_s}
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, env=allowing(origins.spa)
    )
    origins.serve(app.url("").rstrip("/"))
    counts = HubCounts(app.app)
    requests: list[tuple[float, Request]] = []
    module = await origins.open(
        "module",
        readme_script("/pressroom.js"),
        module=True,
        watch=lambda page: page.on("request", lambda r: requests.append((time.time(), r))),
    )
    sio = await origins.open("socketio", readme_script("io(PRESSROOM"))
    closing: list[str] = []
    sio.on("console", lambda message: closing.append(message.text))
    # Without renewal: the server ends the stream when the token expires, saying why.
    raw = await origins.open(
        "raw",
        with_constants(RAW_EVENTSOURCE, API=origins.api_url, PATH=f"/v1/events?channel={CHANNEL}"),
    )
    await counts.until(THREE, 15)

    # Jobs one after another, each seen before the next, across two renewals of each client.
    submitted = 0
    while min(origins.spa.tokens["module"], origins.spa.tokens["socketio"]) < 3:
        await origins.submit(app.http)
        submitted += 1
        for page in (module, sio):
            await page.wait_for_function(
                f"window.received.filter((e) => e.type === 'job.queued').length >= {submitted}",
                timeout=15_000,
            )
    await module.wait_for_function(
        f"window.received.filter((e) => e.type === 'job.done').length >= {submitted}"
    )
    log = await channel_log(pool)
    assert len(log) == 3 * submitted
    for page in (module, sio):
        await wait_received(page, len(log))
        assert await received_ids(page) == log, "each event once, in order, across renewals"
    # Each stream after the first was opened before the token of the one before expired.
    streams = [(at, r.url) for at, r in requests if "/v1/events?" in r.url]
    expiries = [
        jwt.decode(token_of(url), options={"verify_signature": False})["exp"] for _, url in streams
    ]
    assert len(streams) >= 3 and len(set(expiries)) == len(streams), streams
    for (opened_at, _url), expired_at in zip(streams[1:], expiries, strict=False):
        assert opened_at < expired_at, "renewed before the token expired"
    assert not [text for text in closing if "token_expired" in text], closing

    await raw.wait_for_function("window.closedEvents.length > 0", timeout=(ttl_s + 5) * 1000)
    [closed] = await raw.evaluate("window.closedEvents")
    assert closed["code"] == "token_expired" and closed["type"] == "closed", closed


# /pressroom.js in a page of the app's own, each watch's callbacks recorded by its name.
MODULE_WATCHES = """
  const { watchChannel, watchJob } = await import(`${API}/pressroom.js`);
  const getToken = () => fetch("/api/pressroom-token").then((answer) => answer.json());
  window.outcomes = {};
  window.watches = {};
  window.follow = (name, watch, target, options = {}) => {
    const seen = (window.outcomes[name] = { events: [], done: [], errors: [], resets: [] });
    window.watches[name] = watch(API, target, {
      getToken,
      onEvent: (event) => seen.events.push(event),
      onDone: (job) => seen.done.push(job),
      onError: (problem) => seen.errors.push(problem),
      onReset: (reset) => seen.resets.push(reset),
      ...options,
    });
  };
  window.watchJob = watchJob;
  window.watchChannel = watchChannel;
  window.ready = true;
"""


async def module_page(origins: Origins, before: str = "") -> Page:
    """A page of the app with MODULE_WATCHES loaded (after `before`, a script of its own)."""
    script = before + with_constants(MODULE_WATCHES, API=origins.api_url)
    page = await origins.open("module", script, module=True)
    await page.wait_for_function("window.ready === true")
    return page


async def finished_job(origins: Origins, app: RunningApp) -> tuple[str, int]:
    """A job taken to done, and its final event's id."""
    job_id = await origins.submit(app.http)
    url, key = (
        f"{origins.api_url}/v1/jobs/{job_id}/events",
        {"Authorization": f"Bearer {origins.key}"},
    )
    *_before, final = await collect(app.http, url, until="job.done", headers=key)
    assert final.id is not None
    return job_id, int(final.id)


async def test_the_module_learns_why_a_stream_failed(
    start_app: Callable[..., Any],
    origins: Origins,
    pool: asyncpg.Pool,
) -> None:
    origins.spa.token_body = {}  # the tenant's streams
    app: RunningApp = await start_app(
        renderer=FakeRenderer(), render_slots=1, env=allowing(origins.spa)
    )
    origins.serve(app.url("").rstrip("/"))
    counts = HubCounts(app.app)
    job_id, final_id = await finished_job(origins, app)
    page = await module_page(origins)
    await page.evaluate(
        """([job, final]) => {
          follow("finished", watchJob, job, { lastEventId: final });
          follow("unknown", watchJob, "0b5c7e3a-0000-4000-8000-000000000000");
          follow("never given out", watchChannel, null, { lastEventId: "900000000" });
        }""",
        [job_id, final_id],
    )
    # Reopened at its final event, the job's stream answers 204: the job is over.
    await page.wait_for_function("outcomes.finished.done.length === 1")
    finished = await page.evaluate("outcomes.finished")
    assert finished["done"][0]["status"] == "done" and finished["events"] == []
    assert await page.evaluate("watches.finished.state") == "done"
    # A refusal is the problem+json the API answers, and ends the watch.
    await page.wait_for_function("outcomes.unknown.errors.length === 1")
    [problem] = await page.evaluate("outcomes.unknown.errors")
    assert problem["status"] == 404 and problem["title"], problem
    assert await page.evaluate("watches.unknown.state") == "failed"
    # A cursor this server never gave out: a reset saying so, and the stream goes on live.
    await page.wait_for_function("outcomes['never given out'].resets.length === 1")
    [reset] = await page.evaluate("outcomes['never given out'].resets")
    assert reset["code"] == "unknown_cursor", reset
    await counts.until({"sse": 1, "socketio": 0, "longpoll": 0}, 10)
    live = await origins.submit(app.http)
    await page.wait_for_function("outcomes['never given out'].events.length >= 1")
    assert await page.evaluate("outcomes['never given out'].events[0].job.id") == live
    await page.evaluate("watches['never given out'].close()")
    await counts.until(NONE, RELEASED_WITHIN_S)


async def test_without_eventsource_the_module_long_polls(
    start_app: Callable[..., Any],
    origins: Origins,
    pool: asyncpg.Pool,
) -> None:
    renderer = FakeRenderer()
    renderer.gate = asyncio.Event()
    app: RunningApp = await start_app(renderer=renderer, render_slots=1, env=allowing(origins.spa))
    origins.serve(app.url("").rstrip("/"))
    counts = HubCounts(app.app)
    page = await module_page(origins, "delete window.EventSource;\n")
    await page.evaluate(f"follow('channel', watchChannel, {json.dumps(CHANNEL)}, {{ waitS: 5 }})")
    await counts.until({"sse": 0, "socketio": 0, "longpoll": 1}, 10)
    job_id = await origins.submit(app.http)
    await renderer.started.wait()
    await page.evaluate(f"follow('job', watchJob, {json.dumps(job_id)}, {{ waitS: 5 }})")
    await page.wait_for_function("outcomes.job.events.length === 1")  # its state now: running
    renderer.gate.set()
    await page.wait_for_function("outcomes.job.done.length === 1")
    job = await page.evaluate("outcomes.job")
    assert [event["type"] for event in job["events"]] == ["job.running", "job.done"]
    assert "event_id" not in job["events"][0], "the job's long-poll gives states, not events"
    assert await page.evaluate("watches.job.transport") == "longpoll"

    await page.wait_for_function("outcomes.channel.events.length >= 3")
    log = await channel_log(pool)
    assert [e["event_id"] for e in await page.evaluate("outcomes.channel.events")] == log
    assert await page.evaluate("watches.channel.lastEventId") == str(log[-1])


async def test_the_module_is_served_revalidated_and_to_the_allowed_origin(
    start_app: Callable[..., Any],
    origins: Origins,
) -> None:
    app: RunningApp = await start_app(render_slots=0, env=allowing(origins.spa))
    allowed = {"Origin": origins.spa.origin()}
    async with app.http.get(app.url("/pressroom.js"), headers=allowed) as resp:
        assert resp.status == 200 and resp.content_type == "text/javascript"
        assert resp.headers["Cache-Control"] == "no-cache"
        assert resp.headers["Access-Control-Allow-Origin"] == origins.spa.origin()
        assert "export function watchJob" in await resp.text()
        etag = resp.headers["ETag"]
    async with app.http.get(app.url("/pressroom.js"), headers={"If-None-Match": etag}) as resp:
        assert resp.status == 304
    refused = {"Origin": origins.spa.origin(other=True)}
    async with app.http.get(app.url("/pressroom.js"), headers=refused) as resp:
        assert resp.status == 200 and "Access-Control-Allow-Origin" not in resp.headers
