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
HEAVY = {"playwright", "botocore", "aiobotocore", "pikepdf", "pypdf", "pypdfium2", "PIL"}


def loaded_by(statement: str) -> set[str]:
    """Top-level packages in sys.modules after `statement` in a fresh interpreter."""
    code = f"{statement}; import sys; print(' '.join(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout
    return {name.split(".")[0] for name in out.split()}


def test_importing_the_api_loads_neither_the_browser_nor_s3_nor_pdf_libraries() -> None:
    assert loaded_by("import server.web.jobs_api") & HEAVY == set()
    # The same check sees them where they belong.
    assert {"playwright", "pikepdf", "pypdfium2"} <= loaded_by("import server.pipeline.worker")
    assert {"botocore", "aiobotocore"} <= loaded_by("import server.files.s3")


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


#: server/'s packages from the bottom up: a module imports only modules of its own package or of
#: one listed before it. The top-level modules (errors, settings, problems…) are the ground floor.
LAYERS = (
    "server",
    "server.options",
    "server.access",
    "server.files",
    "server.queue",
    "server.events",
    "server.pdf",
    "server.render",
    "server.delivery",
    "server.schemas",
    "server.pipeline",
    "server.web",
    "server.cli",
)
#: Handlers: what they share lives below them (server.web.common, server.pipeline), never in
#: another handler. app.py is the one module that names them all.
HANDLERS = {
    f"server.web.{name}"
    for name in ("jobs_api", "assets_api", "templates_api", "batches_api", "sse", "sockets")
}


def server_modules() -> dict[str, Path]:
    found = {}
    for path in (ROOT / "server").rglob("*.py"):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def layer_of(module: str) -> int:
    package = module if module in PACKAGES else module.rpartition(".")[0]
    return LAYERS.index(package) if package in LAYERS else 0


PACKAGES = set(LAYERS)


def import_graph() -> dict[str, set[str]]:
    files = server_modules()
    return {
        name: {m for m in runtime_imports(path) if m in files and m != name}
        for name, path in files.items()
    }


def test_server_modules_import_each_other_without_a_cycle() -> None:
    try:
        order = list(graphlib.TopologicalSorter(import_graph()).static_order())
    except graphlib.CycleError as exc:
        pytest.fail(f"import cycle: {' -> '.join(exc.args[1])}")
    assert order.index("server.keys") < order.index("server.queue.metrics")


def test_every_package_is_declared_in_the_layers() -> None:
    packages = {name for name, path in server_modules().items() if path.name == "__init__.py"}
    assert packages - {"server.sql", "server.sql.migrations"} == PACKAGES


def test_no_module_imports_a_package_above_its_own() -> None:
    upward = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        if not name.startswith("server.__main__")
        for target in targets
        if layer_of(target) > layer_of(name)
    )
    assert upward == []


def test_handlers_never_import_handlers() -> None:
    borrowed = sorted(
        f"{name} -> {target}"
        for name, targets in import_graph().items()
        if name in HANDLERS
        for target in targets
        if target in HANDLERS
    )
    assert borrowed == []


def test_the_client_package_imports_nothing_of_the_server() -> None:
    for path in (ROOT / "clients" / "python" / "pressroom").rglob("*.py"):
        assert not {m for m in runtime_imports(path) if m.split(".")[0] == "server"}, path


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
