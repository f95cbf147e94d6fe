"""S3Storage against moto's S3 server over real HTTP: uploads, presigned downloads, readiness.

The endpoint and credentials reach it as they reach a deployment: the AWS SDK's own variables,
which botocore reads from the process environment (the `aws_env` fixture sets them)."""

from __future__ import annotations

import hashlib
import hmac
import io
import json
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import aiohttp
import moto.settings
import pytest
import yarl
from aiobotocore.session import AioSession
from moto.server import ThreadedMotoServer
from pypdf import PdfWriter

from server.errors import StorageError
from server.files.s3 import NO_CREDENTIALS, S3Storage, open_s3_storage
from server.options import outputs
from server.settings import S3Location, Settings
from tests.pdfs import small_image

ACCESS_KEY_ID = "AKIAPRESSROOMTEST01"
SECRET_ACCESS_KEY = "pressroom-test-secret-0123456789"
PREFIX = "tenant-files/"


@pytest.fixture(scope="module")
def moto_endpoint() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


@pytest.fixture
async def admin(moto_endpoint: str) -> AsyncIterator[Any]:
    """A plain client that sets up buckets and looks behind the storage's back."""
    async with AioSession().create_client(
        "s3",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="admin",
        aws_secret_access_key="admin",
    ) as client:
        yield client


@pytest.fixture
async def bucket(admin: Any) -> str:
    name = f"pressroom-{uuid.uuid4().hex[:12]}"
    await admin.create_bucket(Bucket=name)
    return name


@pytest.fixture
def aws_env(moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The variables an operator sets for an S3-compatible store, and no other AWS_* variable,
    config file or instance role of the machine the tests run on."""
    for var in [var for var in os.environ if var.startswith("AWS_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY)


def location(storage: str) -> S3Location:
    """A PRESSROOM_STORAGE value as the settings read it."""
    parsed = Settings(storage=storage).storage
    assert isinstance(parsed, S3Location)
    return parsed


@pytest.fixture
async def storage(aws_env: None, bucket: str) -> AsyncIterator[S3Storage]:
    # No region is set: the SDK signs for us-east-1, which R2 and MinIO accept too.
    async with open_s3_storage(location(f"s3://{bucket}/{PREFIX}")) as opened:
        yield opened


@pytest.fixture(scope="module")
def pdf() -> bytes:
    writer = PdfWriter()
    writer.add_blank_page(width=595, height=842)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


async def object_keys(admin: Any, bucket: str) -> list[str]:
    listing = await admin.list_objects_v2(Bucket=bucket)
    return [item["Key"] for item in listing.get("Contents", [])]


def presigned_signature(url: str, secret: str) -> str:
    """Recompute a presigned GET's SigV4 signature by hand: moto itself never checks it."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    params = dict(query)
    canonical_query = "&".join(
        f"{quote(name, safe='-_.~')}={quote(value, safe='-_.~')}"
        for name, value in sorted(query)
        if name != "X-Amz-Signature"
    )
    canonical_request = "\n".join(
        ["GET", parts.path, canonical_query, f"host:{parts.netloc}\n", "host", "UNSIGNED-PAYLOAD"]
    )
    scope = params["X-Amz-Credential"].split("/", 1)[1]
    string_to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            params["X-Amz-Date"],
            scope,
            hashlib.sha256(canonical_request.encode()).hexdigest(),
        ]
    )
    key = f"AWS4{secret}".encode()
    for part in scope.split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, string_to_sign.encode(), hashlib.sha256).hexdigest()


async def download(url: str) -> tuple[int, dict[str, str], bytes]:
    # encoded=True: yarl would otherwise re-quote the signed query string.
    async with aiohttp.ClientSession() as http, http.get(yarl.URL(url, encoded=True)) as response:
        return response.status, dict(response.headers), await response.read()


async def presign(
    storage: S3Storage,
    key: str,
    *,
    filename: str,
    ttl_s: int,
    content_type: str = outputs.PDF.content_type,
) -> str:
    url = await storage.presign(key, filename=filename, content_type=content_type, ttl_s=ttl_s)
    assert url is not None, "a bucket serves its files itself"
    return url


