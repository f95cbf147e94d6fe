"""`Client`: the Python client for code that is not async, each call run on an AsyncClient in a
private event loop thread.

    from pressroom import Client
    with Client() as pressroom:                      # PRESSROOM_URL, PRESSROOM_API_KEY
        job = pressroom.submit(template="<h1>Hi {{name}}</h1>", data={"name": "Ana"})
        job = pressroom.wait(job["id"])              # over SSE; long-poll when SSE fails
        pressroom.download(job, "hi.pdf")            # atomic; a fresh link if it expired
"""

from __future__ import annotations

import asyncio
import builtins
import os
import threading
from collections.abc import AsyncIterator, Coroutine, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from pressroom.client import REQUEST_TIMEOUT_S, AsyncClient, EventCallback, Json

T = TypeVar("T")


class Client:
    """The same API for code that is not async: each call runs on the AsyncClient in a private
    event loop thread. Callbacks (on_event) run on that thread."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="pressroom-client", daemon=True
        )
        self._thread.start()
        self.aio = AsyncClient(url, api_key, timeout_s=timeout_s)

    @property
    def url(self) -> str:
        return self.aio.url

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._loop.is_closed():
            return
        self._run(self.aio.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def submit(self, body: Json | None = None, **kwargs: Any) -> Json:
        return self._run(self.aio.submit(body, **kwargs))

    def get(self, job_id: str) -> Json:
        return self._run(self.aio.get(job_id))

    def list(
        self, *, status: str | None = None, limit: int | None = None, cursor: str | None = None
    ) -> Json:
        return self._run(self.aio.list(status=status, limit=limit, cursor=cursor))

    def cancel(self, job_id: str) -> Json:
        return self._run(self.aio.cancel(job_id))

    def retry(self, job_id: str) -> Json:
        return self._run(self.aio.retry(job_id))

    def wait(
        self,
        job_id: str,
        *,
        timeout_s: float | None = None,
        on_event: EventCallback | None = None,
    ) -> Json:
        return self._run(self.aio.wait(job_id, timeout_s=timeout_s, on_event=on_event))

    def events(
        self,
        job_id: str | None = None,
        last_event_id: int | None = None,
        *,
        types: Iterable[str] | None = None,
    ) -> Iterator[Json]:
        stream = self.aio.events(job_id, last_event_id, types=types)
        try:
            while True:
                try:
                    yield self._run(_next(stream))
                except StopAsyncIteration:
                    return
        finally:
            self._run(stream.aclose())

    def download(self, job: Json | str, path: str | os.PathLike[str]) -> Path:
        return self._run(self.aio.download(job, path))

    def create_batch(
        self,
        items: builtins.list[Json],
        *,
        webhook_url: str | None = None,
        combine: bool | Json = False,
    ) -> Json:
        return self._run(self.aio.create_batch(items, webhook_url=webhook_url, combine=combine))

    def download_combined(self, batch: Json | str, path: str | os.PathLike[str]) -> Path:
        return self._run(self.aio.download_combined(batch, path))

    def get_batch(self, batch_id: str) -> Json:
        return self._run(self.aio.get_batch(batch_id))

    def wait_batch(self, batch_id: str, *, timeout_s: float | None = None) -> Json:
        return self._run(self.aio.wait_batch(batch_id, timeout_s=timeout_s))

    def upload_asset(self, data: bytes, content_type: str) -> Json:
        return self._run(self.aio.upload_asset(data, content_type))

    def list_assets(self, *, limit: int | None = None, cursor: str | None = None) -> Json:
        return self._run(self.aio.list_assets(limit=limit, cursor=cursor))

    def delete_asset(self, asset_id: str) -> None:
        self._run(self.aio.delete_asset(asset_id))

    def create_template(
        self,
        name: str,
        html: str,
        *,
        options: Json | None = None,
        sample_data: Json | None = None,
        publish: bool = False,
    ) -> Json:
        return self._run(
            self.aio.create_template(
                name, html, options=options, sample_data=sample_data, publish=publish
            )
        )

    def publish_template(
        self, template_id: str, *, force: bool = False, threshold: float | None = None
    ) -> Json:
        return self._run(self.aio.publish_template(template_id, force=force, threshold=threshold))

    def get_template(self, template_id: str) -> Json:
        return self._run(self.aio.get_template(template_id))

    def list_templates(self, *, limit: int | None = None, cursor: str | None = None) -> Json:
        return self._run(self.aio.list_templates(limit=limit, cursor=cursor))

    def preview(
        self,
        template_id: str | None = None,
        *,
        html: str | None = None,
        data: Json | None = None,
        options: Json | None = None,
    ) -> bytes:
        return self._run(self.aio.preview(template_id, html=html, data=data, options=options))


async def _next(stream: AsyncIterator[T]) -> T:
    return await anext(stream)
