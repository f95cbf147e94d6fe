"""Jinja2 templates for jobs: compiled once into the sandbox (server/render/sandbox.py) and
kept, checked for syntax, and rendered under a budget (server/render/limits.py), on the event
loop when a render is quick, otherwise in a worker thread.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError

from server.errors import PermanentError
from server.render import sandbox
from server.render.limits import MAX_OUTPUT_CHARS, Budget, LimitExceeded, NotQuick, spending
from server.render.sandbox import compile_template

DEFAULT_TIMEOUT_S = 10.0
# Jinja's own words for an attribute or item that is not there: "'dict object' has no attribute
# 'nmae'", "list object has no element 5".
_NO_MEMBER = re.compile(r"'?(?P<owner>.+?)'? has no (?P<what>attribute|element) (?P<name>.+)")

T = TypeVar("T")


class _Recent(Generic[T]):
    """Values by template source, the oldest dropped past `size`. Unlike functools.lru_cache,
    it answers whether a source is known (render_async and warm() ask), and it keeps no error:
    a source whose `make` raised is tried again."""

    def __init__(self, make: Callable[[str], T], size: int = 64) -> None:
        self._make = make
        self._size = size
        self._values: dict[str, T] = {}
        self._lock = threading.Lock()

    def __contains__(self, source: str) -> bool:
        return source in self._values

    def __call__(self, source: str) -> T:
        try:
            return self._values[source]
        except KeyError:
            pass
        value = self._make(source)
        with self._lock:
            self._values[source] = value
            while len(self._values) > self._size:
                del self._values[next(iter(self._values))]
        return value


# Compiled templates are large; most clients send the same few templates again and again.
_compile: _Recent[jinja2.Template] = _Recent(compile_template)


def _check_compiles(source: str) -> str | None:
    try:
        _compile(source)
    except jinja2.TemplateSyntaxError as exc:
        return f"template syntax error on line {exc.lineno}: {exc.message}"
    except RecursionError:
        return "template is nested too deeply"
    except (ValueError, OverflowError, MemoryError) as exc:
        return f"template cannot be compiled: {exc}"
    return None


#: A syntax error message for the template, or None when it compiles (answers are cached:
#: compiling a large template takes seconds).
check: _Recent[str | None] = _Recent(_check_compiles)


def _render_in(budget: Budget, source: str, data: dict[str, Any]) -> str:
    """Render in the calling thread under `budget`; template failures become PermanentError."""
    try:
        with spending(budget):
            parts: list[str] = []
            total = 0
            for chunk in _compile(source).generate(data):
                total += len(chunk)
                if total > MAX_OUTPUT_CHARS:
                    raise LimitExceeded(f"template output exceeds {MAX_OUTPUT_CHARS} characters")
                budget.tick()
                parts.append(chunk)
            return "".join(parts)
    except LimitExceeded as exc:
        raise PermanentError(f"template limit: {exc}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise PermanentError(f"template syntax error on line {exc.lineno}: {exc.message}") from None
    except jinja2.UndefinedError as exc:
        raise PermanentError(_undefined(source, exc)) from None
    except SecurityError as exc:
        raise PermanentError(f"template refused by the sandbox: {exc}") from None
    except RecursionError:
        raise PermanentError("template error: recursion is too deep") from None
    except MemoryError:
        raise PermanentError("template error: it needs too much memory") from None
    except jinja2.TemplateError as exc:
        raise PermanentError(f"template error: {exc}") from None
    except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as exc:
        raise PermanentError(f"template error: {type(exc).__name__}: {exc}") from None


def _undefined(source: str, exc: jinja2.UndefinedError) -> str:
    """What was undefined, and on which line of the template: "'customer' has no attribute
    'nmae'" where Jinja says "'dict object' has no attribute 'nmae'"."""
    message = exc.message or "a value is undefined"
    line = _template_line(exc)
    if line is None:
        return f"template error: {message}"
    missing = _NO_MEMBER.fullmatch(message)
    if missing is not None:
        owner = _owner(source, line, missing["name"])
        if owner is not None:
            message = f"{owner!r} has no {missing['what']} {missing['name']}"
    return f"template error on line {line}: {message}"


