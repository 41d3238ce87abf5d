"""The batch benchmark (specdec/bench/batch.py), its figures and views (components/batch.py) and the Batch tab's
handlers (ui/batch_tab.py), on the tiny pair: bookkeeping, prediction math, bad input."""

from __future__ import annotations

import json

import gradio as gr
import pytest

from components import batch as view
from specdec.bench import batch as bb
from specdec.cli import main
from specdec.core.errors import InvalidInputError
from specdec.core.speedup import expected_tokens_per_round, lockstep_tokens_per_row
from ui import batch_tab

TINY = ["--pair", "tiny", "--dtype", "float32", "--device", "cpu"]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """One small measurement through the CLI: B in {1, 2, 4}, both modes, 10 tokens per request."""
    out = tmp_path_factory.mktemp("batch") / "batch.json"
    assert main(["bench", "--batch", "1,2,4", *TINY, "--max-new-tokens", "10", "--gamma", "3", "--out", str(out)]) == 0
    return json.loads(out.read_text())


def test_cli_writes_every_row_with_consistent_figures(result, capsys):
    assert result["batches"] == [1, 2, 4] and result["modes"] == ["greedy", "sampled"] and result["gamma"] == 3
    rows = result["rows"]
    assert [(r["mode"], r["batch"]) for r in rows] == [(m, b) for m in ("greedy", "sampled") for b in (1, 2, 4)]
    for r in rows:
        assert r["speedup"] == pytest.approx(r["spec_tok_s"] / r["plain_tok_s"])
        assert r["verify_tokens"] in (r["batch"] * (g + 1) for g in (1, 2, 3))  # gamma shrinks near the budget
        assert 1 <= r["tokens_per_round_per_row"] <= 4 and 0 <= r["alpha"] <= 1
        assert r["plain_latency_ms"] > 0 and r["spec_latency_ms"] > 0
        assert r["accepted"] == round(r["alpha"] * r["tested"])  # one repeat: the pooled count is that run's
        assert r["predicted_tokens_per_round_per_row"] == pytest.approx(
            lockstep_tokens_per_row(result["fits"][r["mode"]]["alpha"], 3, r["batch"]))
    for mode in ("greedy", "sampled"):
        rows_m = [r for r in rows if r["mode"] == mode]
        assert result["fits"][mode]["alpha"] == pytest.approx(sum(r["accepted"] for r in rows_m) /
                                                              sum(r["tested"] for r in rows_m))
        assert set(result["crossover"][mode]) == {"measured", "measured_steady", "predicted"}
        assert len(result["prediction_curve"][mode]) == bb.PREDICT_UP_TO
    ex = result["example"]
    assert ex["batch"] == 4 and len(ex["rounds"][0]["committed"]) == 4


def test_table_names_the_crossover():
    res = {"gamma": 2, "max_new_tokens": 8, "repeats": 1, "models": {"name": "x"}, "device": "cpu", "dtype": "float32",
           "torch_threads": 2, "batches": [1, 2], "modes": ["greedy"], "rows": [_row(1, 2.0), _row(2, 0.8)]}
    bb.add_predictions(res)
    text = bb.format_table(res)
    assert "speculation stops paying at B = 2 (measured)" in text
    assert res["crossover"]["greedy"]["measured"] == 2


def _row(b, speedup, mode="greedy"):
    return {"mode": mode, "batch": b, "gamma": 2, "plain_tok_s": 10.0, "spec_tok_s": 10 * speedup, "speedup": speedup,
            "plain_steady_tok_s": 10.0, "spec_steady_tok_s": 10 * speedup, "steady_speedup": speedup,
            "plain_latency_ms": 1000.0, "spec_latency_ms": 1000.0 / speedup, "plain_max_latency_ms": 1000.0,
            "spec_max_latency_ms": 1000.0, "tokens_per_round_per_row": 2.0, "alpha": 0.7, "accepted": 7 * b,
            "tested": 10 * b, "thrown_per_round": float(b - 1), "verify_ms": 10.0 + 5 * b * 3, "verify_tokens": 3 * b,
            "draft_pass_ms": 3.0 + b, "plain_step_ms": 10.0 + 4 * b}


