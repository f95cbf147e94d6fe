from __future__ import annotations

import pytest

from server import options
from server.options import OptionsError, RenderOptions, capped_ranges


def test_defaults_print_a4_with_backgrounds() -> None:
    args = options.parse(None).pdf_arguments()
    assert args["format"] == "A4" and args["print_background"] is True
    assert "display_header_footer" not in args


def test_options_map_to_chromium_arguments() -> None:
    parsed = options.parse(
        {
            "format": "letter",
            "landscape": True,
            "margin": "12mm",
            "scale": 0.8,
            "page_ranges": "1-2, 4",
            "footer_html": '<span class="pageNumber"></span>',
        }
    )
    args = parsed.pdf_arguments()
    assert args["format"] == "Letter" and args["landscape"] is True and args["scale"] == 0.8
    assert args["margin"] == {"top": "12mm", "right": "12mm", "bottom": "12mm", "left": "12mm"}
    assert args["page_ranges"] == "1-2,4"
    assert args["display_header_footer"] is True and args["header_template"] == "<span></span>"
    assert options.to_json(parsed)["format"] == "Letter"
    assert options.parse(options.to_json(parsed)) == parsed


def test_every_invalid_option_is_reported_with_its_field() -> None:
    with pytest.raises(OptionsError) as caught:
        options.parse(
            {"format": "B9", "scale": 3, "margin": {"middle": "1cm"}, "width": "10cm", "zoom": 2}
        )
    fields = [field for field, _ in caught.value.errors]
    assert fields == [
        "options.zoom",
        "options.format",
        "options.margin",
        "options.scale",
        "options.width",
    ]


@pytest.mark.parametrize(
    ("html", "opts", "expected"),
    [
        ("<p>plain</p>", {}, False),
        ("<P>x</P><SCRIPT>1</SCRIPT>", {}, True),
        ("<p>x</p>", {"wait_for_expression": "window.ready"}, True),
        ("<script>1</script>", {"javascript": False}, False),
    ],
)
def test_scripts_decide_the_isolation_path(
    html: str, opts: dict[str, object], expected: bool
) -> None:
    assert options.parse(opts).needs_javascript(html) is expected
    assert isinstance(RenderOptions(), RenderOptions)


@pytest.mark.parametrize(
    ("ranges", "pages", "expected"),
    [
        ("", 1001, "1-1001"),
        ("1-5000", 1001, "1-1001"),
        ("2000-2005", 1001, "2000-2005"),
        ("1-500,600-2000", 1001, "1-500,600-1100"),
        ("5-", 3, "5-7"),
        ("3,1-2", 10, "1-2,3"),
        ("1-3,2-5", 4, "1-3,4"),
        ("5-3", 2, "5-3"),
    ],
)
def test_page_ranges_are_capped_in_document_order(ranges: str, pages: int, expected: str) -> None:
    assert capped_ranges(ranges, pages) == expected


def test_document_information_is_bounded_as_documented() -> None:
    parsed = options.parse({"title": "t" * 4096, "keywords": ["a", "b"], "author": None})
    assert parsed.document_info() == {"/Title": "t" * 4096, "/Keywords": "a, b"}
    with pytest.raises(OptionsError) as caught:
        options.parse({"title": "t" * 4097, "subject": 5, "height": "1cm"})
    assert [field for field, _ in caught.value.errors] == [
        "options.title",
        "options.subject",
        "options.width",
    ]
    schema = RenderOptions.model_json_schema()["properties"]
    assert schema["title"]["anyOf"][0]["maxLength"] == 4096
    assert {"author", "subject", "keywords"} <= set(schema)


