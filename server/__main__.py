"""`pressroom` and `python -m server`: a client command runs without loading the server (its
modules import Playwright, asyncpg, aiobotocore); every other command is the server's."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from server.cli.commands import CLIENT_COMMANDS, add_client_parsers, run_client_command


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in CLIENT_COMMANDS:
        parser = argparse.ArgumentParser(prog="pressroom", description="Asynchronous PDF service.")
        add_client_parsers(parser.add_subparsers(dest="command", required=True))
        return run_client_command(parser.parse_args(args))
    from server.cli.admin import main as server_main

    return server_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
