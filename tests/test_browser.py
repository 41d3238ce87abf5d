"""The playground end to end: headless Chromium against `python app.py` on the tiny pair, plus API and session checks.

Screenshots (light, dark, 390 px mobile) and the measured click-to-first-round time go to test-artifacts/.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import ARTIFACTS, free_port

pytestmark = pytest.mark.app  # every test here talks to the app in a subprocess

ROUNDS = "#sd-tokens .rnd"
HAS_MIXED_ROUNDS = """() => {
  const t = document.querySelector('#sd-tokens');
  return t.querySelectorAll('.rnd').length >= 2 && !!t.querySelector('.tok-acc')
      && !!t.querySelector('.tok-rej') && !!t.querySelector('.tok-rep')
      && !!document.querySelector('#sd-pq .js-plotly-plot');
}"""
STATUS = "#sd-status"


def status_text(page) -> str:
    return page.inner_text(STATUS).strip()


def wait_status(page, *prefixes: str, timeout: float = 30_000) -> str:
    try:
        page.wait_for_function(
            "(ps) => { const s = document.querySelector('#sd-status').innerText.trim(); "
            "return ps.some(p => s.startsWith(p)); }", arg=list(prefixes), timeout=timeout)
    except Exception:
        page.screenshot(path=str(ARTIFACTS / "failure.png"), full_page=True)
        raise AssertionError(f"status never started with {prefixes}; it says: {status_text(page)!r}") from None
    return status_text(page)


def open_app(page, url: str) -> None:
    page.goto(url)
    page.wait_for_selector("#sd-generate")
    # the tiny pair loads (and is timed) in the background; the badge says when it is ready
    page.wait_for_selector('#sd-model-badge [data-state="ready"]', timeout=60_000)
    # the page switches the drafter to the first example's once loaded; wait, so set_controls is not undone
    page.wait_for_function("() => document.querySelector('#sd-drafter input').value === 'n-gram lookup'",
                           timeout=30_000)


def set_controls(page, prompt: str, max_new: int = 400, seed: int = 0, chat: bool = False) -> None:
    """The prompt and settings these tests use: the draft model at γ = 4, T = 0.7 (the page opens on a grounded
    example with the n-gram drafter at T = 0)."""
    page.fill("#sd-prompt textarea", prompt)
    box = page.locator("#sd-chat input[type=checkbox]")
    if box.is_checked() != chat:
        box.click()
    if page.locator("#sd-drafter input").input_value() != "draft model":
        page.locator("#sd-drafter input").click()
        page.get_by_role("option", name="draft model", exact=True).click()
    for sel, value in (("#sd-max-new input[type=number]", max_new), ("#sd-seed input[type=number]", seed),
                       ("#sd-gamma input[type=number]", 4), ("#sd-temperature input[type=number]", 0.7)):
        page.fill(sel, str(value))
        page.press(sel, "Enter")


def start_and_stop_mid_run(page) -> None:
    """Generate until two or more rounds show accepted and rejected/repaired tokens, then Stop.

    The random tiny models can hit end-of-text early for some seeds (and numerics differ between float32 and bf16
    CPUs), so a run that finishes before Stop is retried with the next seed.
    """
    for seed in range(8):
        page.click("#sd-reset")  # clear the view, so the wait below cannot be satisfied by an earlier run
        wait_status(page, "Reset")
        set_controls(page, "Hello world", seed=seed)
        page.click("#sd-generate")
        page.wait_for_function(
            f"() => ({HAS_MIXED_ROUNDS})() || document.querySelector('#sd-status').innerText.trim().startsWith('Done')",
            timeout=30_000)
        page.click("#sd-stop")
        if wait_status(page, "Stopped", "Done").startswith("Stopped"):
            # Stop's own update redraws the chart (Gradio re-creates the Plotly div), so wait rather than peek
            page.wait_for_function(HAS_MIXED_ROUNDS, timeout=15_000)
            return
    pytest.fail("no seed gave a run long enough to stop mid-way")


def settle(page) -> None:
    """Let the entrance animations (≤ 1.3 s) finish before a screenshot."""
    page.wait_for_timeout(1500)


def click_to_first_round_ms(page) -> float:
    """Click Generate and time, inside the page, until the first round is in the DOM (no polling lag)."""
    page.evaluate("""() => {
      window.__sd = {};
      const tokens = document.querySelector('#sd-tokens');
      new MutationObserver((_, obs) => {
        if (tokens.querySelector('.rnd')) { window.__sd.first = performance.now(); obs.disconnect(); }
      }).observe(tokens, {childList: true, subtree: true});
      document.querySelector('#sd-generate').addEventListener('click', () => { window.__sd.click = performance.now(); },
                                                              {capture: true, once: true});
    }""")
    page.click("#sd-generate")
    page.wait_for_function("() => window.__sd.first !== undefined", timeout=30_000)
    return round(page.evaluate("window.__sd.first - window.__sd.click"), 1)


def save_timing(name: str, value) -> None:
    path = ARTIFACTS / "timings.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[name] = value
    path.write_text(json.dumps(data, indent=2))


@pytest.mark.browser
def test_generate_streams_rounds_then_step_adds_exactly_one(page, app_url):
    open_app(page, app_url)
    set_controls(page, "Hello world")
    save_timing("tiny_click_to_first_round_ms", click_to_first_round_ms(page))
    page.click("#sd-stop")
    wait_status(page, "Stopped", "Done")

    start_and_stop_mid_run(page)
    assert page.locator("#sd-tokens .tok-disc").count() + page.locator("#sd-tokens .tok-bonus").count() > 0
    n = page.locator(ROUNDS).count()

    page.click("#sd-step")
    assert wait_status(page, "Stepped round").startswith(f"Stepped round {n + 1}:")
    assert page.locator(ROUNDS).count() == n + 1
    assert page.locator("#sd-phases .sd-phase").count() == 4  # draft, verify, accept/reject, repair/bonus

    # the keyboard shortcut steps too, but not while typing in a text field
    page.locator("#sd-prompt textarea").focus()
    page.keyboard.press("s")
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("s")
    assert wait_status(page, f"Stepped round {n + 2}").startswith(f"Stepped round {n + 2}:")
    assert page.locator(ROUNDS).count() == n + 2
    # a press while a Step runs queues the next one: two quick presses, two rounds
    page.keyboard.press("s")
    page.keyboard.press("s")
    wait_status(page, f"Stepped round {n + 4}")
    # the status and the token view are separate DOM updates of one event: let the view catch up before counting
    try:
        page.wait_for_function(f"() => document.querySelectorAll('{ROUNDS}').length >= {n + 4}", timeout=10_000)
    except Exception:
        raise AssertionError(f"{page.locator(ROUNDS).count()} rounds on screen, want {n + 4}; "
                             f"status: {status_text(page)!r}") from None
    assert page.locator(ROUNDS).count() == n + 4
    settle(page)
    page.screenshot(path=str(ARTIFACTS / "playground-light.png"), full_page=True)


# Counts the window "resize" listeners alive at any moment: each Plotly chart that stays reachable holds one.
LIVE_RESIZE_LISTENERS = """(() => {
  const live = new Set(), add = window.addEventListener, remove = window.removeEventListener;
  window.addEventListener = function (type, fn, ...rest) { if (type === 'resize') live.add(fn); return add.call(this, type, fn, ...rest); };
  window.removeEventListener = function (type, fn, ...rest) { if (type === 'resize') live.delete(fn); return remove.call(this, type, fn, ...rest); };
  window.__liveResize = () => live.size;
})();"""


@pytest.mark.browser
def test_runs_leave_no_charts_or_stored_outputs_behind(page, app_url):
    """Gradio mounts a new Plotly chart for each new figure and drops the old one without Plotly.purge, whose resize
    listener then keeps it alive; and Gradio's run history copies every streamed update into localStorage. Either
    made each run of the page cost more than the one before. Three runs (each with a Reset) must leave the page with
    as many live charts as one did, and nothing of the runs in the browser's storage."""
    page.add_init_script(LIVE_RESIZE_LISTENERS)
    open_app(page, app_url)
    set_controls(page, "Hello world", max_new=24)
    live = []
    for _ in range(3):
        page.click("#sd-reset")
        wait_status(page, "Reset")
        page.click("#sd-generate")
        wait_status(page, "Done", "Stopped")
        page.wait_for_function("() => !!document.querySelector('#sd-pq .js-plotly-plot')")
        page.wait_for_timeout(300)  # the removal records reach the page's observer after the update
        live.append(page.evaluate("() => window.__liveResize()"))
    assert live[2] == live[0], f"live chart resize listeners after each run: {live}"
    stored = page.evaluate("() => Object.keys(window.localStorage).filter(k => k.startsWith('gradio:run-history'))")
    assert stored == []


