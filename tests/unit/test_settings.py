from __future__ import annotations

import importlib.util
import re
import threading
from concurrent.futures import ThreadPoolExecutor
from functools import cache
from pathlib import Path

import pytest

from server.settings import (
    CLIENT_VARIABLES,
    RETIRED_S3,
    S3Location,
    Settings,
    SettingsError,
    env_name,
    unread_variables,
    with_table,
)

ROOT = Path(__file__).resolve().parents[2]
#: Read by the client and the `pressroom` client commands, not by the server.


def test_defaults_match_the_contract(tmp_path: Path) -> None:
    settings = Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)})
    assert (settings.host, settings.port, settings.storage) == ("127.0.0.1", 8080, "local")
    assert settings.database_url is None and settings.render_slots == 2
    assert settings.webhook_secret.startswith("whsec_")


def test_generated_secrets_survive_a_restart(tmp_path: Path) -> None:
    first = Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)})
    second = Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)})
    assert first.secret == second.secret and len(first.secret) >= 32
    assert (tmp_path / "secret").stat().st_mode & 0o077 == 0


def test_processes_starting_together_agree_on_one_secret(tmp_path: Path) -> None:
    # Several processes (here threads, which race the same way) start on a new data folder
    # at once: every one ends up with the secret that is in the file, none fails.
    starting = threading.Barrier(8)

    def start(_: int) -> tuple[str, str]:
        starting.wait()
        settings = Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)})
        return settings.secret, settings.webhook_secret

    for _ in range(20):
        for path in tmp_path.iterdir():
            path.unlink()
        with ThreadPoolExecutor(8) as pool:
            seen = set(pool.map(start, range(8)))
        [(secret, webhook_secret)] = seen
        assert secret == (tmp_path / "secret").read_text().strip()
        assert webhook_secret == (tmp_path / "webhook_secret").read_text().strip()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["secret", "webhook_secret"]


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PRESSROOM_PORT", "eighty", "PRESSROOM_PORT='eighty'"),
        ("PRESSROOM_PORT", "70000", "port number"),
        ("PRESSROOM_RENDER_SLOTS", "-1", "0 or more"),
        ("PRESSROOM_SHUTDOWN_GRACE_S", "-0.5", "PRESSROOM_SHUTDOWN_GRACE_S"),
        ("PRESSROOM_RENDER_TIMEOUT_S", "0", "greater than 0"),
        ("PRESSROOM_STORAGE", "ftp", "must be local, s3://BUCKET or s3://BUCKET/PREFIX"),
        ("PRESSROOM_STORAGE", "s3", "PRESSROOM_STORAGE='s3' is not valid: name the bucket"),
        ("PRESSROOM_STORAGE", "s3://", "name the bucket, as in s3://BUCKET"),
        ("PRESSROOM_STORAGE", "S3", "name the bucket"),
        ("PRESSROOM_STORAGE", "s3:/pdfs", "must be local, s3://BUCKET"),
        ("PRESSROOM_STORAGE", "s3://my bucket", "'my bucket' is not a bucket name"),
        ("PRESSROOM_STORAGE", "s3://pdfs/a//b", "prefix 'a//b' has an empty"),
        ("PRESSROOM_STORAGE", "s3://pdfs/../b", "'..' segment"),
        ("PRESSROOM_WEBHOOK_SECRET", "hunter2", "whsec_"),
        ("PRESSROOM_ALLOW_HOSTS", "10.0.0.0/33", "PRESSROOM_ALLOW_HOSTS"),
        ("PRESSROOM_PUBLIC_URL", "pdf.example.com", "PRESSROOM_PUBLIC_URL='pdf.example.com'"),
        ("PRESSROOM_PUBLIC_URL", "ftp://pdf.example.com", "must be an origin"),
        ("PRESSROOM_PUBLIC_URL", "http:///pdf", "must be an origin"),
        ("PRESSROOM_PUBLIC_URL", "https://pdf.example.com/pdf", "without path"),
        ("PRESSROOM_PUBLIC_URL", "https://pdf.example.com?a=1", "without path, query"),
        ("PRESSROOM_PUBLIC_URL", "https://me:pw@pdf.example.com", "without user"),
        ("PRESSROOM_PUBLIC_URL", "https://pdf.example.com:99999", "Port out of range"),
        ("PRESSROOM_PUBLIC_URL", "https://pdf example.com", "is not a host name"),
        ("PRESSROOM_CORS_ORIGINS", "https://app.example.com/", "'https://app.example.com/' must"),
        ("PRESSROOM_CORS_ORIGINS", "https://a.example.com,*", "without wildcards"),
        ("PRESSROOM_CORS_ORIGINS", "https://*.example.com", "without wildcards"),
        ("PRESSROOM_CORS_ORIGINS", "app.example.com", "must be an origin such as https://"),
        ("PRESSROOM_CORS_ORIGINS", "null", "'null' must be an origin"),
        ("PRESSROOM_CORS_ORIGINS", "https://app.example.com/spa", "without path"),
        ("PRESSROOM_CORS_ORIGINS", "https://me@app.example.com", "without user"),
    ],
)
def test_a_bad_value_stops_the_start_with_one_clear_message(
    tmp_path: Path, name: str, value: str, message: str
) -> None:
    with pytest.raises(SettingsError, match=message.replace("(", r"\(")):
        Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path), name: value})


