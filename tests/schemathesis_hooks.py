"""Schemathesis hooks for tests/integration/test_openapi.py (loaded via SCHEMATHESIS_HOOKS)."""

from __future__ import annotations

from typing import Any

import schemathesis

MAX_TEST_WAIT_S = 1.0


@schemathesis.hook
def before_call(ctx: Any, case: Any, **kwargs: Any) -> None:
    """A long-poll may rightly hold a request for a minute; keep the fuzz run short."""
    query = case.query or {}
    try:
        too_long = float(query.get("wait")) > MAX_TEST_WAIT_S
    except (TypeError, ValueError):
        too_long = False
    if too_long:
        query["wait"] = str(MAX_TEST_WAIT_S)
