"""JSON in and out, fast: orjson where it reads and writes as the standard library does.

orjson writes compact UTF-8 several times faster than `json.dumps`, which matters on paths
that run per job (asyncpg's json/jsonb parameters, size checks, API responses, event frames).
It refuses integers beyond 64 bits and dictionaries with keys that are not strings; those
values take `json.dumps`, so nothing valid is ever refused.

JSON in (`loads`: request bodies, and asyncpg's json/jsonb decoder for job data, options and
event payloads): orjson too, except where it would read something otherwise than `json.loads`.
It reads an integer beyond 64 bits as a float, and submitted data must come back as sent, so
a result holding a float of 2**63 or more (either sign) is read again by `json.loads`; and it
refuses what `json.loads` accepts (a lone surrogate escape, a number too large for a float),
which then goes there too. (A regular expression looking for long runs of digits in the text
first cost more than `json.loads` itself; the walk over the parsed values costs a fraction.)
"""

from __future__ import annotations

import json
from typing import Any

import orjson

# orjson reads an integer outside [-2**63, 2**64) as a float, which is then at least this large.
_FLOAT_FROM_BIG_INT = 2.0**63


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
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text, **hooks)
    return value if _no_big_float(value) else json.loads(text, **hooks)


def _no_big_float(value: Any) -> bool:
    """No float in `value` is as large as one orjson makes of an integer beyond 64 bits (a
    float that large in the text itself is also read again, which changes nothing)."""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is dict:
            pending.extend(item.values())
        elif kind is list:
            pending.extend(item)
        elif kind is float and not -_FLOAT_FROM_BIG_INT < item < _FLOAT_FROM_BIG_INT:
            return False
    return True
