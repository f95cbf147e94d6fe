"""docs/streams.md runs as written, against a live server in dev mode."""

from __future__ import annotations

import os

from tests.conftest import RunningApp
from tests.docexamples import ROOT, check, run


async def test_the_streams_page_runs_as_written(api: RunningApp) -> None:
    env = {"PATH": os.environ["PATH"], "PRESSROOM_URL": api.url("/").rstrip("/")}
    results = await run(ROOT / "docs" / "streams.md", env)
    assert len([step for step, _ in results if step.expected]) == 3
    check(results)
