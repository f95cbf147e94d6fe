"""Jinja2 templates rendered in a sandbox: {{name}} works, Python internals do not."""

from __future__ import annotations

import functools
from typing import Any

import jinja2
from jinja2.sandbox import SandboxedEnvironment

from server.errors import PermanentError

MAX_OUTPUT_CHARS = 20 * 1024 * 1024


def _environment() -> SandboxedEnvironment:
    return SandboxedEnvironment(
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        auto_reload=False,
        cache_size=0,
    )


_env = _environment()


@functools.lru_cache(maxsize=256)
def _compile(source: str) -> jinja2.Template:
    return _env.from_string(source)


def check(source: str) -> str | None:
    """A syntax error message for the template, or None when it compiles."""
    try:
        _compile(source)
    except jinja2.TemplateSyntaxError as exc:
        return f"template syntax error on line {exc.lineno}: {exc.message}"
    return None


def render(source: str, data: dict[str, Any]) -> str:
    """Template + data → HTML. Every template failure is permanent: retrying cannot fix it."""
    try:
        html = _compile(source).render(data)
    except jinja2.TemplateSyntaxError as exc:
        raise PermanentError(f"template syntax error on line {exc.lineno}: {exc.message}") from None
    except jinja2.UndefinedError as exc:
        raise PermanentError(f"template error: {exc.message}") from None
    except jinja2.exceptions.SecurityError as exc:
        raise PermanentError(f"template refused by the sandbox: {exc}") from None
    except (TypeError, ValueError, ArithmeticError, LookupError, AttributeError) as exc:
        raise PermanentError(f"template error: {type(exc).__name__}: {exc}") from None
    if len(html) > MAX_OUTPUT_CHARS:
        raise PermanentError(f"template output exceeds {MAX_OUTPUT_CHARS} characters")
    return html
