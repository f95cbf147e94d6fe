"""The rules behind the errors that say what to do: the edit a did-you-mean allows, the JSON
nesting bound on both of jsontext's readers, and sizes as the 413s write them."""

from __future__ import annotations

import json

import orjson
import pytest

from server import jsontext
from server.fields import suggestion
from server.problems import human_size, size_text


@pytest.mark.parametrize(
    ("given", "says"),
    [
        ("option", '; did you mean "options"?'),  # a character missing
        ("optionss", '; did you mean "options"?'),  # one too many
        ("optiens", '; did you mean "options"?'),  # one replaced
        ("otpions", '; did you mean "options"?'),  # neighbours swapped
        ("optinos", '; did you mean "options"?'),  # swapped at the end
        ("opts", ""),  # three away
        ("otpinos", ""),  # two swaps
        ("Options", '; did you mean "options"?'),
        ("OPTIONS", ""),
        ("options", ""),  # the name itself is no suggestion (it was refused elsewhere)
        ("dat", '; did you mean "data"?'),
        ("date", '; did you mean "data"?'),
        ("", ""),
    ],
)
def test_a_suggestion_is_a_known_name_one_edit_away(given: str, says: str) -> None:
    assert suggestion(given, ["template", "data", "options", "metadata"]) == says


def test_every_name_one_edit_away_is_suggested_in_field_order() -> None:
    assert suggestion("cat", ["bat", "car", "cat", "bat"]) == '; did you mean "bat" or "car"?'


@pytest.mark.parametrize("kind", ["arrays", "objects"])
@pytest.mark.parametrize("exact", [False, True], ids=["orjson", "json.loads"])
def test_the_nesting_bound_holds_on_both_readers(kind: str, exact: bool) -> None:
    def text(depth: int) -> str:
        inner = '"\\ud800"' if exact else "1"  # orjson refuses a lone surrogate: json.loads
        if kind == "arrays":
            return "[" * depth + inner + "]" * depth
        return '{"a":' * depth + inner + "}" * depth

    for bound in (1, 128, jsontext.ORJSON_MAX_DEPTH):
        assert jsontext.loads(text(bound), max_depth=bound) == json.loads(text(bound))
        with pytest.raises(jsontext.TooDeep, match=f"more than {bound} levels"):
            jsontext.loads(text(bound + 1), max_depth=bound)
    with pytest.raises(jsontext.TooDeep):
        jsontext.loads(text(10_000), max_depth=128)
    # Unbounded (the database's values), orjson's limit only changes the reader.
    deep = text(jsontext.ORJSON_MAX_DEPTH + 1)
    assert jsontext.loads(deep) == json.loads(deep)


def test_orjson_writes_as_deep_as_the_bound_assumes() -> None:
    value: list[object] = []
    for _ in range(jsontext.ORJSON_MAX_DEPTH - 1):
        value = [value]
    assert orjson.dumps(value)
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps([value])


def test_sizes_read_in_bytes_then_in_units() -> None:
    assert size_text(2 * 1024 * 1024) == "2097152 bytes (2 MiB)"
    assert size_text(10 * 1024 * 1024) == "10485760 bytes (10 MiB)"
    assert size_text(1024**3) == "1073741824 bytes (1 GiB)"
    assert size_text(1536) == "1536 bytes (1.5 KiB)"
    assert size_text(900) == "900 bytes"
    assert human_size(8000) == "7.8 KiB"
