"""The template sandbox: ordinary templates render; escapes, endless loops and huge expansions
fail with a clear, permanent error and leave the process healthy."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from server.errors import PermanentError
from server.render import limits, templates

ESCAPES = [
    "{{ ''.__class__.__mro__ }}",
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__ }}",
    "{{ self._TemplateReference__context }}",
    "{{ lipsum.__globals__['os'] }}",
    "{{ namespace.__init__.__globals__ }}",
    "{{ joiner.__init__.__globals__.__builtins__ }}",
    "{{ range.__globals__ }}",
    "{{ ''.format.__self__.__class__ }}",
    "{{ (1).__class__.__base__.__subclasses__() }}",
    "{% set x = [] %}{{ x.append(1) }}",
    "{% set d = {} %}{{ d.update(a=1) }}",
]

EXPANSIONS = {
    "{% for i in range(10**12) %}{{ i }}{% endfor %}": "range() is limited to 100000 numbers",
    "{{ 'x' * 10**10 }}": "repetition (*) would build more than",
    "{{ [0] * 10**9 }}": "repetition (*) would build more than",
    "{{ 10 ** 100000 }}": "numbers are limited to 8192 bits",
    "{% set ns = namespace(n=3) %}{% for i in range(64) %}{% set ns.n = ns.n * ns.n %}"
    "{% endfor %}": "numbers are limited",
    "{% set ns = namespace(s='0123456789') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}": "concatenation (~) would build",
    "{% set ns = namespace(s='0123456789') %}{% for i in range(64) %}"
    "{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s }}": "concatenation (+) would build",
    "{% set a = ['xxxxxxxxxx'] * 10 %}{% set b = [a,a,a,a,a,a,a,a,a,a] %}"
    "{% set c = [b,b,b,b,b,b,b,b,b,b] %}{% set d = [c,c,c,c,c,c,c,c,c,c] %}"
    "{% set e = [d,d,d,d,d,d,d,d,d,d] %}{% set f = [e,e,e,e,e,e,e,e,e,e] %}"
    "{{ [f,f,f,f,f,f,f,f,f,f] }}": "builds a value of more than",
    "{{ 'x'|center(10**9) }}": "center() would build",
    "{{ 'x'.ljust(10**9) }}": "ljust() would build",
    "{{ '{:>999999999}'.format(1) }}": "format widths are limited",
    "{{ '%999999999d' % 1 }}": "format widths are limited",
    "{{ '%*d' % (999999999, 1) }}": "(*) are not allowed",
    "{{ '%999999999s'|format('x') }}": "format widths are limited",
    "{% set s = 'x' * 100000 %}{{ s|replace('x', s) }}": "replace() would build",
    "{% set s = 'x' * 100000 %}{{ s.replace('x', s) }}": "replace() would build",
    "{% set s = 'x' * 1000000 %}{{ range(1000)|join(s) }}": "join() would build",
    "{% set s = 'x' * 1000000 %}{{ s.join(range(1000)|map('string')) }}": "join() would build",
    "{{ lipsum(10**7) }}": "lipsum() is limited",
    "{{ [1]|batch(10**9, 'x')|list }}": "batch() sizes are limited",
    "{% set s = 'x' * 5000000 %}{% set block %}{% for i in range(100) %}{{ s }}{% endfor %}"
    "{% endset %}": "prints more than",
    "{% for i in range(100000) %}{% for j in range(1000) %}0123456789{% endfor %}"
    "{% endfor %}": "output exceeds",
    "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}": "recursion is too deep",
}

ENDLESS = [
    "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "{% for i in range(100000) %}{% for j in range(100000) %}{% if i == j %}{% endif %}"
    "{% endfor %}{% endfor %}",
    # No call, attribute or operator at all: only the loops' own steps meet the deadline.
    "{% for a in '" + "x" * 20000 + "' %}{% for b in '" + "x" * 20000 + "' %}{% endfor %}"
    "{% endfor %}",
]

ENDLESS_OVER_DATA = [
    ("{% for a in rows %}{% for b in rows %}{% endfor %}{% endfor %}", {"rows": [0] * 100_000}),
    ("{% for a in text %}{% for b in text %}{% endfor %}{% endfor %}", {"text": "x" * 100_000}),
]


@pytest.mark.parametrize("source", ESCAPES)
def test_python_internals_are_refused(source: str) -> None:
    with pytest.raises(PermanentError) as failure:
        templates.render(source, {})
    message = str(failure.value)
    assert "sandbox" in message or "unsafe" in message, message
    assert not failure.value.retryable


@pytest.mark.parametrize(("source", "expected"), list(EXPANSIONS.items()))
def test_huge_expansions_fail_before_they_are_built(source: str, expected: str) -> None:
    # The render's own CPU time, in this thread: on a busy machine the slowest of these (about
    # 1.5 s of CPU) can take several times that on the clock, and the deadline is far enough.
    started = time.thread_time()
    with pytest.raises(PermanentError) as failure:
        templates.render(source, {}, timeout_s=60)
    assert expected in str(failure.value)
    assert time.thread_time() - started < 10, "refused early, not after the deadline"


@pytest.mark.parametrize("source", ENDLESS)
def test_endless_templates_stop_at_the_deadline(source: str) -> None:
    started = time.monotonic()
    with pytest.raises(PermanentError) as failure:
        templates.render(source, {}, timeout_s=0.5)
    assert "template rendering took longer than 0.5 s" in str(failure.value)
    assert time.monotonic() - started < 3


@pytest.mark.parametrize(("source", "data"), ENDLESS_OVER_DATA)
def test_loops_over_the_data_stop_at_the_deadline(source: str, data: dict[str, object]) -> None:
    started = time.monotonic()
    with pytest.raises(PermanentError, match=r"took longer than 0\.5 s"):
        templates.render(source, data, timeout_s=0.5)
    assert time.monotonic() - started < 3


def test_concatenation_escapes_as_jinja_does() -> None:
    source = (
        "{% set b %}<b>{% endset %}{{ b ~ '<i>' }}|{{ '<i>' ~ 1 }}|"
        "{% autoescape false %}{{ b ~ '<i>' }}{% endautoescape %}"
    )
    assert templates.render(source, {}) == "<b>&lt;i&gt;|&lt;i&gt;1|<b><i>"


def test_the_bounding_filters_cannot_be_named_in_a_template() -> None:
    assert "syntax error" in (templates.check("{{ rows|pressroom:loop }}") or "")


def test_ordinary_templates_still_render() -> None:
    source = (
        "<h1>Hi {{ name }}</h1>"
        "{% for item in items %}<li>{{ loop.index }}/{{ loop.length }} {{ item.sku|upper }}"
        " {{ '%.2f'|format(item.price) }} {{ '{:>6}'.format(item.qty) }}</li>{% endfor %}"
        "{% macro money(v) %}${{ '%.2f' % v }}{% endmacro %}"
        "{{ money(items|sum(attribute='price')) }}"
        "{% for k, v in meta|dictsort %}{{ k }}={{ v }};{% endfor %}"
        "{{ note }}{{ 'a' ~ 'b' ~ 1 }}{{ [1, 2, 3]|join('-') }}{{ 2 ** 10 }}{{ 'ab' * 3 }}"
        "{% set ns = namespace(total=0) %}{% for i in range(5) %}{% set ns.total = ns.total + i %}"
        "{% endfor %}{{ ns.total }}{{ lipsum(1, html=False)|wordcount > 0 }}"
        "{% for n in tree recursive %}[{{ n.name }}{{ loop(n.children) }}]{% endfor %}"
    )
    data = {
        "name": "Ana",
        "items": [{"sku": "a1", "price": 2.5, "qty": 2}, {"sku": "b2", "price": 1.25, "qty": 1}],
        "meta": {"b": 2, "a": 1},
        "note": "<script>x</script>",
        "tree": [{"name": "root", "children": [{"name": "leaf", "children": []}]}],
    }
    html = templates.render(source, data)
    assert html.startswith("<h1>Hi Ana</h1><li>1/2 A1 2.50      2</li>")
    assert "$3.75" in html and "a=1;b=2;" in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html, "autoescape stays on"
    assert "ab11-2-31024ababab10True" in html
    assert html.endswith("[root[leaf]]")


def test_syntax_problems_are_reported_at_submission() -> None:
    assert templates.check("{{ name }}") is None
    assert "syntax error on line 1" in (templates.check("{% for %}") or "")
    assert "nested too deeply" in (
        templates.check("{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}") or ""
    )
    assert "cannot be compiled" in (templates.check("{{ " + "9" * 5000 + " }}") or "")


async def test_rendering_in_a_thread_keeps_the_event_loop_serving() -> None:
    endless = ENDLESS[0]
    render = asyncio.create_task(templates.render_async(endless, {}, timeout_s=2))
    loop = asyncio.get_running_loop()
    lags = []
    while not render.done():
        before = loop.time()
        await asyncio.sleep(0.01)  # the probe: how late the loop wakes us measures its lag
        lags.append(loop.time() - before - 0.01)
    with pytest.raises(PermanentError, match="took longer than 2 s"):
        await render
    assert len(lags) > 20 and max(lags) < 0.5


def test_a_stopped_render_ends_its_thread() -> None:
    budget = limits.Budget(60)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            templates._render_in(budget, ENDLESS[0], {})
        except PermanentError as exc:
            failures.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    budget.cancelled = True  # what render_async does when the job is cancelled
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert "stopped" in str(failures[0])


class ThreadSpy:
    """Stands in for asyncio.to_thread in the templates module and counts the renders sent."""

    def __init__(self) -> None:
        self.calls = 0

    async def __call__(self, func: object, /, *args: object) -> object:
        self.calls += 1
        return await asyncio.get_running_loop().run_in_executor(None, func, *args)  # type: ignore[arg-type]


@pytest.fixture
def thread_spy(monkeypatch: pytest.MonkeyPatch) -> ThreadSpy:
    spy = ThreadSpy()
    monkeypatch.setattr("server.render.templates.asyncio.to_thread", spy)
    return spy


@pytest.fixture
def roomy_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """More than 2 ms on the loop: a busy test machine must not decide where a render runs."""
    monkeypatch.setattr(templates, "ON_LOOP_S", 1.0)


ROWS = "{% for r in rows %}<td>{{ r.item }}</td><td>{{ '%.2f'|format(r.price) }}</td>{% endfor %}"


async def test_a_quick_render_of_small_data_stays_on_the_event_loop(
    thread_spy: ThreadSpy, roomy_loop: None
) -> None:
    rows = [{"item": f"line {n}", "price": n * 1.5} for n in range(20)]
    first = await templates.render_async(ROWS, {"rows": rows})
    assert thread_spy.calls == 1  # compiling is never done on the loop
    html = await templates.render_async(ROWS, {"rows": rows[:19]})
    assert html.count("<td>") == 38 and "27.00" in html and first.count("<td>") == 40
    assert thread_spy.calls == 1


async def test_a_render_too_long_for_the_loop_starts_again_in_a_thread(
    thread_spy: ThreadSpy,
) -> None:
    # Small data, but far more steps than fit in ON_LOOP_S: the whole render is done again,
    # in a thread, with the job's own budget; the output is the complete document once.
    source = "{% for i in range(50000) %}{{ i }},{% endfor %}"
    templates.check(source)  # compiled, so the loop is tried first
    html = await templates.render_async(source, {})
    assert html == "".join(f"{i}," for i in range(50000))
    assert thread_spy.calls == 1


async def test_large_data_is_rendered_in_a_thread(thread_spy: ThreadSpy, roomy_loop: None) -> None:
    templates.check("{{ rows|length }}")  # compiled: only the size of the data decides
    data = {"rows": list(range(templates.ON_LOOP_MAX_ITEMS + 1))}
    html = await templates.render_async("{{ rows|length }}", data)
    assert html == str(templates.ON_LOOP_MAX_ITEMS + 1)
    assert thread_spy.calls == 1


async def test_template_errors_on_the_loop_are_the_same_permanent_errors(
    thread_spy: ThreadSpy, roomy_loop: None
) -> None:
    # Sources of this test alone: another test's `check` of the same text could answer from
    # its cache after the compiled template was dropped, and then compiling would take a thread.
    undefined = "{{ missing }}{# on the loop #}"
    unsafe = "{{ ''.__class__.__mro__ }}{# on the loop #}"
    for source in (undefined, unsafe):
        templates.check(source)
    with pytest.raises(PermanentError, match="undefined"):
        await templates.render_async(undefined, {})
    with pytest.raises(PermanentError, match=r"sandbox|unsafe"):
        await templates.render_async(unsafe, {})
    assert thread_spy.calls == 0


def test_weighing_a_long_list_meets_the_deadline_on_the_way() -> None:
    # One step (weighing what a filter got) can walk a list of 100,000 items; it checks the
    # deadline as it goes, so a render on the event loop hands over to a thread in time.
    budget = limits.Budget(0.0, on_loop=True)
    time.sleep(0.001)
    with pytest.raises(limits.NotQuick):
        budget.weigh(list(range(5000)))