@pytest.mark.parametrize(
    ("value", "bucket", "prefix"),
    [
        ("s3://pdfs", "pdfs", ""),
        ("s3://pdfs/", "pdfs", ""),
        ("s3://pdfs/pressroom/", "pdfs", "pressroom"),
        ("S3://pdfs/eu/invoices", "pdfs", "eu/invoices"),
    ],
)
def test_s3_storage_names_the_bucket_and_an_optional_prefix(
    tmp_path: Path, value: str, bucket: str, prefix: str
) -> None:
    env = {"PRESSROOM_DATA_DIR": str(tmp_path), "PRESSROOM_STORAGE": value}
    assert Settings.from_env(env).storage == S3Location(bucket, prefix)


def test_a_generated_webhook_secret_is_flagged_once_so_it_can_be_printed(tmp_path: Path) -> None:
    first = Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)})
    again = Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)})
    given = Settings.from_env(
        {"PRESSROOM_DATA_DIR": str(tmp_path / "b"), "PRESSROOM_WEBHOOK_SECRET": "whsec_c2VjcmV0"}
    )
    assert first.webhook_secret_generated and not again.webhook_secret_generated
    assert first.webhook_secret == again.webhook_secret
    assert not given.webhook_secret_generated and given.webhook_secret == "whsec_c2VjcmV0"


def test_cors_origins_are_kept_as_browsers_send_them(tmp_path: Path) -> None:
    given = " HTTPS://App.Example.com:443, http://localhost:5173,,https://app.example.com "
    env = {"PRESSROOM_DATA_DIR": str(tmp_path), "PRESSROOM_CORS_ORIGINS": given}
    settings = Settings.from_env(env)
    assert settings.cors_origins == ("https://app.example.com", "http://localhost:5173")
    assert Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)}).cors_origins == ()


def test_a_bad_cors_origin_is_one_line_naming_the_variable_and_the_entry(tmp_path: Path) -> None:
    env = {"PRESSROOM_DATA_DIR": str(tmp_path), "PRESSROOM_CORS_ORIGINS": "https://a.com,b.com"}
    with pytest.raises(SettingsError) as raised:
        Settings.from_env(env)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("PRESSROOM_CORS_ORIGINS='https://a.com,b.com' is not valid: 'b.com'")


@pytest.mark.parametrize(
    ("env", "public"),
    [
        ({}, "http://127.0.0.1:8080"),
        ({"PRESSROOM_HOST": "0.0.0.0", "PRESSROOM_PORT": "9000"}, "http://127.0.0.1:9000"),
        ({"PRESSROOM_HOST": "::"}, "http://[::1]:8080"),
        ({"PRESSROOM_HOST": "fe80::1%eth0"}, "http://[fe80::1%25eth0]:8080"),
        ({"PRESSROOM_HOST": "pdf.internal"}, "http://pdf.internal:8080"),
        ({"PRESSROOM_PUBLIC_URL": "HTTPS://PDF.Example.com:443/"}, "https://pdf.example.com"),
        ({"PRESSROOM_PUBLIC_URL": "http://[2001:db8::1]:8443"}, "http://[2001:db8::1]:8443"),
    ],
)
def test_the_public_url_defaults_to_the_listen_address(
    tmp_path: Path, env: dict[str, str], public: str
) -> None:
    settings = Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path), **env})
    assert settings.public_base_url == public


def test_keywords_win_over_variables_and_are_checked_alike(tmp_path: Path) -> None:
    env = {"PRESSROOM_DATA_DIR": str(tmp_path), "PRESSROOM_PORT": "9000"}
    assert Settings.from_env(env, port=9001).port == 9001
    with pytest.raises(SettingsError, match="PRESSROOM_PORT=70000 is not valid: must be a port"):
        Settings.from_env(env, port=70000)


