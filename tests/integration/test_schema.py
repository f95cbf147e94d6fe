"""server/sql/schema.sql states today's schema: an empty database brought up by the migration
runner and one loaded from schema.sql have the same catalog, object by object."""

from __future__ import annotations

import asyncio
import contextlib
import difflib
import re
import uuid
from collections.abc import AsyncIterator, Iterator
from importlib import resources
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from server import sql
from server.queue import db

#: The runner's own bookkeeping (server/queue/db.py makes it), not part of the schema.
RUNNER_TABLES = ("schema_migrations",)

# Each query gives one line per object (several for a function's definition), in a fixed order,
# so that two databases compare as text and a difference reads as a diff. Names differ
# legitimately in one place: a partition's indexes are named by whoever made the partition
# (the table 0017 turned into the first partition kept its own index names), so they are shown
# by the partitioned index each one belongs to. A partition's own column defaults are left out
# too: rows reach a partition through the log, whose defaults apply.
CATALOG: dict[str, str] = {
    "tables": """
        SELECT format('%s %s%s%s%s', c.relname,
                      CASE c.relkind WHEN 'p' THEN 'partitioned table' ELSE 'table' END,
                      CASE WHEN c.relkind = 'p' THEN ' by ' || pg_get_partkeydef(c.oid) ELSE '' END,
                      CASE WHEN c.relispartition
                           THEN format(' partition of %s %s', p.inhparent::regclass,
                                       pg_get_expr(c.relpartbound, c.oid))
                           ELSE '' END,
                      format(' persistence=%s options=%s', c.relpersistence, c.reloptions))
        FROM pg_class c LEFT JOIN pg_inherits p ON p.inhrelid = c.oid
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
          AND c.relname <> ALL ($1)
        ORDER BY 1
    """,
    "columns": """
        SELECT format('%s.%s %s: %s%s%s%s%s%s', c.relname,
                      row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum),
                      a.attname, format_type(a.atttypid, a.atttypmod),
                      CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END,
                      CASE WHEN NOT c.relispartition AND d.adbin IS NOT NULL
                           THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid) ELSE '' END,
                      CASE WHEN a.attidentity <> '' THEN format(' IDENTITY %s', a.attidentity)
                           ELSE '' END,
                      CASE WHEN a.attgenerated <> '' THEN format(' GENERATED %s', a.attgenerated)
                           ELSE '' END,
                      CASE WHEN a.attcollation NOT IN (0, t.typcollation)
                           THEN format(' COLLATE %s', a.attcollation::regcollation) ELSE '' END)
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid
        JOIN pg_type t ON t.oid = a.atttypid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
          AND a.attnum > 0 AND NOT a.attisdropped AND c.relname <> ALL ($1)
        ORDER BY c.relname, a.attnum
    """,
    # From PostgreSQL 18 a NOT NULL is a constraint too, named by the server, uniquely in the
    # schema: the log's are job_events_id_not_null1 and so on in a migrated database, where the
    # table 0017 made its first partition holds the first names. Columns' NOT NULL is above.
    "constraints": """
        SELECT format('%s.%s: %s%s', c.relname, k.conname, pg_get_constraintdef(k.oid),
                      CASE WHEN k.condeferrable THEN ' deferrable' ELSE '' END)
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid
        WHERE c.relnamespace = 'public'::regnamespace AND k.contype <> 'n'
          AND c.relname <> ALL ($1)
        ORDER BY 1
    """,
    "indexes": """
        SELECT CASE WHEN c.relispartition
                    THEN format('%s (of %s): %s', t.relname, p.inhparent::regclass,
                                regexp_replace(pg_get_indexdef(i.indexrelid),
                                               ' INDEX \\S+ ON ', ' INDEX * ON '))
                    ELSE format('%s: %s', i.indexrelid::regclass, pg_get_indexdef(i.indexrelid))
               END
        FROM pg_index i
        JOIN pg_class c ON c.oid = i.indexrelid
        JOIN pg_class t ON t.oid = i.indrelid
        LEFT JOIN pg_inherits p ON p.inhrelid = i.indexrelid
        WHERE t.relnamespace = 'public'::regnamespace AND t.relname <> ALL ($1)
        ORDER BY 1
    """,
    "triggers": """
        SELECT format('%s.%s: %s (enabled %s)', t.tgrelid::regclass, t.tgname,
                      pg_get_triggerdef(t.oid), t.tgenabled)
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
        WHERE c.relnamespace = 'public'::regnamespace AND NOT t.tgisinternal
        ORDER BY 1
    """,
    # The whole definition: name, arguments, result, language, volatility, settings, body.
    "functions": """
        SELECT format(E'%s(%s) kind=%s parallel=%s strict=%s security_definer=%s leakproof=%s '
                      'cost=%s rows=%s\n%s',
                      p.proname, pg_get_function_identity_arguments(p.oid), p.prokind,
                      p.proparallel, p.proisstrict, p.prosecdef, p.proleakproof, p.procost,
                      p.prorows, pg_get_functiondef(p.oid))
        FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace
        ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)
    """,
    "views": """
        SELECT format('%s %s: %s', c.relname, c.relkind, pg_get_viewdef(c.oid))
        FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('v', 'm')
        ORDER BY 1
    """,
    "sequences": """
        SELECT format('%s %s start=%s min=%s max=%s increment=%s cycle=%s cache=%s last=%s '
                      'owned by %s', s.sequencename, s.data_type, s.start_value, s.min_value,
                      s.max_value, s.increment_by, s.cycle, s.cache_size, s.last_value,
                      (SELECT d.refobjid::regclass || '.' || a.attname
                       FROM pg_depend d
                       JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                       WHERE d.classid = 'pg_class'::regclass
                         AND d.objid = format('%I', s.sequencename)::regclass
                         AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')))
        FROM pg_sequences s
        WHERE s.schemaname = 'public'
        ORDER BY 1
    """,
    # Enums, domains, ranges, composite types of their own: none today, compared all the same.
    "types": """
        SELECT format('%s %s %s', t.typname, t.typtype, format_type(t.oid, NULL))
        FROM pg_type t
        LEFT JOIN pg_class c ON c.oid = t.typrelid
        WHERE t.typnamespace = 'public'::regnamespace AND t.typelem = 0
          AND (t.typrelid = 0 OR c.relkind = 'c')
        ORDER BY 1
    """,
    "extensions": "SELECT format('%s %s', extname, extversion) FROM pg_extension ORDER BY 1",
}

