"""Settings read once from the environment into a frozen object; a bad value stops the start.

The fields of `Settings` are the one list of variables, defaults and meanings; the table of
docs/configuration.md is generated from them (`python -m server.settings docs/configuration.md`).
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import ipaddress
import os
import re
import secrets
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    JsonValue,
    ValidationError,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from yarl import URL

from server.netpolicy import NetworkPolicy
from server.signkey import SigningKey, SigningKeyError

ENV_PREFIX = "PRESSROOM_"


class SettingsError(ValueError):
    """A configuration value is missing or malformed; the message names the variable."""


# --- value checks (their messages end up in the one line a bad start prints) ---------------


def _port(value: int) -> int:
    if not 0 <= value <= 65535:
        raise ValueError("must be a port number from 0 to 65535")
    return value


def _comma_list(value: Any) -> Any:
    """A variable's `a, b,c` as a list; values given in code pass as they are."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def _allow_list(entries: tuple[str, ...]) -> tuple[str, ...]:
    entries = tuple(entry.lower() for entry in entries)
    NetworkPolicy(entries)  # raises ValueError naming a malformed entry
    return entries


def _webhook_secret(value: str) -> str:
    if value == "":
        return value  # unset: generated into the data folder
    if not value.startswith("whsec_") or len(value) <= len("whsec_"):
        raise ValueError("must look like whsec_<base64>")
    encoded = value.removeprefix("whsec_")
    # binascii.Error is a ValueError: the HMAC key is the decoded base64 part.
    base64.b64decode(encoded + "=" * (-len(encoded) % 4), validate=True)
    return value


def new_webhook_secret() -> str:
    """A fresh `whsec_<base64>` signing secret: 32 random bytes, as Standard Webhooks allows."""
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def _tsa_url(raw: str) -> str:
    url = URL(raw)
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError("must be an http or https URL")
    return raw


_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*\.?")


def check_origin(raw: str, *, example: str = "https://app.example.com") -> str:
    """`raw` as a browser writes it in an Origin header (scheme://host[:port], lower case, no
    default port), or ValueError saying what is wrong; `example` shows the expected shape."""
    shape = f"must be an origin such as {example}"
    if "*" in raw:
        raise ValueError(f"{shape}, without wildcards: name each origin")
    try:
        url = URL(raw)
    except ValueError as exc:
        raise ValueError(f"{shape} ({exc})") from None
    if url.scheme not in ("http", "https") or not url.raw_host or not url.absolute:
        raise ValueError(shape)
    if url.raw_user is not None or url.raw_password is not None:
        raise ValueError(f"{shape}, without user or password")
    if url.raw_path != "/" or "?" in raw or "#" in raw:
        raise ValueError(f"{shape}, without path, query or fragment")
    if raw.endswith("/"):
        # Browsers send none, and an origin is compared as the exact text they send.
        raise ValueError(f"{shape}, without a trailing /")
    host = url.raw_host
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not _HOST_NAME.fullmatch(host):
            raise ValueError(f"{shape}; {host!r} is not a host name") from None
    if url.explicit_port == 0:
        raise ValueError(f"{shape}; port 0 is not a port clients can reach")
    return str(url.origin())


def _public_url(raw: str) -> str:
    """An origin such as https://pdf.example.com, normalised; one trailing / is fine here."""
    if raw == "":
        return raw  # unset: the listen address
    # Links are paths from the root (/v1/jobs/…): a prefix here would be dropped by them.
    return check_origin(raw.removesuffix("/"), example="https://pdf.example.com")


def _origins(entries: tuple[str, ...]) -> tuple[str, ...]:
    checked: dict[str, None] = {}
    for entry in entries:
        try:
            checked[check_origin(entry)] = None
        except ValueError as exc:
            raise ValueError(f"{entry!r} {exc}") from None
    return tuple(checked)


