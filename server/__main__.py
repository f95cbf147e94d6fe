"""`pressroom` and `python -m server`: a client command (the Python client's, pressroom/cli/)
runs without loading the server (its modules import Playwright, asyncpg, aiobotocore); every
other command is the server's."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from pressroom import cli
from pressroom.cli.commands import CLIENT_COMMANDS


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in CLIENT_COMMANDS:
        return cli.main(args)
    from server.cli.admin import main as server_main

    return server_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