def test_from_env_reads_the_mapping_it_is_given_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRESSROOM_PORT", "9000")
    monkeypatch.setenv("PRESSROOM_RUN_WEB", "false")  # set by `pressroom worker`, not by a variable
    assert Settings().port == 9000 and Settings().run_web
    assert Settings.from_env({"PRESSROOM_DATA_DIR": str(tmp_path)}).port == 8080


def test_the_configuration_table_is_the_settings_model() -> None:
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert with_table(page) == page, "run: python -m server.settings docs/configuration.md"


@cache
def sdk_variables() -> frozenset[str]:
    """The AWS_* names in botocore's source: the variables the SDK reads itself, with
    AWS_ENDPOINT_URL_ (the prefix of AWS_ENDPOINT_URL_<SERVICE>)."""
    spec = importlib.util.find_spec("botocore")
    assert spec is not None and spec.submodule_search_locations
    names: set[str] = set()
    for path in Path(spec.submodule_search_locations[0]).rglob("*.py"):
        names |= set(re.findall(r"\bAWS_[A-Z0-9_]+", path.read_text(encoding="utf-8")))
    return frozenset(names)


def is_sdk_variable(name: str) -> bool:
    if name.startswith("AWS_ENDPOINT_URL_"):
        name = "AWS_ENDPOINT_URL_"
    return name in sdk_variables()


def test_every_variable_the_docs_name_is_a_setting() -> None:
    settings = {env_name(name, field) for name, field in Settings.model_fields.items()} - {""}
    named: set[str] = set()
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        named |= set(re.findall(r"\b(?:PRESSROOM|S3|AWS)_[A-Z0-9_]+", path.read_text()))
    # AWS_* names are the SDK's (credentials, region, endpoint), which botocore reads itself.
    assert {name for name in named if name.startswith("AWS_")}, "the Storage section names some"
    sdk = {name for name in named if name.startswith("AWS_") and is_sdk_variable(name)}
    assert named - settings - sdk == CLIENT_VARIABLES


def test_the_docs_check_knows_the_sdks_variables_from_a_typo_and_a_retired_name() -> None:
    assert is_sdk_variable("AWS_DEFAULT_REGION") and is_sdk_variable("AWS_ENDPOINT_URL_S3")
    assert is_sdk_variable("AWS_WEB_IDENTITY_TOKEN_FILE")
    assert not is_sdk_variable("AWS_DEFAULT_REGOIN")
    assert not set(RETIRED_S3) & sdk_variables()


def test_variables_no_setting_reads_are_named_with_what_to_do() -> None:
    environ = {
        "PRESSROOM_RENDER_SLOTS": "2",  # a setting
        "PRESSROOM_URL": "http://127.0.0.1:8080",  # the client's own
        "PRESSROOM_LEASE_S": "10",  # a setting of an earlier release
        "PRESSROOM_RENDR_SLOTS": "4",  # misspelt
        "PRESSROOM_NOTHING_LIKE_IT": "1",
        "S3_BUCKET": "pdfs",  # S3 settings of an earlier release
        "S3_ACCESS_KEY_ID": "AKIAEXAMPLE",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",  # the AWS SDK's own, read by botocore
        "HOME": "/root",
    }
    assert unread_variables(environ) == [
        "PRESSROOM_LEASE_S is no longer a setting and is ignored: remove it",
        "PRESSROOM_NOTHING_LIKE_IT is not a setting and is ignored (docs/configuration.md "
        "lists every setting)",
        "PRESSROOM_RENDR_SLOTS is not a setting and is ignored; did you mean "
        "PRESSROOM_RENDER_SLOTS?",
        "S3_ACCESS_KEY_ID is no longer read: use AWS_ACCESS_KEY_ID (or AWS_PROFILE, or an IAM "
        "role)",
        "S3_BUCKET is no longer read: name the bucket in PRESSROOM_STORAGE=s3://BUCKET/PREFIX",
    ]


@pytest.mark.parametrize(
    "retired",
    [
        "S3_ENDPOINT",
        "S3_REGION",
        "S3_BUCKET",
        "S3_ACCESS_KEY_ID",
        "S3_SECRET_ACCESS_KEY",
        "S3_PREFIX",
        "S3_PATH_STYLE",
    ],
)
def test_each_retired_s3_variable_says_what_replaces_it(retired: str) -> None:
    [warning] = unread_variables({retired: "x"})
    assert warning.startswith(f"{retired} is no longer read: ")
    replacement = re.findall(r"\b(?:AWS|PRESSROOM)_[A-Z0-9_]+", warning)
    assert replacement, warning
    assert all(is_sdk_variable(name) or name == "PRESSROOM_STORAGE" for name in replacement)