def test_prediction_math():
    # B = 1 is the batch-1 formula's tokens per round; more rows can only lower it, towards 1
    for a in (0.3, 0.7, 0.95):
        assert lockstep_tokens_per_row(a, 4, 1) == pytest.approx(expected_tokens_per_round(a, 4))
        assert lockstep_tokens_per_row(a, 4, 8) < lockstep_tokens_per_row(a, 4, 2) < expected_tokens_per_round(a, 4)
    assert lockstep_tokens_per_row(1.0, 4, 16) == 5.0
    assert bb.line_fit([1, 2, 3], [3, 5, 7]) == pytest.approx((1.0, 2.0))
    assert bb.line_fit([1, 2, 3], [7, 5, 3]) == pytest.approx((5.0, 0.0))  # a falling cost is noise: flat
    assert bb.line_fit([1, 2, 3], [0.5, 5, 9.5])[0] == 0.0  # never a negative fixed cost
    assert bb.line_fit([4], [9.0]) == (9.0, 0.0) and bb.line_fit([], []) is None
    fits = {"verify": (10.0, 1.0), "draft": (2.0, 0.5), "plain": (10.0, 0.5)}
    p = bb.predict(0.8, 4, 2, fits)
    assert p["spec_tok_s"] == pytest.approx(1e3 * 2 * lockstep_tokens_per_row(0.8, 4, 2) / (4 * 3.0 + 20.0))
    assert p["plain_tok_s"] == pytest.approx(1e3 * 2 / 11.0)
    assert bb.crossover([(4, 0.9), (1, 1.5), (2, 1.1)]) == 4 and bb.crossover([(1, 1.2)]) is None


@pytest.mark.parametrize("text,match", [("", "at least one"), ("1,x", "comma list"), ("1,17", "from 1 to 16"),
                                        ("0", "from 1 to 16"), ("2,2", "repeat")])
def test_bad_batch_lists_are_refused(text, match):
    with pytest.raises(InvalidInputError, match=match):
        bb.parse_batches(text)


def test_cli_bad_batch_is_a_clear_error(capsys):
    assert main(["bench", "--batch", "1,32", *TINY]) == 2
    assert "batch sizes must be from 1 to 16" in capsys.readouterr().err


def test_load_result_refuses_other_files(tmp_path, result):
    (tmp_path / "x.json").write_text(json.dumps({"groups": {}}))
    with pytest.raises(InvalidInputError, match="not a batch benchmark"):
        bb.load_result(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("{nope")
    with pytest.raises(InvalidInputError, match="could not read"):
        bb.load_result(tmp_path / "y.json")
    stripped = {k: v for k, v in result.items() if k not in ("fits", "crossover", "prediction_curve")}
    (tmp_path / "z.json").write_text(json.dumps(stripped))
    assert bb.load_result(tmp_path / "z.json")["crossover"] == result["crossover"]  # recomputed from the rows


def test_figures_show_prediction_beside_measurement(result):
    fig = view.batch_figure(result)
    names = [t.name for t in fig.data]
    for mode in ("greedy", "T = 0.7"):
        assert f"measured · {mode}" in names and f"predicted · {mode}" in names
        assert f"plain · {mode}" in names and f"speculative · {mode}" in names
    cost = view.cost_figure(result)
    assert any(t.name.startswith("verify") for t in cost.data) and any(t.name.startswith("fit") for t in cost.data)
    assert view.batch_figure(None).layout.annotations  # an empty figure says what to do
    for note in fig.layout.annotations:
        if note.text.startswith("crossover B="):  # on the log axis, at log10(B)
            assert 10 ** note.x == pytest.approx(int(note.text.split("=")[1]))
    reading = view.crossover_reading(result)
    assert "least-accepted row" in reading and "B×(γ+1)" in reading


def test_batch_view_shows_waiting_rows_and_the_slowest():
    rnd = {"index": 0, "gamma": 3, "active": [True, True, False], "n_accepted": [1, 3, None], "slowest": 1,
           "committed": [[5, 6], [7, 8], []], "pieces": [["a", "b"], ["c", " d"], []], "own": [True, False, False],
           "held": [0, 2, 0], "thrown": 2}
    out = view.render_batch_view([rnd], ["first <prompt>", "second"])
    assert out.count("sdb-slow'") + out.count("sdb-slow ") >= 1 and "slowest" in out
    assert "+2 held" in out and "sdb-wait" in out and "done" in out
    assert "&lt;prompt&gt;" in out and "<prompt>" not in out  # prompt text is escaped
    assert "sdb-rep" in out  # the slowest row's last token is its own repair
    assert "appears after a run" in view.render_batch_view([])


def test_tab_inputs_and_loading(result, tmp_path):
    with pytest.raises(InvalidInputError, match="at least one batch"):
        batch_tab.check_inputs([], ["greedy"], 4, 16)
    with pytest.raises(InvalidInputError, match="greedy"):
        batch_tab.check_inputs(["1"], [], 4, 16)
    with pytest.raises(InvalidInputError, match="from 1 to 16"):
        batch_tab.check_inputs(["32"], ["greedy"], 4, 16)
    with pytest.raises(InvalidInputError, match="γ"):
        batch_tab.check_inputs(["1"], ["greedy"], 0, 16)
    with pytest.raises(InvalidInputError, match="must be lists"):
        batch_tab.check_inputs("12", ["greedy"], 4, 16)
    assert batch_tab.check_inputs(["4", "1"], ["sampled"], 4.0, 16.0) == ([1, 4], ["sampled"], 4, 16)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(result))
    out = batch_tab.load_handler(str(path))
    assert "Loaded" in out[0] and "sdb-grid" in out[4] and "greedy" in out[5]
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    assert "not a batch benchmark" in batch_tab.load_handler(str(bad))[0]


