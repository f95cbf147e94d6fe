"""Stored templates: named, immutable versions that jobs name as `template_id` (`name` for the
latest, `name@version` for one), as rows and as the API shows them. A version is Jinja2 HTML or
a Word template (an uploaded .docx, server/render/docx.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

import asyncpg

from server.sql import query

#: A template reference: its name, and its version (None: the latest).
Ref = tuple[str, int | None]
#: What a version is made of, as its JSON's `kind` says.
HTML, DOCX = "html", "docx"


@dataclasses.dataclass(frozen=True, slots=True)
class StoredTemplate:
    name: str
    version: int
    #: The Jinja2 HTML; None for a Word template.
    html: str | None
    options: dict[str, Any]
    sample_data: dict[str, Any]
    assets: dict[str, str]
    created_at: dt.datetime
    #: A Word template's asset id; None for HTML.
    docx: str | None = None

    @property
    def kind(self) -> str:
        return HTML if self.docx is None else DOCX

    @property
    def docx_name(self) -> str:
        """The name a Word template's jobs give its file (in their assets, in their errors)."""
        return f"{self.name}@{self.version}.docx"

    @classmethod
    def from_row(cls, row: asyncpg.Record) -> StoredTemplate:
        return cls(
            name=row["name"],
            version=row["version"],
            html=row["html"],
            options=row["options"],
            sample_data=row["sample_data"],
            assets=row["assets"],
            created_at=row["created_at"],
            docx=row["docx"],
        )

    def public(self) -> dict[str, Any]:
        """The version as the API shows it."""
        return {
            "name": self.name,
            "version": self.version,
            "template_id": f"{self.name}@{self.version}",
            "kind": self.kind,
            "html": self.html,
            "docx": self.docx,
            "options": self.options,
            "sample_data": self.sample_data,
            "assets": self.assets,
            "created_at": self.created_at.isoformat(),
            "links": {
                "self": f"/v1/templates/{self.name}@{self.version}",
                "latest": f"/v1/templates/{self.name}",
                "preview": f"/v1/templates/{self.name}/preview",
            },
        }


async def find(
    conn: asyncpg.Pool | asyncpg.Connection, tenant: str, refs: Iterable[Ref]
) -> dict[Ref, StoredTemplate]:
    """The stored versions these references name, in one query; unknown ones are missing."""
    wanted = sorted(set(refs), key=lambda ref: (ref[0], ref[1] or 0))
    if not wanted:
        return {}
    rows = await conn.fetch(
        query("template_find"), tenant, [name for name, _ in wanted], [v for _, v in wanted]
    )
    return {
        (row["wanted_name"], row["wanted_version"]): StoredTemplate.from_row(row) for row in rows
    }