#: What the schema writes itself (the seal of the log's first range, 0017): each table's rows.
TABLES_WITH_ROWS = """
    SELECT c.relname FROM pg_class c
    WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p')
      AND NOT c.relispartition AND c.relname <> ALL ($1)
    ORDER BY 1
"""


def schema_sql() -> str:
    return resources.files(sql).joinpath("schema.sql").read_text()


async def catalog(dsn: str) -> list[str]:
    """The schema of the database at `dsn`, as text: one block of lines per kind of object."""
    conn = await db.connect(dsn)
    try:
        lines: list[str] = []
        for kind, query in CATALOG.items():
            lines.append(f"== {kind}")
            args = [list(RUNNER_TABLES)] if "$1" in query else []
            for row in await conn.fetch(query, *args):
                lines.extend(row[0].splitlines())
        lines.append("== rows")
        for table in await conn.fetch(TABLES_WITH_ROWS, list(RUNNER_TABLES)):
            name = table["relname"]
            rows = await conn.fetch(f'SELECT to_jsonb(t)::text AS r FROM "{name}" t ORDER BY 1')
            lines.extend(f"{name}: {row['r']}" for row in rows)
        return lines
    finally:
        await conn.close()


def _with_database(dsn: str, name: str) -> str:
    return urlunsplit(urlsplit(dsn)._replace(path="/" + name))


@contextlib.asynccontextmanager
async def empty_database(server_dsn: str) -> AsyncIterator[str]:
    """A database with nothing in it (from template0), dropped afterwards."""
    name = f"pressroom_schema_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(server_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    finally:
        await admin.close()
    try:
        yield _with_database(server_dsn, name)
    finally:
        admin = await asyncpg.connect(server_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def _both(server_dsn: str) -> tuple[list[str], list[str]]:
    async with empty_database(server_dsn) as migrated, empty_database(server_dsn) as stated:
        await db.migrate_at(migrated)
        conn = await db.connect(stated)
        try:
            async with conn.transaction():
                await conn.execute(schema_sql())
        finally:
            await conn.close()
        return await catalog(migrated), await catalog(stated)


@pytest.fixture(scope="module")
def catalogs(server_dsn: str) -> Iterator[tuple[list[str], list[str]]]:
    """(the migrated database's catalog, schema.sql's), read once for this module."""
    yield asyncio.run(_both(server_dsn))


def test_schema_sql_states_what_the_migrations_make(
    catalogs: tuple[list[str], list[str]],
) -> None:
    migrated, stated = catalogs
    diff = list(
        difflib.unified_diff(
            migrated,
            stated,
            "migrations (empty database, migrated)",
            "server/sql/schema.sql",
            n=2,
            lineterm="",
        )
    )
    if diff:
        pytest.fail(
            "server/sql/schema.sql and the migrations make different schemas; a migration that "
            "changes the schema changes schema.sql too:\n" + "\n".join(diff),
            pytrace=False,
        )


def test_the_comparison_sees_every_kind_of_object(catalogs: tuple[list[str], list[str]]) -> None:
    migrated, _ = catalogs
    text = "\n".join(migrated)
    for seen in (
        "jobs table",
        "job_events partitioned table by RANGE (id)",
        "job_events_overflow table partition of job_events DEFAULT",
        "jobs.3 status: text NOT NULL DEFAULT 'queued'::text",
        "jobs.jobs_status_known: CHECK",
        "jobs_due: CREATE INDEX jobs_due ON public.jobs",
        "job_events_from_1 (of job_events_position): CREATE INDEX * ON",
        "job_events.job_events_side_effects: CREATE TRIGGER",
        "job_public(j jobs) kind=f",
        "job_events_id_seq bigint",
        "== rows",  # none in a new database (0025), but a seeded row would be compared
    ):
        assert seen in text, f"the catalog has no {seen!r}"


def test_no_function_is_a_renamed_copy(catalogs: tuple[list[str], list[str]]) -> None:
    migrated, _ = catalogs
    functions = migrated[migrated.index("== functions") + 1 : migrated.index("== views")]
    names = [line.split("(")[0] for line in functions if re.match(r"\w+\(.*\) kind=", line)]
    assert "job_public" in names
    assert [name for name in names if "_without_" in name] == []
    assert "_without_" not in schema_sql()
