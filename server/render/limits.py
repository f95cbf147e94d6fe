"""What one template render may spend, and the checks that hold it to that.

Every step a template takes is counted against a deadline (loop iterations, calls, attribute
reads, operators, filters), and every value it builds is weighed as the text it would print:
before it is built where the size can be known in advance (`'x' * n`, `**`, padding widths,
`replace`, joins) and right after otherwise, so no single step allocates much more than the
value limit. Rendering runs in a worker thread; a thread cannot be killed, so these checks are
what stop it. The sandbox (server/render/sandbox.py) calls them at every step.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import string
import threading
import time
from collections.abc import Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any

from jinja2.utils import Namespace

MAX_OUTPUT_CHARS = 20 * 1024 * 1024
MAX_VALUE_CHARS = 10 * 1024 * 1024
# Everything printed with {{ }}, also into macros and {% set %} blocks that are never output:
# escaping copies each value, so a block printing one big string in a loop would fill memory.
MAX_PRINTED_CHARS = 2 * MAX_OUTPUT_CHARS
MAX_RANGE = 100_000
MAX_INT_BITS = 8192
MAX_FORMAT_WIDTH = 10_000
MAX_LIPSUM_PARAGRAPHS = 100
# Sums of lists copy the running total at every step: cost is items x size.
MAX_SEQUENCE_SUM_COST = 50_000_000
# Weights of big containers are remembered for the render (they cannot change: the sandbox is
# immutable); small ones are cheap to weigh again, and remembering them all would keep every
# temporary list of a long loop alive.
_MEMO_MIN_ITEMS = 32
_MEMO_MAX_ENTRIES = 10_000
_PERCENT_SPEC = re.compile(r"%(\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
_DIGITS = re.compile(r"\d+")


class LimitExceeded(Exception):
    """A template went past one of the limits above; the message says which."""


class NotQuick(BaseException):
    """A render tried on the event loop took longer than templates.ON_LOOP_S: it starts again
    in a thread. A BaseException, so that no handler on the way mistakes it for a template error."""


class Budget:
    """What one render may still spend: the deadline, and the weights already measured."""

    __slots__ = ("_memo", "cancelled", "deadline", "on_loop", "printed", "timeout_s")

    def __init__(self, timeout_s: float | None, *, on_loop: bool = False) -> None:
        self.timeout_s = timeout_s
        self.deadline = math.inf if timeout_s is None else time.monotonic() + timeout_s
        self.on_loop = on_loop
        self.cancelled = False
        self.printed = 0
        self._memo: dict[int, tuple[object, int]] = {}

    def tick(self) -> None:
        """Called at every step the template takes; a monotonic clock read costs ~50 ns."""
        if self.cancelled:
            raise LimitExceeded("template rendering was stopped (the job ended)")
        if time.monotonic() > self.deadline:
            if self.on_loop:
                raise NotQuick
            raise LimitExceeded(
                f"template rendering took longer than {self.timeout_s:g} s"
                " (an endless or very long loop?)"
            )

    def weigh(self, value: Any) -> int:
        """The length of `value` as text, or LimitExceeded when above MAX_VALUE_CHARS."""
        # Most values a template prints are plain strings: weighed without the walk.
        kind = type(value)
        if kind is str:
            weight = len(value)
        elif kind is float or kind is bool or value is None:
            return 8
        else:
            weight = self._weight(value, {})
        if weight > MAX_VALUE_CHARS:
            raise _too_big()
        return weight

    def checked(self, value: Any) -> Any:
        self.weigh(value)
        return value

    def _weight(self, value: Any, seen: dict[int, int]) -> int:
        # JSON's own types first, by exact type (isinstance against an ABC is slow); their
        # subclasses (Markup, say) take the general checks below.
        kind = type(value)
        children: Iterable[Any]
        if kind is str:
            return len(value)
        if kind is float or kind is bool or value is None:
            return 8
        if kind is int:
            return int(value.bit_length()) // 3 + 1
        if kind is list or kind is tuple:
            children = value
        elif kind is dict:
            children = (part for pair in value.items() for part in pair)
        elif isinstance(value, (str, bytes)):
            return len(value)
        elif isinstance(value, (bool, float)):
            return 8
        elif isinstance(value, int):
            return value.bit_length() // 3 + 1
        elif isinstance(value, Namespace):
            # Mutable through {% set ns.x = ... %}: weighed afresh every time. No public API
            # lists a namespace's attributes (its repr builds the very text being limited).
            attrs = object.__getattribute__(value, "_Namespace__attrs")
            return 16 + self._weight(attrs, {})
        elif isinstance(value, Mapping):
            children = (part for pair in value.items() for part in pair)
        elif isinstance(value, (list, tuple, set, frozenset, KeysView, ValuesView)):
            children = value
        else:
            return 16  # macros, cyclers, loop state, ranges: short reprs
        key = id(value)
        if key in self._memo:
            return self._memo[key][1]
        if key in seen:
            return seen[key]
        total = 2
        for count, child in enumerate(children):
            if count & 1023 == 1023:
                self.tick()  # a long walk is steps too: it meets the deadline
            total += self._weight(child, seen) + 2
            if total > MAX_VALUE_CHARS:
                raise _too_big()
        if len(value) >= _MEMO_MIN_ITEMS:
            if len(self._memo) >= _MEMO_MAX_ENTRIES:
                self._memo.clear()
            self._memo[key] = (value, total)
        else:
            seen[key] = total
        return total


def _too_big() -> LimitExceeded:
    return LimitExceeded(f"the template builds a value of more than {MAX_VALUE_CHARS} characters")


_local = threading.local()


def current() -> Budget:
    """The budget of the render running in this thread; an unbounded one outside a render."""
    budget: Budget | None = getattr(_local, "budget", None)
    return budget if budget is not None else Budget(None)


@contextlib.contextmanager
def spending(budget: Budget) -> Iterator[None]:
    """The steps this thread takes inside the block are charged to `budget`."""
    _local.budget = budget
    try:
        yield
    finally:
        _local.budget = None


# --- size estimates made before a step runs -------------------------------------------------


def limit(estimate: int, what: str) -> None:
    if estimate > MAX_VALUE_CHARS:
        raise LimitExceeded(f"{what} would build more than {MAX_VALUE_CHARS} characters")


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _format_widths(spec_numbers: Iterable[str]) -> int:
    total = 0
    for number in spec_numbers:
        if len(number) > 6 or int(number) > MAX_FORMAT_WIDTH:
            raise LimitExceeded(f"format widths are limited to {MAX_FORMAT_WIDTH}")
        total += int(number)
    return total


def _percent_widths(template: str) -> int:
    """The widths a `%` format asks for; LimitExceeded for `*` widths and huge widths."""
    widths = 0
    for match in _PERCENT_SPEC.finditer(template):
        if "*" in (match.group(2) or "", match.group(3) or ""):
            raise LimitExceeded("format widths from arguments (*) are not allowed")
        widths += _format_widths(n for n in (match.group(2), match.group(3)) if n)
    return widths


# Short formats such as "%.2f" come back at every line of a table; long ones are not kept.
_short_percent_widths = functools.lru_cache(maxsize=256)(_percent_widths)
_SHORT_FORMAT_CHARS = 100


def _check_percent(template: str, args: Any) -> None:
    """`'%10s' % x`: refuse `*` widths and huge widths; estimate the result."""
    short = len(template) <= _SHORT_FORMAT_CHARS
    widths = _short_percent_widths(template) if short else _percent_widths(template)
    limit(len(template) + widths + current().weigh(args), "string formatting")


def check_format(template: str, args: Any) -> None:
    """`'{:>10}'.format(x)`: the same rule for str.format."""
    widths = 0
    try:
        fields = list(string.Formatter().parse(template))
    except ValueError:
        return  # str.format raises the same error with a better message
    for _literal, _name, spec, _conversion in fields:
        if spec and "{" in spec:
            raise LimitExceeded("nested format fields are not allowed")
        widths += _format_widths(_DIGITS.findall(spec or ""))
    limit(len(template) + widths + current().weigh(args), "string formatting")


def _check_replace(s: Any, old: Any, new: Any, count: Any = None) -> None:
    s, old, new = _text(s), _text(old), _text(new)
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    limit(len(s) + max(0, len(new) - len(old)) * hits, "replace()")


def _check_width(width: Any, what: str) -> None:
    if isinstance(width, int):
        limit(width, what)


def sized(items: Any) -> Any:
    """Iterators (map, select) become lists, so that a join can be measured before it runs."""
    if isinstance(items, (str, list, tuple, Mapping)) or not isinstance(items, Iterable):
        return items
    return list(items)


def _check_join(items: Any, separator: Any) -> None:
    count = len(items) if hasattr(items, "__len__") else 0
    limit(current().weigh(items) + len(_text(separator)) * count, "join()")


def check_binop(operator: str, left: Any, right: Any) -> None:
    budget = current()
    if operator == "**":
        if _is_int(left) and _is_int(right) and right > 0 and abs(left) > 1:
            if left.bit_length() * right > MAX_INT_BITS:
                raise LimitExceeded(f"numbers are limited to {MAX_INT_BITS} bits")
    elif operator == "*":
        if _is_int(left) and _is_int(right):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise LimitExceeded(f"numbers are limited to {MAX_INT_BITS} bits")
        elif _is_int(right) or _is_int(left):
            times, sequence = (right, left) if _is_int(right) else (left, right)
            limit(budget.weigh(sequence) * max(times, 0), "repetition (*)")
    elif operator == "%":
        if isinstance(left, str):
            _check_percent(left, right)
    elif operator == "+":
        limit(budget.weigh(left) + budget.weigh(right), "concatenation (+)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int)


def _arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int, name: str) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name)


def check_filter(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """Filters whose result can dwarf their input, judged from their arguments."""
    if not args:
        return
    value = args[0]
    if name == "center":
        _check_width(_arg(args, kwargs, 1, "width"), "center()")
    elif name == "indent":
        width = _arg(args, kwargs, 1, "width")
        per_line = width if isinstance(width, int) else len(_text(width or ""))
        text = _text(value)
        limit(len(text) + per_line * (text.count("\n") + 1), "indent()")
    elif name == "format":
        _check_percent(_text(value), args[1:] or kwargs)
    elif name == "replace" and len(args) >= 3:
        _check_replace(args[0], args[1], args[2], _arg(args, kwargs, 3, "count"))
    elif name == "wordwrap":
        width = _arg(args, kwargs, 1, "width") or 79
        wrap = _arg(args, kwargs, 3, "wrapstring") or "\n"
        text = _text(value)
        breaks = len(text) // max(width if isinstance(width, int) else 1, 1) + 1
        limit(len(text) + breaks * len(_text(wrap)), "wordwrap()")
    elif name in ("batch", "slice"):
        size = _arg(args, kwargs, 1, "linecount" if name == "batch" else "slices")
        if isinstance(size, int) and size > MAX_RANGE:
            raise LimitExceeded(f"{name}() sizes are limited to {MAX_RANGE}")
    elif name == "join":
        _check_join(value, _arg(args, kwargs, 1, "d") or "")
    elif name == "list" and isinstance(value, str):
        limit(3 * len(value), "list()")
    elif name == "sum":
        start = _arg(args, kwargs, 2, "start")
        if start is not None and not isinstance(start, (int, float)):
            items = len(value) if hasattr(value, "__len__") else MAX_RANGE
            if items * current().weigh(value) > MAX_SEQUENCE_SUM_COST:
                raise LimitExceeded("sum() of sequences this large is not allowed")


def check_method(method: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
    """String methods whose result can dwarf the string, judged from their arguments."""
    owner = getattr(method, "__self__", None)
    if not isinstance(owner, str):
        return
    name = getattr(method, "__name__", "")
    if name in ("ljust", "rjust", "center", "zfill"):
        _check_width(_arg(args, kwargs, 0, "width"), f"{name}()")
    elif name == "expandtabs":
        size = _arg(args, kwargs, 0, "tabsize")
        if isinstance(size, int):
            limit(len(owner) + owner.count("\t") * size, "expandtabs()")
    elif name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1], _arg(args, kwargs, 2, "count"))
    elif name == "join" and args:
        _check_join(args[0], owner)
