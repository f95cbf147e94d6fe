"""`pressroom doctor`: the installation checked the way `pressroom serve` would run it, one line
per check (ok, warn or FAIL, what it found, what to do); it exits 1 when a check fails."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import json
import os
import pwd
import re
import secrets
import shutil
import socket
import tempfile
import time
from asyncio.subprocess import DEVNULL, PIPE
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from enum import StrEnum
from urllib.parse import urlsplit

import asyncpg

from server import sql
from server.access import apikeys
from server.errors import StorageError
from server.files.storage import LocalStorage, Storage
from server.queue import db
from server.render.browsers import CHROMIUM_ARGS, choose_chromium
from server.render.cgroups import RenderCgroups
from server.render.dropuser import launcher
from server.settings import S3Location, Settings, env_name
from server.signkey import SigningKeyError
from server.web.auth import is_loopback

#: Clock skew against PostgreSQL that tokens and links (time-bound) begin to feel, and break by.
CLOCK_WARN_S = 2.0
CLOCK_FAIL_S = 30.0
SIGNING_KEY_WARN_DAYS = 30
#: Chromium's start, fontconfig's first scan of a large font folder.
COMMAND_TIMEOUT_S = 30.0
#: Every object the storage check writes is under this key, and deleted again.
STORAGE_PREFIX = "doctor/"
CREATE_KEY = "pressroom keys create --tenant NAME"
MIGRATE = "pressroom migrate (every start applies them too; docs/operations.md: which ones lock)"
FONTCONFIG = "apt-get install fontconfig"


class Status(StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "FAIL"


OK, WARN, FAIL = Status.OK, Status.WARN, Status.FAIL


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """One finding; `fix` says what to do (with an ok, a note)."""

    name: str
    status: Status
    detail: str
    fix: str = ""

    def line(self) -> str:
        fix = f" -- {self.fix}" if self.fix else ""
        return f"{self.status:<4}  {self.name:<14} {self.detail}{fix}"


async def open_database(
    settings: Settings, stack: contextlib.AsyncExitStack
) -> tuple[Check, asyncpg.Connection | None]:
    """A connection to the database `serve` would use (the embedded one started here, stopped
    with `stack`), or None and why not."""
    if settings.database_url is not None:
        where, fix = "DATABASE_URL", "start PostgreSQL there, or correct DATABASE_URL"
    else:
        where = f"the embedded PostgreSQL in {settings.data_dir}"
        fix = "read the log the message names, or set DATABASE_URL to an existing PostgreSQL"
    try:
        dsn = await stack.enter_async_context(db.server(settings))
        conn = await db.connect(dsn)
    except Exception as exc:  # a refused connect, a password, the embedded start: the finding
        return Check("database", FAIL, f"cannot reach {where}: {_reason(exc)}", fix), None
    stack.push_async_callback(conn.close)
    version = await conn.fetchval("SHOW server_version")
    name = await conn.fetchval("SELECT current_database()")
    return Check("database", OK, f"PostgreSQL {version}, database {name} ({where})"), conn


async def check_migrations(conn: asyncpg.Connection) -> Check:
    """The migrations in schema_migrations against the files of server/sql/migrations/."""
    if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
        return Check("migrations", FAIL, "not migrated: no schema_migrations table", MIGRATE)
    applied = {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}
    known = [version for version, _ in sql.migrations()]
    ahead = sorted(applied - set(known))
    if ahead:
        # A rollback of the code, or an old process during a rolling upgrade: the previous
        # release runs on the newer schema (tests/e2e/test_upgrade.py), so this is no failure.
        found = f"the database is ahead of the code: {', '.join(ahead)}, unknown to this Pressroom"
        return Check(
            "migrations",
            WARN,
            found,
            "fine for a rollback to the previous release; otherwise run the version that "
            "applied them, or a newer one",
        )
    behind = [version for version in known if version not in applied]
    if behind:
        found = f"the database is behind the code: {len(behind)} of {len(known)} not applied"
        return Check("migrations", FAIL, f"{found}, from {behind[0]} on", MIGRATE)
    return Check("migrations", OK, f"all {len(known)} applied, the last {known[-1]}")


async def check_clock(
    conn: asyncpg.Connection, *, local_time: Callable[[], float] = time.time
) -> Check:
    """This machine's clock against PostgreSQL's, which stamps what tokens and links meet."""
    before = local_time()
    db_now: dt.datetime = await conn.fetchval("SELECT now()")
    skew_s = db_now.timestamp() - (before + local_time()) / 2
    side = "ahead of" if skew_s > 0 else "behind"
    found = f"the database's clock is {abs(skew_s):.1f} s {side} this machine's"
    fix = "synchronise both machines' clocks (NTP: chrony, systemd-timesyncd)"
    if abs(skew_s) > CLOCK_FAIL_S:
        return Check("clock", FAIL, f"{found}: tokens and links expire early or late", fix)
    if abs(skew_s) > CLOCK_WARN_S:
        return Check("clock", WARN, found, fix)
    return Check("clock", OK, found)


async def check_api_keys(settings: Settings, conn: asyncpg.Connection) -> Check:
    """Keys exist, or dev mode stays on loopback, as `serve` demands."""
    try:
        active = await apikeys.active_ids(conn)
    except asyncpg.UndefinedTableError:  # not migrated yet: the first start makes no key
        active = set()
    if active:
        return Check("api-keys", OK, f"{len(active)} active: every /v1 request needs one")
    host = settings.host
    if is_loopback(host):
        found = f"dev mode: no key exists, so the API is open, on {host} only"
        return Check("api-keys", OK, found, f"to require keys: {CREATE_KEY}")
    found = f"no API key, and PRESSROOM_HOST={host} is not loopback: serve refuses to run open"
    return Check("api-keys", FAIL, found, CREATE_KEY)


async def find_chromium(settings: Settings) -> str:
    """The executable `serve` would launch; RuntimeError when there is none."""
    if settings.chromium is not None:
        if (found := shutil.which(settings.chromium)) is None:
            raise RuntimeError(f"PRESSROOM_CHROMIUM={settings.chromium!r} is not an executable")
        return found
    from playwright.async_api import Error, async_playwright

    build = ""  # where Playwright's own build would be, installed or not
    with contextlib.suppress(Error, OSError):
        async with async_playwright() as playwright:
            build = playwright.chromium.executable_path
    return choose_chromium(build)


async def check_chromium(executable: str) -> Check:
    """Its version, from the executable itself."""
    code, out, err = await _command(executable, "--version")
    if code != 0:
        found = f"{executable} --version failed: {_last_line(err)}"
        return Check("chromium", FAIL, found, "reinstall it, or set PRESSROOM_CHROMIUM to another")
    return Check("chromium", OK, f"{(_lines(out) or ['Chromium'])[0]} ({executable})")


def check_chromium_user(settings: Settings, executable: str) -> Check:
    """Chromium never runs as root (server/render/dropuser.py)."""
    try:
        made, user = launcher(executable, settings.chromium_user)
    except RuntimeError as exc:
        fix = "set PRESSROOM_CHROMIUM_USER to an unprivileged user of this machine (nobody)"
        return Check("chromium-user", FAIL, str(exc), fix)
    if made is None:
        return Check("chromium-user", OK, f"{user}, Pressroom's own user (not root)")
    made.remove()
    return Check("chromium-user", OK, f"{user} (Pressroom runs as root; setpriv drops to {user})")


async def check_sandbox(settings: Settings, executable: str) -> Check:
    """Chromium started as its user with its sandbox, as `serve` tries first, else without."""
    made, user = launcher(executable, settings.chromium_user)
    program = executable if made is None else made.path
    profile = tempfile.mkdtemp(prefix="pressroom-doctor-")
    try:
        page = ("--headless", *CHROMIUM_ARGS, f"--user-data-dir={profile}", "--dump-dom")
        code, _, err = await _command(program, *page, "about:blank")
        if code == 0:
            return Check("sandbox", OK, f"on: Chromium starts as {user} with its sandbox")
        code, _, without = await _command(program, *page, "--no-sandbox", "about:blank")
    finally:
        shutil.rmtree(profile, ignore_errors=True)
        if made is not None:
            made.remove()
    if code != 0:
        found = f"Chromium does not start as {user}, sandbox or not: {_last_line(without)}"
        return Check("sandbox", FAIL, found, f"run {program} --headless about:blank as {user}")
    refused = next((line for line in _lines(err) if "sandbox" in line.lower()), _last_line(err))
    found = (
        f"off: Chromium refuses its sandbox here ({refused}), so it runs without: a page "
        f"that exploits the browser gets all of {user}'s rights"
    )
    fix = (
        "allow unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; Ubuntu: "
        "kernel.apparmor_restrict_unprivileged_userns=0; a container: a seccomp profile that "
        "permits them)"
    )
    return Check("sandbox", WARN, found, fix)


async def check_memory_bound(settings: Settings) -> Check:
    """A memory cgroup made and a process bounded in it, as each render's renderer is."""
    cgroups, why = RenderCgroups.create(settings.render_max_mb)
    if cgroups is not None:
        try:
            why = await _bound_a_process(cgroups)
        finally:
            cgroups.close()
        if not why:
            return Check("memory-bound", OK, cgroups.description)
    found = (
        f"no memory cgroup for renders ({why}): only V8's heap limit ({settings.render_max_mb} "
        "MiB) bounds a page, so its images, layout and DOM may take all the machine's memory"
    )
    fix = "run Pressroom as root, or in a cgroup its user may divide (systemd: Delegate=yes)"
    return Check("memory-bound", WARN, found, fix)


