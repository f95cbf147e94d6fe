"""The shape of server/: what an import loads, and that no module imports one above it."""

from __future__ import annotations

import ast
import asyncio
import graphlib
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from server import tasks

ROOT = Path(__file__).resolve().parents[2]
HEAVY = {"playwright", "botocore", "aiobotocore", "pypdf", "pypdfium2", "PIL"}


def loaded_by(statement: str) -> set[str]:
    """Top-level packages in sys.modules after `statement` in a fresh interpreter."""
    code = f"{statement}; import sys; print(' '.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return {name.split(".")[0] for name in out.split()}


def test_importing_the_api_loads_neither_the_browser_nor_s3_nor_pdf_libraries() -> None:
    assert loaded_by("import server.api") & HEAVY == set()
    # The same check sees them where they belong.
    assert {"playwright", "pypdf", "pypdfium2"} <= loaded_by("import server.render")
    assert {"botocore", "aiobotocore"} <= loaded_by("import server.s3")


def test_the_app_keys_import_none_of_the_modules_they_name() -> None:
    code = "import server.keys; import sys; print(' '.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split()
    assert sorted(m for m in out if m.startswith("server")) == ["server", "server.keys"]


def runtime_imports(path: Path) -> set[str]:
    """The server modules a file imports when it runs (not those under TYPE_CHECKING)."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for branch in ast.walk(tree)
        if isinstance(branch, ast.If) and "TYPE_CHECKING" in ast.unparse(branch.test)
        for statement in branch.body
        for node in ast.walk(statement)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_server_modules_import_each_other_without_a_cycle() -> None:
    files = {f"server.{p.stem}": p for p in (ROOT / "server").glob("*.py")}
    graph = {
        name: {m for m in runtime_imports(path) if m in files and m != name}
        for name, path in files.items()
    }
    try:
        order = list(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")
    assert order.index("server.keys") < order.index("server.metrics")


async def test_a_failed_periodic_pass_is_logged_and_tried_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls = 0
    third = asyncio.Event()

    async def one_pass() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionRefusedError("database is down")
        if calls == 2:
            raise RuntimeError("a bug in one pass")
        third.set()

    with caplog.at_level(logging.WARNING, logger="server.tasks"):
        async with tasks.periodic("test-pass", 0.01, one_pass) as task:
            await asyncio.wait_for(third.wait(), 10)
    assert task.cancelled(), "the pass runs until its context ends, then is cancelled"
    assert "test-pass failed, trying again: database is down" in caplog.text
    assert "a bug in one pass" in caplog.text
