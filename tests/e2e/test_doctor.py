"""`pressroom doctor` on this machine: a good installation (the test database, a fresh data dir,
the system Chromium and fonts) passes, and each broken one fails with what to do about it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from asyncio.subprocess import PIPE
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest
from aiobotocore.session import AioSession

from server import sql
from server.access import apikeys
from server.cli import doctor
from server.cli.doctor import FAIL, OK, WARN, Check
from server.queue import db
from server.settings import Settings
from tests import testca
from tests.integration import test_s3_storage as s3_storage

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
EVERY_CHECK = [
    "database",
    "migrations",
    "clock",
    "api-keys",
    "chromium",
    "chromium-user",
    "sandbox",
    "memory-bound",
    "fonts-latin",
    "fonts-cjk",
    "fonts-emoji",
    "storage",
    "secrets",
    "public-url",
    "signing-key",
]
#: The program `pressroom doctor` runs, until server/cli/admin.py names the command.
DOCTOR = (
    "import argparse, asyncio, os, sys; from server.cli import doctor; "
    "from server.settings import Settings; "
    "sys.exit(asyncio.run(doctor.run(Settings.from_env(os.environ), "
    "argparse.Namespace(json='--json' in sys.argv))))"
)


async def all_checks(settings: Settings) -> dict[str, Check]:
    return {check.name: check async for check in doctor.diagnose(settings, environ={})}


@contextlib.asynccontextmanager
async def connected(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await db.connect(dsn)
    try:
        yield conn
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def empty_database(server_dsn: str) -> AsyncIterator[str]:
    """A database with nothing in it, dropped afterwards."""
    name = f"pressroom_doctor_{uuid.uuid4().hex[:12]}"
    async with connected(server_dsn) as admin:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    try:
        yield urlunsplit(urlsplit(server_dsn)._replace(path="/" + name))
    finally:
        async with connected(server_dsn) as admin:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture
def empty_fontconfig(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fontconfig, in this process and the programs it starts, configured with no font."""
    conf = tmp_path / "fonts.conf"
    conf.write_text('<?xml version="1.0"?>\n<fontconfig></fontconfig>\n')
    monkeypatch.setenv("FONTCONFIG_FILE", str(conf))