async def _bound_a_process(cgroups: RenderCgroups) -> str:
    """Why no process can be bounded in a cgroup of its own here, or "" once one was."""
    probe = await asyncio.create_subprocess_exec("sleep", "60")
    try:
        cgroups.confine(probe.pid)
    except OSError as exc:
        return f"cannot bound a process in {cgroups.root}: {exc.strerror or exc}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            probe.kill()
        await probe.wait()
    return ""


async def _fontconfig(program: str, pattern: str) -> list[str]:
    """The families fc-list has for a pattern (what Chromium's fallback picks from), or the
    one fc-match picks first for it."""
    code, out, err = await _command(program, "--format", "%{family[0]}\n", pattern)
    if code != 0:
        raise RuntimeError(f"{program} {pattern} failed: {_last_line(err)}")
    return sorted(set(_lines(out)))


async def _fonts(name: str, scripts: Mapping[str, str], missing: Status, package: str) -> Check:
    picked: dict[str, str] = {}
    try:
        for script, pattern in scripts.items():
            if await _fontconfig("fc-list", pattern):
                picked[script] = (await _fontconfig("fc-match", f"sans-serif{pattern}"))[0]
    except FileNotFoundError:
        return Check(name, FAIL, "fontconfig is not installed", FONTCONFIG)
    if absent := [script for script in scripts if script not in picked]:
        found = f"no font for {', '.join(absent)}: such text prints as empty boxes"
        return Check(name, missing, found, f"apt-get install {package}")
    return Check(name, OK, ", ".join(f"{script} in {font}" for script, font in picked.items()))