@dataclass(frozen=True)
class S3Location:
    """Where S3 storage keeps its objects: PRESSROOM_STORAGE=s3://BUCKET/PREFIX."""

    bucket: str
    prefix: str = ""

    def __str__(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


_STORAGE_SHAPES = "s3://BUCKET or s3://BUCKET/PREFIX"
# What AWS, R2 and MinIO accept (AWS's oldest buckets may have capitals and underscores).
_BUCKET_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _storage(value: Any) -> Any:
    """`local`, or `s3://BUCKET[/PREFIX]` as an S3Location; values set in code pass as they are."""
    if not isinstance(value, str) or value == "local":
        return value
    scheme, slashes, rest = value.partition("://")
    if scheme.lower() != "s3" or not slashes:
        if value.lower().rstrip(":/") == "s3":
            raise ValueError(f"name the bucket, as in {_STORAGE_SHAPES}")
        raise ValueError(f"must be local, {_STORAGE_SHAPES}")
    bucket, _, prefix = rest.partition("/")
    if not bucket:
        raise ValueError(f"name the bucket, as in {_STORAGE_SHAPES}")
    if not _BUCKET_NAME.fullmatch(bucket):
        raise ValueError(
            f"{bucket!r} is not a bucket name (letters, digits, '.', '-', '_'): "
            f"expected {_STORAGE_SHAPES}"
        )
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        # Object keys with such segments break presigned URLs (clients normalise the path).
        raise ValueError(f"the prefix {prefix!r} has an empty, '.' or '..' segment")
    return S3Location(bucket, prefix)


Port = Annotated[int, AfterValidator(_port)]
NonNegativeInt = Annotated[int, Field(ge=0)]
PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]
Storage = Annotated[Literal["local"] | S3Location, BeforeValidator(_storage)]
AllowList = Annotated[tuple[str, ...], BeforeValidator(_comma_list), AfterValidator(_allow_list)]
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR"],
    BeforeValidator(lambda value: value.upper() if isinstance(value, str) else value),
]
WebhookSecret = Annotated[str, AfterValidator(_webhook_secret)]
PublicUrl = Annotated[str, AfterValidator(_public_url)]
Origins = Annotated[tuple[str, ...], BeforeValidator(_comma_list), AfterValidator(_origins)]
TsaUrl = Annotated[str, AfterValidator(_tsa_url)]


def setting(
    default: Any, description: str, *, env: str | None = None, shown: str | None = None
) -> Any:
    """A field of Settings: `env` names a variable outside PRESSROOM_*; `shown` is the default
    as docs/configuration.md's table gives it, where the value itself says little ("generated")."""
    extra: dict[str, JsonValue] = {}
    if env is not None:
        extra["env"] = env
    if shown is not None:
        extra["shown"] = shown
    return Field(default, description=description, json_schema_extra=extra or None)


def internal(default: Any, description: str) -> Any:
    """A field set by the code that starts Pressroom (a CLI command), never by a variable."""
    return Field(default, description=description, json_schema_extra={"env": ""})


def env_name(name: str, field: FieldInfo) -> str:
    """The variable a field is read from; "" for a field no variable sets."""
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("env"), str):
        return str(extra["env"])
    return ENV_PREFIX + name.upper()


