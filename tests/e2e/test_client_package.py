"""The Python client is a distribution of its own (clients/python, `pressroom-client`): pip
installs it into a fresh virtual environment with aiohttp alone, nothing of the server comes
with it, and its `pressroom` command renders a document through a running server."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import RunningApp
from tests.pdfs import FakeRenderer

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 240


async def run(*command: str | Path, cwd: Path, timeout_s: float = 60) -> str:
    """Run away from the checkout (whose folder would put the server on sys.path)."""
    proc = await asyncio.create_subprocess_exec(
        *map(str, command),
        cwd=cwd,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
    assert proc.returncode == 0, out.decode(errors="replace")[-4000:]
    return out.decode()


@pytest.mark.timeout(INSTALL_TIMEOUT_S + 60)
async def test_pip_installs_the_client_alone_and_its_command_renders_a_pdf(
    start_app: Callable[..., Any], tmp_path: Path
) -> None:
    venv = tmp_path / "venv"
    await run(sys.executable, "-m", "venv", venv, cwd=tmp_path)
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    await run(*pip, ROOT / "clients" / "python", cwd=tmp_path, timeout_s=INSTALL_TIMEOUT_S)

    shown = await run(
        venv / "bin" / "python", "-m", "pip", "show", "pressroom-client", cwd=tmp_path
    )
    assert "Requires: aiohttp" in shown
    probe = "import importlib.util as u; print(u.find_spec('server'), u.find_spec('asyncpg'))"
    assert (await run(venv / "bin" / "python", "-c", probe, cwd=tmp_path)).split() == [
        "None",
        "None",
    ]
    assert "{submit,jobs,watch,batch}" in await run(
        venv / "bin" / "pressroom", "--help", cwd=tmp_path
    )

    app: RunningApp = await start_app(renderer=FakeRenderer(), render_slots=1)
    (tmp_path / "hi.html").write_text("<h1>Hi {{ name }}</h1>")
    (tmp_path / "hi.json").write_text('{"name": "Ana"}')
    out = tmp_path / "hi.pdf"
    await run(
        venv / "bin" / "pressroom", "submit", tmp_path / "hi.html", "--data", tmp_path / "hi.json",
        "--out", out, "--url", app.url("").rstrip("/"), cwd=tmp_path,
    )  # fmt: skip
    assert out.read_bytes().startswith(b"%PDF")