async def check_latin_fonts() -> Check:
    return await _fonts("fonts-latin", {"Latin": ":lang=en"}, FAIL, "fonts-dejavu fonts-liberation")


async def check_cjk_fonts() -> Check:
    scripts = {
        "Japanese": ":lang=ja",
        "Simplified Chinese": ":lang=zh-cn",
        "Traditional Chinese": ":lang=zh-tw",
        "Korean": ":lang=ko",
    }
    return await _fonts("fonts-cjk", scripts, WARN, "fonts-noto-cjk")


async def check_emoji_fonts() -> Check:
    try:
        colour = await _fontconfig("fc-list", ":charset=1f600:color=true")
        plain = [] if colour else await _fontconfig("fc-list", ":charset=1f600")
    except FileNotFoundError:
        return Check("fonts-emoji", FAIL, "fontconfig is not installed", FONTCONFIG)
    if colour:
        return Check("fonts-emoji", OK, f"colour emoji: {', '.join(colour)}")
    shown = f"in black and white ({', '.join(plain)})" if plain else "as empty boxes"
    fix = "apt-get install fonts-noto-color-emoji"
    return Check("fonts-emoji", WARN, f"no colour emoji font: emoji print {shown}", fix)


async def check_storage(settings: Settings) -> Check:
    """A small object put, read back and deleted where `serve` keeps its files."""
    key = f"{STORAGE_PREFIX}{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}.txt"
    if isinstance(settings.storage, S3Location):
        from server.files.s3 import open_s3_storage

        fix = (
            "check PRESSROOM_STORAGE, the AWS credentials and their rights on the bucket "
            "(s3:PutObject, s3:GetObject, s3:DeleteObject)"
        )
        try:
            async with open_s3_storage(settings.storage) as s3:
                return await _round_trip(s3, key, str(settings.storage), fix)
        except StorageError as exc:
            return Check("storage", FAIL, str(exc), fix)
    user = pwd.getpwuid(os.geteuid()).pw_name
    fix = f"make {settings.files_dir} a folder {user} can write, or set PRESSROOM_DATA_DIR"
    local = LocalStorage(settings.files_dir)
    try:
        return await _round_trip(local, key, str(settings.files_dir), fix)
    finally:
        await asyncio.to_thread(local.close)