@pytest.mark.browser
def test_clicking_a_token_charts_its_position(page, app_url):
    open_app(page, app_url)
    start_and_stop_mid_run(page)
    chip = page.locator("#sd-tokens .tok-rej").first
    r, p = int(chip.get_attribute("data-r")), int(chip.get_attribute("data-p"))
    # two clicks in one go, as a quick user makes them: the second arrives while the first is still answered
    page.evaluate("""(chip) => new Promise((done) => {
      document.querySelector('#sd-tokens .rnd .tok').click();
      setTimeout(() => { chip.click(); done(); }, 30);
    })""", chip.element_handle())
    page.wait_for_function(
        "(want) => (document.querySelector('#sd-pq .gtitle')?.textContent || '').startsWith(want)",
        arg=f"Round {r + 1}, position {p}", timeout=15_000)
    assert "rejected" in page.locator("#sd-pq .gtitle").text_content()


@pytest.mark.browser
def test_bad_input_shows_a_message_and_the_app_keeps_working(page, app_url):
    open_app(page, app_url)
    page.fill("#sd-prompt textarea", "   ")
    page.click("#sd-generate")
    assert "prompt is empty" in wait_status(page, "the prompt is empty")
    assert page.locator("#sd-status .sd-status-error").count() == 1

    # markup in the prompt is shown as text, never parsed
    set_controls(page, "<b id='inj'>bold</b><img src=x onerror=alert(1)>", max_new=8)
    page.click("#sd-generate")
    wait_status(page, "Done")
    assert page.locator("#inj").count() == 0
    assert page.inner_text("#sd-tokens .sd-prompt").startswith("<b id='inj'>bold</b>")

    page.click("#sd-reset")
    wait_status(page, "Reset")
    assert page.locator(ROUNDS).count() == 0


