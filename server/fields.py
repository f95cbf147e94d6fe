"""pydantic's validation errors as the API reports them: (field, message), with fields written
the way a client names them (`items[3].options.scale`). Imports nothing of the server, so the
option model and the client CLI can use it without loading the web app."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

Loc = tuple[int | str, ...]


def field_errors(exc: ValidationError, prefix: Loc = ()) -> list[tuple[str, str]]:
    """pydantic's errors as (field, message): fields written `items[3].options.scale` (the
    body itself is ""), unknown fields first at each level, then the rest in field order."""
    listed = [((*prefix, *error["loc"]), error) for error in exc.errors(include_url=False)]
    first: dict[Loc, int] = {}
    for index, (loc, _) in enumerate(listed):
        for depth in range(len(loc) + 1):
            first.setdefault(loc[:depth], index)

    def order(item: tuple[int, tuple[Loc, Any]]) -> list[tuple[int, int]]:
        index, (loc, error) = item
        extra = error["type"] == "extra_forbidden"
        steps = [(1, first[loc[: depth + 1]]) for depth in range(len(loc))]
        if extra and steps:
            steps[-1] = (0, index)
        return steps

    return [
        (_path(loc), _message(error, loc))
        for _, (loc, error) in sorted(enumerate(listed), key=order)
    ]


def _path(loc: Loc) -> str:
    path = ""
    for part in loc:
        if part == "[key]":
            continue  # pydantic's mark of an object's key (not its value): the key names it
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _message(error: Any, loc: Loc) -> str:
    kind = error["type"]
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        return "is not a known field"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "the body must be a JSON object" if not loc else "must be an object"
    message: str = error["msg"]  # "Input should be a valid integer": the field is the input
    return message.removeprefix("Input ") if message.startswith("Input ") else message
