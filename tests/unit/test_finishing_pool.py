"""The finishing pool: work done in a process of its own, a process that runs past its time
limit killed and replaced (the job is retried, as after a render that timed out), and what the
document makes impossible failing the job for good."""

from __future__ import annotations

import pytest

from server import options
from server.errors import PermanentError, TransientError
from server.pdf.finishing import FinishPool, Work
from tests.pdfs import minimal_pdf


async def test_a_process_past_its_time_limit_is_killed_and_replaced() -> None:
    pool = FinishPool(1, max_mb=512)
    work = Work(minimal_pdf(), options.parse({"rotate": {"degrees": 90}}))
    try:
        with pytest.raises(TransientError, match="timed out"):
            await pool.run(work, timeout_s=0.01)
        done = await pool.run(work, timeout_s=60)
        assert done.pdf.startswith(b"%PDF-") and set(done.steps) == {"rotate", "write"}
        assert pool.started == 2  # the first never answered, and is gone
        with pytest.raises(PermanentError, match="cannot be read"):
            await pool.run(Work(b"not a PDF", work.options), timeout_s=60)
        await pool.run(work, timeout_s=60)
        assert pool.started == 2  # a refused document leaves its process in the pool
    finally:
        await pool.close()