async def _round_trip(storage: Storage, key: str, where: str, fix: str) -> Check:
    data = f"pressroom doctor {time.time()}\n".encode()
    try:
        await storage.put(key, data, filename="doctor.txt", content_type="text/plain")
        try:
            if await storage.get(key) != data:
                return Check("storage", FAIL, f"{key} in {where} read back changed", fix)
        finally:
            await storage.delete(key)
    except (StorageError, OSError) as exc:
        found = _reason(exc)
        return Check("storage", FAIL, found if where in found else f"{where}: {found}", fix)
    return Check("storage", OK, f"put, get and delete of {key} in {where}")


def check_secrets(settings: Settings, environ: Mapping[str, str]) -> Check:
    """Secrets left unset are generated into the data dir: one per data dir, not per cluster."""
    variables = (
        env_name(name, Settings.model_fields[name]) for name in ("secret", "webhook_secret")
    )
    if not (generated := [var for var in variables if not environ.get(var, "").strip()]):
        return Check("secrets", OK, "set in the environment")
    names = " and ".join(generated)
    found = f"{names} generated into {settings.data_dir}"
    if is_loopback(settings.host):
        return Check("secrets", OK, f"{found} (for this machine)")
    found += ": links and tokens one process signs are refused by those with another data dir"
    fix = f"set {names} alike in every process, or let them all share this data dir"
    return Check("secrets", WARN, found, fix)


def check_public_url(settings: Settings) -> Check:
    """Links are built from PRESSROOM_PUBLIC_URL, else from the listen address."""
    base = settings.public_base_url
    if settings.public_url or is_loopback(settings.host):
        return Check("public-url", OK, f"links start with {base}")
    fix = "set PRESSROOM_PUBLIC_URL to the URL clients use (https://pdf.example.com)"
    if settings.listens_everywhere:
        found = f"links would name {base}, which only this machine reaches"
        return Check("public-url", FAIL, found, fix)
    found = f"links name {base}, the listen address: wrong behind a load balancer or proxy"
    return Check("public-url", WARN, found, fix)


def check_signing_key(settings: Settings) -> Check:
    """PRESSROOM_SIGNING_KEY opens, and its certificate is not about to expire."""
    if (key := settings.signing) is None:
        return Check("signing-key", OK, "PRESSROOM_SIGNING_KEY unset: `sign` is refused")
    try:
        expires = key.check()
    except SigningKeyError as exc:
        fix = "give PRESSROOM_SIGNING_KEY a PKCS#12 file with a valid certificate, or unset it"
        return Check("signing-key", FAIL, str(exc), fix)
    days = (expires - dt.datetime.now(dt.UTC)).days
    found = f"valid until {expires.date().isoformat()} ({days} days)"
    if days < SIGNING_KEY_WARN_DAYS:
        fix = "renew the certificate and replace the file PRESSROOM_SIGNING_KEY names"
        return Check("signing-key", WARN, found, fix)
    return Check("signing-key", OK, found)