def test_field_errors_name_nested_places() -> None:
    from pydantic import ValidationError

    from server.fields import field_errors
    from server.schemas.batches import BatchRequest
    from server.schemas.common import Checks
    from server.settings import Settings

    body = {"items": [{"key": "a", "template": "x", "options": {"scale": 9, "dpi": 1}}], "x": 1}
    with pytest.raises(ValidationError) as caught:
        BatchRequest.model_validate(body, context=Checks(Settings()).context())
    assert field_errors(caught.value) == [
        ("x", "is not a known field"),
        ("items[0].options.dpi", "is not a known field"),
        ("items[0].options.scale", "must be between 0.1 and 2"),
    ]


@pytest.mark.parametrize(
    ("given", "field", "says"),
    [
        ({"screenshot": {"full_page": True}}, "options.screenshot", "image only"),
        ({"output": "pdf", "screenshot": {}}, "options.screenshot", "image only"),
        ({"output": "png", "screenshot": {"quality": 80}}, "options.screenshot", "jpeg and webp"),
        ({"output": "jpeg", "screenshot": {"omit_background": True}}, "options.screenshot", "png"),
        ({"output": "png", "landscape": True}, "options.landscape", "PDF only"),
        ({"output": "webp", "thumbnail": {"width": 90}}, "options.thumbnail", "PDF only"),
        (
            {"output": "png", "screenshot": {"selector": "main", "full_page": True}},
            "options.screenshot.selector",
            "not both",
        ),
        ({"output": "png", "screenshot": {"width": 5000}}, "options.screenshot.width", "4096"),
        ({"output": "png", "screenshot": {"scale": 8}}, "options.screenshot.scale", "4"),
        ({"output": "jpeg", "screenshot": {"quality": 101}}, "options.screenshot.quality", "100"),
        ({"thumbnail": {"width": 2001}}, "options.thumbnail.width", "2000"),
        ({"thumbnail": {}}, "options.thumbnail.width", "required"),
        ({"output": "gif"}, "options.output", "webp"),
    ],
)
def test_image_options_that_do_not_go_together_name_their_field(
    given: dict[str, object], field: str, says: str
) -> None:
    with pytest.raises(OptionsError) as caught:
        options.parse(given)
    assert [name for name, _ in caught.value.errors] == [field]
    assert says in caught.value.errors[0][1]


def test_an_image_is_taken_of_the_screen_and_stored_without_its_defaults() -> None:
    shot = options.parse({"output": "webp", "screenshot": {"quality": 60, "scale": 2}})
    assert shot.image and shot.media == "screen" and shot.screenshot_or_default().width == 1280
    stored = options.to_json(shot)
    assert stored == {"output": "webp", "screenshot": {"quality": 60, "scale": 2.0}}
    assert options.parse(stored) == shot
    assert options.parse({"output": "png", "media": "print"}).media == "print"


def test_a_job_naming_another_output_leaves_the_templates_other_options_behind() -> None:
    printed = {"landscape": True, "margin": {"top": "1cm"}, "wait_for_selector": "main"}
    assert options.layered(printed, {"output": "png"}) == {
        "output": "png",
        "wait_for_selector": "main",
    }
    shot = {"output": "png", "screenshot": {"full_page": True}}
    assert options.layered(shot, {"output": "pdf"}) == {"output": "pdf"}
    assert options.layered(shot, {"output": None}) == {"output": None}
    # Without an output of its own the job takes the template's, and its own are checked.
    assert options.layered(shot, {"landscape": True}) == {**shot, "landscape": True}
    with pytest.raises(OptionsError):
        options.parse(options.layered(shot, {"landscape": True}))


