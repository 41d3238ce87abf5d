"""The benchmark command on the tiny pair: every mode runs, and the printed ratios are the ratios of its own data."""

from __future__ import annotations

import json
import math

import pytest

from specdec.bench import CONTENDERS, summarize_group
from specdec.cli import main
from specdec.metrics import predicted_speedup

TINY = ["--pair", "tiny", "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "8"]


def _bench(tmp_path, *extra) -> dict:
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", *TINY, "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_quick_bench_reports_every_group_and_consistent_ratios(tmp_path, capsys):
    res = _bench(tmp_path, "--gamma", "3")
    printed = capsys.readouterr().out
    assert "(d)/(b)" in printed and "render overhead" in printed
    groups = res["groups"]
    assert set(groups) == {f"{m}/{k}" for m in ("greedy", "sampled") for k in ("code", "prose", "chat", "all")} | {"all"}
    # interleaved: each (mode, prompt) ran every contender once, and all produced tokens
    assert len(res["samples"]) == 2 * 3 * len(CONTENDERS)
    assert all(s["tokens"] > 0 and s["seconds"] > 0 for s in res["samples"])
    for g in groups.values():
        t = g["tok_s"]
        assert g["d/a"] == pytest.approx(t["ours_spec"] / t["hf_plain"])
        assert g["d/b"] == pytest.approx(t["ours_spec"] / t["hf_assisted"])
        assert g["measured_speedup"] == pytest.approx(t["ours_spec"] / t["ours_plain"])
        assert g["predicted_speedup"] == pytest.approx(predicted_speedup(g["alpha"], 3, g["c_run"]))
        assert g["c"] == res["c"] and 0 < g["c_run"]
        assert 0 <= g["alpha"] <= 1 and 1 <= g["tokens_per_round"] <= 4
    # tiny-model rounds take about a millisecond, so only the bookkeeping is checked here
    assert res["render"]["render_ms"] > 0 and res["render"]["generation_ms"] > 0


def test_group_summary_uses_medians_and_per_token_alpha():
    from specdec.bench import Sample

    def s(name, tok, sec, **extra):
        return Sample(name, "code", "greedy", "p", tok, sec, extra)

    spec = dict(drafted=8, accepted=6, rounds=3, rejections=2, draft_ms=400.0, verify_ms=600.0)
    xs = [s("hf_plain", 10, 2.0), s("hf_plain", 10, 4.0), s("hf_plain", 10, 5.0),
          s("hf_assisted", 10, 1.0), s("ours_plain", 10, 2.0), s("ours_spec", 9, 1.0, **spec)]
    other = Sample("hf_plain", "code", "greedy", "q", 30, 2.0)  # a second prompt: 15 tok/s
    g = summarize_group(xs + [other], gamma=4, c=0.5)
    # median repeat of prompt p (10 tokens in 4 s) plus prompt q (30 tokens in 2 s): 40 tokens in 6 s
    assert g["tok_s"]["hf_plain"] == pytest.approx(40 / 6)
    assert g["alpha"] == pytest.approx(6 / 8)  # kept / tested: 6 kept, 2 rejections
    assert g["acceptance_rate"] == pytest.approx(6 / 8)
    assert g["tokens_per_round"] == pytest.approx(3.0)
    assert g["c_run"] == pytest.approx((400 / 8) / (600 / 3)) and g["c"] == 0.5  # 50 ms per guess, 200 per pass
    assert g["predicted_speedup"] == pytest.approx(predicted_speedup(6 / 8, 4, 0.25))
    assert g["d/a"] == pytest.approx(9 / (40 / 6)) and g["d/b"] == pytest.approx(0.9)


def test_adaptive_compare_ranks_policies_against_the_best_fixed_gamma(tmp_path):
    res = _bench(tmp_path, "--gamma", "auto", "--modes", "greedy", "--kinds", "code")
    rows = res["adaptive"]
    assert {(r["policy"], r["gamma"]) for r in rows} >= {("fixed", 2), ("fixed", 8), ("heuristic", 4),
                                                          ("confidence", 8), ("expected", 4)}
    best = max(r["tok_s"] for r in rows if r["policy"] == "fixed")
    for r in rows:
        assert r["vs_best_fixed"] == pytest.approx(r["tok_s"] / best)
        assert 1 <= r["mean_gamma"] <= 16
    assert max(r["vs_best_fixed"] for r in rows if r["policy"] == "fixed") == pytest.approx(1.0)
    fixed8 = next(r for r in rows if (r["policy"], r["gamma"]) == ("fixed", 8))
    assert fixed8["mean_gamma"] <= 7  # capped only by the token budget of 8 (7 guesses + repair/bonus)


def test_gamma_sweep_prints_measured_next_to_predicted(tmp_path, capsys):
    res = _bench(tmp_path, "--sweep-gamma", "1..3", "--modes", "greedy", "--kinds", "prose")
    assert [r["gamma"] for r in res["sweep"]] == [1, 2, 3]
    for r in res["sweep"]:
        assert r["predicted_speedup"] == pytest.approx(predicted_speedup(r["alpha"], r["gamma"], r["c_run"]))
        assert r["measured_speedup"] > 0 and math.isfinite(r["measured_speedup"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()[:1].isdigit()]
    assert len(lines) == 3


def test_policy_option_runs_our_loop_adaptively_and_predicts_at_its_mean_gamma(tmp_path):
    res = _bench(tmp_path, "--policy", "expected", "--modes", "greedy", "--kinds", "code")
    assert res["policy"] == "expected"
    g = res["groups"]["all"]
    assert g["predicted_speedup"] == pytest.approx(predicted_speedup(g["alpha"], g["mean_gamma"], g["c_run"]))
