"""Assets: files a tenant uploads once (images, fonts, stylesheets, scripts, XML, PDF, Office
documents) and jobs map in by the relative paths their pages use (or convert: `office`).

An asset is its bytes: its id is `sha256:<hex>` of them, the same bytes uploaded twice are one
asset, and it never changes. The bytes live in the job storage at `<tenant>/assets/<hex>`
(the local folder or S3), the row saying they are there (size, content type) in PostgreSQL,
per tenant: another tenant's id is as unknown as one never uploaded. Being immutable, an asset
a process has read is kept in its `AssetCache` by hash, so the bucket is read once per asset
however many jobs draw it in.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import datetime as dt
import hashlib
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import asyncpg

from server.errors import PermanentError
from server.files import office_formats
from server.files.storage import Storage
from server.options import outputs
from server.sql import query

ID_PREFIX = "sha256:"
ID_PATTERN = r"sha256:[0-9a-f]{64}"
#: Hash off the event loop above this size (10 MiB take about 20 ms).
HASH_IN_THREAD_BYTES = 1024 * 1024
#: Asset bytes each process keeps in memory: room for the logos, fonts and stylesheets that
#: recur in most documents, little next to a Chromium of several hundred MiB.
CACHE_BYTES = 64 * 1024 * 1024

#: The content types an asset may have, each with the file extensions that name it: a file
#: sent without a type of its own (application/octet-stream) takes the type of its name.
CONTENT_TYPES: Mapping[str, tuple[str, ...]] = {
    "image/png": (".png",),
    "image/jpeg": (".jpg", ".jpeg"),
    "image/gif": (".gif",),
    "image/webp": (".webp",),
    "image/avif": (".avif",),
    "image/svg+xml": (".svg",),
    "font/woff2": (".woff2",),
    "font/woff": (".woff",),
    "font/ttf": (".ttf",),
    "font/otf": (".otf",),
    "text/css": (".css",),
    "text/javascript": (".js", ".mjs"),
    "application/json": (".json",),
    "application/xml": (".xml",),
    "application/pdf": (".pdf",),
    **office_formats.CONTENT_TYPES,
}
#: Older names of the same types, stored under the current one.
ALIASES: Mapping[str, str] = {
    "image/jpg": "image/jpeg",
    "application/font-woff": "font/woff",
    "application/font-woff2": "font/woff2",
    "application/x-font-ttf": "font/ttf",
    "application/x-font-otf": "font/otf",
    "application/javascript": "text/javascript",
    "application/x-javascript": "text/javascript",
    "text/xml": "application/xml",
    **office_formats.ALIASES,
}
_BY_EXTENSION = {ext: kind for kind, exts in CONTENT_TYPES.items() for ext in exts}
_ID = re.compile(ID_PATTERN)


def is_id(value: object) -> bool:
    """Whether `value` is written as an asset id (sha256: and 64 lower-case hex digits)."""
    return isinstance(value, str) and _ID.fullmatch(value) is not None


def content_type(given: str) -> str | None:
    """The type an asset sent as `given` is stored with (parameters dropped), None if refused."""
    bare = given.partition(";")[0].strip().lower()
    bare = ALIASES.get(bare, bare)
    return bare if bare in CONTENT_TYPES else None


def type_of_name(filename: str) -> str | None:
    """The content type a file name's extension stands for, None for any other."""
    _, dot, ext = filename.rpartition(".")
    return _BY_EXTENSION.get(f".{ext.lower()}") if dot else None


def accepted() -> str:
    """The accepted content types, for error messages."""
    return ", ".join(CONTENT_TYPES)


def storage_key(tenant: str, asset_id: str) -> str:
    return f"{tenant}/assets/{asset_id.removeprefix(ID_PREFIX)}"


