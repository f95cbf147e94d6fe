"""What a channel may be called: one end user's documents, say (`user-42`,
`org:7/user@example.com`). Jobs, batches, streams and tokens name channels; the
`channel_valid` CHECK of migration 0014 says the same in SQL."""

from __future__ import annotations

import re
from typing import Any

MAX_CHANNEL_CHARS = 200
CHANNEL_PATTERN = rf"[A-Za-z0-9_.:@/-]{{1,{MAX_CHANNEL_CHARS}}}"
CHANNEL_RULE = f"1 to {MAX_CHANNEL_CHARS} letters, digits or the characters - _ . : @ /"
_CHANNEL = re.compile(CHANNEL_PATTERN)


def is_channel(value: Any) -> bool:
    return isinstance(value, str) and _CHANNEL.fullmatch(value) is not None


def check_channel(value: Any) -> str | None:
    """Why `value` cannot be a channel, or None when it can."""
    return None if is_channel(value) else f"must be a channel: {CHANNEL_RULE}"
