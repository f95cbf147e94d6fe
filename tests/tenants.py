"""A tenant of a running test app, as its backend acts: its API key, its token secret, the jobs
it submits and the tokens it asks for."""

from __future__ import annotations

from typing import Any

import asyncpg

from server.access import apikeys
from tests.conftest import RunningApp

SEED = {"template": "<p>{{ n }}</p>", "data": {"n": 1}}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


class Tenant:
    """A tenant of the running app: its name, key and token secret."""

    def __init__(self, app: RunningApp, name: str, key: str, secret: str) -> None:
        self.app, self.name, self.key, self.secret = app, name, key, secret

    async def submit(self, channel: str | None = None) -> str:
        body = {**SEED, **({"channel": channel} if channel else {})}
        async with self.app.http.post(
            self.app.url("/v1/jobs"), json=body, headers=bearer(self.key)
        ) as resp:
            assert resp.status == 202, await resp.text()
            job_id: str = (await resp.json())["id"]
            return job_id

    async def mint(self, **body: Any) -> dict[str, Any]:
        async with self.app.http.post(
            self.app.url("/v1/tokens"), json=body, headers=bearer(self.key)
        ) as resp:
            answer: dict[str, Any] = await resp.json()
            assert resp.status == 200, answer
            return answer


async def made(pool: asyncpg.Pool, name: str) -> tuple[str, str]:
    """A new tenant's first API key and its token secret."""
    _row, key, secret = await apikeys.create_key_and_tenant(pool, name)
    assert secret is not None and secret.startswith("prts_")
    return key, secret