@dataclasses.dataclass(frozen=True, slots=True)
class Asset:
    """A stored asset, as its row says."""

    id: str
    size: int
    content_type: str
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> Asset:
        return cls(row["id"], row["size"], row["content_type"], row["created_at"])

    def public(self) -> dict[str, Any]:
        """The asset as the API shows it."""
        return {
            "id": self.id,
            "size": self.size,
            "content_type": self.content_type,
            "created_at": self.created_at.isoformat(),
            "links": {"self": f"/v1/assets/{self.id}", "content": f"/v1/assets/{self.id}/content"},
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Upload:
    """Bytes to store as an asset, with their id and accepted content type."""

    id: str
    data: bytes
    content_type: str

    @classmethod
    async def of(cls, data: bytes, kind: str) -> Upload:
        if len(data) > HASH_IN_THREAD_BYTES:
            digest = await asyncio.to_thread(lambda: hashlib.sha256(data).hexdigest())
        else:
            digest = hashlib.sha256(data).hexdigest()
        return cls(ID_PREFIX + digest, data, kind)

    @property
    def size(self) -> int:
        return len(self.data)

    def problem(self) -> str | None:
        """Why these bytes cannot be an asset of their type, None when they can."""
        if (kind := office_formats.BY_TYPE.get(self.content_type)) is not None:
            return office_formats.mismatch(self.data, kind)
        why = outputs.incomplete(self.data, self.content_type)
        return None if why is None else f"is {why}"


class QuotaExceeded(Exception):
    """Storing these uploads would take the tenant past its asset quota."""

    def __init__(self, used: int, adding: int, limit: int) -> None:
        super().__init__(f"{used} + {adding} bytes is over {limit}")
        self.used = used
        self.adding = adding
        self.limit = limit


async def find(
    conn: asyncpg.Pool | asyncpg.Connection, tenant: str, ids: Iterable[str]
) -> dict[str, Asset]:
    """The tenant's assets among `ids`, in one query; unknown ones (or another tenant's) are
    missing."""
    wanted = sorted({i for i in ids if isinstance(i, str)})
    if not wanted:
        return {}
    rows = await conn.fetch(query("asset_find"), tenant, wanted)
    return {row["id"]: Asset.from_row(row) for row in rows}


async def store(
    pool: asyncpg.Pool,
    storage: Storage,
    tenant: str,
    uploads: Sequence[Upload],
    *,
    max_total_bytes: int,
) -> list[tuple[Asset, bool]]:
    """Store the uploads not stored yet, all or none of them within the tenant's quota:
    (the asset, whether it is new) for each. Bytes go to storage before their row exists, so a
    row always has its bytes."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(query("asset_lock"), tenant)
        known = await find(conn, tenant, (u.id for u in uploads))
        new = list({u.id: u for u in uploads if u.id not in known}.values())
        if new:
            used: int = await conn.fetchval(query("asset_total"), tenant)
            adding = sum(u.size for u in new)
            if used + adding > max_total_bytes:
                raise QuotaExceeded(used, adding, max_total_bytes)
            for upload in new:
                await storage.put(
                    storage_key(tenant, upload.id),
                    upload.data,
                    filename=upload.id.removeprefix(ID_PREFIX),
                    content_type=upload.content_type,
                )
            rows = await conn.fetch(
                query("asset_insert"),
                tenant,
                [u.id for u in new],
                [u.size for u in new],
                [u.content_type for u in new],
            )
            created = {row["id"]: Asset.from_row(row) for row in rows}
        else:
            created = {}
    return [(created[u.id], True) if u.id in created else (known[u.id], False) for u in uploads]


@dataclasses.dataclass(frozen=True, slots=True)
class Removal:
    """What DELETE found: no such asset, or the jobs in flight that keep it, or neither (gone)."""

    found: bool
    users: list[uuid.UUID]


async def remove(pool: asyncpg.Pool, storage: Storage, tenant: str, asset_id: str) -> Removal:
    """Delete an asset no queued or running job uses: its row and its bytes."""
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute(query("asset_lock"), tenant)
        if not await find(conn, tenant, [asset_id]):
            return Removal(found=False, users=[])
        used = await conn.fetchrow(query("asset_users"), tenant, [asset_id])
        users: list[uuid.UUID] = used["jobs"] if used is not None else []
        if users:
            return Removal(found=True, users=users)
        await conn.execute(query("asset_delete"), tenant, asset_id)
        # Under the lock: an upload of the same bytes waits, and then stores them again.
        await storage.delete(storage_key(tenant, asset_id))
    return Removal(found=True, users=[])


def job_assets(
    paths: Mapping[str, str], known: Mapping[str, Asset]
) -> dict[str, dict[str, str]] | None:
    """What a job row keeps of its asset map: path → {id, content_type}; None for none."""
    if not paths:
        return None
    return {
        path: {"id": asset_id, "content_type": known[asset_id].content_type}
        for path, asset_id in paths.items()
    }


class AssetCache:
    """Asset bytes by id, each read from storage once and then kept while the cache has room
    (the least recently used go first). Concurrent reads of one asset share one storage read,
    which a cancelled render does not cut off for the others."""

    def __init__(self, storage: Storage, *, max_bytes: int = CACHE_BYTES) -> None:
        self._storage = storage
        self._max_bytes = max_bytes
        self._kept: collections.OrderedDict[str, bytes] = collections.OrderedDict()
        self._size = 0
        self._reading: dict[tuple[str, str], asyncio.Task[bytes]] = {}
        #: Storage reads made (a test's and an operator's view of the hit rate).
        self.reads = 0

    @property
    def size(self) -> int:
        """Bytes kept."""
        return self._size

    async def get(self, tenant: str, asset_id: str) -> bytes:
        """The asset's bytes; FileNotFoundError when storage no longer has them."""
        if (data := self._kept.get(asset_id)) is not None:
            self._kept.move_to_end(asset_id)
            return data
        # Per tenant: an asset's bytes are the same for all, but where they live is not.
        key = (tenant, asset_id)
        task = self._reading.get(key)
        if task is None:
            task = asyncio.create_task(self._read(tenant, asset_id), name=f"asset-{asset_id}")
            self._reading[key] = task
            task.add_done_callback(lambda done: self._read_done(key, done))
        return await asyncio.shield(task)

    async def _read(self, tenant: str, asset_id: str) -> bytes:
        self.reads += 1
        data = await self._storage.get(storage_key(tenant, asset_id))
        self._keep(asset_id, data)
        return data

    def _read_done(self, key: tuple[str, str], task: asyncio.Task[bytes]) -> None:
        self._reading.pop(key, None)
        if not task.cancelled():
            task.exception()  # retrieved here, should every caller have been cancelled

    def _keep(self, asset_id: str, data: bytes) -> None:
        if len(data) > self._max_bytes or asset_id in self._kept:
            return
        self._kept[asset_id] = data
        self._size += len(data)
        while self._size > self._max_bytes:
            _, dropped = self._kept.popitem(last=False)
            self._size -= len(dropped)

    async def files(
        self, tenant: str, refs: Mapping[str, Mapping[str, str]]
    ) -> dict[str, tuple[str, bytes]]:
        """A job's assets (path → {id, content_type}) as path → (content type, bytes).
        PermanentError names a path whose asset storage no longer has."""
        paths = list(refs)
        found = await asyncio.gather(
            *(self.get(tenant, refs[path]["id"]) for path in paths), return_exceptions=True
        )
        files: dict[str, tuple[str, bytes]] = {}
        for path, data in zip(paths, found, strict=True):
            if isinstance(data, FileNotFoundError):
                raise PermanentError(
                    f"the asset {path} ({refs[path]['id']}) is no longer stored"
                ) from None
            if isinstance(data, BaseException):
                raise data
            files[path] = (refs[path]["content_type"], data)
        return files
