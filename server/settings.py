"""Settings read once from the environment into a frozen object; a bad value stops the start."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import ipaddress
import os
import re
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from yarl import URL

T = TypeVar("T")


class SettingsError(ValueError):
    """A configuration value is missing or malformed; the message names the variable."""


def _parse(environ: Mapping[str, str], name: str, default: T, cast: Callable[[str], T]) -> T:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return cast(raw.strip())
    except (TypeError, ValueError) as exc:
        raise SettingsError(f"{name}={raw!r} is not valid: {exc}") from None


def _positive(cast: Callable[[str], T]) -> Callable[[str], T]:
    def check(raw: str) -> T:
        value = cast(raw)
        if value <= 0:  # type: ignore[operator]
            raise ValueError("must be greater than 0")
        return value

    return check


def _non_negative_int(raw: str) -> int:
    value = int(raw)
    if value < 0:
        raise ValueError("must be 0 or more")
    return value


def _non_negative_float(raw: str) -> float:
    value = float(raw)
    if not value >= 0:  # also refuses nan
        raise ValueError("must be 0 or more")
    return value


def _port(raw: str) -> int:
    value = int(raw)
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number from 0 to 65535")
    return value


def _bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError("must be true or false")


def _choice(*allowed: str) -> Callable[[str], str]:
    def check(raw: str) -> str:
        if raw not in allowed:
            raise ValueError(f"must be one of {', '.join(allowed)}")
        return raw

    return check


def _allow_list(raw: str) -> tuple[str, ...]:
    from server.netpolicy import NetworkPolicy

    entries = tuple(part.strip().lower() for part in raw.split(",") if part.strip())
    NetworkPolicy(entries)  # raises ValueError naming a malformed entry
    return entries


def _webhook_secret(raw: str) -> str:
    if not raw.startswith("whsec_") or len(raw) <= len("whsec_"):
        raise ValueError("must look like whsec_<base64>")
    encoded = raw.removeprefix("whsec_")
    # binascii.Error is a ValueError: the HMAC key is the decoded base64 part.
    base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    return raw


def new_webhook_secret() -> str:
    """A fresh `whsec_<base64>` signing secret: 32 random bytes, as Standard Webhooks allows."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _schedule(raw: str) -> tuple[float, ...]:
    delays = tuple(float(part) for part in raw.split(","))
    if any(delay <= 0 for delay in delays):
        raise ValueError("must be a comma-separated list of seconds, each greater than 0")
    return delays


_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")


def _public_url(raw: str) -> str:
    """An origin such as https://pdf.example.com, normalised (lower case, no default port)."""
    shape = "must be an origin such as https://pdf.example.com"
    try:
        url = URL(raw)
    except ValueError as exc:
        raise ValueError(f"{shape} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.raw_host or not url.absolute:
        raise ValueError(shape)
    if url.raw_user is not None or url.raw_password is not None:
        raise ValueError(f"{shape}, without user or password")
    if url.raw_path not in ("", "/") or url.raw_query_string or url.raw_fragment:
        # Links are paths from the root (/v1/jobs/…): a prefix here would be dropped by them.
        raise ValueError(f"{shape}, without path, query or fragment")
    host = url.raw_host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(f"{shape}; {host!r} is not a host name") from None
    if url.explicit_port == 0:
        raise ValueError(f"{shape}; port 0 is not a port clients can reach")
    return str(url.origin())


def _url_host(host: str) -> str:
    """A listen address as a URL's host: every-address binds become loopback, IPv6 bracketed."""
    bare = host.strip("[]")
    if bare in ("", "0.0.0.0"):
        return "127.0.0.1"
    if bare == "::":
        return "[::1]"
    if ":" in bare:
        return "[" + bare.replace("%", "%25") + "]"  # a zone id is percent-encoded (RFC 6874)
    return bare


#: 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 10 h: the last attempt comes about 28 hours in.
DEFAULT_WEBHOOK_SCHEDULE_S: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 36000)


