"""S3-compatible buckets (AWS S3, Cloudflare R2, MinIO) through one aiobotocore client.

The AWS SDK finds the credentials, region and endpoint itself, from its own variables
(`AWS_ACCESS_KEY_ID`, `AWS_PROFILE`, `AWS_DEFAULT_REGION`, `AWS_ENDPOINT_URL_S3`, …), the
shared config files, or the IAM role the process runs with (EKS IRSA, ECS task role, EC2
instance profile). Its own module, so that only a process that stores in S3 loads botocore."""

from __future__ import annotations

import contextlib
import unicodedata
from collections.abc import AsyncIterator, Iterable
from typing import Any
from urllib.parse import quote

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from server.errors import StorageError
from server.files.storage import check_complete
from server.options import outputs
from server.settings import S3Location

S3_CONNECT_TIMEOUT_S = 5.0
S3_READ_TIMEOUT_S = 30.0
#: Total tries per call, first included; the job's own retry covers longer outages.
S3_MAX_ATTEMPTS = 3
#: SigV4 presigned URLs cannot live longer than seven days.
S3_MAX_URL_TTL_S = 7 * 24 * 3600
DEFAULT_FILENAME = "document.pdf"
#: What a process without credentials says: at start, in /readyz and in every failed call.
NO_CREDENTIALS = (
    "S3 storage found no AWS credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
    "or AWS_PROFILE, or run with an IAM role (EKS IRSA, ECS task role, EC2 instance profile)"
)

# RFC 5987 attr-char punctuation; quote() keeps letters and digits on its own.
_ATTR_CHAR_PUNCTUATION = "!#$&+-.^_`|~"
_S3_ERRORS: tuple[type[BaseException], ...] = (
    BotoCoreError,
    ClientError,
    aiohttp.ClientError,
    TimeoutError,
)


def content_disposition(filename: str) -> str:
    """An RFC 6266 `attachment` header value: an ASCII filename, plus filename* when needed."""
    name = (
        "".join("_" if ch in "/\\" else ch for ch in filename if ch.isprintable()).strip()[:255]
        or DEFAULT_FILENAME
    )
    fallback = []
    for ch in unicodedata.normalize("NFKD", name):
        if unicodedata.combining(ch):
            continue  # "é" decomposes to "e" + accent: keep the letter, drop the accent
        # Quotes and backslashes become "_" because browsers disagree on quoted-pair escapes.
        fallback.append("_" if not ch.isascii() or ch in '"\\' else ch)
    ascii_name = "".join(fallback)
    value = f'attachment; filename="{ascii_name}"'
    if ascii_name != name:
        value += f"; filename*=UTF-8''{quote(name, safe=_ATTR_CHAR_PUNCTUATION)}"
    return value


