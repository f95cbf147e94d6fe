"""Shorter leases, polls and retries for tests, so that a lost process's work moves within
seconds: the constants of the modules that read them, changed before a server starts.

In a test's own process, `quick(monkeypatch, LEASE_S=2)`; for a server in a subprocess,
`as_env(LEASE_S=2)` among its variables and `python -m tests.timings COMMAND` as its command,
which sets them and then runs `python -m server COMMAND`.
"""

from __future__ import annotations

import json
import os
import sys
from types import ModuleType
from typing import Any

import pytest

from server.access import tenants
from server.delivery import webhooks
from server.queue import lease, listener, maintenance

#: Each timing and the module whose constant it is (read there when a server starts).
MODULES: dict[str, ModuleType] = {
    "LEASE_S": lease,
    "RETRY_BASE_S": lease,
    "RETRY_MAX_S": lease,
    "POLL_INTERVAL_S": listener,
    "RESCUE_INTERVAL_S": maintenance,
    "TIMEOUT_S": webhooks,
    "SCHEDULE_S": webhooks,
    "ROTATION_OVERLAP_S": tenants,
}
VARIABLE = "TIMINGS_FOR_TESTS"


def _checked(values: dict[str, Any]) -> dict[str, Any]:
    unknown = set(values) - set(MODULES)
    if unknown:
        raise KeyError(f"no such timing: {sorted(unknown)}; known: {sorted(MODULES)}")
    return {
        name: tuple(value) if isinstance(value, list) else value for name, value in values.items()
    }


def quick(monkeypatch: pytest.MonkeyPatch, **values: Any) -> None:
    """Set timings in this process until the test ends."""
    for name, value in _checked(values).items():
        monkeypatch.setattr(MODULES[name], name, value)


def as_env(**values: Any) -> dict[str, str]:
    """The variable that gives a `python -m tests.timings` subprocess these timings."""
    return {VARIABLE: json.dumps(_checked(values))}


if __name__ == "__main__":
    for name, value in _checked(json.loads(os.environ.get(VARIABLE, "{}"))).items():
        setattr(MODULES[name], name, value)
    from server.__main__ import main

    raise SystemExit(main(sys.argv[1:]))
