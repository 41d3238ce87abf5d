"""The bug zoo and the break-even map in headless Chromium against `python app.py` on the tiny pair.

Run under the shared lock: `flock /tmp/specdec-heavy.lock pytest -m browser tests/test_browser_zoo.py`.
Screenshots go to zoo.png, zoo-eleven.png (the tree entry and every entry's verdict) and breakeven.png under
tests.conftest.SCREENSHOTS (test-artifacts/ unless SPECDEC_SCREENSHOTS says otherwise).
"""

from __future__ import annotations

import re

import pytest

from components.zoo import ZOO_CHOICES
from specdec.learn import zoo
from tests.conftest import SCREENSHOTS
from tests.test_browser_learn import _open_learn, _record_a_run, _wait_text

pytestmark = [pytest.mark.browser, pytest.mark.app]
LABELS = {key: label for label, key in ZOO_CHOICES}
EXPECTED = {key: "exact" if key == "none" else ("hidden" if key == "bf16-draw" else "caught") for key in zoo.ENTRIES}


def _pick(page, selector: str, label: str) -> None:
    page.locator(f"{selector} input").click()
    page.get_by_role("option", name=label, exact=True).click()


def _shot(page, selector: str, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    el = page.locator(selector).first
    el.scroll_into_view_if_needed()
    page.wait_for_timeout(400)  # let Plotly finish its transition before the picture
    el.screenshot(path=str(SCREENSHOTS / name))


def test_every_zoo_entry_shows_its_verdict_at_the_default_n(page, app_url):
    _open_learn(page, app_url)
    n = page.locator("#learn-lab-n input").input_value()
    assert n == "20000", n  # the lab's default N
    # One card per kind of verdict (the tree entry's comes last); tests/test_zoo.py checks every entry's verdict in
    # process, and the overview below shows every entry's in the page.
    for key in ("none", "bf16-draw", "q-before-topk"):
        verdict = EXPECTED[key]
        _pick(page, "#learn-zoo-key", LABELS[key])
        page.click("#learn-zoo-run")
        page.wait_for_selector(f'#learn-zoo-result .zoo-result[data-key="{key}"]', timeout=60_000)
        assert page.locator("#learn-zoo-result .zoo-result").get_attribute("data-verdict") == verdict
        assert page.locator("#learn-zoo-result .zoo-verdict").inner_text().startswith(f"{verdict.upper()} · p-value")
        text = page.locator("#learn-zoo-result").inner_text()
        assert "N = 20,000" in text or verdict == "exact", text
        if verdict == "hidden":
            # It cannot be seen at this N, and the note says which N would.
            assert re.search(r"needs about [\d.]+ million rounds for even odds", text), text
        if verdict == "caught":
            assert "p-value 0" in text or re.search(r"p-value [\d.e-]+ < 0.001", text), text
        assert page.locator("#learn-zoo-result .zoo-ref a").count() == 1
        assert page.locator("#learn-zoo-plot .js-plotly-plot").count() == 1
    # The overview: every entry at once, same N.
    page.click("#learn-zoo-all")
    page.wait_for_selector("#learn-zoo-table tr.zoo-row", timeout=60_000)
    rows = page.locator("#learn-zoo-table tr.zoo-row")
    assert rows.count() == len(EXPECTED)
    got = {rows.nth(i).get_attribute("data-key"): rows.nth(i).get_attribute("data-verdict")
           for i in range(rows.count())}
    assert got == EXPECTED
    # The picture: the top-k bug (the card on screen), with the table below it.
    assert page.locator("#learn-zoo-result .zoo-result").get_attribute("data-key") == "q-before-topk"
    _shot(page, "#learn-zoo-section", "zoo.png")
    # The tree entry's pair chart, with the same table of every entry's verdict below it.
    _pick(page, "#learn-zoo-key", LABELS["eagle-tree-bonus"])
    page.click("#learn-zoo-run")
    page.wait_for_selector('#learn-zoo-result .zoo-result[data-key="eagle-tree-bonus"]', timeout=60_000)
    assert page.locator("#learn-zoo-result .zoo-result").get_attribute("data-verdict") == "caught"
    assert "cat→dog" in page.locator("#learn-zoo-plot").inner_text()
    _shot(page, "#learn-zoo-section", "zoo-eleven.png")


def test_zoo_on_the_real_rows(page, app_url):
    _open_learn(page, app_url)
    _pick(page, "#learn-zoo-real-key", LABELS["target-not-warped"])
    page.click("#learn-zoo-real-run")
    text = _wait_text(page, "#learn-zoo-real-result", r"CAUGHT · p-value", timeout=120_000)
    assert "Real rows at your prefix" in text


def test_breakeven_map_places_a_run(page, app_url):
    page.goto(app_url)
    _record_a_run(page)
    page.get_by_role("tab", name="Learn").click()
    page.wait_for_selector("#learn-be-measure", timeout=30_000)
    page.locator("#learn-be-measure").scroll_into_view_if_needed()
    page.click("#learn-be-measure")
    _wait_text(page, "#learn-be-result", r"Measured on this machine", timeout=120_000)
    page.click("#learn-be-place")
    text = _wait_text(page, "#learn-be-result", r"recommended γ at this α")
    assert page.locator("#be-advice tr.be-run").count() >= 1, text
    assert page.locator("#learn-be-plot .js-plotly-plot").count() == 1
    _shot(page, "#learn-be-section", "breakeven.png")