class EnvironSource(PydanticBaseSettingsSource):
    """Each field's variable from `environ`; a blank value counts as unset."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        super().__init__(settings_cls)
        self.environ = environ

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        var = env_name(field_name, field)
        raw = self.environ.get(var, "").strip() if var else ""
        return raw or None, field_name, False

    def __call__(self) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for name, field in self.settings_cls.model_fields.items():
            raw, key, _ = self.get_field_value(field, name)
            if raw is not None:
                found[key] = raw
        return found


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


#: Today's wording for pydantic's own checks, so that a message reads the same for every field.
_MESSAGES = {
    "greater_than": "must be greater than {gt}",
    "greater_than_equal": "must be {ge} or more",
    "bool_parsing": "must be true or false",
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
}


class Settings(BaseSettings):
    """Every setting of a Pressroom process, with its default and its meaning."""

    # Variable names come from env_name (EnvironSource), exact and case-sensitive.
    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    host: str = setting("127.0.0.1", "where the web app listens")
    port: Port = setting(8080, "the web app's port")
    health_port: Port | None = setting(
        None,
        "`pressroom worker` answers `/healthz`, `/readyz` and `/metrics` on this port of "
        "PRESSROOM_HOST (for probes and scrapes); unset, a worker serves no HTTP",
        shown="none",
    )
    data_dir: Path = setting(
        Path(".pressroom"),
        "embedded database, local files, generated secrets",
        shown="`./.pressroom`",
    )
    database_url: str | None = setting(
        None, "an existing PostgreSQL", env="DATABASE_URL", shown="embedded"
    )
    render_slots: NonNegativeInt = setting(2, "concurrent renders in this process (0 = no worker)")
    run_web: bool = internal(True, "serve the web app (`pressroom worker` turns it off)")
    run_background: bool = internal(
        True, "run batch joins and webhook deliveries (`pressroom web` turns it off)"
    )
    storage: Storage = setting(
        "local",
        "`local` (files under the data dir) or `s3://BUCKET` / `s3://BUCKET/PREFIX`; the AWS "
        "SDK finds the credentials, region and endpoint itself ([Storage](operations.md#storage))",
    )
    secret: str = setting(
        "",
        "signs download URLs, and the dev-mode tenant's subscription tokens (kept in the data dir)",
        shown="generated",
    )
    webhook_secret: WebhookSecret = setting(
        "",
        "`whsec_…` signing the webhooks of dev mode (tenants with keys have their own)",
        shown="generated",
    )
    webhook_secret_generated: bool = internal(
        False, "this start generated the webhook secret (dev mode): the log says where it is"
    )
    allow_hosts: AllowList = setting(
        (),
        "hosts, IPs and CIDRs the renderer and webhooks may reach despite the private-address "
        "block",
        shown="none",
    )
    render_timeout_s: PositiveFloat = setting(
        30.0, "time limit of one render (template rendering and the browser each)"
    )
    max_attempts: PositiveInt = setting(3, "attempts per job (per job: `max_attempts`)")
    chromium: str | None = setting(
        None,
        "a Chromium executable instead of Playwright's build, Debian's headless shell or "
        "chromium (tried in that order)",
    )
    chromium_user: str = setting("nobody", "the user Chromium runs as when Pressroom runs as root")
    render_max_mb: PositiveInt = setting(
        1024, "memory one render may use; a page that needs more fails its job"
    )
    url_ttl_s: PositiveInt = setting(3600, "lifetime of download links (at most 7 days on S3)")
    token_ttl_s: PositiveInt = setting(
        3600, "lifetime of the subscription tokens Pressroom mints, and the longest `ttl_s` gets"
    )
    dashboard_token_ttl_s: PositiveInt = setting(
        900, "lifetime of a dashboard token (renewed before it ends, without the key)"
    )
    dashboard_session_s: PositiveInt = setting(
        43200, "how long the dashboard's renewals go on after its API key was given"
    )
    max_body_bytes: PositiveInt = setting(2 * 1024 * 1024, "largest request body (413 above)")
    max_pages: PositiveInt = setting(1000, "pages a PDF may have; a longer one fails its job")
    max_asset_bytes: PositiveInt = setting(
        10 * 1024 * 1024,
        "largest asset (`POST /v1/assets`, or a file of a multipart job; 413 above)",
    )
    tenant_max_asset_bytes: PositiveInt = setting(
        1024 * 1024 * 1024, "all of a tenant's assets together (413 `asset-quota` above)"
    )
    max_upload_bytes: PositiveInt = setting(
        32 * 1024 * 1024, "largest multipart/form-data job, all its parts together (413 above)"
    )
    rate_limit_rps: PositiveFloat = setting(
        50.0, "requests per second per API key and process (429 above)"
    )
    tenant_max_inflight: PositiveInt = setting(
        10000, "queued and running jobs a tenant may have (429 above)"
    )
    shutdown_grace_s: PositiveFloat = setting(20.0, "how long SIGTERM lets running renders finish")
    log_format: Literal["text", "json"] = setting(
        "text", "`json` writes one JSON object per log line (with `job_id` and `tenant`)"
    )
    log_level: LogLevel = setting(
        "INFO",
        "the least severe log lines a server writes: `DEBUG`, `INFO`, `WARNING` or `ERROR` "
        "(operator commands, such as `keys` or `doctor`, write warnings and errors only)",
    )
    public_url: PublicUrl = setting(
        "",
        "the origin clients reach this server at (`https://pdf.example.com`: no path, query or "
        "user); every absolute link (the download `url` in answers, streams and webhooks) "
        "starts with it, never with the request's `Host`. Unset, the listen address: "
        "`0.0.0.0` becomes `127.0.0.1`, `::` `[::1]`, and the start-up log warns",
        shown="`http://HOST:PORT`",
    )
    cors_origins: Origins = setting(
        (),
        "exact origins (`https://app.example.com`, comma-separated) whose pages may call the "
        "API, streams, downloads and Socket.IO, for every tenant; a tenant adds its own with "
        "`pressroom tenants origins` (docs/cors.md)",
        shown="none",
    )
    signing_key: Path | None = setting(
        None,
        "a PKCS#12 file with the key and certificate chain that `sign` uses (unset: `sign` is "
        "refused); one that cannot be opened stops the start",
    )
    signing_key_password: str | None = setting(None, "the password of PRESSROOM_SIGNING_KEY")
    tsa_url: TsaUrl | None = setting(
        None, "an RFC 3161 timestamp authority: signatures become PAdES B-T (unset: B-B)"
    )
    retention_days: NonNegativeInt = setting(
        0, "delete jobs finished more than N days ago, files first (0 = keep forever)"
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Variables only, read as `from_env` reads them: no .env file, no secrets folder.
        return init_settings, EnvironSource(settings_cls, os.environ)

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if (key := self.signing) is not None:
            try:
                # An expired certificate does not stop the start: /readyz reports it.
                key.check(expiry=False)
            except SigningKeyError as exc:
                raise ValueError(str(exc)) from None
        return self

    @property
    def signing(self) -> SigningKey | None:
        """The signing key, when one is configured."""
        if self.signing_key is None:
            return None
        return SigningKey(self.signing_key, self.signing_key_password, self.tsa_url)

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
    def from_env(cls, environ: Mapping[str, str], **overrides: Any) -> Self:
        """Read every variable from `environ` (keywords win); raise SettingsError naming the
        first bad one. Secrets left unset are read from the data folder, made there once."""
        source = EnvironSource(cls, environ)
        sources = (InitSettingsSource(cls, init_kwargs=overrides), source)
        try:
            # pydantic-settings takes prepared sources in place of its own (os.environ).
            settings = cls(_build_sources=(sources, overrides))  # type: ignore[call-arg]
        except ValidationError as exc:
            given = {**source(), **overrides}  # each value as validation saw it
            raise SettingsError(_first_problem(exc, given)) from None
        update: dict[str, Any] = {}
        if not settings.secret:
            secret_file = settings.data_dir / "secret"
            update["secret"] = _read_or_create_secret(
                secret_file, lambda: secrets.token_urlsafe(32)
            )
        if not settings.webhook_secret:
            secret_file = settings.data_dir / "webhook_secret"
            if "webhook_secret_generated" not in overrides:
                update["webhook_secret_generated"] = not secret_file.exists()
            update["webhook_secret"] = _read_or_create_secret(secret_file, new_webhook_secret)
        return settings.model_copy(update=update) if update else settings


#: The command-line client's own variables (pressroom/client.py), which the server never reads.
CLIENT_VARIABLES = frozenset({"PRESSROOM_URL", "PRESSROOM_API_KEY"})
#: Settings of earlier releases that are constants now, each in the module that uses it.
RETIRED = frozenset(
    {
        "PRESSROOM_AUTH_CACHE_S",
        "PRESSROOM_CLAIM_WHILE_PRINTING_S",
        "PRESSROOM_COMBINE_SLOTS",
        "PRESSROOM_HAND_OFF",
        "PRESSROOM_LEASE_S",
        "PRESSROOM_POLL_INTERVAL_S",
        "PRESSROOM_RETRY_BASE_S",
        "PRESSROOM_RETRY_MAX_S",
        "PRESSROOM_RATE_LIMIT_BURST",
        "PRESSROOM_RESCUE_INTERVAL_S",
        "PRESSROOM_WEBHOOK_TIMEOUT_S",
        "PRESSROOM_WEBHOOK_SCHEDULE_S",
        "PRESSROOM_WEBHOOK_ROTATION_OVERLAP_S",
        "PRESSROOM_WEBHOOK_CONCURRENCY",
    }
)


#: The S3 settings of earlier releases, and what replaces each: PRESSROOM_STORAGE names the
#: bucket, and the AWS SDK reads its own variables (or a profile, or an IAM role) for the rest.
RETIRED_S3 = {
    "S3_BUCKET": "name the bucket in PRESSROOM_STORAGE=s3://BUCKET/PREFIX",
    "S3_PREFIX": "put the prefix in PRESSROOM_STORAGE=s3://BUCKET/PREFIX",
    "S3_ENDPOINT": "use AWS_ENDPOINT_URL_S3",
    "S3_REGION": "use AWS_DEFAULT_REGION",
    "S3_ACCESS_KEY_ID": "use AWS_ACCESS_KEY_ID (or AWS_PROFILE, or an IAM role)",
    "S3_SECRET_ACCESS_KEY": "use AWS_SECRET_ACCESS_KEY",
    "S3_PATH_STYLE": "a custom endpoint (AWS_ENDPOINT_URL_S3) is addressed path-style and "
    "AWS virtual-hosted, so remove it",
}


def unread_variables(environ: Mapping[str, str]) -> list[str]:
    """A warning for each PRESSROOM_* variable that no setting reads: one an earlier release
    read, or a misspelt one, with the setting it is closest to; and for each retired S3_* one,
    with what replaces it."""
    known = {env_name(name, field) for name, field in Settings.model_fields.items()}
    warnings = []
    for var in sorted(environ):
        if var in RETIRED_S3:
            warnings.append(f"{var} is no longer read: {RETIRED_S3[var]}")
            continue
        if not var.startswith(ENV_PREFIX) or var in known or var in CLIENT_VARIABLES:
            continue
        if var in RETIRED:
            warnings.append(f"{var} is no longer a setting and is ignored: remove it")
            continue
        # Names compared without the prefix they all share, which would make any two alike.
        suffixes = [name.removeprefix(ENV_PREFIX) for name in known if name]
        close = difflib.get_close_matches(var.removeprefix(ENV_PREFIX), suffixes, n=1)
        hint = (
            f"; did you mean {ENV_PREFIX}{close[0]}?"
            if close
            else " (docs/configuration.md lists every setting)"
        )
        warnings.append(f"{var} is not a setting and is ignored{hint}")
    return warnings


def _first_problem(exc: ValidationError, given: Mapping[str, Any]) -> str:
    """One line for the first error: the variable, the value it was given, what is wrong."""
    error = exc.errors(include_url=False)[0]
    ctx = error.get("ctx", {})
    if error["type"] == "value_error":
        what = str(ctx["error"])
    else:
        shown = {
            key: f"{value:g}" if isinstance(value, float) else value for key, value in ctx.items()
        }
        what = _MESSAGES.get(error["type"], error["msg"]).format(**shown)
    if not error["loc"]:  # a rule across fields: its message names the variables
        return what
    name = str(error["loc"][0])
    field = Settings.model_fields.get(name)
    var = env_name(name, field) if field is not None else name
    value = given.get(name, error["input"])
    return f"{var or name}={value!r} is not valid: {what}"


def _default_cell(field: FieldInfo) -> str:
    extra = field.json_schema_extra
    if isinstance(extra, dict) and isinstance(extra.get("shown"), str):
        return str(extra["shown"])
    value = field.default
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, float):
        value = f"{value:g}"
    elif isinstance(value, tuple):
        value = ",".join(f"{part:g}" if isinstance(part, float | int) else part for part in value)
    return f"`{value}`"


def settings_table() -> str:
    """docs/configuration.md's table: one row per variable, from the fields of Settings."""
    lines = ["| variable | default | meaning |", "|---|---|---|"]
    for name, field in Settings.model_fields.items():
        var = env_name(name, field)
        if var:
            lines.append(f"| `{var}` | {_default_cell(field)} | {field.description} |")
    return "\n".join(lines)


TABLE_BEGIN = (
    "<!-- settings table: generated by `python -m server.settings docs/configuration.md` -->"
)
TABLE_END = "<!-- end of settings table -->"


def with_table(text: str) -> str:
    """`text` (docs/configuration.md) with its generated settings table brought up to date."""
    head, begin, rest = text.partition(TABLE_BEGIN)
    _, end, tail = rest.partition(TABLE_END)
    if not begin or not end:
        raise ValueError(f"no {TABLE_BEGIN!r} … {TABLE_END!r} block")
    return f"{head}{TABLE_BEGIN}\n{settings_table()}\n{TABLE_END}{tail}"


if __name__ == "__main__":
    if len(sys.argv) > 1:
        readme = Path(sys.argv[1])
        readme.write_text(with_table(readme.read_text()))
    else:
        print(settings_table())
