"""Which Chromium Pressroom launches: Playwright's own build, else Debian's headless shell,
else the full chromium, else an error that says what to install."""

from __future__ import annotations

import pytest

from server.render import browsers


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """What exists on this pretend machine: paths, and command names on PATH."""
    present: set[str] = set()
    monkeypatch.setattr(browsers.os.path, "exists", lambda path: path in present)
    monkeypatch.setattr(
        browsers.shutil, "which", lambda name: f"/usr/bin/{name}" if name in present else None
    )
    return present


PLAYWRIGHT = "/ms-playwright/chromium_headless_shell-1/chrome-linux/headless_shell"


@pytest.mark.parametrize(
    ("present", "chosen"),
    [
        ({PLAYWRIGHT, "chromium-headless-shell", "chromium"}, PLAYWRIGHT),
        ({"chromium-headless-shell", "chromium"}, "/usr/bin/chromium-headless-shell"),
        ({"chromium"}, "/usr/bin/chromium"),
        ({"google-chrome"}, "/usr/bin/google-chrome"),
    ],
)
def test_the_engine_falls_back_in_order(
    installed: set[str], present: set[str], chosen: str
) -> None:
    installed |= present
    assert browsers.choose_chromium(PLAYWRIGHT) == chosen


def test_no_engine_is_a_clear_error(installed: set[str]) -> None:
    with pytest.raises(RuntimeError, match="chromium-headless-shell or chromium"):
        browsers.choose_chromium(PLAYWRIGHT)
