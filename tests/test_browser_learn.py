"""The Learn tab in headless Chromium against `python app.py` on the tiny pair: every section, as a learner uses it."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ARTIFACTS

pytestmark = [pytest.mark.browser, pytest.mark.app]

P_VALUE = re.compile(r"p-value = ([0-9.eE+-]+)")


def _p_value(text: str) -> float:
    m = P_VALUE.search(text)
    assert m, f"no p-value in {text!r}"
    return float(m.group(1))


def _open_learn(page, url):
    page.goto(url)
    page.get_by_role("tab", name="Learn").click()
    page.wait_for_selector("#learn-walkthrough .learn-walk", timeout=30_000)


def _shot(page, selector: str, name: str):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.locator(selector).first.scroll_into_view_if_needed()
    page.locator(selector).first.screenshot(path=str(ARTIFACTS / name))


def _wait_text(page, selector: str, pattern: str, timeout: float = 60_000):
    """Wait until the element's text matches pattern (a regex); returns the text."""
    page.wait_for_function(
        "([sel, pat]) => { const el = document.querySelector(sel); return el && new RegExp(pat).test(el.innerText); }",
        arg=[selector, pattern], timeout=timeout,
    )
    return page.locator(selector).first.inner_text()


def _record_a_run(page):
    """Generate in the playground so the Learn tab has recorded rounds to replay and plot."""
    page.locator("#sd-gamma input[type=number]").fill("4")
    page.locator("#sd-max-new input[type=number]").fill("40")
    page.locator("#sd-temperature input[type=number]").fill("1")
    page.click("#sd-generate")
    _wait_text(page, "#sd-status", r"Done:", timeout=120_000)


def test_learn_tab_end_to_end(page, app_url):
    page.goto(app_url)
    _record_a_run(page)
    page.get_by_role("tab", name="Learn").click()
    page.wait_for_selector("#learn-walkthrough .learn-walk", timeout=30_000)

    # 1. Walkthrough: all seven steps forward, the story's cells appear where they should, Back works.
    names = []
    for i in range(1, 8):
        text = _wait_text(page, "#learn-step-name", rf"Step {i} of 7")
        names.append(text)
        if i == 4:
            assert page.locator("#learn-walkthrough .learn-rejected").count() == 1
            assert page.locator("#learn-walkthrough .learn-discarded").count() == 0  # "down" is the last guess
        if i == 5:
            repair = page.locator("#learn-walkthrough .learn-out-repair")
            assert repair.count() == 1 and "nearby" in repair.inner_text()
            assert page.locator("#learn-walkthrough .learn-changed").count() == 1  # only the repair changed
            _shot(page, "#learn-walkthrough-section", "learn-walkthrough.png")
        if i < 7:
            page.click("#learn-next")
    assert "Round result" in names[-1]
    assert "The ·cat ·sat ·nearby" in page.locator("#learn-walkthrough").inner_text()
    page.click("#learn-next")  # past the end stays on the last step
    _wait_text(page, "#learn-step-name", r"Step 7 of 7")
    page.click("#learn-back")
    _wait_text(page, "#learn-step-name", r"Step 6 of 7: Bonus token")

    # A recorded playground round replays too.
    page.locator("#learn-round input").click()
    page.get_by_role("option", name=re.compile(r"^Your run: Round 1:")).click()
    _wait_text(page, "#learn-step-name", r"Step 1 of 7")
    assert "Round 1, after 0 generated tokens" in page.locator("#learn-walkthrough").inner_text()
    for i in range(2, 8):  # one click per step: a click while the previous update is pending is dropped
        page.click("#learn-next")
        _wait_text(page, "#learn-step-name", rf"Step {i} of 7")
    assert "from one target pass" in page.locator("#learn-walkthrough").inner_text()

    # 2. The 100-point picture: the defaults, then an edit to q that no longer sums to 100.
    summary = page.locator("#learn-100-summary")
    assert "α = Σ min(p, q) = 0.800" in summary.inner_text()
    assert "repair probability 1 − α = 0.200" in summary.inner_text()
    q_dog = page.locator("#learn-q-1 input")
    q_dog.fill("20")
    q_dog.press("Tab")
    text = _wait_text(page, "#learn-100-summary", r"rescaled")
    assert "added up to 110" in text
    assert "α = Σ min(p, q) = 0.882" in text  # 50 + 20/110·100 + 20 points kept
    _shot(page, "#learn-100-section", "learn-100points.png")
    q_dog.fill("-5")
    q_dog.press("Tab")
    assert "negative" in _wait_text(page, "#learn-100-summary", r"negative")
    q_dog.fill("20")
    q_dog.press("Tab")
    _wait_text(page, "#learn-100-summary", r"0\.882")

    # 3. Exactness lab: the rule passes the chi-square at N = 20 000, a wrong repair fails it.
    page.locator("#learn-lab-n input").fill("20000")
    page.click("#learn-lab-run")
    text = _wait_text(page, "#learn-lab-result", r"p-value = .*\n[\s\S]*20,000 rounds[\s\S]*Correct")
    assert _p_value(text) > 1e-3, text
    page.locator("#learn-lab-repair").get_by_text("Wrong: fresh draw from p").click()
    text = _wait_text(page, "#learn-lab-result", r"fresh draw from p")
    assert _p_value(text) < 1e-3, text
    assert "does not follow p" in text
    _shot(page, "#learn-lab-section", "learn-lab.png")

    # 4. Real models (the tiny pair here): vectorized draws and a few real decoder rounds, both against p0.
    page.locator("#learn-real-k input").fill("30")
    page.click("#learn-real-run")
    text = _wait_text(page, "#learn-real-result", r"Real decoder rounds: the first token of 30", timeout=180_000)
    assert _p_value(page.locator("#learn-real-pvalue").inner_text()) > 1e-3, text
    assert "Every one emitted a token p0 allows" in text
    _shot(page, "#learn-real-section", "learn-real.png")

    # 5. Speedup: the recorded run is on the chart, and c moves the curves.
    text = _wait_text(page, "#learn-speedup-summary", r"your last run")
    assert re.search(r"α = 0\.\d{3}", text)
    page.locator("#learn-c input[type=number]").fill("0.5")
    page.locator("#learn-c input[type=number]").press("Enter")
    _wait_text(page, "#learn-speedup-summary", r"c = 0\.50")
    _shot(page, "#learn-speedup-section", "learn-speedup.png")