class S3Storage:
    """Objects in one bucket under an optional prefix; downloads go straight to presigned URLs."""

    def __init__(
        self,
        client: Any,
        *,
        bucket: str,
        prefix: str = "",
        redact: Iterable[str] = (),
        credentials_from: str = "",
    ) -> None:
        self._client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        # Longest first, so a secret that contains the key id is scrubbed whole.
        self._redact = sorted((value for value in redact if value), key=len, reverse=True)
        self._credentials_from = credentials_from  # where the SDK found them: "env", "iam-role"…

    def object_key(self, key: str) -> str:
        """The full object key for a storage key: the configured prefix, a slash, the key."""
        parts = key.split("/")
        if any(part in {"", ".", ".."} for part in parts):
            # Clients and proxies normalise such paths, which breaks presigned signatures.
            raise StorageError(f"object key has an empty or dot segment: {key!r}")
        return f"{self.prefix}/{key}" if self.prefix else key

    async def put(
        self, key: str, data: bytes, *, filename: str, content_type: str = outputs.PDF.content_type
    ) -> None:
        check_complete(data, content_type)
        object_key = self.object_key(key)
        try:
            await self._client.put_object(
                Bucket=self.bucket,
                Key=object_key,
                Body=data,
                ContentType=content_type,
                ContentDisposition=content_disposition(filename),
            )
        except _S3_ERRORS as exc:
            raise self._error(f"could not write {object_key}", exc) from exc

    async def get(self, key: str) -> bytes:
        """The object's bytes; FileNotFoundError when it does not exist, as for local storage."""
        object_key = self.object_key(key)
        try:
            response = await self._client.get_object(Bucket=self.bucket, Key=object_key)
            async with response["Body"] as body:
                data: bytes = await body.read()
                return data
        except ClientError as exc:
            if _error_code(exc) in {"NoSuchKey", "404"}:
                raise FileNotFoundError(f"s3://{self.bucket}/{object_key}") from exc
            raise self._error(f"could not read {object_key}", exc) from exc
        except _S3_ERRORS as exc:
            raise self._error(f"could not read {object_key}", exc) from exc

    async def delete(self, key: str) -> None:
        object_key = self.object_key(key)
        try:
            await self._client.delete_object(Bucket=self.bucket, Key=object_key)
        except _S3_ERRORS as exc:
            raise self._error(f"could not delete {object_key}", exc) from exc

    async def presign(
        self, key: str, *, filename: str, content_type: str, ttl_s: int
    ) -> str | None:
        """A presigned GET URL with `content_type` and `filename` signed in as response headers.
        The bucket checks it, not Pressroom: it lasts ttl_s whatever becomes of the API key the
        link was made for."""
        if not 1 <= ttl_s <= S3_MAX_URL_TTL_S:
            raise StorageError(f"presigned URL lifetime must be 1 to {S3_MAX_URL_TTL_S} s: {ttl_s}")
        object_key = self.object_key(key)
        try:
            url: str = await self._client.generate_presigned_url(
                "get_object",
                Params={
                    "Bucket": self.bucket,
                    "Key": object_key,
                    "ResponseContentType": content_type,
                    "ResponseContentDisposition": content_disposition(filename),
                },
                ExpiresIn=ttl_s,
            )
        except _S3_ERRORS as exc:
            raise self._error(f"could not presign {object_key}", exc) from exc
        return url

    async def check(self) -> None:
        try:
            await self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            raise self._bucket_error(exc) from exc
        except NoCredentialsError as exc:
            raise StorageError(NO_CREDENTIALS) from exc
        except _S3_ERRORS as exc:
            raise self._error(f"S3 bucket {self.bucket!r} is unreachable", exc) from exc

    def _bucket_error(self, exc: ClientError) -> StorageError:
        code = _error_code(exc)
        where = f"S3 bucket {self.bucket!r} at {self._client.meta.endpoint_url}"
        if code in {"404", "NoSuchBucket"}:
            return StorageError(f"{where} does not exist; create it or fix PRESSROOM_STORAGE")
        if code in {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
            found = f" (found in {self._credentials_from})" if self._credentials_from else ""
            return StorageError(
                f"{where} refused the credentials{found} (HTTP 403): check them and their "
                "access to the bucket"
            )
        if code in {"301", "PermanentRedirect", "AuthorizationHeaderMalformed"}:
            region = _response_headers(exc).get("x-amz-bucket-region")
            if region:
                return StorageError(f"{where} lives in {region}; set AWS_DEFAULT_REGION={region}")
            return StorageError(f"{where} lives in another region; set AWS_DEFAULT_REGION to it")
        return self._error(f"{where} failed the readiness check", exc)

    def _error(self, action: str, exc: BaseException) -> StorageError:
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
            detail = f"{error.get('Code', 'error')} (HTTP {status})"
            if error.get("Message"):
                detail += f": {error['Message']}"
        elif isinstance(exc, NoCredentialsError):
            detail = NO_CREDENTIALS
        else:
            detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        message = f"{action}: {detail}"
        for secret in self._redact:
            message = message.replace(secret, "[redacted]")
        return StorageError(message)


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _response_headers(exc: ClientError) -> dict[str, str]:
    headers: dict[str, str] = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    return headers


@contextlib.asynccontextmanager
async def open_s3_storage(location: S3Location) -> AsyncIterator[S3Storage]:
    """Open the process's one S3 client on `location`; the client is closed on exit.

    Missing credentials do not stop the start: every call, and so the readiness check at start
    and /readyz, fails with NO_CREDENTIALS until the process runs with some."""
    config = AioConfig(
        # No addressing style: botocore addresses a custom endpoint (AWS_ENDPOINT_URL_S3)
        # path-style, as MinIO needs, and AWS itself virtual-hosted, as AWS recommends.
        signature_version="s3v4",
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        read_timeout=S3_READ_TIMEOUT_S,
        retries={"max_attempts": S3_MAX_ATTEMPTS, "mode": "standard"},
        # botocore's default CRC checksums on every PUT are refused by several
        # S3-compatible stores; send them only where the API demands one.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
        # Loads the bundled S3 model in a thread instead of on the event loop.
        warm_up_loader_caches=True,
    )
    session = AioSession()
    async with contextlib.AsyncExitStack() as stack:
        try:
            # Resolved by the session, which the client then reuses.
            credentials = await session.get_credentials()
            frozen = await credentials.get_frozen_credentials() if credentials else None
            client = await stack.enter_async_context(session.create_client("s3", config=config))
        except (BotoCoreError, ValueError) as exc:
            # Half a key pair, an unknown profile, a malformed endpoint URL or region.
            raise StorageError(
                f"could not create the S3 client (check AWS_ENDPOINT_URL_S3, AWS_DEFAULT_REGION "
                f"and the AWS credentials): {exc}"
            ) from exc
        yield S3Storage(
            client,
            bucket=location.bucket,
            prefix=location.prefix,
            # Never shown back, even inside botocore's messages.
            redact=(frozen.secret_key, frozen.token or "", frozen.access_key) if frozen else (),
            credentials_from=credentials.method if credentials else "",
        )
