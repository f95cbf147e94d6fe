"""What the client commands share at the terminal: exit codes, usage errors, input files, and
the progress display.

Progress is drawn as a bar and a state line on a terminal, and written as plain lines
otherwise (logs, pipes, CI). Exit codes: 0 done, 1 a job or item failed, 2 a usage or server
error, 130 interrupted.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import TextIO

from pressroom.client import Json

EXIT_OK, EXIT_FAILED, EXIT_ERROR, EXIT_INTERRUPTED = 0, 1, 2, 130
BAR_WIDTH = 24


class UsageError(Exception):
    """A bad argument or input file; the message says which."""


def read_text(name: str) -> str:
    if name == "-":
        return sys.stdin.read()
    try:
        return Path(name).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {name}: {exc}") from None


def read_json_object(name: str) -> Json:
    try:
        value = json.loads(read_text(name))
    except ValueError as exc:
        raise UsageError(f"{name} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"{name} must hold a JSON object")
    return value


def bar(percent: int) -> str:
    filled = BAR_WIDTH * max(0, min(percent, 100)) // 100
    return "[" + "#" * filled + "-" * (BAR_WIDTH - filled) + "]"


class Display:
    """One redrawn status line on a terminal; plain lines (each state once) elsewhere."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self._status = ""
        self._last_plain = ""

    def status(self, line: str) -> None:
        """The live state: redrawn in place on a terminal, printed when it changes otherwise."""
        if self.tty:
            self._status = line
            width = shutil.get_terminal_size().columns - 1
            self.stream.write("\r\x1b[2K" + line[:width])
            self.stream.flush()
        elif line != self._last_plain:
            self._last_plain = line
            print(line, file=self.stream, flush=True)

    def say(self, line: str) -> None:
        """A line that stays (an item saved or failed), printed above the live state."""
        if self.tty:
            self.stream.write("\r\x1b[2K" + line + "\n")
            self.status(self._status)
        else:
            print(line, file=self.stream, flush=True)

    def done(self) -> None:
        if self.tty and self._status:
            self.stream.write("\n")
            self.stream.flush()
            self._status = ""