async def test_presigned_url_downloads_the_stored_pdf(
    storage: S3Storage, bucket: str, pdf: bytes
) -> None:
    await storage.put("jobs/job_1.pdf", pdf, filename="invoice-42.pdf")

    url = await presign(storage, "jobs/job_1.pdf", filename="invoice-42.pdf", ttl_s=900)
    status, headers, body = await download(url)

    assert status == 200
    assert body == pdf
    assert headers["Content-Type"] == "application/pdf"
    assert headers["Content-Disposition"] == 'attachment; filename="invoice-42.pdf"'
    parts = urlsplit(url)
    assert parts.path == f"/{bucket}/{PREFIX}jobs/job_1.pdf"  # path-style addressing
    params = dict(parse_qsl(parts.query))
    assert params["X-Amz-Algorithm"] == "AWS4-HMAC-SHA256"
    assert params["X-Amz-Expires"] == "900"
    # Signed with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, for the SDK's default region.
    assert params["X-Amz-Credential"].startswith(f"{ACCESS_KEY_ID}/")
    assert params["X-Amz-Credential"].endswith("/us-east-1/s3/aws4_request")
    assert params["X-Amz-Signature"] == presigned_signature(url, SECRET_ACCESS_KEY)
    assert SECRET_ACCESS_KEY not in url


async def test_the_region_is_the_sdks_own_variable(
    aws_env: None, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "auto")  # what Cloudflare R2 calls its region
    async with open_s3_storage(location(f"s3://{bucket}")) as storage:
        url = await presign(storage, "job_1.pdf", filename="a.pdf", ttl_s=60)
    credential = dict(parse_qsl(urlsplit(url).query))["X-Amz-Credential"]
    assert credential.endswith("/auto/s3/aws4_request")


async def test_a_custom_endpoint_is_addressed_path_style_even_by_host_name(
    aws_env: None,
    moto_endpoint: str,
    admin: Any,
    bucket: str,
    pdf: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A host name, as MinIO's usually is (http://minio:9000): by IP address the SDK would
    # address it path-style anyway. Virtual-hosted, the bucket would be part of the host name.
    endpoint = moto_endpoint.replace("127.0.0.1", "localhost")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint)
    async with open_s3_storage(location(f"s3://{bucket}/{PREFIX}")) as storage:
        await storage.check()
        await storage.put("job_1.pdf", pdf, filename="a.pdf")
        assert await storage.get("job_1.pdf") == pdf
        url = await presign(storage, "job_1.pdf", filename="a.pdf", ttl_s=60)

    assert url.startswith(f"{endpoint}/{bucket}/{PREFIX}job_1.pdf?")
    assert await object_keys(admin, bucket) == [f"{PREFIX}job_1.pdf"]
    status, _headers, body = await download(url)
    assert (status, body) == (200, pdf)


async def test_credentials_from_the_aws_variables_are_the_ones_the_bucket_checks(
    aws_env: None,
    moto_endpoint: str,
    admin: Any,
    bucket: str,
    pdf: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A user of moto's IAM with its own key, then moto's signature and key checks on.
    user = f"pressroom-{uuid.uuid4().hex[:8]}"
    async with AioSession().create_client(
        "iam",
        endpoint_url=moto_endpoint,
        region_name="us-east-1",
        aws_access_key_id="admin",
        aws_secret_access_key="admin",
    ) as iam:
        await iam.create_user(UserName=user)
        policy = {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Action": "s3:*", "Resource": "*"}
        ]}  # fmt: skip
        await iam.put_user_policy(
            UserName=user, PolicyName="bucket", PolicyDocument=json.dumps(policy)
        )
        key = (await iam.create_access_key(UserName=user))["AccessKey"]
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", key["AccessKeyId"])
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", key["SecretAccessKey"])

    async with open_s3_storage(location(f"s3://{bucket}")) as storage:
        await storage.check()
        await storage.put("job_1.pdf", pdf, filename="a.pdf")
        assert await storage.get("job_1.pdf") == pdf

    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-the-secret-of-that-key")
    async with open_s3_storage(location(f"s3://{bucket}")) as storage:
        with pytest.raises(StorageError, match="refused the credentials"):
            await storage.check()