@pytest.mark.browser
def test_dark_theme_screenshot(page, app_url):
    open_app(page, app_url + "?__theme=dark")
    start_and_stop_mid_run(page)
    page.click("#sd-step")
    wait_status(page, "Stepped round")
    assert page.evaluate("document.querySelector('.dark') !== null")
    settle(page)
    page.screenshot(path=str(ARTIFACTS / "playground-dark.png"), full_page=True)


@pytest.mark.browser
def test_mobile_viewport_screenshot(browser, app_url):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2, is_mobile=True)
    page = ctx.new_page()
    try:
        open_app(page, app_url)
        start_and_stop_mid_run(page)
        # nothing may push the page sideways on a phone
        assert page.evaluate("document.documentElement.scrollWidth") <= 390 + 1
        settle(page)
        page.screenshot(path=str(ARTIFACTS / "playground-mobile.png"), full_page=True)
    finally:
        ctx.close()


def test_api_endpoints_and_one_round_per_step(app_url):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    args = ("Hello world", False, 4, 40, 0.7, 0, 1.0, 3, "tiny", "", "")
    first = client.predict(*args, api_name="/step")
    second = client.predict(*args, api_name="/step")
    assert first[0].count("Stepped round 1:") == 1 and "Stepped round 2:" in second[0]
    assert second[1].count('class="rnd"') == 2
    streamed = list(client.submit(*args, api_name="/run_to_end"))
    assert len(streamed) >= 2 and "Done:" in streamed[-1][0]
    reset = client.predict(api_name="/reset")
    assert "Reset" in reset[0] and 'class="rnd"' not in reset[1]
    empty = client.predict("  ", False, 4, 40, 0.7, 0, 1.0, 0, "tiny", "", "", api_name="/generate")
    assert "sd-status-error" in empty[0] and "prompt is empty" in empty[0]
    # an unknown model id is refused with a message (offline here; online the hub answers 404 the same way)
    missing = client.predict("Hello", False, 4, 40, 0.7, 0, 1.0, 0, "default", "no-such-org/no-such-model", "",
                             api_name="/generate")
    assert "sd-status-error" in missing[0] and "no-such-org/no-such-model" in missing[0]
    # and the app still works afterwards
    assert "Stepped round 1:" in client.predict(*args, api_name="/step")[0]


def test_sessions_share_the_models_by_reference(tiny_pair):
    """Two browser sessions get their own decoders, and both hold the one loaded pair: Gradio copies nothing."""
    from gradio_client import Client

    import app
    from ui.loader import PairLoader, PairRequest
    from ui.playground import Playground, Session

    pg = Playground(PairLoader(dtype="float32", device="cpu"), PairRequest("tiny"))
    demo = app.build_demo(pg)
    demo.queue()
    _, url, _ = demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    try:
        args = ("Hello world", False, 4, 16, 0.7, 0, 1.0, 0, "tiny", "", "")
        for _ in range(2):
            Client(url, verbose=False).predict(*args, api_name="/step")
        sessions = [v for s in demo.state_holder.session_data.values() for v in s.state_data.values()
                    if isinstance(v, Session)]
        assert len(sessions) == 2
        assert sessions[0].decoder is not sessions[1].decoder
        for s in sessions:
            assert s.decoder.pair is tiny_pair  # load_pair memoizes; the session holds that very object
            assert s.decoder.pair.target is tiny_pair.target and s.decoder.pair.draft is tiny_pair.draft
    finally:
        demo.close()


def test_unexpected_errors_become_a_short_message_not_a_traceback(tiny_pair, monkeypatch):
    import ui.playground as playground
    from ui.loader import PairLoader, PairRequest

    pg = playground.Playground(PairLoader(dtype="float32", device="cpu"), PairRequest("tiny"))

    def broken(*args, **kwargs):
        raise RuntimeError("kaboom")

    monkeypatch.setattr(playground, "SpeculativeDecoder", broken)
    outputs = list(playground.guarded(pg.generate)(None, "Hello", False, 4, 8, 0.7, 0, 1.0, 0, "tiny", "", ""))
    status = outputs[-1][1]
    assert "sd-status-error" in status and "Unexpected error (RuntimeError): kaboom" in status
    assert "Traceback" not in status
    # the session survives: once the bug is gone the next Step works
    monkeypatch.undo()
    session = outputs[-1][0]
    stepped = list(playground.guarded(pg.step)(session, "Hello", False, 4, 8, 0.7, 0, 1.0, 0, "tiny", "", ""))
    assert "Stepped round 1:" in stepped[-1][1]
