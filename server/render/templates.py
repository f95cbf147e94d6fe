"""Jinja2 templates in a sandbox: {{name}} works; Python internals, endless loops and huge
expansions fail the job with a clear error instead of harming the process.

Jinja's sandbox already refuses private attributes (`__class__`, `_TemplateReference__context`).
On top of it every step a template takes is counted against a deadline (loop iterations,
calls, attribute reads, operators, filters), and every value it builds is weighed as the text
it would print before it is built where the size can be known in advance (`'x' * n`, `**`,
padding widths, `replace`, joins) and right after otherwise, so no single step allocates much
more than the value limit. Loop steps, `~` and literals, which no hook of the sandbox sees, are
routed through filters by a rewrite of the parsed template (`_bounded`), with Jinja's public
API only (docs/decisions/010-template-bounds.md). Rendering runs in a worker thread; a thread
cannot be killed, so these checks are what stop it.
"""

from __future__ import annotations

import asyncio
import functools
import math
import re
import string
import threading
import time
from collections.abc import Callable, Iterable, Iterator, KeysView, Mapping, ValuesView
from typing import Any, Generic, TypeVar

import jinja2
from jinja2 import nodes
from jinja2.exceptions import SecurityError
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum
from markupsafe import Markup, soft_str

from server.errors import PermanentError

MAX_OUTPUT_CHARS = 20 * 1024 * 1024
MAX_VALUE_CHARS = 10 * 1024 * 1024
# Everything printed with {{ }}, also into macros and {% set %} blocks that are never output:
# escaping copies each value, so a block printing one big string in a loop would fill memory.
MAX_PRINTED_CHARS = 2 * MAX_OUTPUT_CHARS
MAX_RANGE = 100_000
MAX_INT_BITS = 8192
MAX_FORMAT_WIDTH = 10_000
MAX_LIPSUM_PARAGRAPHS = 100
DEFAULT_TIMEOUT_S = 10.0
# Sums of lists copy the running total at every step: cost is items x size.
MAX_SEQUENCE_SUM_COST = 50_000_000
# Weights of big containers are remembered for the render (they cannot change: the sandbox is
# immutable); small ones are cheap to weigh again, and remembering them all would keep every
# temporary list of a long loop alive.
_MEMO_MIN_ITEMS = 32
_MEMO_MAX_ENTRIES = 10_000
_PERCENT_SPEC = re.compile(r"%(\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")
_DIGITS = re.compile(r"\d+")
_DICT_ATTRIBUTES = frozenset(dir(dict))


class LimitExceeded(Exception):
    """A template went past one of the limits above; the message says which."""


class _NotQuick(BaseException):
    """A render tried on the event loop took longer than ON_LOOP_S: it starts again in a
    thread. A BaseException, so that no handler on the way mistakes it for a template error."""


class _Budget:
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
                raise _NotQuick
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
            # Mutable through {% set ns.x = ... %}: weighed afresh every time.
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


def _budget() -> _Budget:
    budget: _Budget | None = getattr(_local, "budget", None)
    return budget if budget is not None else _Budget(None)


# --- size estimates made before a step runs -------------------------------------------------


def _limit(estimate: int, what: str) -> None:
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
    _limit(len(template) + widths + _budget().weigh(args), "string formatting")


def _check_format(template: str, args: Any) -> None:
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
    _limit(len(template) + widths + _budget().weigh(args), "string formatting")


def _check_replace(s: Any, old: Any, new: Any, count: Any = None) -> None:
    s, old, new = _text(s), _text(old), _text(new)
    hits = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        hits = min(hits, count)
    _limit(len(s) + max(0, len(new) - len(old)) * hits, "replace()")


def _check_width(width: Any, what: str) -> None:
    if isinstance(width, int):
        _limit(width, what)


def _sized(items: Any) -> Any:
    """Iterators (map, select) become lists, so that a join can be measured before it runs."""
    if isinstance(items, (str, list, tuple, Mapping)) or not isinstance(items, Iterable):
        return items
    return list(items)


def _check_join(items: Any, separator: Any) -> None:
    count = len(items) if hasattr(items, "__len__") else 0
    _limit(_budget().weigh(items) + len(_text(separator)) * count, "join()")


def _check_binop(operator: str, left: Any, right: Any) -> None:
    budget = _budget()
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
            _limit(budget.weigh(sequence) * max(times, 0), "repetition (*)")
    elif operator == "%":
        if isinstance(left, str):
            _check_percent(left, right)
    elif operator == "+":
        _limit(budget.weigh(left) + budget.weigh(right), "concatenation (+)")