def test_tab_runs_on_the_loaded_pair(tiny_pair):
    run = batch_tab.run_handler(lambda: tiny_pair)
    out = run(["1", "2"], ["greedy"], 2, 4, progress=lambda *a, **k: None)
    assert "Measured" in out[0] and out[6].endswith(".json")
    assert json.loads(open(out[6]).read())["batches"] == [1, 2]
    waiting = batch_tab.run_handler(lambda: None)(["1"], ["greedy"], 2, 4, progress=lambda *a, **k: None)
    assert "still loading" in waiting[0]
    with gr.Blocks() as demo:
        parts = batch_tab.build_batch_tab(lambda: tiny_pair)
    assert {"figure", "view", "run", "upload"} <= set(parts) and demo is not None


@pytest.mark.browser
def test_batch_tab_in_the_browser(tiny_pair, browser):
    """The tab alone in a Blocks on the tiny pair: Run fills the chart, the reading and the batch view; screenshot
    to test-artifacts/batch-tab.png."""
    from pathlib import Path

    from tests.conftest import ARTIFACTS, free_port

    root = Path(__file__).resolve().parent.parent
    with gr.Blocks(title="batch tab") as demo:
        with gr.Tabs():
            with gr.Tab("Batch"):
                batch_tab.build_batch_tab(lambda: tiny_pair)
    port = free_port()
    demo.queue().launch(server_port=port, prevent_thread_lock=True, css_paths=[root / "assets" / "style.css"],
                        quiet=True)
    try:
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        page = ctx.new_page()
        page.goto(f"http://127.0.0.1:{port}/")
        page.locator("#sdb-batches label", has_text="16").click()
        page.locator("#sdb-modes label", has_text="T = 0.7").click()
        page.click("#sdb-run")
        page.wait_for_function("() => document.querySelector('#sdb-status').innerText.includes('Measured')",
                               timeout=120_000)
        page.wait_for_selector("#sdb-figure .js-plotly-plot")
        assert page.locator("#sdb-view .sdb-grid").count() == 2  # the lockstep batch, then the ragged one
        page.wait_for_selector("#sdb-loop-figure .js-plotly-plot")
        page.wait_for_selector("#sdb-pace .js-plotly-plot")
        reading = page.inner_text("#sdb-reading")  # tiny-model timings are noise: any of the three readings
        assert any(w in reading for w in ("stops paying", "still pays", "does not pay even")), reading
        page.wait_for_timeout(1000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "batch-tab.png"), full_page=True)
        ctx.close()
    finally:
        demo.close()