def test_learn_walkthrough_steps_through_a_token_tree(page, app_url):
    """The built-in tree round: one step per child the rule tried, the refused " cat" struck through, the path lit,
    the bonus only once the walk is over."""
    _open_learn(page, app_url)
    page.locator("#learn-round input").click()
    page.get_by_role("option", name=re.compile(r"^Example: a token tree")).click()
    _wait_text(page, "#learn-step-name", r"Step 1 of 7: Draft a token tree")
    tree = "#learn-walkthrough .sd-tree"
    assert page.locator(f'{tree} [data-fate="untried"]').count() == 4  # (the legend's samples carry no data-fate)
    for i, name in ((2, "One pass"), (3, "Try cat"), (4, "Try dog"), (5, "Try ran"), (6, "Bonus token")):
        page.click("#learn-next")
        _wait_text(page, "#learn-step-name", rf"Step {i} of 7: {name}")
        if i == 3:
            assert page.locator(f'{tree} [data-fate="rejected"]').count() == 1
        if i == 5:
            assert page.locator(f'{tree} [data-fate="accepted"]').count() == 2
            assert page.locator(f"{tree} [data-kind]").count() == 0
    assert page.locator(f'{tree} [data-kind="bonus"]').count() == 1
    assert "away" in page.locator("#learn-walkthrough .learn-story").inner_text()
    _shot(page, "#learn-walkthrough-section", "learn-tree-walkthrough.png")


def test_learn_tab_dark_theme(page, app_url):
    _open_learn(page, app_url + "?__theme=dark")
    for i in range(2, 6):  # wait for each step: a click while the previous update is pending is dropped
        page.click("#learn-next")
        _wait_text(page, "#learn-step-name", rf"Step {i} of 7")
    page.click("#learn-lab-run")
    _wait_text(page, "#learn-lab-result", r"p-value =")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "learn-dark.png"), full_page=True)
    bg = page.evaluate("getComputedStyle(document.body).backgroundColor")
    assert bg != "rgb(255, 255, 255)", "dark theme did not apply"