async def test_a_good_installation_passes_every_check(
    make_settings: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = make_settings()
    checks = await all_checks(settings)
    assert list(checks) == EVERY_CHECK
    assert {name: c.status for name, c in checks.items() if c.status not in (OK, WARN)} == {}
    assert checks["migrations"].detail.startswith(f"all {len(sql.migrations())} applied")
    assert "dev mode" in checks["api-keys"].detail
    assert checks["api-keys"].fix == "to require keys: pressroom keys create --tenant NAME"
    assert checks["chromium"].detail.startswith("Chromium ")
    assert checks["fonts-latin"].status is OK, "no PDF prints without"
    assert list((settings.files_dir / "doctor").iterdir()) == [], "its object is deleted again"

    assert await doctor.run(settings, argparse.Namespace(json=False)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[:-1]] == EVERY_CHECK
    assert all(line.split()[0] in ("ok", "warn") for line in lines[:-1])
    assert lines[-1].endswith(" 0 FAIL")


@pytest.fixture
def read_only_storage(make_settings: Callable[..., Settings]) -> Iterator[Settings]:
    """Settings whose storage folder even root cannot write: chmod 0500 stops everyone else,
    an immutable folder (chattr +i) stops root too."""
    settings = make_settings()
    settings.files_dir.mkdir(parents=True)
    chattr = ["chattr", "+i", str(settings.files_dir)]
    if shutil.which("chattr") is None or subprocess.run(chattr, check=False).returncode:
        pytest.skip("this file system cannot make a folder immutable (chattr +i)")
    try:
        yield settings
    finally:
        subprocess.run(["chattr", "-i", str(settings.files_dir)], check=True)


async def test_a_storage_folder_root_cannot_write_fails(read_only_storage: Settings) -> None:
    check = await doctor.check_storage(read_only_storage)
    assert check.status is FAIL
    assert "Operation not permitted" in check.detail
    assert check.fix.startswith(f"make {read_only_storage.files_dir} a folder ")


async def test_a_storage_folder_that_is_a_file_fails(
    make_settings: Callable[..., Settings],
) -> None:
    settings = make_settings()
    settings.files_dir.write_text("not a folder")
    check = await doctor.check_storage(settings)
    assert (check.status, check.name) == (FAIL, "storage")
    assert "Not a directory" in check.detail
    assert "or set PRESSROOM_DATA_DIR" in check.fix


# An S3 API over real HTTP (moto's server), shared with tests/integration/test_s3_storage.py.
moto_endpoint = s3_storage.moto_endpoint


@pytest.fixture
def s3_env(moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The AWS SDK's variables for that endpoint, and no other AWS setting of this machine."""
    for var in [var for var in os.environ if var.startswith("AWS_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAPRESSROOMDOCTOR1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "pressroom-doctor-secret")


@pytest.mark.usefixtures("s3_env")
async def test_s3_storage_is_written_read_and_emptied_again(
    make_settings: Callable[..., Settings],
) -> None:
    bucket = f"pressroom-{uuid.uuid4().hex[:12]}"
    async with AioSession().create_client("s3", region_name="us-east-1") as admin:
        await admin.create_bucket(Bucket=bucket)
        check = await doctor.check_storage(
            make_settings(env={"PRESSROOM_STORAGE": f"s3://{bucket}/pre"})
        )
        left = await admin.list_objects_v2(Bucket=bucket)
    assert check.status is OK
    assert f"in s3://{bucket}/pre" in check.detail
    assert left.get("Contents", []) == []

    missing = await doctor.check_storage(make_settings(env={"PRESSROOM_STORAGE": "s3://nowhere"}))
    assert missing.status is FAIL
    assert "NoSuchBucket" in missing.detail
    assert missing.fix.startswith("check PRESSROOM_STORAGE, the AWS credentials")


@pytest.mark.usefixtures("empty_fontconfig")
async def test_missing_fonts_name_the_package_to_install() -> None:
    latin, cjk, emoji = (
        await doctor.check_latin_fonts(),
        await doctor.check_cjk_fonts(),
        await doctor.check_emoji_fonts(),
    )
    assert (latin.status, latin.fix) == (FAIL, "apt-get install fonts-dejavu fonts-liberation")
    assert latin.detail == "no font for Latin: such text prints as empty boxes"
    assert (cjk.status, cjk.fix) == (WARN, "apt-get install fonts-noto-cjk")
    assert "Japanese, Simplified Chinese, Traditional Chinese, Korean" in cjk.detail
    assert (emoji.status, emoji.fix) == (WARN, "apt-get install fonts-noto-color-emoji")


async def test_an_unreachable_database_fails_and_stops_its_checks(
    make_settings: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql://pressroom:hunter2secret@127.0.0.1:{closed_port()}/pressroom"
    settings = make_settings(env={"DATABASE_URL": url})
    checks = await all_checks(settings)
    database = checks["database"]
    assert database.status is FAIL
    assert database.detail.startswith("cannot reach DATABASE_URL: ")
    assert database.fix == "start PostgreSQL there, or correct DATABASE_URL"
    assert {"migrations", "clock", "api-keys"}.isdisjoint(checks), "nothing to ask them of"
    assert checks["storage"].status is OK, "the other checks still run"

    assert await doctor.run(settings, argparse.Namespace(json=True)) == 1
    out = capsys.readouterr().out
    assert "hunter2secret" not in out
    assert json.loads(out.splitlines()[0])["status"] == "FAIL"


async def test_a_database_behind_the_code_fails(
    server_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    everything = sql.migrations()
    async with empty_database(server_dsn) as dsn:
        with monkeypatch.context() as older:
            older.setattr(sql, "migrations", lambda: everything[:3])  # an older release's
            await db.migrate_at(dsn)
        async with connected(dsn) as conn:
            check = await doctor.check_migrations(conn)
    assert check.status is FAIL
    behind = len(everything) - 3
    assert check.detail == (
        f"the database is behind the code: {behind} of {len(everything)} not applied, "
        f"from {everything[3][0]} on"
    )
    assert check.fix.startswith("pressroom migrate")


async def test_a_database_ahead_of_the_code_warns_naming_the_migration(dsn: str) -> None:
    async with connected(dsn) as conn:
        await conn.execute("INSERT INTO schema_migrations (version) VALUES ('9001_from_later')")
        check = await doctor.check_migrations(conn)
    assert check.status is WARN  # a rollback of the code runs so: the doctor lets it start
    assert "ahead of the code: 9001_from_later" in check.detail
    assert "rollback to the previous release" in check.fix


async def test_a_database_never_migrated_fails(
    server_dsn: str, make_settings: Callable[..., Settings]
) -> None:
    settings = make_settings(env={"PRESSROOM_HOST": "10.1.2.3"})
    async with empty_database(server_dsn) as dsn, connected(dsn) as conn:
        migrations = await doctor.check_migrations(conn)
        keys = await doctor.check_api_keys(settings, conn)
    assert migrations.status is FAIL
    assert migrations.detail == "not migrated: no schema_migrations table"
    assert keys.status is FAIL, "once migrated, it has no key, and serve refuses to start"


async def test_a_keyless_server_beyond_loopback_fails(
    make_settings: Callable[..., Settings], dsn: str
) -> None:
    settings = make_settings(env={"PRESSROOM_HOST": "0.0.0.0"})
    async with connected(dsn) as conn:
        keyless = await doctor.check_api_keys(settings, conn)
        await apikeys.create_key_and_tenant(conn, "acme", "doctor")
        keyed = await doctor.check_api_keys(settings, conn)
    assert keyless.status is FAIL
    assert "PRESSROOM_HOST=0.0.0.0 is not loopback" in keyless.detail
    assert keyless.fix == "pressroom keys create --tenant NAME"
    assert (keyed.status, keyed.detail) == (OK, "1 active: every /v1 request needs one")

    public_url = doctor.check_public_url(settings)
    assert public_url.status is FAIL
    assert (
        public_url.detail
        == "links would name http://127.0.0.1:8080, which only this machine reaches"
    )
    assert public_url.fix.startswith("set PRESSROOM_PUBLIC_URL")
    named = make_settings(
        env={"PRESSROOM_HOST": "0.0.0.0", "PRESSROOM_PUBLIC_URL": "https://pdf.example.com"}
    )
    assert doctor.check_public_url(named).status is OK

    secrets = doctor.check_secrets(settings, environ={})
    assert secrets.status is WARN
    assert "PRESSROOM_SECRET and PRESSROOM_WEBHOOK_SECRET generated into" in secrets.detail
    given = {"PRESSROOM_SECRET": "s", "PRESSROOM_WEBHOOK_SECRET": "whsec_c2VjcmV0"}
    assert doctor.check_secrets(settings, environ=given).status is OK


async def test_clock_skew_against_postgresql_warns_then_fails(dsn: str) -> None:
    async with connected(dsn) as conn:
        now = await doctor.check_clock(conn)
        slow = await doctor.check_clock(conn, local_time=lambda: time.time() - 5)
        stopped = await doctor.check_clock(conn, local_time=lambda: time.time() - 60)
    assert now.status is OK
    assert slow.status is WARN
    assert slow.detail.startswith("the database's clock is 5.0 s ahead of this machine's")
    assert stopped.status is FAIL
    assert "tokens and links expire early or late" in stopped.detail
    assert "NTP" in stopped.fix


def test_a_signing_key_that_expires_soon_warns_and_an_expired_one_fails(
    make_settings: Callable[..., Settings], tmp_path: Path
) -> None:
    def with_key(folder: str, valid_days: float = 30, expired: bool = False) -> Check:
        (tmp_path / folder).mkdir()
        made = testca.make(tmp_path / folder, valid_days=valid_days, expired=expired)
        env = {"PRESSROOM_SIGNING_KEY": made.p12, "PRESSROOM_SIGNING_KEY_PASSWORD": made.password}
        return doctor.check_signing_key(make_settings(env=env))

    assert doctor.check_signing_key(make_settings()).detail.endswith("`sign` is refused")
    assert with_key("year", valid_days=365).status is OK
    soon = with_key("soon", valid_days=10)
    assert soon.status is WARN
    assert soon.detail.endswith("(9 days)")
    assert soon.fix.startswith("renew the certificate")
    expired = with_key("expired", expired=True)
    assert expired.status is FAIL
    assert "expired at" in expired.detail


async def test_the_command_as_a_process(dsn: str, tmp_path: Path) -> None:
    fonts = tmp_path / "fonts.conf"
    fonts.write_text("<fontconfig></fontconfig>\n")
    env = {**os.environ, "DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": str(tmp_path / "data")}
    for variable in ("PRESSROOM_HOST", "PRESSROOM_SECRET", "PRESSROOM_WEBHOOK_SECRET"):
        env.pop(variable, None)
    good, broken = await asyncio.gather(
        doctor_process(env, "--json"),
        doctor_process({**env, "PRESSROOM_HOST": "0.0.0.0", "FONTCONFIG_FILE": str(fonts)}),
    )
    code, out = good
    assert code == 0, out
    found = {entry["name"]: entry for entry in map(json.loads, out.splitlines())}
    assert list(found) == EVERY_CHECK
    assert {entry["status"] for entry in found.values()} <= {"ok", "warn"}

    code, out = broken
    assert code == 1
    failed = [line.split()[1] for line in out.splitlines() if line.startswith("FAIL")]
    assert failed == ["api-keys", "fonts-latin", "public-url"]
    assert "-- apt-get install fonts-dejavu fonts-liberation" in out
    assert out.splitlines()[-1].endswith(" 3 FAIL")


async def doctor_process(env: dict[str, str], *args: str) -> tuple[int, str]:
    """The exit status and output of the command; what it logs goes to stderr, shown on failure."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", DOCTOR, *args, cwd=ROOT, env=env, stdout=PIPE, stderr=PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), 120)
    assert process.returncode is not None
    if process.returncode not in (0, 1):
        pytest.fail(f"doctor exited with {process.returncode}:\n{err.decode()}")
    return process.returncode, out.decode()


CHECKOUT = Path(__file__).resolve().parents[2]


async def test_doctor_into_a_reader_that_stops_ends_quietly(dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, "DATABASE_URL": dsn, "PRESSROOM_DATA_DIR": str(tmp_path / "data")}
    proc = await asyncio.create_subprocess_shell(
        f"{sys.executable} -m server doctor | head -1",
        cwd=CHECKOUT,
        env=env,
        stdout=PIPE,
        stderr=PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert out.decode().startswith("ok    database"), out
    assert "Traceback" not in err.decode() and "BrokenPipe" not in err.decode(), err
