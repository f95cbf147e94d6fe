"""Runs the shell examples of a docs page as a reader would: the page's ```sh blocks in order,
in one bash, against a live server; each `# → …` line under a command is what it must print
(`…` stands for anything, a number for any number, spaces after `:` and `,` are optional)."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARROW = "# → "
MARK = "@@pressroom-doc-example@@"


@dataclasses.dataclass(frozen=True)
class Step:
    commands: str
    expected: str


def steps(page: Path) -> list[Step]:
    """The commands of the page's sh blocks, cut at each expected-output line."""
    found: list[Step] = []
    for block in re.findall(r"```sh\n(.*?)```", page.read_text(), flags=re.S):
        pending: list[str] = []
        for line in block.splitlines():
            if line.startswith(ARROW):
                found.append(Step("\n".join(pending), line[len(ARROW) :]))
                pending = []
            else:
                pending.append(line)
        if any(line.strip() for line in pending):
            found.append(Step("\n".join(pending), ""))
    return found


def pattern(expected: str) -> re.Pattern[str]:
    """The output an expected line stands for."""
    parts = []
    for token in re.split(r"(…|\d+|[:,]\s*)", expected):
        if token == "…":
            parts.append(".*")
        elif token.isdigit():
            parts.append(r"\d+")
        elif token and token[0] in ":,":
            parts.append(re.escape(token[0]) + r"\s*")
        else:
            parts.append(re.escape(token))
    return re.compile("".join(parts), flags=re.S)


async def run(page: Path, env: dict[str, str], timeout_s: float = 60) -> list[tuple[Step, str]]:
    """Each step with what it printed; raises when a command fails."""
    found = steps(page)
    script = "set -euo pipefail\n" + "".join(f"{step.commands}\necho {MARK}\n" for step in found)
    proc = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(timeout_s):
        out, err = await proc.communicate()
    assert proc.returncode == 0, f"{page.name}: exit {proc.returncode}\n{err.decode()}"
    printed = out.decode().split(MARK + "\n")
    return list(zip(found, printed, strict=False))


def check(results: list[tuple[Step, str]]) -> None:
    for step, printed in results:
        if step.expected:
            assert pattern(step.expected).fullmatch(printed.strip()), (
                f"{step.commands!r} printed {printed.strip()!r}, the docs say {step.expected!r}"
            )
