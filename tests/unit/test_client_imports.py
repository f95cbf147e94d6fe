"""The Python client and the `pressroom` client commands load none of the server's weight."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What a client must not pay for: the browser, the database driver, S3, templates, Socket.IO.
HEAVY = ("playwright", "asyncpg", "aiobotocore", "botocore", "jinja2", "socketio", "engineio")


def loaded(code: str, tmp_path: Path) -> tuple[set[str], subprocess.CompletedProcess[str]]:
    """Run `code` in a fresh interpreter; the top-level packages it had imported at exit."""
    modules = tmp_path / "modules.json"
    dump = f"open({str(modules)!r}, 'w').write(json.dumps(list(sys.modules)))"
    probe = f"import atexit, json, sys\natexit.register(lambda: {dump})\n{code}"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    return {name.split(".")[0] for name in json.loads(modules.read_text())}, done


def test_importing_the_client_as_the_readme_shows_is_light(tmp_path: Path) -> None:
    modules, done = loaded("from pressroom import AsyncClient, Client, PressroomError\n", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "aiohttp" in modules  # the probe sees what the client does load
    assert sorted(modules & set(HEAVY)) == []


def test_a_client_command_is_light(tmp_path: Path) -> None:
    with socket.socket() as sock:  # a port where nothing listens: the command fails at once
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    modules, done = loaded(
        "import runpy\n"
        f"sys.argv = ['pressroom', 'jobs', '--url', 'http://127.0.0.1:{port}']\n"
        "runpy.run_module('server', run_name='__main__')\n",
        tmp_path,
    )
    assert done.returncode == 2 and "pressroom:" in done.stderr, done.stderr
    assert sorted(modules & set(HEAVY)) == []


def test_a_server_command_still_loads_the_server(tmp_path: Path) -> None:
    modules, done = loaded(
        "import runpy\nsys.argv = ['pressroom', 'keys', '--help']\n"
        "runpy.run_module('server', run_name='__main__')\n",
        tmp_path,
    )
    assert done.returncode == 0 and "create" in done.stdout, done.stderr
    assert {"asyncpg", "server"} <= modules
    # but not the app: keys, tenants and migrate need the database, not the browser or S3.
    assert sorted(modules & {"playwright", "aiobotocore", "botocore", "pikepdf", "pyhanko"}) == []
