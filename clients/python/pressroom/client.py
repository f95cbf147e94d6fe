"""The Python client's `AsyncClient` (asyncio, aiohttp); pressroom/sync.py runs it for code that
is not async. The CLI is built on it.

    from pressroom import AsyncClient
    async with AsyncClient() as pressroom:           # PRESSROOM_URL, PRESSROOM_API_KEY
        job = await pressroom.submit(template="<h1>Hi {{name}}</h1>", data={"name": "Ana"})
        job = await pressroom.wait(job["id"])        # over SSE; long-poll when SSE fails
        await pressroom.download(job, "hi.pdf")      # atomic; a fresh link if it expired
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import json
import os
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Coroutine, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import aiohttp
from yarl import URL

#: The client's own settings, read when a client is made without them: the server's URL (else
#: DEFAULT_URL) and an API key (else none, as the open dev mode takes).
URL_VARIABLE = "PRESSROOM_URL"
API_KEY_VARIABLE = "PRESSROOM_API_KEY"
DEFAULT_URL = "http://127.0.0.1:8080"
FINAL_STATES = frozenset({"done", "failed", "cancelled"})
TERMINAL_EVENTS = frozenset({"job.done", "job.failed", "job.cancelled"})
LONG_POLL_S = 30
REQUEST_TIMEOUT_S = 30.0
# The server pings idle streams (every 15 s by default); silence for this long means a dead link.
STREAM_IDLE_S = 60.0
RECONNECT_MIN_S = 0.25
RECONNECT_MAX_S = 10.0
DOWNLOAD_ATTEMPTS = 3
PDF_SIGNATURE = b"%PDF-"

Json = dict[str, Any]
EventCallback = Callable[[Json], None]


def _stop_if_cancelled() -> None:
    """In a retry loop's handler of transport errors: stop when this task is being cancelled.
    aiohttp can raise a TimeoutError in place of the CancelledError of a cancel that meets one
    of its timers (aio-libs/aiohttp#5979); taken for a broken connection, the cancel would be
    lost and the loop would reconnect for ever (a `pressroom watch` that Ctrl-C did not end)."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class PressroomError(Exception):
    """The server refused a request; `problem` is its problem+json body (RFC 9457)."""

    def __init__(self, status: int, problem: Json) -> None:
        self.status = status
        self.problem = problem
        title = problem.get("title") or f"HTTP {status}"
        detail = problem.get("detail")
        message = f"{title}: {detail}" if detail else str(title)
        for error in problem.get("errors") or []:
            if isinstance(error, dict):
                message += f"\n  {error.get('field') or '(body)'}: {error.get('message')}"
        super().__init__(message)

    @property
    def errors(self) -> list[Json]:
        """Field errors of a 422: [{"field": ..., "message": ...}]."""
        return list(self.problem.get("errors") or [])


class PressroomUnavailable(PressroomError):
    """The server could not be reached (or answered with something that is not the API)."""

    def __init__(self, detail: str) -> None:
        super().__init__(0, {"title": "Server unavailable", "status": 0, "detail": detail})


class _StreamUnavailable(Exception):
    """The event stream could not be opened (no SSE here): callers fall back to long-poll."""


class _StreamEnded(Exception):
    """The job's stream is over (204: its final event is behind the cursor): nothing comes."""


async def _problem(resp: aiohttp.ClientResponse) -> PressroomError:
    try:
        body = json.loads(await resp.read())
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {"title": resp.reason or f"HTTP {resp.status}", "status": resp.status}
    return PressroomError(resp.status, body)


def write_atomically(path: Path, data: bytes) -> None:
    """Write to a temporary file beside `path`, flush it to disk, then rename it into place."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.part")
    try:
        with open(tmp, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    with contextlib.suppress(OSError):  # the rename itself is durable once the folder is synced
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)


class AsyncClient:
    """A Pressroom server's API. Use `async with AsyncClient() as client:` or call close()."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self.url = (url or os.environ.get(URL_VARIABLE) or DEFAULT_URL).rstrip("/")
        self.api_key = api_key or os.environ.get(API_KEY_VARIABLE) or None
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *_exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s)
            )
        return self._session

    def _absolute(self, path_or_url: str) -> str:
        return str(URL(self.url + "/").join(URL(path_or_url, encoded=True)))

    def _headers(self, target: str, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = dict(extra or {})
        # The key goes to this server only, never to a storage host behind a signed link.
        if self.api_key and URL(target).origin() == URL(self.url).origin():
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    async def _request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        data: bytes | None = None,
        params: dict[str, str] | None = None,
        headers: dict[str, str] | None = None,
        timeout_s: float | None = None,
    ) -> Any:
        """The answer's JSON (or PDF bytes; None for 204 and 304): `body` is sent as JSON,
        `data` as it is."""
        url = self._absolute(path)
        timeout = aiohttp.ClientTimeout(total=timeout_s or self.timeout_s)
        try:
            async with self._http().request(
                method,
                url,
                json=body,
                data=data,
                params=params,
                headers=self._headers(url, headers),
                timeout=timeout,
            ) as resp:
                if resp.status >= 400:
                    raise await _problem(resp)
                if resp.status in (204, 304):
                    return None
                if resp.content_type == "application/pdf":
                    return await resp.read()
                return await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise PressroomUnavailable(f"{method} {url}: {exc or type(exc).__name__}") from exc

    # --- jobs ---------------------------------------------------------------------------

    async def submit(
        self,
        body: Json | None = None,
        *,
        template: str | None = None,
        template_id: str | None = None,
        data: Json | None = None,
        options: Json | None = None,
        idempotency_key: str | None = None,
        **fields: Any,
    ) -> Json:
        """Queue a job: a full JSON body, or template (or template_id) + data + options."""
        job_body = dict(body or {})
        for name, value in (
            ("template", template),
            ("template_id", template_id),
            ("data", data),
            ("options", options),
            *fields.items(),
        ):
            if value is not None:
                job_body[name] = value
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        job: Json = await self._request("POST", "/v1/jobs", body=job_body, headers=headers)
        return job

    async def get(self, job_id: str) -> Json:
        job: Json = await self._request("GET", f"/v1/jobs/{job_id}")
        return job

    async def list(
        self, *, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Json:
        """One page of jobs, newest first: {"items": [...], "next_cursor": ...}."""
        params = {
            name: str(value)
            for name, value in (("status", status), ("limit", limit), ("cursor", cursor))
            if value is not None
        }
        page: Json = await self._request("GET", "/v1/jobs", params=params)
        return page

    async def cancel(self, job_id: str) -> Json:
        job: Json = await self._request("POST", f"/v1/jobs/{job_id}/cancel")
        return job

    async def retry(self, job_id: str) -> Json:
        job: Json = await self._request("POST", f"/v1/jobs/{job_id}/retry")
        return job

    # --- events -------------------------------------------------------------------------

    async def _stream(
        self,
        path: str,
        last_event_id: int | None,
        on_open: Callable[[], None] | None = None,
    ) -> AsyncIterator[Json]:
        """The events of one SSE connection. _StreamUnavailable when it cannot be opened;
        it ends (or raises a ClientError) when the connection does."""
        url = self._absolute(path)
        headers = {"Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = str(last_event_id)
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.timeout_s, sock_read=STREAM_IDLE_S
        )
        try:
            resp = await self._http().get(url, headers=self._headers(url, headers), timeout=timeout)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _StreamUnavailable(str(exc)) from exc
        async with resp:
            if resp.status == 204:
                raise _StreamEnded()
            if 400 <= resp.status < 500:
                raise await _problem(resp)  # no such job, bad credentials: not a transport issue
            if resp.status != 200 or resp.content_type != "text/event-stream":
                raise _StreamUnavailable(f"HTTP {resp.status} {resp.content_type}")
            if on_open is not None:
                on_open()
            event, ident, data = "message", None, []
            async for raw in resp.content:
                line = raw.decode("utf-8").rstrip("\r\n")
                if line.startswith(":"):
                    continue  # a ping
                if line:
                    field, _, value = line.partition(":")
                    value = value.removeprefix(" ")
                    if field == "event":
                        event = value
                    elif field == "id":
                        ident = value
                    elif field == "data":
                        data.append(value)
                    continue
                if data:
                    message: Json = json.loads("\n".join(data))
                    message.setdefault("type", event)
                    if ident and ident.isascii() and ident.isdigit():
                        message.setdefault("event_id", int(ident))
                    yield message
                event, ident, data = "message", None, []

    async def events(
        self,
        job_id: str | None = None,
        last_event_id: int | None = None,
        *,
        types: Iterable[str] | None = None,
        on_open: Callable[[], None] | None = None,
    ) -> AsyncGenerator[Json, None]:
        """Events as they happen: one job's (from its first event; ends after its final one)
        or all of the tenant's (live, or after `last_event_id`; only of `types`, when given,
        such as ["job.done", "job.failed"]). Reconnects by itself and resumes after the last
        event it gave you, so none is missed or repeated. `on_open` is called whenever a
        connection is open (subscribed)."""
        if job_id:
            path = f"/v1/jobs/{job_id}/events"
        else:
            path = "/v1/events"
            if types:
                path += "?" + urlencode({"type": ",".join(types)})
        delay_s = RECONNECT_MIN_S
        while True:
            try:
                async for event in self._stream(path, last_event_id, on_open):
                    delay_s = RECONNECT_MIN_S
                    if event.get("type") == "closed":
                        break  # the server asks us to come back (shutdown, fell behind)
                    if event.get("event_id") is not None:
                        last_event_id = event["event_id"]
                    yield event
                    if job_id is not None and event.get("type") in TERMINAL_EVENTS:
                        return
            except _StreamEnded:
                return
            except (_StreamUnavailable, aiohttp.ClientError, TimeoutError, ConnectionError):
                _stop_if_cancelled()
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, RECONNECT_MAX_S)

    async def wait(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        on_event: EventCallback | None = None,
    ) -> Json:
        """The job once it is done, failed or cancelled. Follows its SSE stream (on_event sees
        each event); where SSE cannot be opened, long-polls GET /v1/jobs/{id}?wait=30."""
        async with asyncio.timeout(timeout_s):
            last_event_id: int | None = None
            delay_s = RECONNECT_MIN_S
            while True:
                try:
                    async for event in self._stream(f"/v1/jobs/{job_id}/events", last_event_id):
                        delay_s = RECONNECT_MIN_S
                        if event.get("type") == "closed":
                            break
                        if event.get("event_id") is not None:
                            last_event_id = event["event_id"]
                        if on_event is not None:
                            on_event(event)
                        job = event.get("job")
                        if isinstance(job, dict) and (
                            event.get("type") in TERMINAL_EVENTS
                            or (event.get("type") == "reset" and job.get("status") in FINAL_STATES)
                        ):
                            return job
                except _StreamEnded:
                    return await self.get(job_id)
                except _StreamUnavailable:
                    return await self._long_poll(job_id, on_event)
                except (aiohttp.ClientError, TimeoutError, ConnectionError):
                    _stop_if_cancelled()  # else the connection broke: resume by event id
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, RECONNECT_MAX_S)

    async def _long_poll(self, job_id: str, on_event: EventCallback | None) -> Json:
        etag: str | None = None
        delay_s = RECONNECT_MIN_S
        while True:
            url = self._absolute(f"/v1/jobs/{job_id}")
            headers = {"If-None-Match": etag} if etag else {}
            try:
                async with self._http().get(
                    url,
                    params={"wait": str(LONG_POLL_S)},
                    headers=self._headers(url, headers),
                    timeout=aiohttp.ClientTimeout(total=LONG_POLL_S + self.timeout_s),
                ) as resp:
                    if 400 <= resp.status < 500 and resp.status != 304:
                        raise await _problem(resp)
                    if resp.status == 304:
                        continue
                    if resp.status != 200:
                        raise aiohttp.ClientResponseError(
                            resp.request_info, (), status=resp.status, message=resp.reason or ""
                        )
                    etag = resp.headers.get("ETag")
                    job: Json = await resp.json()
            except (aiohttp.ClientError, TimeoutError):
                _stop_if_cancelled()
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, RECONNECT_MAX_S)
                continue
            delay_s = RECONNECT_MIN_S
            if on_event is not None:
                on_event({"type": f"job.{job['status']}", "event_id": None, "job": job})
            if job["status"] in FINAL_STATES:
                return job

    # --- files --------------------------------------------------------------------------

    async def download(self, job: Json | str, path: str | os.PathLike[str]) -> Path:
        """Save a done job's PDF at `path`, atomically (temp file + rename), after checking
        it is a PDF. An expired link is replaced by a fresh one; nothing is rendered again."""
        current = await self.get(job) if isinstance(job, str) else job

        async def link(renew: bool) -> tuple[str, str]:
            nonlocal current
            if renew or "url" not in current:
                current = await self.get(current["id"])
            what = f"job {current.get('id')}"
            if current.get("status") != "done" or not current.get("url"):
                detail = f"{what} is {current.get('status')}; only a done job has a PDF"
                raise PressroomError(409, {"title": "Not done", "status": 409, "detail": detail})
            return current["url"], what

        return await self._save_pdf(link, Path(path))

    async def download_combined(self, batch: Json | str, path: str | os.PathLike[str]) -> Path:
        """Save the combined PDF of a batch made with `combine` at `path`, as `download` saves
        a job's."""
        current = await self.get_batch(batch) if isinstance(batch, str) else batch

        async def link(renew: bool) -> tuple[str, str]:
            nonlocal current
            if renew or not (current.get("combined") or {}).get("url"):
                current = await self.get_batch(current["id"])
            combined = current.get("combined") or {}
            what = f"the combined PDF of batch {current.get('id')}"
            if combined.get("status") != "done" or not combined.get("url"):
                state = combined.get("status") or "not asked for (combine)"
                detail = f"{what} is {state}" + (
                    f": {combined['error']}" if combined.get("error") else ""
                )
                raise PressroomError(409, {"title": "Not done", "status": 409, "detail": detail})
            return combined["url"], what

        return await self._save_pdf(link, Path(path))

    async def _save_pdf(
        self, link: Callable[[bool], Coroutine[Any, Any, tuple[str, str]]], target: Path
    ) -> Path:
        """Download the PDF `link` names (asked again for a fresh one when refused: an expired
        link) and write it at `target` atomically."""
        what = "the file"
        for attempt in range(DOWNLOAD_ATTEMPTS):
            url, what = await link(attempt > 0)
            url = self._absolute(url)
            try:
                async with self._http().get(url, headers=self._headers(url)) as resp:
                    if resp.status == 403:
                        continue  # the signed link expired: ask for a fresh one
                    if resp.status >= 400:
                        raise await _problem(resp)
                    data = await resp.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise PressroomUnavailable(f"GET {url}: {exc or type(exc).__name__}") from exc
            if not data.startswith(PDF_SIGNATURE):
                raise PressroomError(
                    502,
                    {
                        "title": "Not a PDF",
                        "status": 502,
                        "detail": f"the download of {what} is not a PDF",
                    },
                )
            await asyncio.to_thread(write_atomically, target, data)
            return target
        raise PressroomError(
            403,
            {
                "title": "Download refused",
                "status": 403,
                "detail": f"the download links of {what} kept being refused",
            },
        )

    # --- batches ------------------------------------------------------------------------

    async def create_batch(
        self,
        items: builtins.list[Json],
        *,
        webhook_url: str | None = None,
        combine: bool | Json = False,
    ) -> Json:
        """One job per item ({key, template | template_id, data, options}); submitting the
        same items again returns the same batch and creates nothing. With `combine` (True, or
        {"outline": False}), the items' PDFs are also joined into one (download_combined)."""
        body: Json = {"items": items}
        if webhook_url is not None:
            body["webhook_url"] = webhook_url
        if combine:
            body["combine"] = combine
        batch: Json = await self._request("POST", "/v1/batches", body=body)
        return batch

    async def get_batch(self, batch_id: str) -> Json:
        batch: Json = await self._request("GET", f"/v1/batches/{batch_id}")
        return batch

    async def wait_batch(self, batch_id: str, *, timeout_s: float | None = None) -> Json:
        """The batch once it is done: every item final and, with combine, the join over. A
        batch already done is returned at once: the tenant's batch.done events are followed
        from before the batch is read, so the one that ends it cannot pass unseen."""
        async with asyncio.timeout(timeout_s):
            opened = asyncio.Event()
            events = self.events(types=["batch.done"], on_open=opened.set)
            done = asyncio.ensure_future(self._batch_done(events, batch_id))
            subscribed = asyncio.ensure_future(opened.wait())
            try:
                await asyncio.wait([done, subscribed], return_when=asyncio.FIRST_COMPLETED)
                if not done.done():
                    batch = await self.get_batch(batch_id)
                    if batch["status"] == "done":
                        return batch
                return await done
            finally:
                for task in (done, subscribed):
                    task.cancel()
                await asyncio.gather(done, subscribed, return_exceptions=True)
                await events.aclose()

    @staticmethod
    async def _batch_done(events: AsyncGenerator[Json, None], batch_id: str) -> Json:
        async for event in events:
            batch = event.get("batch")
            if isinstance(batch, dict) and batch.get("id") == batch_id:
                return batch
        raise PressroomUnavailable("the event stream ended before the batch was done")

    # --- assets -------------------------------------------------------------------------

    async def upload_asset(self, data: bytes, content_type: str) -> Json:
        """Store a file (an image, a font, a stylesheet, …) that jobs map in by relative path
        (`assets={"img/logo.png": asset["id"]}`); the same bytes give the same asset."""
        asset: Json = await self._request(
            "POST", "/v1/assets", data=data, headers={"Content-Type": content_type}
        )
        return asset

    async def list_assets(self, *, limit: int | None = None, cursor: str | None = None) -> Json:
        """One page of the tenant's assets by id, with `total_bytes` and `quota_bytes`."""
        params = {
            name: str(value)
            for name, value in (("limit", limit), ("cursor", cursor))
            if value is not None
        }
        page: Json = await self._request("GET", "/v1/assets", params=params)
        return page

    async def delete_asset(self, asset_id: str) -> None:
        """Delete an asset; PressroomError 409 while a queued or running job uses it."""
        await self._request("DELETE", f"/v1/assets/{asset_id}")

    # --- templates ----------------------------------------------------------------------

    async def create_template(
        self,
        name: str,
        html: str,
        *,
        options: Json | None = None,
        sample_data: Json | None = None,
        publish: bool = False,
    ) -> Json:
        """Store a new version of a template, a draft unless `publish`: jobs name it as
        `name@version`, and as `name` once it is published."""
        body: Json = {"name": name, "html": html}
        if options is not None:
            body["options"] = options
        if sample_data is not None:
            body["sample_data"] = sample_data
        if publish:
            body["publish"] = True
        template: Json = await self._request("POST", "/v1/templates", body=body)
        return template

    async def publish_template(
        self, template_id: str, *, force: bool = False, threshold: float | None = None
    ) -> Json:
        """Publish a draft (`name@version`) once its samples compare well with the published
        version (a PressroomError with status 409 otherwise, naming what changed, unless
        `force`)."""
        body: Json = {"force": force}
        if threshold is not None:
            body["threshold"] = threshold
        template: Json = await self._request(
            "POST", f"/v1/templates/{template_id}/publish", body=body
        )
        return template

    async def get_template(self, template_id: str) -> Json:
        """The latest version of `name` (or `name@version`), with the list of versions."""
        template: Json = await self._request("GET", f"/v1/templates/{template_id}")
        return template

    async def list_templates(self, *, limit: int | None = None, cursor: str | None = None) -> Json:
        params = {
            name: str(value)
            for name, value in (("limit", limit), ("cursor", cursor))
            if value is not None
        }
        page: Json = await self._request("GET", "/v1/templates", params=params)
        return page

    async def preview(
        self,
        template_id: str | None = None,
        *,
        html: str | None = None,
        data: Json | None = None,
        options: Json | None = None,
    ) -> bytes:
        """The PDF of a stored template (with its sample data unless `data` is given), or of
        inline `html`, rendered at once."""
        body: Json = {}
        if html is not None:
            body["html"] = html
        if data is not None:
            body["data"] = data
        if options is not None:
            body["options"] = options
        path = f"/v1/templates/{template_id}/preview" if template_id else "/v1/templates/preview"
        pdf: bytes = await self._request("POST", path, body=body)
        return pdf