async def diagnose(
    settings: Settings, environ: Mapping[str, str] = os.environ
) -> AsyncIterator[Check]:
    """Every check in the order printed, each as soon as it is done."""
    async with contextlib.AsyncExitStack() as stack:
        found, conn = await open_database(settings, stack)
        yield found
        if conn is not None:
            yield await _guarded("migrations", lambda: check_migrations(conn))
            yield await _guarded("clock", lambda: check_clock(conn))
            yield await _guarded("api-keys", lambda: check_api_keys(settings, conn))
    try:
        executable = await find_chromium(settings)
    except RuntimeError as exc:
        fix = "apt-get install chromium-headless-shell, or set PRESSROOM_CHROMIUM"
        yield Check("chromium", FAIL, str(exc), fix)
    else:
        yield await _guarded("chromium", lambda: check_chromium(executable))
        user = await _guarded("chromium-user", lambda: check_chromium_user(settings, executable))
        yield user
        if user.status is not FAIL:
            yield await _guarded("sandbox", lambda: check_sandbox(settings, executable))
    yield await _guarded("memory-bound", lambda: check_memory_bound(settings))
    yield await _guarded("fonts-latin", check_latin_fonts)
    yield await _guarded("fonts-cjk", check_cjk_fonts)
    yield await _guarded("fonts-emoji", check_emoji_fonts)
    yield await _guarded("storage", lambda: check_storage(settings))
    yield check_secrets(settings, environ)
    yield check_public_url(settings)
    yield await _guarded("signing-key", lambda: check_signing_key(settings))


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    doctor = commands.add_parser(
        "doctor", help="check this installation the way `pressroom serve` would run it"
    )
    doctor.add_argument("--json", action="store_true", help="one JSON object per check and line")


async def run(settings: Settings, args: argparse.Namespace) -> int:
    """Print every check; 1 when one failed (warnings do not fail), else 0."""
    counts = dict.fromkeys(Status, 0)
    async for check in diagnose(settings):
        counts[check.status] += 1
        shown = dataclasses.replace(
            check, detail=_redacted(check.detail, settings), fix=_redacted(check.fix, settings)
        )
        print(json.dumps(dataclasses.asdict(shown)) if args.json else shown.line(), flush=True)
    if not args.json:
        print(f"{counts[OK]} ok, {counts[WARN]} warn, {counts[FAIL]} FAIL")
    return 1 if counts[FAIL] else 0


async def _guarded(name: str, check: Callable[[], Awaitable[Check] | Check]) -> Check:
    try:
        result = check()
        return result if isinstance(result, Check) else await result
    except Exception as exc:  # one check's surprise must not hide the others' findings
        return Check(name, FAIL, f"the check itself failed: {_reason(exc)}", "")


async def _command(*argv: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of a program; FileNotFoundError if it is not there."""
    process = await asyncio.create_subprocess_exec(*argv, stdin=DEVNULL, stdout=PIPE, stderr=PIPE)
    try:
        out, err = await asyncio.wait_for(process.communicate(), COMMAND_TIMEOUT_S)
    except TimeoutError:
        process.kill()
        await process.wait()
        return -1, "", f"no answer within {COMMAND_TIMEOUT_S:g} s"
    assert process.returncode is not None
    return process.returncode, out.decode(errors="replace"), err.decode(errors="replace")


_LOG_PREFIX = re.compile(r"^\[[^\]]*\]\s*")  # Chromium's [pid:tid:time:LEVEL:file(line)]


def _lines(text: str) -> list[str]:
    return [_LOG_PREFIX.sub("", line).strip() for line in text.splitlines() if line.strip()]


def _last_line(text: str) -> str:
    return (_lines(text) or ["(no output)"])[-1]


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _redacted(text: str, settings: Settings) -> str:
    """`text` without a secret of `settings` in it (a DSN's password in a driver's message)."""
    hidden = [settings.secret, settings.webhook_secret, settings.signing_key_password]
    with contextlib.suppress(ValueError):
        hidden.append(urlsplit(settings.database_url or "").password)
    for secret in hidden:
        if secret:
            text = text.replace(secret, "[redacted]")
    return text
