"""The client's list of text-valued options is the server's: the client cannot import the
options model, so this test keeps the two the same."""

from __future__ import annotations

from pressroom.cli.commands import TEXT_OPTIONS
from server.options import RenderOptions


def test_the_clients_text_options_are_the_servers() -> None:
    schema = RenderOptions.model_json_schema()["properties"]
    text = {
        name
        for name, shown in schema.items()
        if [branch.get("type") for branch in shown.get("anyOf", [])] == ["string", "null"]
    }
    assert text == TEXT_OPTIONS
