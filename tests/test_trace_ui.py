"""Trace export and replay in the app: the download button and the upload in headless Chromium, and the
/export_trace and /import_trace endpoints through gradio_client. Screenshots go to test-artifacts/."""

from __future__ import annotations

import json
import re

import pytest

from specdec.io.trace import load_trace_file
from tests.conftest import ARTIFACTS
from tests.test_browser import ROUNDS, open_app, set_controls, settle, wait_status

pytestmark = pytest.mark.app  # both tests talk to the app in a subprocess
EXPORT = "#sd-export"


@pytest.mark.browser
def test_download_then_replay_a_trace_in_the_browser(page, app_url, tmp_path):
    open_app(page, app_url)
    assert page.locator(EXPORT).is_disabled(), "nothing to export before a run"
    set_controls(page, "Hello world", max_new=40, seed=2)
    page.click("#sd-generate")
    done = wait_status(page, "Done")
    page.wait_for_function(f"() => !document.querySelector('{EXPORT}').disabled", timeout=15_000)
    n_rounds = page.locator(ROUNDS).count()
    text = page.input_value("#sd-text textarea")

    with page.expect_download(timeout=15_000) as dl:
        page.click(EXPORT)
    path = tmp_path / dl.value.suggested_filename
    dl.value.save_as(path)
    assert path.name.startswith("specdec-trace-") and path.suffix == ".json"
    tr = load_trace_file(path)
    assert len(tr.rounds) == n_rounds and tr.text == text and tr.prompt == "Hello world"
    assert f"{len(tr.generated_ids)} tokens in {n_rounds} rounds" in done
    settle(page)
    page.locator("#sd-trace").screenshot(path=str(ARTIFACTS / "trace-export.png"))

    # a fresh page (another session) replays the file without generating anything
    page.goto(app_url)
    page.wait_for_selector("#sd-import")
    page.set_input_files("#sd-import input[type=file]", str(path))
    status = wait_status(page, "Replaying a trace")
    assert f"{len(tr.generated_ids)} tokens in {n_rounds} rounds" in status and "tiny:target" in status
    assert page.locator(ROUNDS).count() == n_rounds
    assert page.input_value("#sd-text textarea") == text
    page.wait_for_selector("#sd-pq .js-plotly-plot")
    assert page.locator("#sd-round input").input_value().startswith(f"Round {n_rounds}:")
    # the replay can be downloaded again, unchanged
    page.wait_for_function(f"() => !document.querySelector('{EXPORT}').disabled", timeout=15_000)
    with page.expect_download(timeout=15_000) as dl2:
        page.click(EXPORT)
    again = tmp_path / "again.json"
    dl2.value.save_as(again)
    assert again.read_bytes() == path.read_bytes()
    settle(page)
    page.screenshot(path=str(ARTIFACTS / "trace-replay.png"), full_page=True)

    # the Learn tab replays the trace's rounds too
    page.get_by_role("tab", name="Learn").click()
    page.locator("#learn-round input").click()
    page.get_by_role("option", name=re.compile(f"^Your run: Round {n_rounds}:")).click()
    page.wait_for_function("() => document.querySelector('#learn-walkthrough').innerText.includes("
                           f"'Round {n_rounds},')", timeout=15_000)
    page.get_by_role("tab", name="Playground").click()

    # a broken file: a clear message, and the replay on screen stays
    bad = tmp_path / "broken.json"
    doc = json.loads(path.read_text())
    doc["rounds"][0]["n_accepted"] = 99
    bad.write_text(json.dumps(doc))
    page.set_input_files("#sd-import input[type=file]", str(bad))
    error = wait_status(page, "rounds[0].n_accepted")
    assert "is 99, more than the" in error
    assert page.locator("#sd-status .sd-status-error").count() == 1
    assert page.locator(ROUNDS).count() == n_rounds
    settle(page)
    page.locator("#sd-main").screenshot(path=str(ARTIFACTS / "trace-error.png"))


def test_trace_api_round_trip(app_url, tmp_path):
    from gradio_client import Client, handle_file

    args = ("def f(x):", True, 3, 30, 0.9, 0, 0.95, 5, "tiny", "", "")
    a = Client(app_url, verbose=False)
    assert a.predict(api_name="/export_trace") is None  # no run yet
    final = a.predict(*args, api_name="/generate")
    path = a.predict(api_name="/export_trace")
    tr = load_trace_file(path)
    assert tr.prompt == "def f(x):" and tr.settings.chat is True
    assert tr.text == final[8] and tr.metrics.speedup is not None and tr.costs.target_ms > 0

    b = Client(app_url, verbose=False)
    replay = b.predict(handle_file(path), api_name="/import_trace")
    assert "Replaying a trace" in replay[0]
    assert replay[1] == final[1] and replay[8] == final[8]  # the same token view and text
    assert replay[3] == final[3]  # stats, speedup included, from the costs the trace recorded

    # malformed files: a message naming the problem; the session keeps its replay
    for raw, message in ((b"\xff\xfe", "not UTF-8"), (b"[1, 2]", "must be a JSON object"),
                         (b'{"schema": "specdec.trace", "version": 9}', "newer specdec")):
        bad = tmp_path / "bad.json"
        bad.write_bytes(raw)
        out = b.predict(handle_file(str(bad)), api_name="/import_trace")
        assert "sd-status-error" in out[0] and message in out[0], out[0]
        assert out[8] == final[8]
    again = b.predict(api_name="/export_trace")
    assert open(again, "rb").read() == open(path, "rb").read()
