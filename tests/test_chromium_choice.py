"""Which Chromium the browser tests launch: Debian's, else Playwright's own, else a skip -- and a failure under CI."""

from __future__ import annotations

import pytest


DEBIAN = "/usr/bin/chromium"
BUNDLED = "/root/.cache/ms-playwright/chromium-9999/chrome-linux64/chrome"


def _pick(env: dict, present: set[str], bundled: str | None = BUNDLED) -> str:
    from tests.conftest import chromium_executable

    return chromium_executable(env, lambda p: p in present, bundled)


def test_browser_fixture_selects_debian_then_playwright_then_skips_or_fails_under_ci():
    # Debian's Chromium wins when present, even with Playwright's own installed.
    assert _pick({}, {DEBIAN, BUNDLED}) == DEBIAN
    assert _pick({}, {DEBIAN}) == DEBIAN
    # Without it, Playwright's own Chromium.
    assert _pick({}, {BUNDLED}) == BUNDLED
    assert _pick({"CI": "true"}, {BUNDLED}) == BUNDLED
    # SPECDEC_CHROMIUM replaces the Debian path (and a missing one falls through the same way).
    assert _pick({"SPECDEC_CHROMIUM": "/opt/chrome"}, {"/opt/chrome", DEBIAN}) == "/opt/chrome"
    assert _pick({"SPECDEC_CHROMIUM": "/nowhere"}, {DEBIAN, BUNDLED}) == BUNDLED
    # Neither: a skip that names both ways to get a browser...
    for env, bundled in (({}, BUNDLED), ({}, None), ({"CI": "false"}, BUNDLED), ({"CI": ""}, None)):
        with pytest.raises(pytest.skip.Exception) as skipped:
            _pick(env, set(), bundled)
        msg = str(skipped.value)
        assert "apt-get install" in msg and "chromium" in msg and "python -m playwright install chromium" in msg, msg
    # ...except under CI, where a missing browser fails the run.
    for ci in ("true", "TRUE", "1", "yes"):
        with pytest.raises(pytest.fail.Exception) as failed:
            _pick({"CI": ci}, set())
        msg = str(failed.value)
        assert "apt-get install" in msg and "python -m playwright install chromium" in msg and "CI" in msg, msg