async def test_missing_credentials_fail_every_call_with_one_line_saying_what_to_set(
    aws_env: None, bucket: str, pdf: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    async with open_s3_storage(location(f"s3://{bucket}")) as storage:
        with pytest.raises(StorageError) as raised:
            await storage.check()
        assert str(raised.value) == NO_CREDENTIALS
        for call in (
            storage.put("job_1.pdf", pdf, filename="a.pdf"),
            storage.get("job_1.pdf"),
            storage.presign(
                "job_1.pdf", filename="a.pdf", content_type="application/pdf", ttl_s=60
            ),
        ):
            with pytest.raises(
                StorageError, match="found no AWS credentials: set AWS_ACCESS_KEY_ID"
            ):
                await call
    assert "\n" not in NO_CREDENTIALS and "IAM role" in NO_CREDENTIALS


async def test_an_image_is_stored_and_served_with_its_own_type(storage: S3Storage) -> None:
    webp = small_image("webp")
    await storage.put("jobs/job_4.webp", webp, filename="j.webp", content_type="image/webp")
    url = await presign(
        storage, "jobs/job_4.webp", filename="j.webp", ttl_s=900, content_type="image/webp"
    )
    status, headers, body = await download(url)
    assert (status, headers["Content-Type"], body) == (200, "image/webp", webp)
    with pytest.raises(StorageError, match="complete WEBP"):
        await storage.put("jobs/job_5.webp", b"RIFF", filename="j.webp", content_type="image/webp")


async def test_presign_refuses_a_lifetime_sigv4_cannot_sign(storage: S3Storage) -> None:
    with pytest.raises(StorageError, match="lifetime"):
        await presign(storage, "job_1.pdf", filename="a.pdf", ttl_s=8 * 24 * 3600)


async def test_prefix_is_applied_to_object_keys(
    storage: S3Storage, admin: Any, bucket: str, pdf: bytes
) -> None:
    await storage.put("t1/job_2.pdf", pdf, filename="a.pdf")

    assert await object_keys(admin, bucket) == [f"{PREFIX}t1/job_2.pdf"]
    assert await storage.get("t1/job_2.pdf") == pdf


async def test_non_ascii_filename_gets_an_ascii_fallback_and_filename_star(
    storage: S3Storage, admin: Any, bucket: str, pdf: bytes
) -> None:
    filename = 'Rechnung März "Q1"\r\n.pdf'
    await storage.put("job_3.pdf", pdf, filename=filename)

    expected = (
        'attachment; filename="Rechnung Marz _Q1_.pdf"; '
        "filename*=UTF-8''Rechnung%20M%C3%A4rz%20%22Q1%22.pdf"
    )
    stored = await admin.head_object(Bucket=bucket, Key=f"{PREFIX}job_3.pdf")
    assert stored["ContentDisposition"] == expected
    url = await presign(storage, "job_3.pdf", filename=filename, ttl_s=60)
    _, headers, _ = await download(url)
    assert headers["Content-Disposition"] == expected


async def test_check_passes_for_an_existing_bucket(storage: S3Storage) -> None:
    await storage.check()


async def test_check_names_a_missing_bucket(aws_env: None) -> None:
    async with open_s3_storage(location("s3://pressroom-no-such-bucket")) as storage:
        with pytest.raises(StorageError, match=r"'pressroom-no-such-bucket'.*does not exist"):
            await storage.check()


async def test_check_reports_refused_credentials_without_leaking_them(
    aws_env: None, bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server runs in this process, so this turns on moto's signature and key checks.
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)
    async with open_s3_storage(location(f"s3://{bucket}")) as storage:
        with pytest.raises(
            StorageError, match=r"refused the credentials \(found in env\)"
        ) as raised:
            await storage.check()
    assert bucket in str(raised.value)
    assert SECRET_ACCESS_KEY not in str(raised.value)
    assert ACCESS_KEY_ID not in str(raised.value)


async def test_put_refuses_bytes_that_are_not_a_pdf(
    storage: S3Storage, admin: Any, bucket: str
) -> None:
    with pytest.raises(StorageError, match="not a complete PDF"):
        await storage.put("job_4.pdf", b"<html>502 Bad Gateway</html>", filename="x.pdf")

    assert await object_keys(admin, bucket) == []


async def test_delete_removes_the_object(
    storage: S3Storage, admin: Any, bucket: str, pdf: bytes
) -> None:
    await storage.put("job_5.pdf", pdf, filename="a.pdf")

    await storage.delete("job_5.pdf")

    assert await object_keys(admin, bucket) == []
    with pytest.raises(FileNotFoundError):
        await storage.get("job_5.pdf")
    await storage.delete("job_5.pdf")  # retention may delete twice; that is not an error


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_unreachable_endpoint_raises_storage_error_quickly(
    aws_env: None, pdf: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{closed_port()}")
    # A key that holds the secret: botocore's message names the URL, which must not show it.
    key = f"{SECRET_ACCESS_KEY}/job_6.pdf"
    async with open_s3_storage(location("s3://pressroom-anywhere")) as storage:
        for attempt in (storage.check(), storage.put(key, pdf, filename="a.pdf")):
            started = time.monotonic()
            with pytest.raises(StorageError, match="Could not connect") as raised:
                await attempt
            # Three tries with jittered backoff (at most 1 s, then 2 s), never the 60 s default.
            assert time.monotonic() - started < 8
            assert SECRET_ACCESS_KEY not in str(raised.value)
    assert "[redacted]/job_6.pdf" in str(raised.value)
