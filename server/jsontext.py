"""JSON in and out, fast: orjson where it reads and writes as the standard library does.

orjson writes compact UTF-8 several times faster than `json.dumps`, which matters on paths
that run per job (asyncpg's json/jsonb parameters, size checks, API responses, event frames).
It refuses integers beyond 64 bits and dictionaries with keys that are not strings; those
values take `json.dumps`, so nothing valid is ever refused.

JSON in (`loads`: request bodies, and asyncpg's json/jsonb decoder for job data, options and
event payloads): orjson too, except where it would read something otherwise than `json.loads`.
It reads an integer beyond 64 bits as a float, and submitted data must come back as sent, so
a result holding a float of 1e16 or more (either sign) is read again by `json.loads`; and it
refuses what `json.loads` accepts (a lone surrogate escape, a number too large for a float),
which then goes there too. (A regular expression looking for long runs of digits in the text
cost more than `json.loads` itself, and a walk over the parsed values half as much.)

A reader may bound how deeply arrays and objects nest (`max_depth`: request bodies). orjson
writes at most `ORJSON_MAX_DEPTH` levels and the fast path writes the value once anyway, so
writing it wrapped in `ORJSON_MAX_DEPTH - max_depth` one-element lists checks the bound at no
extra cost. Values deeper than orjson writes (from the database) take `json.loads`.
"""

from __future__ import annotations

import json
from typing import Any

import orjson


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


#: The most arrays and objects within each other orjson writes (it refuses one level more).
ORJSON_MAX_DEPTH = 254


class TooDeep(ValueError):
    """The JSON nests arrays and objects more than `max_depth` levels deep."""

    def __init__(self, max_depth: int) -> None:
        super().__init__(f"arrays and objects are nested more than {max_depth} levels deep")
        self.max_depth = max_depth


def loads(text: str, *, max_depth: int | None = None, **hooks: Any) -> Any:
    """JSON text → Python values, exactly as `json.loads(text, **hooks)` reads them, faster;
    TooDeep when they nest more than `max_depth` (at most ORJSON_MAX_DEPTH) levels deep.

    The hooks (parse_float, parse_constant) may only refuse what orjson refuses as well (a
    non-finite number, NaN): on the fast path they are not called."""
    if max_depth is not None and not 0 < max_depth <= ORJSON_MAX_DEPTH:
        raise ValueError(f"max_depth must be from 1 to {ORJSON_MAX_DEPTH}")
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:  # past 1024 levels too: json.loads decides
        return _exact(text, max_depth, hooks)
    padded = value
    for _ in range(ORJSON_MAX_DEPTH - (max_depth or ORJSON_MAX_DEPTH)):
        padded = [padded]
    try:
        written = orjson.dumps(padded)
    except orjson.JSONEncodeError:  # deeper than orjson writes (a value it read has no other)
        if max_depth is not None:
            raise TooDeep(max_depth) from None
        return json.loads(text, **hooks)
    return value if _no_big_float(written) else json.loads(text, **hooks)


def _exact(text: str, max_depth: int | None, hooks: dict[str, Any]) -> Any:
    try:
        value = json.loads(text, **hooks)
    except RecursionError:
        if max_depth is None:
            raise
        raise TooDeep(max_depth) from None
    if max_depth is not None and _deeper(value, max_depth):
        raise TooDeep(max_depth)
    return value


def _deeper(value: Any, max_depth: int) -> bool:
    """Whether `value` nests arrays and objects more than `max_depth` levels deep."""
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, (dict, list)):
            if depth > max_depth:
                return True
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)
    return False


def _no_big_float(written: bytes) -> bool:
    """No float in the value orjson wrote as `written` is as large as one orjson makes of an
    integer beyond 64 bits.

    orjson writes every float from 1e16 up with an exponent (`9.2e+18`), so such a float shows
    as `e+1`, `e+2` or `e+3` in its output, which three substring searches find faster than a
    walk over the values. A string holding one of those, or a large float written as such,
    only sends the text to the exact reader, which reads it the same."""
    return b"e+1" not in written and b"e+2" not in written and b"e+3" not in written