def _read_or_create_secret(path: Path, make: Callable[[], str]) -> str:
    """A secret kept in the data folder so that restarts keep signed URLs and tokens valid.

    Processes that start together on a new data folder agree on one: each writes its own
    temporary file and links it into place, which never replaces a file already there, so
    the first wins and the others read the winner's value."""
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    value = make()
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
        handle.write(value + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        value = path.read_text().strip()
    finally:
        tmp.unlink()
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8080
    data_dir: Path = Path(".pressroom")
    database_url: str | None = None
    db_pool_min: int = 2
    db_pool_max: int = 10
    render_slots: int = 2
    prefetch: int = 0
    #: When a page that loaded within this many seconds starts printing, the next job is
    #: claimed for its slot (Workers); 0 turns it off.
    claim_while_printing_s: float = 0.5
    #: A job submitted while this process's worker is idle goes straight to it (jobs.create).
    hand_off: bool = True
    run_web: bool = True
    storage: str = "local"
    s3_endpoint: str | None = None
    s3_region: str = "auto"
    s3_bucket: str | None = None
    s3_access_key_id: str | None = None
    s3_secret_access_key: str | None = None
    s3_prefix: str = ""
    s3_path_style: bool = True
    secret: str = ""
    #: Signs the webhooks of the open dev mode's tenant only; tenants with API keys have their
    #: own secrets (server/tenants.py).
    webhook_secret: str = ""
    #: True on the start that generated the webhook secret (dev mode): it is printed once.
    webhook_secret_generated: bool = False
    allow_hosts: tuple[str, ...] = ()
    render_timeout_s: float = 30.0
    max_attempts: int = 3
    lease_s: float = 30.0
    poll_interval_s: float = 1.0
    retry_base_s: float = 2.0
    retry_max_s: float = 300.0
    chromium: str | None = None
    #: The user Chromium runs as when Pressroom runs as root.
    chromium_user: str = "nobody"
    #: Memory one render may use (its renderer process); a page that needs more fails.
    render_max_mb: int = 1024
    url_ttl_s: int = 3600
    token_ttl_s: int = 3600
    event_retention_s: int = 7 * 24 * 3600
    max_body_bytes: int = 2 * 1024 * 1024
    max_template_bytes: int = 512 * 1024
    max_data_bytes: int = 1024 * 1024
    max_pages: int = 1000
    idempotency_ttl_s: int = 24 * 3600
    rate_limit_rps: float = 50.0
    rate_limit_burst: int = 100
    tenant_max_inflight: int = 10000
    auth_cache_s: float = 5.0
    sse_ping_s: float = 15.0
    subscriber_queue: int = 1000
    browser_recycle_jobs: int = 1000
    browser_max_rss_mb: int = 1500
    rescue_interval_s: float = 5.0
    shutdown_grace_s: float = 20.0
    log_json: bool = False
    #: Where clients reach this server: every absolute link (download URLs in answers,
    #: streams and webhooks) starts with it, never with a request's Host header.
    public_url: str = ""
    webhook_timeout_s: float = 10.0
    #: Delays before each retry; one attempt more than entries. About a day in total.
    webhook_schedule_s: tuple[float, ...] = DEFAULT_WEBHOOK_SCHEDULE_S
    #: After a tenant's webhook secret is rotated, deliveries are signed with the old one too
    #: for this long, so that receivers can switch without refusing a delivery.
    webhook_rotation_overlap_s: float = 24 * 3600.0
    #: Concurrent webhook POSTs from this process (0 = this process sends none).
    webhook_concurrency: int = 8
    #: Finished jobs and their files are deleted after this many days (0 = kept forever).
    retention_days: int = 0

    @property
    def files_dir(self) -> Path:
        return self.data_dir / "files"

    @property
    def public_base_url(self) -> str:
        """PRESSROOM_PUBLIC_URL, else http://host:port of the listen address."""
        if self.public_url:
            return self.public_url
        return f"http://{_url_host(self.host)}:{self.port}"

    @property
    def listens_everywhere(self) -> bool:
        """Bound to every address: the default public URL (loopback) suits local clients only."""
        return self.host.strip("[]") in ("", "0.0.0.0", "::")

    @classmethod
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> Settings:
        """Read every PRESSROOM_* variable; raise SettingsError naming the first bad one."""
        e = environ
        data_dir = _parse(e, "PRESSROOM_DATA_DIR", Path(".pressroom"), Path)
        values: dict[str, Any] = dict(
            host=_parse(e, "PRESSROOM_HOST", "127.0.0.1", str),
            port=_parse(e, "PRESSROOM_PORT", 8080, _port),
            data_dir=data_dir,
            database_url=_parse(e, "DATABASE_URL", None, str),
            db_pool_min=_parse(e, "PRESSROOM_DB_POOL_MIN", 2, _non_negative_int),
            db_pool_max=_parse(e, "PRESSROOM_DB_POOL_MAX", 10, _positive(int)),
            render_slots=_parse(e, "PRESSROOM_RENDER_SLOTS", 2, _non_negative_int),
            prefetch=_parse(e, "PRESSROOM_PREFETCH", 0, _non_negative_int),
            claim_while_printing_s=_parse(
                e, "PRESSROOM_CLAIM_WHILE_PRINTING_S", 0.5, _non_negative_float
            ),
            hand_off=_parse(e, "PRESSROOM_HAND_OFF", True, _bool),
            storage=_parse(e, "PRESSROOM_STORAGE", "local", _choice("local", "s3")),
            s3_endpoint=_parse(e, "S3_ENDPOINT", None, str),
            s3_region=_parse(e, "S3_REGION", "auto", str),
            s3_bucket=_parse(e, "S3_BUCKET", None, str),
            s3_access_key_id=_parse(e, "S3_ACCESS_KEY_ID", None, str),
            s3_secret_access_key=_parse(e, "S3_SECRET_ACCESS_KEY", None, str),
            s3_prefix=_parse(e, "S3_PREFIX", "", str),
            s3_path_style=_parse(e, "S3_PATH_STYLE", True, _bool),
            allow_hosts=_parse(e, "PRESSROOM_ALLOW_HOSTS", tuple[str, ...](), _allow_list),
            render_timeout_s=_parse(e, "PRESSROOM_RENDER_TIMEOUT_S", 30.0, _positive(float)),
            max_attempts=_parse(e, "PRESSROOM_MAX_ATTEMPTS", 3, _positive(int)),
            lease_s=_parse(e, "PRESSROOM_LEASE_S", 30.0, _positive(float)),
            poll_interval_s=_parse(e, "PRESSROOM_POLL_INTERVAL_S", 1.0, _positive(float)),
            retry_base_s=_parse(e, "PRESSROOM_RETRY_BASE_S", 2.0, _positive(float)),
            retry_max_s=_parse(e, "PRESSROOM_RETRY_MAX_S", 300.0, _positive(float)),
            chromium=_parse(e, "PRESSROOM_CHROMIUM", None, str),
            chromium_user=_parse(e, "PRESSROOM_CHROMIUM_USER", "nobody", str),
            render_max_mb=_parse(e, "PRESSROOM_RENDER_MAX_MB", 1024, _positive(int)),
            url_ttl_s=_parse(e, "PRESSROOM_URL_TTL_S", 3600, _positive(int)),
            token_ttl_s=_parse(e, "PRESSROOM_TOKEN_TTL_S", 3600, _positive(int)),
            event_retention_s=_parse(e, "PRESSROOM_EVENT_RETENTION_S", 7 * 86400, _positive(int)),
            max_body_bytes=_parse(e, "PRESSROOM_MAX_BODY_BYTES", 2 * 1024 * 1024, _positive(int)),
            max_template_bytes=_parse(
                e, "PRESSROOM_MAX_TEMPLATE_BYTES", 512 * 1024, _positive(int)
            ),
            max_data_bytes=_parse(e, "PRESSROOM_MAX_DATA_BYTES", 1024 * 1024, _positive(int)),
            max_pages=_parse(e, "PRESSROOM_MAX_PAGES", 1000, _positive(int)),
            idempotency_ttl_s=_parse(e, "PRESSROOM_IDEMPOTENCY_TTL_S", 86400, _positive(int)),
            rate_limit_rps=_parse(e, "PRESSROOM_RATE_LIMIT_RPS", 50.0, _positive(float)),
            rate_limit_burst=_parse(e, "PRESSROOM_RATE_LIMIT_BURST", 100, _positive(int)),
            tenant_max_inflight=_parse(e, "PRESSROOM_TENANT_MAX_INFLIGHT", 10000, _positive(int)),
            auth_cache_s=_parse(e, "PRESSROOM_AUTH_CACHE_S", 5.0, _non_negative_float),
            sse_ping_s=_parse(e, "PRESSROOM_SSE_PING_S", 15.0, _positive(float)),
            subscriber_queue=_parse(e, "PRESSROOM_SUBSCRIBER_QUEUE", 1000, _positive(int)),
            browser_recycle_jobs=_parse(e, "PRESSROOM_BROWSER_RECYCLE_JOBS", 1000, _positive(int)),
            browser_max_rss_mb=_parse(e, "PRESSROOM_BROWSER_MAX_RSS_MB", 1500, _positive(int)),
            rescue_interval_s=_parse(e, "PRESSROOM_RESCUE_INTERVAL_S", 5.0, _positive(float)),
            shutdown_grace_s=_parse(e, "PRESSROOM_SHUTDOWN_GRACE_S", 20.0, _positive(float)),
            log_json=_parse(e, "PRESSROOM_LOG_JSON", False, _bool),
            public_url=_parse(e, "PRESSROOM_PUBLIC_URL", "", _public_url),
            webhook_timeout_s=_parse(e, "PRESSROOM_WEBHOOK_TIMEOUT_S", 10.0, _positive(float)),
            webhook_schedule_s=_parse(
                e, "PRESSROOM_WEBHOOK_SCHEDULE_S", DEFAULT_WEBHOOK_SCHEDULE_S, _schedule
            ),
            webhook_rotation_overlap_s=_parse(
                e, "PRESSROOM_WEBHOOK_ROTATION_OVERLAP_S", 24 * 3600.0, _non_negative_float
            ),
            webhook_concurrency=_parse(e, "PRESSROOM_WEBHOOK_CONCURRENCY", 8, _non_negative_int),
            retention_days=_parse(e, "PRESSROOM_RETENTION_DAYS", 0, _non_negative_int),
        )
        values.update(overrides)
        data_dir = Path(values["data_dir"])
        secret = _parse(e, "PRESSROOM_SECRET", "", str) or _read_or_create_secret(
            data_dir / "secret", lambda: secrets.token_urlsafe(32)
        )
        webhook_secret = _parse(e, "PRESSROOM_WEBHOOK_SECRET", "", _webhook_secret)
        if not webhook_secret:
            secret_file = data_dir / "webhook_secret"
            values.setdefault("webhook_secret_generated", not secret_file.exists())
            webhook_secret = _read_or_create_secret(secret_file, new_webhook_secret)
        values.setdefault("secret", secret)
        values.setdefault("webhook_secret", webhook_secret)
        settings = cls(**values)
        settings.validate()
        return settings

    def validate(self) -> None:
        if self.storage == "s3":
            missing = [
                name
                for name, value in (
                    ("S3_BUCKET", self.s3_bucket),
                    ("S3_ACCESS_KEY_ID", self.s3_access_key_id),
                    ("S3_SECRET_ACCESS_KEY", self.s3_secret_access_key),
                )
                if not value
            ]
            if missing:
                raise SettingsError(f"PRESSROOM_STORAGE=s3 needs {', '.join(missing)}")
        if self.db_pool_min > self.db_pool_max:
            raise SettingsError("PRESSROOM_DB_POOL_MIN must not exceed PRESSROOM_DB_POOL_MAX")
