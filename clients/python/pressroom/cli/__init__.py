"""`pressroom submit | jobs | watch | batch`: the command line of the Python client, against a
running Pressroom (PRESSROOM_URL, PRESSROOM_API_KEY). The server's own `pressroom` command
hands these four to `main` and runs the rest itself."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from pressroom.cli.commands import add_client_parsers, run_client_command


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pressroom", description="Asynchronous PDF service.")
    add_client_parsers(parser.add_subparsers(dest="command", required=True))
    return run_client_command(parser.parse_args(argv))
