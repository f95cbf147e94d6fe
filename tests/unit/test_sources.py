"""A job's source → the document Chromium loads: Markdown, options.css, and which cookies
go with which request of the page's origin."""

from __future__ import annotations

import pytest

from server import options
from server.render import markdown, navigation, sources
from server.render.sources import PageUrl


async def test_markdown_is_jinja2_first_then_commonmark_in_the_stylesheet() -> None:
    text = "# {{ title }}\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\n~~x~~ *y*\n\n- [ ] open\n"
    html = await sources.load(
        sources.MARKDOWN, text, {"title": "Q3 <report>"}, options.parse(None), timeout_s=5
    )
    assert isinstance(html, str)
    assert html.startswith("<!doctype html>") and markdown.STYLESHEET in html
    assert "<h1>Q3 &lt;report&gt;</h1>" in html
    assert "<table>" in html and "<td>1</td>" in html
    assert "<s>x</s> <em>y</em>" in html
    assert '<input class="task-list-item-checkbox" disabled="disabled" type="checkbox">' in html


async def test_css_joins_html_sources_and_a_page_is_opened_as_it_is() -> None:
    css = options.parse({"css": "p { color: red } /* </style><script>x</script> */"})
    html = await sources.load(sources.TEMPLATE, "<p>{{ n }}</p>", {"n": 1}, css, timeout_s=5)
    assert html == "<p>1</p><style>p { color: red } /* <\\/style><script>x<\\/script> */</style>"
    page = await sources.load(sources.PAGE_URL, "https://a.example/", {}, css, timeout_s=5)
    assert page == PageUrl("https://a.example/")


@pytest.mark.parametrize(
    ("cookie", "url", "sent"),
    [
        ({}, "https://a.example/", True),
        ({"path": "/app"}, "https://a.example/app", True),
        ({"path": "/app"}, "https://a.example/app/x", True),
        ({"path": "/app"}, "https://a.example/apple", False),
        ({"path": "/app/"}, "https://a.example/app/x", True),
        ({"path": "/app"}, "https://a.example/", False),
        ({"secure": True}, "https://a.example/", True),
        ({"secure": True}, "http://a.example/", False),
    ],
)
def test_cookies_go_to_their_path_and_secure_ones_over_https_only(
    cookie: dict[str, object], url: str, sent: bool
) -> None:
    given = options.parse({"cookies": [{"name": "s", "value": "v", **cookie}]})
    origin = url.split("/", 3)
    own = navigation.OwnOrigin("/".join(origin[:3]), given, timeout_ms=1000)
    header = own._cookie_header(url, None)
    assert (header == "s=v") is sent
    assert own._cookie_header(url, "theirs=1") == ("s=v; theirs=1" if sent else "theirs=1")


def test_the_route_matches_the_origin_and_nothing_that_only_starts_like_it() -> None:
    own = navigation.OwnOrigin("http://127.0.0.1:8080", options.parse(None), timeout_ms=1)
    for url in ("http://127.0.0.1:8080/", "http://127.0.0.1:8080?x", "http://127.0.0.1:8080"):
        assert own.pattern.match(url), url
    for url in ("http://127.0.0.1:80801/", "https://127.0.0.1:8080/", "http://127.0.0.1/"):
        assert not own.pattern.match(url), url