def _is_int(value: Any) -> bool:
    return isinstance(value, int)


def _arg(args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int, name: str) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name)


def _check_filter(name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
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
        _limit(len(text) + per_line * (text.count("\n") + 1), "indent()")
    elif name == "format":
        _check_percent(_text(value), args[1:] or kwargs)
    elif name == "replace" and len(args) >= 3:
        _check_replace(args[0], args[1], args[2], _arg(args, kwargs, 3, "count"))
    elif name == "wordwrap":
        width = _arg(args, kwargs, 1, "width") or 79
        wrap = _arg(args, kwargs, 3, "wrapstring") or "\n"
        text = _text(value)
        breaks = len(text) // max(width if isinstance(width, int) else 1, 1) + 1
        _limit(len(text) + breaks * len(_text(wrap)), "wordwrap()")
    elif name in ("batch", "slice"):
        size = _arg(args, kwargs, 1, "linecount" if name == "batch" else "slices")
        if isinstance(size, int) and size > MAX_RANGE:
            raise LimitExceeded(f"{name}() sizes are limited to {MAX_RANGE}")
    elif name == "join":
        _check_join(value, _arg(args, kwargs, 1, "d") or "")
    elif name == "list" and isinstance(value, str):
        _limit(3 * len(value), "list()")
    elif name == "sum":
        start = _arg(args, kwargs, 2, "start")
        if start is not None and not isinstance(start, (int, float)):
            items = len(value) if hasattr(value, "__len__") else MAX_RANGE
            if items * _budget().weigh(value) > MAX_SEQUENCE_SUM_COST:
                raise LimitExceeded("sum() of sequences this large is not allowed")


def _check_method(method: Any, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> None:
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
            _limit(len(owner) + owner.count("\t") * size, "expandtabs()")
    elif name == "replace" and len(args) >= 2:
        _check_replace(owner, args[0], args[1], _arg(args, kwargs, 2, "count"))
    elif name == "join" and args:
        _check_join(args[0], owner)


# --- the environment ------------------------------------------------------------------------


# Jinja's sandbox hooks see calls, attribute reads, items and operators, but not the steps of
# a `{% for %}` (a loop with an empty body calls nothing), nor `~` and literal lists, tuples
# and dicts. The parsed template is rewritten, with Jinja's documented node classes, so that
# these pass through the filters below before it is compiled. A colon cannot be part of a
# filter name in a template, so only the rewrite can name these.
_LOOP = "pressroom:loop"
_CONCAT = "pressroom:concat"
_LITERAL = "pressroom:literal"


def _loop_steps(iterable: Iterable[Any]) -> Iterator[Any]:
    """Every item a `{% for %}` takes is a step."""
    budget = _budget()
    for item in iterable:
        budget.tick()
        yield item


@jinja2.pass_eval_context
def _concat(eval_ctx: EvalContext, parts: tuple[Any, ...]) -> str:
    """`a ~ b`, measured before it is joined; with autoescape on, as Jinja joins it."""
    budget = _budget()
    budget.tick()
    _limit(sum(budget.weigh(part) for part in parts), "concatenation (~)")
    texts = [soft_str(part) for part in parts]
    if eval_ctx.autoescape and any(hasattr(text, "__html__") for text in texts):
        return Markup("").join(texts)
    return "".join(texts)


def _literal(value: Any) -> Any:
    """`[a, b]`, `(a, b)`, `{k: v}` once built."""
    budget = _budget()
    budget.tick()
    return budget.checked(value)


def _through(name: str, node: nodes.Node) -> nodes.Filter:
    return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)


def _bounded(node: nodes.Node) -> nodes.Node:
    """Routes every loop, `~` and literal in `node` through the filters above, in place;
    returns the node that takes the place of `node`."""
    for field, value in node.iter_fields():
        if isinstance(value, nodes.Node):
            setattr(node, field, _bounded(value))
        elif isinstance(value, list):
            value[:] = [_bounded(v) if isinstance(v, nodes.Node) else v for v in value]
    if isinstance(node, nodes.For):
        node.iter = _through(_LOOP, node.iter)
    elif isinstance(node, nodes.Concat):
        return _through(_CONCAT, nodes.Tuple(node.nodes, "load", lineno=node.lineno))
    elif isinstance(node, (nodes.List, nodes.Dict)):
        return _through(_LITERAL, node)
    elif isinstance(node, nodes.Tuple) and node.ctx == "load":  # not an assignment target
        return _through(_LITERAL, node)
    return node


def _bounded_range(*args: int) -> range:
    numbers = range(*args)
    try:
        size = len(numbers)
    except OverflowError:
        size = MAX_RANGE + 1
    if size > MAX_RANGE:
        raise LimitExceeded(f"range() is limited to {MAX_RANGE} numbers")
    return numbers


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
    if n > MAX_LIPSUM_PARAGRAPHS or max > 1000:
        raise LimitExceeded(f"lipsum() is limited to {MAX_LIPSUM_PARAGRAPHS} paragraphs")
    return generate_lorem_ipsum(n=n, html=html, min=min, max=max)


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` passes here before it becomes text."""
    budget = _budget()
    budget.tick()
    budget.printed += budget.weigh(value)
    if budget.printed > MAX_PRINTED_CHARS:
        raise LimitExceeded(f"the template prints more than {MAX_PRINTED_CHARS} characters")
    return value


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    passes_context = getattr(func, "jinja_pass_arg", None) is not None

    @functools.wraps(func)  # keeps jinja_pass_arg, so Jinja passes the same arguments
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        skip = 1 if passes_context else 0
        if name == "join" and len(args) > skip:
            args = (*args[:skip], _sized(args[skip]), *args[skip + 1 :])
        own = args[skip:]
        for arg in (*own, *kwargs.values()):
            budget.weigh(arg)
        _check_filter(name, own, kwargs)
        return budget.checked(func(*args, **kwargs))

    return guarded


def _guard_test(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        for arg in (*args, *kwargs.values()):
            if not isinstance(arg, Context):
                budget.weigh(arg)
        return func(*args, **kwargs)

    return guarded


class _Sandbox(ImmutableSandboxedEnvironment):
    """Jinja's immutable sandbox with a deadline and size limits on every step."""

    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self) -> None:
        super().__init__(
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            auto_reload=False,
            cache_size=0,
            finalize=_finalize,
        )
        self.globals["range"] = _bounded_range
        self.globals["lipsum"] = _lipsum
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.filters.update({_LOOP: _loop_steps, _CONCAT: _concat, _LITERAL: _literal})
        tests: dict[str, Any] = self.tests  # typed as a bare "function" in Jinja's stubs
        self.tests = {name: _guard_test(f) for name, f in tests.items()}

    # Buffers of macros, {% set %} blocks, {% filter %} blocks and caller() are joined here.
    @staticmethod
    def concat(parts: Iterable[str]) -> str:
        pieces = list(parts)
        _limit(sum(len(piece) for piece in pieces), "a block")
        return "".join(pieces)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = _budget()
        budget.tick()
        _check_binop(operator, left, right)
        return budget.checked(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        _budget().tick()
        # `line.item` on JSON data: the key, as Jinja would find it after the attribute
        # lookup failed, without raising and catching AttributeError on every row.
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _budget().tick()
        return super().getitem(obj, argument)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        budget.tick()
        if args and isinstance(getattr(obj, "__self__", None), str) and obj.__name__ == "join":
            args = (_sized(args[0]), *args[1:])
        for arg in (*args, *kwargs.values()):
            budget.weigh(arg)
        _check_method(obj, args, kwargs)
        return budget.checked(super().call(context, obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        template: str = value.__self__
        is_map = value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> str:
            _check_format(template, args[0] if is_map and args else (args, kwargs))
            return wrapper(*args, **kwargs)

        return checked


_env = _Sandbox()


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


def _from_source(source: str) -> jinja2.Template:
    """Parse, bound, compile: Environment.parse and from_string of a node tree are Jinja's
    documented API, so no private part of Jinja's compiler is needed."""
    tree = _env.parse(source)
    _bounded(tree)
    tree.set_environment(_env)  # the filter nodes the rewrite added
    return _env.from_string(tree)


# Compiled templates are large; most clients send the same few templates again and again.
_compile: _Recent[jinja2.Template] = _Recent(_from_source)


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


def _render_in(budget: _Budget, source: str, data: dict[str, Any]) -> str:
    """Render in the calling thread under `budget`; template failures become PermanentError."""
    _local.budget = budget
    try:
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
        raise PermanentError(f"template error: {exc.message}") from None
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
    finally:
        _local.budget = None


def render(source: str, data: dict[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S) -> str:
    """Template + data → HTML in this thread. Every template failure is permanent."""
    return _render_in(_Budget(timeout_s), source, data)


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
            return _render_in(_Budget(ON_LOOP_S, on_loop=True), source, data)
        except _NotQuick:
            pass
    budget = _Budget(timeout_s)
    try:
        return await asyncio.to_thread(_render_in, budget, source, data)
    finally:
        # A cancelled job stops its thread at the template's next step.
        budget.cancelled = True