def test_page_options_have_their_defaults_and_bounds() -> None:
    parsed = options.parse(None)
    assert (parsed.wait_until, parsed.wait_delay_ms, parsed.lazy_load) == ("load", 0, False)
    assert parsed.fail_on.model_dump() == {
        "http_status": True,
        "console_errors": False,
        "resource_errors": False,
        # The preflight kinds: warnings unless named (server/render/preflight.py).
        "overflow": False,
        "missing_glyph": False,
        "low_resolution_image": False,
        "broken_image": False,
        "blank_page": False,
    }
    assert parsed.preflight is None and parsed.preflight_checks() is None
    assert options.parse({"preflight": True}).preflight_checks() == options.Preflight()
    assert options.parse({"fail_on": {"blank_page": True}}).preflight_checks() is not None
    assert options.parse({"wait_delay_ms": 10_000}).wait_delay_ms == 10_000
    with pytest.raises(OptionsError) as caught:
        options.parse({"wait_delay_ms": -1, "lazy_load": "yes", "fail_on": {"pages": True}})
    assert [field for field, _ in caught.value.errors] == [
        "options.wait_delay_ms",
        "options.lazy_load",
        "options.fail_on.pages",
    ]
    # Stored as given, read back the same.
    given = {"fail_on": {"console_errors": True}, "media_features": {"forced-colors": "active"}}
    assert options.to_json(options.parse(given)) == given


def test_media_features_map_to_playwright_and_reset_what_is_not_asked() -> None:
    assert options.parse(None).emulated_media() == {
        "media": "print",
        "color_scheme": "null",
        "reduced_motion": "null",
        "forced_colors": "null",
        "contrast": "null",
    }
    features = {"prefers-color-scheme": "dark", "prefers-reduced-motion": "reduce"}
    emulated = options.parse({"media": "screen", "media_features": features}).emulated_media()
    assert emulated["media"] == "screen" and emulated["color_scheme"] == "dark"
    assert emulated["reduced_motion"] == "reduce" and emulated["contrast"] == "null"
    with pytest.raises(OptionsError) as caught:
        options.parse({"media_features": {"prefers-sparkle": "yes"}})
    assert caught.value.errors == [
        ("options.media_features.prefers-sparkle", "is not a known field")
    ]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"headers": {"Content-Length": "1"}}, "Content-Length cannot be set"),
        ({"headers": {"bad name": "1"}}, "'bad name' is not a header name"),
        ({"headers": {"X-A": "1", "x-a": "2"}}, "x-a is given twice"),
        ({"headers": {"X-A": 1}}, "the value of X-A must be a string"),
        ({"headers": {f"X-{n}": "v" for n in range(51)}}, "at most 50 headers"),
        ({"cookies": [{"name": "a", "value": "has space"}]}, "must be a cookie value"),
        ({"cookies": [{"name": "a", "value": "b", "path": "app"}]}, "must be a path"),
        ({"cookies": [{"name": "a", "value": "b", "expires": 1}]}, "is not a known field"),
        ({"user_agent": "Bot\n1"}, "must be printable ASCII"),
    ],
)
def test_cookies_headers_and_user_agent_are_checked_without_echoing_values(
    given: dict[str, object], message: str
) -> None:
    with pytest.raises(OptionsError) as caught:
        options.parse(given)
    assert message in str(caught.value)
    assert "has space" not in str(caught.value)


@pytest.mark.parametrize("opts", [{"lazy_load": True}, {"fail_on": {"console_errors": True}}])
def test_scrolling_and_catching_script_errors_run_scripts(opts: dict[str, object]) -> None:
    assert options.parse(opts).needs_javascript("<p>plain</p>")
    assert not options.parse({**opts, "javascript": False}).needs_javascript("<p>plain</p>")


@pytest.mark.parametrize(
    ("raw", "paper"),
    [
        ({}, (793.92, 1123.2)),  # A4 as Playwright prints it: 8.27 x 11.7 in
        ({"format": "letter", "landscape": True}, (1056.0, 816.0)),
        ({"width": "100mm", "height": "2in"}, (378.0, 192.0)),
        ({"width": 800, "height": "600px"}, (800.0, 600.0)),
        ({"format": "A5", "scale": 0.5}, (1119.36, 1587.84)),  # laid out at twice the size
    ],
)
def test_the_paper_in_css_pixels_of_the_page_laid_out_for_it(
    raw: dict[str, object], paper: tuple[float, float]
) -> None:
    assert options.parse(raw).paper_px() == pytest.approx(paper)
