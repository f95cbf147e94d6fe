"""The whole app on S3 storage (moto's server over real HTTP): downloads, redirects, readiness."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import moto.settings
import pytest

from server.files.s3 import NO_CREDENTIALS
from tests.assetfiles import png
from tests.conftest import RunningApp
from tests.integration import test_s3_storage as s3
from tests.integration.test_s3_storage import (
    ACCESS_KEY_ID,
    SECRET_ACCESS_KEY,
    download,
    object_keys,
    presigned_signature,
)
from tests.pdfs import FakeRenderer, minimal_pdf, page_contents
from tests.sse import collect, messages

# moto's S3 server, a fresh bucket per test and the AWS SDK's variables that lead to it,
# shared with test_s3_storage.
admin = s3.admin
aws_env = s3.aws_env
bucket = s3.bucket
moto_endpoint = s3.moto_endpoint
pytestmark = pytest.mark.usefixtures("aws_env")

SEED = {"template": "<h1>Hi {{name}}</h1>", "data": {"name": "Ana"}}


def s3_env(bucket_name: str, **extra: str) -> dict[str, str]:
    return {"PRESSROOM_STORAGE": f"s3://{bucket_name}/pdfs", **extra}


async def submit_and_finish(api: RunningApp) -> dict[str, Any]:
    async with api.http.post(api.url("/v1/jobs"), json=SEED) as resp:
        assert resp.status == 202, await resp.text()
        job: dict[str, Any] = await resp.json()
    messages = await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"))
    assert messages[-1].event == "job.done"
    async with api.http.get(api.url(f"/v1/jobs/{job['id']}")) as resp:
        done: dict[str, Any] = await resp.json()
    return done


async def test_done_job_links_a_presigned_url_with_the_stored_bytes(
    start_app: Callable[..., Any], moto_endpoint: str, bucket: str, admin: Any
) -> None:
    api: RunningApp = await start_app(
        renderer=FakeRenderer(),
        render_slots=1,
        env=s3_env(bucket, PRESSROOM_URL_TTL_S="900"),
    )

    job = await submit_and_finish(api)

    key = f"pdfs/default/{job['id']}/1.pdf"
    assert await object_keys(admin, bucket) == [key]
    stored = await admin.get_object(Bucket=bucket, Key=key)
    assert stored["ContentType"] == "application/pdf"
    async with stored["Body"] as body:
        kept = await body.read()
    assert page_contents(kept) == page_contents(minimal_pdf())
    url = job["url"]
    parts = urlsplit(url)
    assert f"{parts.scheme}://{parts.netloc}" == moto_endpoint
    assert parts.path == f"/{bucket}/{key}"
    params = dict(parse_qsl(parts.query))
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert params["X-Amz-Expires"] == "900"
    assert params["X-Amz-Credential"].startswith(f"{ACCESS_KEY_ID}/")
    assert params["X-Amz-Signature"] == presigned_signature(url, SECRET_ACCESS_KEY)
    status, headers, data = await download(url)
    assert status == 200 and headers["Content-Type"] == "application/pdf"
    assert data == kept
    assert job["bytes"] == len(data)


async def test_pdf_route_redirects_to_a_fresh_presigned_url(
    start_app: Callable[..., Any], moto_endpoint: str, bucket: str
) -> None:
    api: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1, env=s3_env(bucket))
    job = await submit_and_finish(api)

    async with api.http.get(api.url(job["links"]["pdf"]), allow_redirects=False) as resp:
        assert resp.status == 302
        location = resp.headers["Location"]

    assert location.startswith(f"{moto_endpoint}/{bucket}/pdfs/default/{job['id']}/1.pdf?")
    assert "X-Amz-Signature=" in location
    status, _headers, data = await download(location)
    assert status == 200 and page_contents(data) == page_contents(minimal_pdf())


async def test_a_combined_batch_is_kept_in_the_bucket_and_linked_presigned(
    start_app: Callable[..., Any], moto_endpoint: str, bucket: str
) -> None:
    api: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1, env=s3_env(bucket))
    items = [{"key": f"s3-{n}", **SEED} for n in range(2)]
    async with api.http.get(api.url("/v1/events?type=batch.done")) as events:
        async with api.http.post(
            api.url("/v1/batches"), json={"items": items, "combine": True}
        ) as resp:
            assert resp.status == 202
            batch = await resp.json()
        async for message in messages(events):
            if message.json["batch"]["id"] == batch["id"]:
                break
    combined = message.json["batch"]["combined"]
    key = f"pdfs/default/batches/{batch['id']}/1.pdf"
    assert combined["url"].startswith(f"{moto_endpoint}/{bucket}/{key}?")
    status, headers, data = await download(combined["url"])
    assert status == 200 and data.startswith(b"%PDF-") and len(data) == combined["bytes"]
    assert headers["Content-Type"] == "application/pdf"
    assert f'filename="{batch["id"]}.pdf"' in headers["Content-Disposition"]
    async with api.http.get(api.url(batch["links"]["pdf"]), allow_redirects=False) as resp:
        assert resp.status == 302
        assert resp.headers["Location"].startswith(f"{moto_endpoint}/{bucket}/{key}?")


async def test_missing_bucket_fails_readyz_and_says_so_at_start(
    start_app: Callable[..., Any], caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="server.web.app"):
        api: RunningApp = await start_app(render_slots=0, env=s3_env("pressroom-missing-bucket"))

    assert any(
        "storage is not ready" in r.getMessage()
        and "'pressroom-missing-bucket'" in r.getMessage()
        and "does not exist" in r.getMessage()
        for r in caplog.records
    ), [r.getMessage() for r in caplog.records]
    async with api.http.get(api.url("/readyz")) as resp:
        assert resp.status == 503
        body = await resp.json()
    assert body["ready"] is False
    assert "does not exist" in body["checks"]["storage"]
    assert body["checks"]["database"] == "ok"


async def test_refused_credentials_fail_readyz_without_leaking_them(
    start_app: Callable[..., Any], bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The moto server runs in this process: this turns on its credential checks.
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    api: RunningApp = await start_app(render_slots=0, env=s3_env(bucket))

    async with api.http.get(api.url("/readyz")) as resp:
        assert resp.status == 503
        body = await resp.json()

    assert "refused the credentials" in body["checks"]["storage"]
    assert SECRET_ACCESS_KEY not in str(body) and ACCESS_KEY_ID not in str(body)


async def test_a_start_without_credentials_says_which_to_set_and_is_not_ready(
    start_app: Callable[..., Any],
    bucket: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with caplog.at_level(logging.ERROR, logger="server.web.app"):
        api: RunningApp = await start_app(render_slots=0, env=s3_env(bucket))

    said = [r.getMessage() for r in caplog.records if r.name == "server.web.app"]
    assert said == [f"storage is not ready (/readyz fails until it is): {NO_CREDENTIALS}"]
    async with api.http.get(api.url("/readyz")) as resp:
        assert resp.status == 503
        body = await resp.json()
    assert body["checks"]["storage"] == f"error: {NO_CREDENTIALS}"
    upload = {"data": png((0, 0, 0), 2, 2), "headers": {"Content-Type": "image/png"}}
    async with api.http.post(api.url("/v1/assets"), **upload) as resp:
        assert resp.status == 503  # with Retry-After: a file call fails as a bucket outage does
        assert resp.headers["Retry-After"]


async def test_assets_are_kept_in_the_bucket_and_read_back_for_jobs(
    start_app: Callable[..., Any], bucket: str, admin: Any
) -> None:
    renderer = FakeRenderer()
    api: RunningApp = await start_app(renderer=renderer, render_slots=1, env=s3_env(bucket))
    logo = png((10, 200, 10), 12, 6)
    async with api.http.post(
        api.url("/v1/assets"), data=logo, headers={"Content-Type": "image/png"}
    ) as resp:
        assert resp.status == 201, await resp.text()
        asset = await resp.json()
    key = f"pdfs/default/assets/{asset['id'].removeprefix('sha256:')}"
    assert await object_keys(admin, bucket) == [key]
    stored = await admin.get_object(Bucket=bucket, Key=key)
    assert stored["ContentType"] == "image/png"
    async with stored["Body"] as body:
        assert await body.read() == logo
    async with api.http.get(api.url(asset["links"]["content"])) as resp:
        assert resp.status == 200 and await resp.read() == logo

    body = {"template": "<img src='img/logo.png'>", "assets": {"img/logo.png": asset["id"]}}
    async with api.http.post(api.url("/v1/jobs"), json=body) as resp:
        assert resp.status == 202, await resp.text()
        job = await resp.json()
    messages = await collect(api.http, api.url(f"/v1/jobs/{job['id']}/events"))
    assert messages[-1].event == "job.done"
    assert renderer.assets[-1] == {"img/logo.png": ("image/png", logo)}

    async with api.http.delete(api.url(f"/v1/assets/{asset['id']}")) as resp:
        assert resp.status == 204
    assert key not in await object_keys(admin, bucket)
