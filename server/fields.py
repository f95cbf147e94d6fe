"""pydantic's validation errors as the API reports them: (field, message), with fields written
the way a client names them (`items[3].options.scale`), and an unknown field one edit away from
a known one told which (`did you mean "options"?`). Imports nothing of the server, so the
option model and the client CLI can use it without loading the web app."""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

Loc = tuple[int | str, ...]


def field_errors(
    exc: ValidationError, prefix: Loc = (), *, model: type[BaseModel] | None = None
) -> list[tuple[str, str]]:
    """pydantic's errors as (field, message): fields written `items[3].options.scale` (the
    body itself is ""), unknown fields first at each level, then the rest in field order. With
    the `model` that refused the input, an unknown field's message names the known field it is
    one edit away from, if any."""
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
        (_path(loc), _message(error, loc, model, len(prefix)))
        for _, (loc, error) in sorted(enumerate(listed), key=order)
    ]


def suggestion(given: str, known: Sequence[str]) -> str:
    """What an unknown name's message ends with: `; did you mean "options"?` when names in
    `known` are one edit away (a character inserted, deleted or replaced, or two neighbours
    swapped), else nothing."""
    near = [name for name in dict.fromkeys(known) if _one_edit(given, name)]
    if not near:
        return ""
    return "; did you mean " + " or ".join(f'"{name}"' for name in near) + "?"


def _one_edit(given: str, name: str) -> bool:
    if given == name or abs(len(given) - len(name)) > 1:
        return False
    start = 0
    while start < min(len(given), len(name)) and given[start] == name[start]:
        start += 1
    a, b = given[start:], name[start:]
    if len(a) == len(b):  # one substitution, or two neighbours swapped
        return a[1:] == b[1:] or (len(a) >= 2 and a[0] == b[1] and a[1] == b[0] and a[2:] == b[2:])
    return a[1:] == b if len(a) > len(b) else a == b[1:]


def _known_names(model: type[BaseModel], loc: Loc) -> list[str]:
    """The names a body may give at the place of the last part of `loc`, in field order: the
    fields of the models found there by following `loc` from `model` (by alias, where a field
    has one)."""
    places: list[Any] = [model]
    for part in loc[:-1]:
        places = [inner for place in places for inner in _step(place, part)]
    names: list[str] = []
    for place in places:
        for found in _models(place):
            by_name = bool(found.model_config.get("validate_by_name")) or bool(
                found.model_config.get("populate_by_name")
            )
            for name, field in found.model_fields.items():
                alias = field.validation_alias if isinstance(field.validation_alias, str) else None
                alias = alias or field.alias
                names.extend([alias, name] if alias and by_name else [alias or name])
    return names


def _step(place: Any, part: int | str) -> Iterator[Any]:
    """The types inside `place` that the loc part `part` leads to."""
    for kind in _alternatives(place):
        origin = typing.get_origin(kind)
        args = typing.get_args(kind)
        if isinstance(kind, type) and issubclass(kind, BaseModel) and isinstance(part, str):
            for name, field in kind.model_fields.items():
                if part in (name, field.alias, field.validation_alias):
                    yield field.annotation
        elif part == "[key]":
            continue
        elif isinstance(origin, type) and issubclass(origin, Mapping) and len(args) == 2:
            yield args[1]
        elif isinstance(origin, type) and issubclass(origin, Sequence) and isinstance(part, int):
            yield args[-1] if origin is not tuple else args[min(part, len(args) - 1)]


def _alternatives(place: Any) -> Iterator[Any]:
    """`place` with Annotated, Optional and unions taken apart."""
    origin = typing.get_origin(place)
    if origin is typing.Annotated:
        yield from _alternatives(typing.get_args(place)[0])
    elif origin is typing.Union or origin is types.UnionType:
        for arg in typing.get_args(place):
            yield from _alternatives(arg)
    else:
        yield place


def _models(place: Any) -> Iterator[type[BaseModel]]:
    for kind in _alternatives(place):
        if isinstance(kind, type) and issubclass(kind, BaseModel):
            yield kind


def _path(loc: Loc) -> str:
    path = ""
    for part in loc:
        if part == "[key]":
            continue  # pydantic's mark of an object's key (not its value): the key names it
        path += f"[{part}]" if isinstance(part, int) else f".{part}" if path else str(part)
    return path


def _message(error: Any, loc: Loc, model: type[BaseModel] | None, prefixed: int) -> str:
    kind = error["type"]
    if kind == "value_error":
        return str(error["ctx"]["error"])
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        own = loc[prefixed:]
        unknown = own[-1] if own else None
        if model is None or not isinstance(unknown, str):
            return "is not a known field"
        return "is not a known field" + suggestion(unknown, _known_names(model, own))
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return "the body must be a JSON object" if not loc else "must be an object"
    message: str = error["msg"]  # "Input should be a valid integer": the field is the input
    return message.removeprefix("Input ") if message.startswith("Input ") else message
