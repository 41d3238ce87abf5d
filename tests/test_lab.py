"""The Learn tab's math, sampler and renderers: exact 100-point numbers, input handling, and a lab that can fail."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch

import specdec.core.verify
from components import learn as view
from specdec.learn import lab
from specdec.core.events import Round
from specdec.learn.examples import example_rounds
from specdec.core.kvcache import CachedLM
from specdec.core.sampling import SamplingConfig, warp

CAT = (["cat", "dog", "owl"], [50, 30, 20], [60, 10, 30])


# ------------------------------------------------------------------------------------------ 100 points


def test_hundred_points_cat_dog_owl_is_exact():
    hp = lab.hundred_points(CAT[1], CAT[2], CAT[0])
    assert np.allclose(100 * hp.kept, [50, 10, 20], atol=1e-12)
    assert np.allclose(100 * hp.residual, [0, 20, 0], atol=1e-12)
    assert np.allclose(100 * hp.final, [50, 30, 20], atol=1e-12)
    assert np.allclose(hp.final, hp.p, atol=1e-15)
    assert hp.alpha == pytest.approx(0.8, abs=1e-12)
    assert hp.gap == pytest.approx(0.2, abs=1e-12)
    assert np.allclose(hp.repair_dist, [0, 1, 0])
    assert hp.notes == []


@pytest.mark.parametrize("seed", range(5))
def test_hundred_points_final_is_p_for_random_inputs(seed):
    rng = np.random.default_rng(seed)
    k = rng.integers(3, 7)
    p, q = rng.random(k) * 100, rng.random(k) * 100
    hp = lab.hundred_points(p, q)
    assert np.allclose(hp.final, p / p.sum(), atol=1e-12)
    assert hp.residual.sum() == pytest.approx(hp.gap, abs=1e-12)
    assert hp.alpha == pytest.approx(1 - 0.5 * np.abs(p / p.sum() - q / q.sum()).sum(), abs=1e-12)  # α = 1 − TV


def test_inputs_not_summing_to_100_are_normalized_with_a_note():
    hp = lab.hundred_points([5, 3, 2], [60, 20, 30], CAT[0])
    assert np.allclose(hp.p, [0.5, 0.3, 0.2])
    assert np.allclose(hp.q, np.array([60, 20, 30]) / 110)
    assert len(hp.notes) == 2
    assert "Target p added up to 10" in hp.notes[0] and "Draft q added up to 110" in hp.notes[1]
    assert lab.hundred_points([0.5, 0.3, 0.2], [0.6, 0.1, 0.3]).notes == []  # probabilities are fine as they are


@pytest.mark.parametrize(
    "p, q, tokens, message",
    [
        ([50, -30, 20], CAT[2], CAT[0], "negative"),
        ([50, float("nan"), 20], CAT[2], CAT[0], "nan"),
        ([50, float("inf"), 20], CAT[2], CAT[0], "inf"),
        ([50, None, 20], CAT[2], CAT[0], "empty"),
        ([50, "", 20], CAT[2], CAT[0], "empty"),
        ([50, "lots", 20], CAT[2], CAT[0], "not a number"),
        ([0, 0, 0], CAT[2], CAT[0], "adds up to 0"),
        ([], [], [], "empty"),
        ([50, 30, 20], [60, 40], CAT[0], "same tokens"),
        ([50, 30, 20], CAT[2], ["cat", "cat", "owl"], "appears twice"),
    ],
)
def test_bad_input_gives_a_clear_message(p, q, tokens, message):
    with pytest.raises(lab.LabInputError, match=message):
        lab.hundred_points(p, q, tokens)


def test_tab_handlers_turn_bad_input_into_messages_not_tracebacks():
    from ui.learn_tab import run_lab, update_hundred

    cells = ["cat", "dog", "owl", "", "", "", 50, None, 20, 0, 0, 0, 60, 10, 30, 0, 0, 0]
    _, html = update_hundred(3, *cells)
    assert "learn-msg-error" in html and "empty" in html
    cells[7] = -3
    _, html = update_hundred(3, *cells)
    assert "negative" in html
    cells[7] = 30
    fig, html = update_hundred(3, *cells)
    assert "α = Σ min(p, q) = 0.800" in html
    for n in (0, 100_001, 2.5, None):
        _, html = run_lab(n, 0, "correct", 3, *cells)
        assert "learn-msg-error" in html and "N (rounds)" in html
    _, html = run_lab(1000, 0, "correct", 3, *cells)
    assert "p-value = " in html


def test_hundred_points_figure_stacks_to_the_numbers():
    hp = lab.hundred_points(CAT[1], CAT[2], CAT[0])
    fig = view.hundred_points_figure(hp)
    bars = list(fig.data[0].x)
    final, kept, repair = bars.index("Final"), bars.index("Kept min(p,q)"), bars.index("Repair max(0,p−q)")
    total_at = lambda i: sum(tr.y[i] for tr in fig.data[1:-1])  # noqa: E731 - the token traces, not base or gap
    assert total_at(final) == pytest.approx(100)
    assert total_at(kept) == pytest.approx(80)
    assert fig.data[0].y[repair] == pytest.approx(80)  # the repair sits on top of the kept 80 points
    assert total_at(repair) == pytest.approx(20)
    assert fig.data[-1].y[kept] == pytest.approx(20)  # the gap


# ------------------------------------------------------------------------------------------ sampling


@pytest.mark.stat
def test_sampler_passes_chi_square_with_the_engine_rule():
    hp = lab.hundred_points(CAT[1], CAT[2], CAT[0])
    res = lab.run_lab(hp, 100_000, seed=1, repair="correct")
    assert res.counts.sum() == 100_000
    assert res.test.p_value > 1e-3
    assert res.tv < 0.01


@pytest.mark.stat
@pytest.mark.parametrize("repair", ["fresh-p", "from-q"])
def test_wrong_repairs_drift_and_the_test_catches_them(repair):
    hp = lab.hundred_points(CAT[1], CAT[2], CAT[0])
    res = lab.run_lab(hp, 20_000, seed=1, repair=repair)
    assert res.test.p_value < 1e-3
    assert res.tv > 0.1


@pytest.mark.stat
def test_random_six_token_case_passes():
    rng = np.random.default_rng(3)
    p, q = rng.dirichlet(np.ones(6)), rng.dirichlet(np.ones(6))
    res = lab.run_lab(lab.hundred_points(p, q), 50_000, seed=2)
    assert res.test.p_value > 1e-3


def test_sampler_goes_through_verify_batch(monkeypatch):
    calls = []
    real = specdec.core.verify.verify_batch

    def spy(*args, **kwargs):
        calls.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(specdec.core.verify, "verify_batch", spy)
    lab.sample_first_tokens([0.5, 0.3, 0.2], [0.6, 0.1, 0.3], 100_000, torch.Generator().manual_seed(0))
    assert sum(calls) == 100_000 and 1 <= len(calls) <= 4  # one or a few batched calls, not a Python loop


@pytest.mark.stat
def test_a_broken_verifier_makes_the_lab_fail(monkeypatch):
    hp = lab.hundred_points(CAT[1], CAT[2], CAT[0])
    assert lab.run_lab(hp, 20_000, seed=4).test.p_value > 1e-3
    real = specdec.core.verify.verify_batch

    def always_accepts(draft_tokens, draft_probs, target_probs, generator=None, **kw):
        kw.pop("uniforms", None)
        return real(draft_tokens, draft_probs, target_probs, generator, uniforms=torch.zeros(draft_tokens.shape), **kw)

    monkeypatch.setattr(specdec.core.verify, "verify_batch", always_accepts)
    assert lab.run_lab(hp, 20_000, seed=4).test.p_value < 1e-3


@pytest.mark.stat
def test_a_broken_residual_makes_the_lab_fail(monkeypatch):
    hp = lab.hundred_points(CAT[1], CAT[2], CAT[0])
    assert lab.run_lab(hp, 20_000, seed=5).test.p_value > 1e-3
    monkeypatch.setattr(specdec.core.verify, "residual_distribution", lambda p, q: p)  # "repair" by sampling p afresh
    bad = lab.run_lab(hp, 20_000, seed=5)
    assert bad.test.p_value < 1e-3
    assert bad.empirical[1] < 0.2  # dog, the token only the repair can top up, comes out too rarely


def test_repair_from_q_falls_back_to_p_on_the_bonus_row():
    p = torch.tensor([[0.5, 0.5], [0.2, 0.8]])
    q = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    out = lab.repair_from_q(p, q)
    assert torch.equal(out[0], q[0]) and torch.equal(out[1], p[1])


def test_sampler_rejects_bad_n():
    for n in (0, -1, 100_001, 2.5, True):
        with pytest.raises(lab.LabInputError):
            lab.sample_first_tokens([0.5, 0.5], [0.5, 0.5], n)


def test_lab_timing_at_100k_rounds():
    hp = lab.hundred_points([10, 20, 30, 15, 15, 10], [30, 10, 20, 20, 10, 10])
    lab.run_lab(hp, 1000)  # warm-up
    t0 = time.perf_counter()
    res = lab.run_lab(hp, 100_000, seed=0)
    elapsed = time.perf_counter() - t0
    print(f"\nlab at N=100000: {elapsed * 1e3:.0f} ms (sampling {res.seconds * 1e3:.0f} ms)")
    assert elapsed < 10.0  # generous: 2 shared cores; typically well under a second


# ------------------------------------------------------------------------------------------ statistics


def test_chi_square_handles_zero_expected_cells():
    p = [0.5, 0.5, 0.0]
    ok = lab.chi_square([480, 520, 0], p)
    assert ok.dof == 1 and ok.p_value > 0.05  # the impossible cell with no draws is simply not a cell
    bad = lab.chi_square([480, 519, 1], p)
    assert bad.p_value == 0.0 and "probability 0" in bad.note


def test_chi_square_pools_small_cells_and_still_detects_bias():
    p = np.array([0.5] + [0.5 / 40] * 40)
    counts = np.zeros(41)
    counts[0], counts[1:] = 100, 100 / 40  # 2.5 expected per rare token: too few to test one by one
    fair = lab.chi_square(counts, p)
    assert fair.p_value > 0.5 and "pooled" in fair.note and fair.cells > 2
    counts[0], counts[1:] = 170, 30 / 40
    assert lab.chi_square(counts, p).p_value < 1e-6


def test_chi_square_single_token_and_tiny_samples():
    assert lab.chi_square([100, 0], [1.0, 0.0]).p_value == 1.0
    assert math.isnan(lab.chi_square([1, 0, 0], [0.4, 0.3, 0.3]).p_value)
    assert lab.format_p_value(0.42131) == "0.4213"
    assert lab.format_p_value(3.2e-9) == "3.20e-09"
    assert lab.format_p_value(float("nan")) == "n/a"


def test_total_variation():
    assert lab.total_variation([1, 0], [0, 1]) == pytest.approx(1.0)
    assert lab.total_variation([30, 70], [0.3, 0.7]) == pytest.approx(0.0)


# ------------------------------------------------------------------------------------------ walkthrough


def test_example_rounds_come_from_verify():
    ex = example_rounds()
    rej, bonus = ex["builtin:reject"].round, ex["builtin:bonus"].round
    for r in (rej, bonus):
        assert Round.from_dict(r.to_dict()) == r
        for q, p, a in zip(r.q_draft, r.p_draft, r.accept_probs):
            assert a == pytest.approx(min(1.0, p / q), abs=1e-6)
    assert ex["builtin:reject"].context == "Tell me where the cat is."
    assert rej.draft_pieces == ["The", " cat", " sat", " down"]
    assert rej.n_accepted == 3 and rej.rejected_at == 3
    assert rej.committed_pieces == ["The", " cat", " sat", " nearby"]
    assert [t.piece for t in rej.residual_top] == [" nearby", " quietly"]
    assert rej.residual_top[0].prob == pytest.approx(0.875, abs=1e-6)  # (55-20) / (35+5)
    assert bonus.is_bonus and bonus.rejected_at is None and len(bonus.committed_ids) == 5


def test_walkthrough_steps_change_the_right_cells():
    rnd = example_rounds()["builtin:reject"].round
    changed = [view._changed(rnd, s) for s in range(view.N_STEPS)]
    assert changed[0]["guess"] == [True] * 4 + [False]
    assert all(changed[1]["check"])
    assert changed[2]["out"] == [True, True, True, False, False]
    assert changed[3]["guess"] == [False, False, False, True, False]
    assert changed[4]["out"] == [False, False, False, True, False]
    assert not any(any(v) for v in changed[5].values())  # no bonus after a rejection
    html = view.walkthrough_html(rnd, 4)
    assert "Step 5 of 7: Repair" in html and "learn-out-repair" in html and "·nearby" in html
    bonus = example_rounds()["builtin:bonus"].round
    assert view._changed(bonus, 5)["out"] == [False] * 4 + [True]
    assert "learn-out-bonus" in view.walkthrough_html(bonus, 5)


def test_walkthrough_escapes_token_text():
    rnd = example_rounds()["builtin:reject"].round
    rnd.draft_pieces = ["<script>alert(1)</script>", " cat", " sat", " down"]
    rnd.emitted_piece = "<b>"
    context = "<img src=x onerror=alert(1)>"
    for s in range(view.N_STEPS):
        html = view.walkthrough_html(rnd, s, context)
        assert "<script>" not in html and "<img" not in html
        assert "&lt;script&gt;" in html
    assert "&lt;b&gt;" in view.walkthrough_html(rnd, 4, context)


def test_recorded_rounds_replay_and_feed_the_speedup_chart(tiny_pair):
    from specdec.core.settings import DecodeSettings
    from specdec.loop.decoder import SpeculativeDecoder
    from specdec.core.metrics import StepCosts
    from ui.learn_tab import c_from_run, render_walkthrough, round_choices

    dec = SpeculativeDecoder(tiny_pair, "The cat", DecodeSettings(gamma=3, max_new_tokens=20,
                                                                   sampling=SamplingConfig(temperature=1.0)))
    rounds = list(dec)
    bare, timed = [dec.record()], [dec.record(StepCosts(20.0, 6.0))]
    for records in (bare, timed):
        keys = [v for _, v in round_choices(records)]
        assert keys[:3] == ["builtin:reject", "builtin:bonus", "builtin:tree"] and len(keys) == 3 + len(rounds)
        for s in range(view.N_STEPS):
            assert "learn-walk" in render_walkthrough("run:0", s, records)
        (pt,) = lab.run_points(records)
        kept = sum(f == "kept" for r in rounds for f in r.fates)  # per-token alpha: kept / tested
        assert pt.alpha == pytest.approx(kept / (kept + sum(f == "rejected" for r in rounds for f in r.fates)))
        assert pt.rounds == len(rounds)
    assert lab.run_points(bare)[0].measured_speedup is None
    pt = lab.run_points(timed)[0]
    assert pt.measured_speedup == pytest.approx(timed[0].metrics.speedup) and pt.c_plain == pytest.approx(0.3)
    assert lab.run_points([]) == []
    assert c_from_run(0.1, timed) == 0.3  # the pair's timed c_plain wins
    c_loop = lab.run_points(bare)[0].c_loop
    assert c_loop is not None and c_from_run(0.1, bare) == round(min(1.0, c_loop), 2)
    assert "gone" in render_walkthrough("run:999", 0, bare)


def test_speedup_figure_curves_and_shading():
    from specdec.core.speedup import leviathan_speedup

    from components.charts import speedup_curves_figure

    pts = [lab.RunPoint("run", "model", 10, 0.7, 4.0, 3.0, 1.4, None)]
    fig = speedup_curves_figure(0.2, pts)
    curves = [t for t in fig.data if t.name and t.name.startswith("γ=")]
    assert [t.name for t in curves] == [f"γ={g}" for g in range(1, 13)]
    i = int(np.argmin(np.abs(np.asarray(curves[3].x) - 0.5)))
    assert curves[3].y[i] == pytest.approx(leviathan_speedup(float(curves[3].x[i]), 4, 0.2))
    shapes = [s for s in fig.layout.shapes if s.type == "rect"]
    assert shapes and shapes[0].y0 == 0 and shapes[0].y1 == 1
    measured = [t for t in fig.data if t.name and "measured" in t.name]
    assert measured and measured[0].y[0] == 1.4


# ------------------------------------------------------------------------------------------ real models


@pytest.mark.stat
def test_first_token_rows_match_the_engine_and_the_lab_passes_on_them(tiny_pair):
    cfg = SamplingConfig(temperature=1.0, top_k=20)
    prefix = "def fibonacci(n):"
    rows = lab.first_token_rows(tiny_pair, prefix, cfg)
    plain = CachedLM(tiny_pair.target, tiny_pair.vocab_size)
    p_plain = warp(plain.logits_after(rows.prompt_ids)[-1], cfg)
    assert torch.allclose(rows.p0, p_plain, atol=1e-5)
    assert int((rows.p0 > 0).sum()) == 20 and int((rows.q0 > 0).sum()) == 20

    draws = lab.sample_on_support(rows, 20_000, seed=0)
    assert draws.capped_from is None and len(draws.support) <= 40
    engine = lab.engine_first_tokens(tiny_pair, prefix, cfg, 60, gamma=2)
    chk = lab.real_check(rows, draws, engine)
    assert chk.test.p_value > 1e-3
    assert chk.engine_outside == 0  # every real round emitted a token inside the target's top-20
    assert chk.engine_test is not None and chk.engine_test.n == 60

    wrong = lab.sample_on_support(rows, 20_000, seed=0, repair="from-q")
    assert lab.real_check(rows, wrong, []).test.p_value < 1e-3

    html = view.real_result_html(chk, "tiny", 60)
    assert 'id="learn-real-pvalue"' in html and "Real decoder rounds" in html


def test_full_vocabulary_support_stops_at_the_time_budget():
    rows = lab.FirstTokenRows([1], torch.softmax(torch.randn(150_000), 0), torch.softmax(torch.randn(150_000), 0),
                              SamplingConfig(1.0))
    d = lab.sample_on_support(rows, 100_000, seed=0, time_budget_s=0.3)
    assert len(d.support) == 150_000
    assert 0 < d.n < 100_000 and d.capped_from == 100_000 and d.counts.sum() == d.n
    assert d.seconds < 5


@pytest.mark.slow
def test_real_pair_first_token_check(real_pair_fp32):
    """The real-model panel's path on the embedded Qwen pair: exact rows, vectorized draws, a few real rounds."""
    cfg = SamplingConfig(temperature=0.8, top_k=40)
    prefix = "def fibonacci(n):\n    "
    rows = lab.first_token_rows(real_pair_fp32, prefix, cfg)
    assert int((rows.p0 > 0).sum()) == 40 and float(rows.p0.sum()) == pytest.approx(1.0, abs=1e-5)
    draws = lab.sample_on_support(rows, 20_000, seed=0)
    assert draws.capped_from is None
    engine = lab.engine_first_tokens(real_pair_fp32, prefix, cfg, 3, gamma=1)
    chk = lab.real_check(rows, draws, engine)
    assert chk.test.p_value > 1e-3 and chk.tv < 0.03
    assert chk.engine_outside == 0
    assert lab.real_check(rows, lab.sample_on_support(rows, 20_000, 0, repair="fresh-p"), []).test.p_value < 1e-3


def test_real_panel_waits_for_loading_models_and_reports_failures():
    from ui.learn_tab import wait_for_pair

    answers = iter([None, None, "PAIR"])
    out = list(wait_for_pair(lambda: next(answers), poll_s=0))
    assert [p for p, _ in out] == [None, None, "PAIR"] and "still loading" in out[0][1]

    def broken():
        raise lab.LabInputError("the model pair 'x' failed to load: no such file")

    assert list(wait_for_pair(broken, poll_s=0)) == [(None, "the model pair 'x' failed to load: no such file")]
    assert "still loading after" in list(wait_for_pair(lambda: None, timeout_s=0, poll_s=0))[-1][1]
