"""The Jinja environment templates run in: {{name}} works; Python internals, endless loops and
huge expansions fail with a clear error instead of harming the process.

Jinja's sandbox already refuses private attributes (`__class__`, `_TemplateReference__context`).
On top of it every hook of the sandbox charges the render's budget (server/render/limits.py).
Loop steps, `~` and literals, which no hook sees, are routed through filters by a rewrite of
the parsed template (`_bounded`), with Jinja's public API only
(docs/decisions/022-template-bounds.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.nodes import EvalContext
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment
from markupsafe import Markup, soft_str

from server.render.limits import (
    MAX_LIPSUM_PARAGRAPHS,
    MAX_PRINTED_CHARS,
    MAX_RANGE,
    LimitExceeded,
    check_binop,
    check_filter,
    check_format,
    check_method,
    current,
    limit,
    sized,
)

_DICT_ATTRIBUTES = frozenset(dir(dict))

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
    budget = current()
    for item in iterable:
        budget.tick()
        yield item


@jinja2.pass_eval_context
def _concat(eval_ctx: EvalContext, parts: tuple[Any, ...]) -> str:
    """`a ~ b`, measured before it is joined; with autoescape on, as Jinja joins it."""
    budget = current()
    budget.tick()
    limit(sum(budget.weigh(part) for part in parts), "concatenation (~)")
    texts = [soft_str(part) for part in parts]
    if eval_ctx.autoescape and any(hasattr(text, "__html__") for text in texts):
        return Markup("").join(texts)
    return "".join(texts)


def _literal(value: Any) -> Any:
    """`[a, b]`, `(a, b)`, `{k: v}` once built."""
    budget = current()
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


def _bounded_lipsum(lipsum: Callable[..., str]) -> Callable[..., str]:
    """Jinja's own `lipsum` global, with a bound on what it makes."""

    def bounded(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:
        if n > MAX_LIPSUM_PARAGRAPHS or max > 1000:
            raise LimitExceeded(f"lipsum() is limited to {MAX_LIPSUM_PARAGRAPHS} paragraphs")
        return lipsum(n=n, html=html, min=min, max=max)

    return bounded


def _finalize(value: Any) -> Any:
    """Every `{{ value }}` passes here before it becomes text."""
    budget = current()
    budget.tick()
    budget.printed += budget.weigh(value)
    if budget.printed > MAX_PRINTED_CHARS:
        raise LimitExceeded(f"the template prints more than {MAX_PRINTED_CHARS} characters")
    return value


def _guard_filter(name: str, func: Callable[..., Any]) -> Callable[..., Any]:
    passes_context = getattr(func, "jinja_pass_arg", None) is not None

    @functools.wraps(func)  # keeps jinja_pass_arg, so Jinja passes the same arguments
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = current()
        budget.tick()
        skip = 1 if passes_context else 0
        if name == "join" and len(args) > skip:
            args = (*args[:skip], sized(args[skip]), *args[skip + 1 :])
        own = args[skip:]
        for arg in (*own, *kwargs.values()):
            budget.weigh(arg)
        check_filter(name, own, kwargs)
        return budget.checked(func(*args, **kwargs))

    return guarded


def _guard_test(func: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(func)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = current()
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
        defaults: dict[str, Any] = self.globals  # typed as objects in Jinja's own code
        defaults["range"] = _bounded_range
        defaults["lipsum"] = _bounded_lipsum(defaults["lipsum"])
        self.filters = {name: _guard_filter(name, f) for name, f in self.filters.items()}
        self.filters.update({_LOOP: _loop_steps, _CONCAT: _concat, _LITERAL: _literal})
        tests: dict[str, Any] = self.tests  # typed as a bare "function" in Jinja's stubs
        self.tests = {name: _guard_test(f) for name, f in tests.items()}

    # Buffers of macros, {% set %} blocks, {% filter %} blocks and caller() are joined here.
    @staticmethod
    def concat(parts: Iterable[str]) -> str:
        pieces = list(parts)
        limit(sum(len(piece) for piece in pieces), "a block")
        return "".join(pieces)

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        budget = current()
        budget.tick()
        check_binop(operator, left, right)
        return budget.checked(super().call_binop(context, operator, left, right))

    def getattr(self, obj: Any, attribute: str) -> Any:
        current().tick()
        # `line.item` on JSON data: the key, as Jinja would find it after the attribute
        # lookup failed, without raising and catching AttributeError on every row.
        if type(obj) is dict and attribute not in _DICT_ATTRIBUTES and attribute in obj:
            return obj[attribute]
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        current().tick()
        return super().getitem(obj, argument)

    def call(self, context: Context, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        budget = current()
        budget.tick()
        if args and isinstance(getattr(obj, "__self__", None), str) and obj.__name__ == "join":
            args = (sized(args[0]), *args[1:])
        for arg in (*args, *kwargs.values()):
            budget.weigh(arg)
        check_method(obj, args, kwargs)
        return budget.checked(super().call(context, obj, *args, **kwargs))

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        wrapper = super().wrap_str_format(value)
        if wrapper is None:
            return None
        template: str = value.__self__
        is_map = value.__name__ == "format_map"

        def checked(*args: Any, **kwargs: Any) -> str:
            check_format(template, args[0] if is_map and args else (args, kwargs))
            return wrapper(*args, **kwargs)

        return checked


_env = _Sandbox()


def parse(source: str) -> nodes.Template:
    """The template's node tree as written (error messages read it)."""
    return _env.parse(source)


def compile_template(source: str) -> jinja2.Template:
    """Parse, bound, compile: Environment.parse and from_string of a node tree are Jinja's
    documented API, so no private part of Jinja's compiler is needed."""
    tree = _env.parse(source)
    _bounded(tree)
    tree.set_environment(_env)  # the filter nodes the rewrite added
    return _env.from_string(tree)
