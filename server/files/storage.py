"""Where rendered files live: a Storage protocol and the local folder (S3 buckets: s3.py)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import fcntl
import glob
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

from server.errors import StorageError
from server.options import outputs

IO_THREADS = 32
#: `pressroom backup` holds this file's lock, exclusively, from just before it copies the
#: database until it has copied the folder; a deletion takes it shared, so that no file a
#: copied row names goes before it is copied too (server/cli/backup.py).
BACKUP_LOCK = ".backup.lock"
T = TypeVar("T")


class Storage(Protocol):
    """A durable home for rendered files. `put` returns only once the bytes are durable."""

    async def put(
        self, key: str, data: bytes, *, filename: str, content_type: str = outputs.PDF.content_type
    ) -> None:
        """Store `data`; a rendered file (a PDF, an image) must be whole (check_complete)."""
        ...

    async def get(self, key: str) -> bytes: ...

    async def delete(self, key: str) -> None: ...

    async def presign(
        self, key: str, *, filename: str, content_type: str, ttl_s: int
    ) -> str | None:
        """A URL the store itself serves the file at for ttl_s seconds (a bucket's presigned
        GET), or None when it serves none and Pressroom streams `get()` instead."""
        ...

    async def check(self) -> None:
        """Raise StorageError when the store cannot be written (readiness)."""
        ...


def check_complete(data: bytes, content_type: str) -> None:
    """Refuse to store a rendered file that is not whole (outputs.incomplete)."""
    if (why := outputs.incomplete(data, content_type)) is not None:
        raise StorageError(why)


class LocalStorage:
    """Files in a folder; written to a temp file, fsynced and renamed, so readers never see half."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._resolved_root = root.resolve()
        # Writes wait on fsync, not on the CPU: a pool of their own lets many renders store at
        # once without starving template rendering in the default pool.
        self._io = concurrent.futures.ThreadPoolExecutor(
            max_workers=IO_THREADS, thread_name_prefix="storage"
        )

    async def _run(self, func: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._io, func, *args)

    def close(self) -> None:
        self._io.shutdown(wait=True)

    def _path(self, key: str) -> Path:
        # A lexical check, no filesystem call: this runs on the event loop for every file.
        parts = key.split("/")
        if key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts):
            raise StorageError(f"object key escapes the storage folder: {key!r}")
        return self._resolved_root.joinpath(*parts)

    async def put(
        self, key: str, data: bytes, *, filename: str, content_type: str = outputs.PDF.content_type
    ) -> None:
        check_complete(data, content_type)
        path = self._path(key)
        try:
            await self._run(_atomic_write, path, data)
        except OSError as exc:
            raise StorageError(f"could not write {key}: {exc}") from exc

    async def get(self, key: str) -> bytes:
        try:
            return await self._run(self._path(key).read_bytes)
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise StorageError(f"could not read {key}: {exc}") from exc

    async def delete(self, key: str) -> None:
        try:
            await self._run(_delete, self._resolved_root, self._path(key))
        except OSError as exc:
            raise StorageError(f"could not delete {key}: {exc}") from exc

    async def presign(
        self, key: str, *, filename: str, content_type: str, ttl_s: int
    ) -> str | None:
        return None  # the folder serves nothing itself: the API's download route streams it

    async def check(self) -> None:
        try:
            await self._run(_probe_writable, self.root)
        except OSError as exc:
            raise StorageError(f"storage folder {self.root} is not writable: {exc}") from exc


def _atomic_write(path: Path, data: bytes) -> None:
    """The file is whole and durable when this returns: its bytes, its name in its folder,
    and the name of every folder created for it (each job's first file gets a folder)."""
    _make_folder(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{time.monotonic_ns()}.tmp")
    try:
        with open(tmp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_folder(path.parent)


def _make_folder(folder: Path) -> None:
    """mkdir -p, where each folder created is made durable in its parent (fsync of the parent):
    a folder's name, like a file's, survives a crash only once its parent is synced."""
    try:
        os.mkdir(folder)
    except FileExistsError:
        return
    except FileNotFoundError:
        _make_folder(folder.parent)
        try:
            os.mkdir(folder)
        except FileExistsError:
            return
    fsync_folder(folder.parent)


def fsync_folder(folder: Path) -> None:
    """Make the names in `folder` durable (new, renamed or removed entries)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _delete(root: Path, path: Path) -> None:
    """The file, and the temp files of writes to it that a killed process left behind (a key
    is only deleted once nobody writes it any more)."""
    with _no_backup_running(root):
        path.unlink(missing_ok=True)
        for leftover in path.parent.glob(f".{glob.escape(path.name)}.*.tmp"):
            leftover.unlink(missing_ok=True)


@contextlib.contextmanager
def _no_backup_running(root: Path) -> Iterator[None]:
    """The backup lock, shared; StorageError while a backup holds it."""
    try:
        fd = os.open(root / BACKUP_LOCK, os.O_RDONLY)
    except FileNotFoundError:
        fd = None  # no backup ever ran here (one starting now waits for our transaction)
    try:
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                raise StorageError(
                    "a backup (pressroom backup) is copying the storage folder, and files are "
                    "deleted only once it has finished"
                ) from None
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _probe_writable(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    probe = root / f".ready.{os.getpid()}"
    probe.write_bytes(b"ok")
    probe.unlink()