def _template_line(exc: BaseException) -> int | None:
    """The template line the error was raised on: Jinja rewrites the traceback so that the
    template's frames carry its own line numbers."""
    line, tb = None, exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno  # the innermost: a macro's line, not its caller's
        tb = tb.tb_next
    return line


def _owner(source: str, line: int, name: str) -> str | None:
    """The expression on `line` whose attribute or item `name` (a repr) was looked up, as
    written (`customer`, `order.lines[0]`), if there is one."""
    for node in sandbox.parse(source).find_all((nodes.Getattr, nodes.Getitem)):
        if node.lineno != line:
            continue
        if isinstance(node, nodes.Getattr):
            key: Any = node.attr
        elif isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
            key = node.arg.value
        else:
            continue
        if repr(key) == name and (owner := _written(node.node)) is not None:
            return owner
    return None


def _written(node: nodes.Node) -> str | None:
    """A variable and its attributes and constant items as the template writes them."""
    if isinstance(node, nodes.Name):
        return node.name
    if isinstance(node, nodes.Getattr):
        owner = _written(node.node)
        return None if owner is None else f"{owner}.{node.attr}"
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Const):
        owner = _written(node.node)
        return None if owner is None else f"{owner}[{node.arg.value!r}]"
    return None


def render(
    source: str,
    data: dict[str, Any],
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    budget: Budget | None = None,
) -> str:
    """Template + data → HTML in this thread. Every template failure is permanent. A `budget`
    given is spent instead of a new one of `timeout_s`: the parts of one Word template share
    one (server/render/docx.py), which its caller can stop (budget.cancelled)."""
    return _render_in(budget or Budget(timeout_s), source, data)


async def check_async(source: str) -> str | None:
    """`check` in a worker thread, so a large template does not stall the event loop."""
    return await asyncio.to_thread(check, source)


async def warm(sources: Iterable[Any], *, max_bytes: int) -> None:
    """Compile submitted templates off the event loop, so the `check` that validation then
    runs on the loop is answered from the cache. Anything not a string within the size limit
    is left to validation to refuse."""
    for source in {s for s in sources if isinstance(s, str) and len(s) <= max_bytes}:
        if source not in check:  # a known template needs no trip to a thread
            await check_async(source)


# A small template already compiled, on small data, is rendered on the event loop when it
# finishes within ON_LOOP_S: most documents take well under a millisecond, and a trip to a
# thread costs about as much again in CPU and in latency. Small data keeps every single step
# short (a step is where the deadline is checked); anything longer starts again in a thread
# with the full budget (rendering has no side effects, so starting again is safe). Compiling
# is never done on the loop: a template's first render goes to a thread.
ON_LOOP_S = 0.002
ON_LOOP_MAX_SOURCE = 8 * 1024
ON_LOOP_MAX_ITEMS = 2_000
ON_LOOP_MAX_TEXT = 64 * 1024


def _small(source: str, data: Any) -> bool:
    """Whether the template and its data are small enough to try on the event loop; the walk
    stops as soon as the data is found too large, so it costs little either way."""
    if len(source) > ON_LOOP_MAX_SOURCE:
        return False
    pending, items, text = [data], 0, 0
    while pending:
        value = pending.pop()
        items += 1
        if items > ON_LOOP_MAX_ITEMS:
            return False
        if isinstance(value, str):
            text += len(value)
            if text > ON_LOOP_MAX_TEXT:
                return False
        elif isinstance(value, dict):
            pending.extend(value.keys())
            pending.extend(value.values())
        elif isinstance(value, list):
            pending.extend(value)
    return True


async def render_async(
    source: str, data: dict[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> str:
    """Template + data → HTML: on the event loop when it is quick (see ON_LOOP_S), otherwise
    in a worker thread, so the event loop keeps serving."""
    if timeout_s > ON_LOOP_S and source in _compile and _small(source, data):
        try:
            return _render_in(Budget(ON_LOOP_S, on_loop=True), source, data)
        except NotQuick:
            pass
    budget = Budget(timeout_s)
    try:
        return await asyncio.to_thread(_render_in, budget, source, data)
    finally:
        # A cancelled job stops its thread at the template's next step.
        budget.cancelled = True
