"""The Race tab in headless Chromium: plain, draft-model and ngram lanes on an input-grounded prompt at T = 0 must
write the same text. The screenshot goes to race.png under tests.conftest.SCREENSHOTS.

By default the app runs the tiny pair (shared `app_url`); SPECDEC_RACE_PAIR=default runs this test on the embedded
pair instead (minutes; run it under the heavy-job lock), which is how the README screenshot is made.
"""

from __future__ import annotations

import os

import pytest

from specdec.prompts import GROUNDED
from tests.conftest import ARTIFACTS, SCREENSHOTS, start_app, stop_app

pytestmark = [pytest.mark.browser, pytest.mark.app]

SHOT = SCREENSHOTS / "race.png"
ALL_DONE = """() => {
  const lanes = document.querySelectorAll('#race-view .race-lane');
  return lanes.length === 3 && [...lanes].every(l => l.dataset.state === 'done');
}"""


@pytest.fixture(scope="module")
def race_url(request):
    pair = os.environ.get("SPECDEC_RACE_PAIR", "tiny")
    if pair == "tiny":
        yield request.getfixturevalue("app_url")
        return
    proc, url = start_app({"SPECDEC_PAIR": pair}, ARTIFACTS / f"app-race-{pair}.log", timeout=600)
    yield url
    stop_app(proc)


def test_race_lanes_agree_at_temperature_zero(browser, race_url):
    ctx = browser.new_context(viewport={"width": 1440, "height": 1100})
    page = ctx.new_page()
    try:
        page.goto(race_url)
        page.get_by_role("tab", name="Race").click()
        page.wait_for_selector("#race-run", state="visible")
        page.fill("#race-prompt textarea", GROUNDED[0]["prompt"])
        if not page.locator("#race-chat input[type=checkbox]").is_checked():
            page.locator("#race-chat input[type=checkbox]").click()
        page.fill("#race-lanes textarea, #race-lanes input", "model:4, ngram:8")
        for sel, value in (("#race-max-new input[type=number]", 48), ("#race-temperature input[type=number]", 0)):
            page.fill(sel, str(value))
            page.press(sel, "Enter")
        page.click("#race-run")
        try:
            page.wait_for_function(ALL_DONE, timeout=600_000)
        except Exception:
            page.screenshot(path=str(ARTIFACTS / "race-failure.png"), full_page=True)
            raise
        texts = page.locator("#race-view .race-lane .race-text").all_inner_texts()
        assert len(texts) == 3 and texts[0].strip() and texts[0] == texts[1] == texts[2], texts
        labels = page.locator("#race-view .race-name").all_inner_texts()
        assert labels[0] == "plain target" and "draft model" in labels[1] and "n-gram lookup" in labels[2]
        note = page.inner_text("#race-note")
        assert "Temperature 0" in note and "fastest lane" in note
        # Every lane reports its speed, and the speculative ones a speedup against the plain lane.
        stats = page.locator("#race-view .race-stats").all_inner_texts()
        assert all("tok/s" in s and "tokens/pass" in s for s in stats) and all("×" in s for s in stats[1:])
        page.wait_for_selector("#race-plot .js-plotly-plot")
        SHOT.parent.mkdir(parents=True, exist_ok=True)
        page.locator("#race-view").scroll_into_view_if_needed()
        page.screenshot(path=str(SHOT), full_page=True)
    finally:
        ctx.close()
