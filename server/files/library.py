"""Stored templates: named, immutable versions that jobs name as `template_id` (`name` for the
latest published version, `name@version` for any one, a draft included), as rows and as the
API shows them. A version is Jinja2 HTML or a Word template (an uploaded .docx,
server/render/docx.py); it may carry a data contract (a JSON Schema, draft 2020-12, that its
jobs' data must meet) and named samples of such data."""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable
from typing import Any

import asyncpg
import jsonschema

from server.sql import query

#: A template reference: its name, and its version (None: the latest published).
Ref = tuple[str, int | None]
#: What a version is made of, as its JSON's `kind` says.
HTML, DOCX = "html", "docx"
#: Where a version stands: jobs naming the template alone get its latest published version.
DRAFT, PUBLISHED = "draft", "published"


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
    #: The JSON Schema its jobs' data must meet; None for none.
    data_schema: dict[str, Any] | None = None
    #: Named data sets, for previews and the checks of publishing.
    samples: dict[str, dict[str, Any]] = dataclasses.field(default_factory=dict)
    #: When it was published; None for a draft.
    published_at: dt.datetime | None = None

    @property
    def status(self) -> str:
        return DRAFT if self.published_at is None else PUBLISHED

    @property
    def kind(self) -> str:
        return HTML if self.docx is None else DOCX

    @property
    def template_id(self) -> str:
        return f"{self.name}@{self.version}"

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
            data_schema=row["data_schema"],
            samples=row["samples"],
            published_at=row["published_at"],
        )

    def public(self) -> dict[str, Any]:
        """The version as the API shows it."""
        return {
            "name": self.name,
            "version": self.version,
            "template_id": f"{self.name}@{self.version}",
            "kind": self.kind,
            "status": self.status,
            "published_at": self.published_at.isoformat() if self.published_at else None,
            "html": self.html,
            "docx": self.docx,
            "options": self.options,
            "sample_data": self.sample_data,
            "data_schema": self.data_schema,
            "samples": self.samples,
            "assets": self.assets,
            "created_at": self.created_at.isoformat(),
            "links": {
                "self": f"/v1/templates/{self.name}@{self.version}",
                "latest": f"/v1/templates/{self.name}",
                "preview": f"/v1/templates/{self.name}/preview",
                "publish": f"/v1/templates/{self.name}@{self.version}/publish",
                "diff": f"/v1/templates/{self.name}@{self.version}/diff",
            },
        }


async def find(
    conn: asyncpg.Pool | asyncpg.Connection,
    tenant: str,
    refs: Iterable[Ref],
    *,
    drafts: bool = False,
) -> dict[Ref, StoredTemplate]:
    """The stored versions these references name, in one query; unknown ones are missing. A
    name alone is its latest published version; with `drafts` (people reading, not jobs), its
    latest draft where none is published."""
    wanted = sorted(set(refs), key=lambda ref: (ref[0], ref[1] or 0))
    if not wanted:
        return {}
    rows = await conn.fetch(
        query("template_find"),
        tenant,
        [name for name, _ in wanted],
        [v for _, v in wanted],
        drafts,
    )
    return {
        (row["wanted_name"], row["wanted_version"]): StoredTemplate.from_row(row) for row in rows
    }


# --- the data contract ---------------------------------------------------------------------

#: What a JSON Schema `type` is called in a problem: `is not a number`.
_TYPE_WORDS = {
    "number": "a number",
    "integer": "an integer",
    "string": "a string",
    "boolean": "true or false",
    "object": "an object",
    "array": "an array",
    "null": "null",
}


def schema_problems(schema: dict[str, Any]) -> list[str]:
    """Why `schema` is not a JSON Schema (draft 2020-12) a version can carry; [] when it is."""
    try:
        jsonschema.Draft202012Validator.check_schema(schema)
    except jsonschema.SchemaError as exc:
        where = _path("data_schema", exc.absolute_path)
        return [f"not a valid JSON Schema (draft 2020-12): {exc.message} (at {where})"]
    return []


def contract_problems(
    schema: dict[str, Any], data: dict[str, Any], root: str = "data"
) -> list[tuple[str, str]]:
    """Where `data` breaks the contract `schema`: (path, problem), the path written as a job's
    fields are (`data.items[3].price`), in the data's order."""
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    problems = []
    for error in sorted(validator.iter_errors(data), key=lambda e: [str(p) for p in e.path]):
        path = _path(root, error.absolute_path)
        if error.validator == "required" and isinstance(error.validator_value, list):
            missing = [n for n in error.validator_value if n not in (error.instance or {})]
            problems += [(_path(path, [name]), "is required") for name in missing]
        elif error.validator == "type":
            wanted = error.validator_value
            names = [wanted] if isinstance(wanted, str) else list(wanted)
            words = " or ".join(_TYPE_WORDS.get(name, name) for name in names)
            problems.append((path, f"is not {words}"))
        else:
            problems.append((path, error.message))
    return problems


def _path(root: str, steps: Iterable[Any]) -> str:
    path = root
    for step in steps:
        path += f"[{step}]" if isinstance(step, int) else (f".{step}" if path else str(step))
    return path
