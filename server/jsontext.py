"""JSON in and out, fast: orjson where it reads and writes as the standard library does.

orjson writes compact UTF-8 several times faster than `json.dumps`, which matters on paths
that run per job (asyncpg's json/jsonb parameters, size checks, API responses, event frames).
It refuses integers beyond 64 bits and dictionaries with keys that are not strings; those
values take `json.dumps`, so nothing valid is ever refused.

JSON in (`loads`: request bodies, and asyncpg's json/jsonb decoder for job data, options and
event payloads): orjson too, except where it would read something otherwise than `json.loads`.
It reads an integer beyond 64 bits as a float, and submitted data must come back as sent, so
text with a run of 19 digits or more goes to `json.loads`; and it refuses what `json.loads`
accepts (a lone surrogate escape, a number too large for a float), which then goes there too.
"""

from __future__ import annotations

import json
import re
from typing import Any

import orjson

# Every integer orjson can misread has at least 19 digits (2**63 has 19); a run of 19 digits
# anywhere (in a string, a fraction) only costs the slower, always exact reader.
_LONG_DIGITS = re.compile(r"\d{19}")


def dumps_bytes(value: Any) -> bytes:
    """Compact JSON as UTF-8. A float that is not finite becomes null, as in JSON it must."""
    try:
        return orjson.dumps(value)
    except TypeError:  # orjson.JSONEncodeError: big integers, non-string keys
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def dumps(value: Any) -> str:
    """The same as text."""
    return dumps_bytes(value).decode()


def size(value: Any) -> int:
    """Bytes of `value` as compact UTF-8 JSON: what a size limit on JSON counts."""
    return len(dumps_bytes(value))


def loads(text: str, **hooks: Any) -> Any:
    """JSON text → Python values, exactly as `json.loads(text, **hooks)` reads them, faster.

    The hooks (parse_float, parse_constant) may only refuse what orjson refuses as well (a
    non-finite number, NaN): on the fast path they are not called."""
    if _LONG_DIGITS.search(text) is None:
        try:
            return orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
    return json.loads(text, **hooks)
