"""A submission for tests that write jobs through server.queue.jobs directly (no HTTP)."""

from __future__ import annotations

from typing import Any

from server.queue.jobs import NewJob


def new_job(**fields: Any) -> NewJob:
    """A job of the default tenant with a one-line template; `fields` override any value."""
    values: dict[str, Any] = {
        "tenant": "default",
        "template": "<p>x</p>",
        "data": {},
        "options": {},
        "metadata": {},
        "max_attempts": 3,
    }
    values.update(fields)
    return NewJob(**values)
