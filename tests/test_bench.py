"""The benchmark command on the tiny pair: every mode runs, and the printed ratios are the ratios of its own data."""

from __future__ import annotations

import json
import math

import pytest

from specdec.bench.harness import Sample, assistant_for
from specdec.bench.speed import CONTENDERS, summarize_group
from specdec.cli import main
from specdec.core.speedup import leviathan_speedup
from tests.conftest import load_script

TINY = ["--pair", "tiny", "--dtype", "float32", "--device", "cpu", "--max-new-tokens", "8"]


def _bench(tmp_path, *extra) -> dict:
    out = tmp_path / "bench.json"
    assert main(["bench", "--quick", *TINY, "--out", str(out), *extra]) == 0
    return json.loads(out.read_text())


def test_quick_bench_reports_every_group_and_consistent_ratios(tmp_path, capsys):
    res = _bench(tmp_path, "--gamma", "3")
    printed = capsys.readouterr().out
    assert "(d)/(b)" in printed and "scripts/render_overhead.py" in printed  # where the render overhead went
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
        assert g["predicted_speedup"] == pytest.approx(leviathan_speedup(g["alpha"], g["mean_gamma"], g["c_loop"]))
        assert g["c_plain"] == pytest.approx(res["c_plain"]) and 0 < g["c_loop"]
        assert 1 <= g["mean_gamma"] <= 3
        assert 0 <= g["alpha"] <= 1 and 1 <= g["tokens_per_round"] <= 4
    assert "render" not in res  # the bench does not import the app's renderers
    assert [(s["mode"], s["kind"]) for s in res["samples"][:4]] == [("greedy", "code")] * 4
    assert [s["contender"] for s in res["samples"][:8]] == [*CONTENDERS, *CONTENDERS[1:], CONTENDERS[0]]  # rotated


def _render_script():
    return load_script("render_overhead")


def test_render_overhead_script_runs_the_bench_and_adds_the_render_share(tmp_path, capsys):
    out = tmp_path / "render.json"
    script = _render_script()
    assert script.main(["--quick", *TINY, "--modes", "greedy", "--kinds", "code", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    printed = capsys.readouterr().out
    assert "(d)/(b)" in printed and "render overhead (app components, charts every round)" in printed
    assert set(res["groups"]) == {"greedy/code", "greedy/all", "all"}
    # tiny-model rounds take about a millisecond, so only the bookkeeping is checked here
    r = res["render"]
    assert r["render_ms"] > 0 and r["generation_ms"] > 0 and r["fraction"] == pytest.approx(r["render_ms"] /
                                                                                             r["generation_ms"])
    assert script.main(["--drafter", "ngram", *TINY]) == 2
    assert "drop --drafter" in capsys.readouterr().err


def test_group_summary_uses_medians_and_per_token_alpha():
    from specdec.core.metrics import StepCosts
    from tests.test_fates_and_counts import _round

    def s(name, tok, sec, rounds=()):
        return Sample(name, "code", "greedy", "p", tok, sec, list(rounds))

    # Three rounds drafting 4, 4 and 0 guesses: all 4 kept (+ bonus), 1 kept then a rejection, a plain step.
    rounds = [_round(4, 4, 5), _round(4, 1, 2), _round(0, 0, 1)]
    for r, (d_ms, v_ms) in zip(rounds, [(100.0, 200.0), (300.0, 200.0), (0.0, 200.0)]):
        r.draft_ms, r.verify_ms = d_ms, v_ms
    xs = [s("hf_plain", 10, 2.0), s("hf_plain", 10, 4.0), s("hf_plain", 10, 5.0),
          s("hf_assisted", 10, 1.0), s("ours_plain", 10, 2.0), s("ours_spec", 8, 1.0, rounds)]
    other = Sample("hf_plain", "code", "greedy", "q", 30, 2.0)  # a second prompt: 15 tok/s
    g = summarize_group(xs + [other], StepCosts(100.0, 50.0))
    # median repeat of prompt p (10 tokens in 4 s) plus prompt q (30 tokens in 2 s): 40 tokens in 6 s
    assert g["tok_s"]["hf_plain"] == pytest.approx(40 / 6)
    assert g["alpha"] == pytest.approx(5 / 6)  # kept / tested: 5 kept, 1 rejection
    assert g["acceptance_rate"] == pytest.approx(5 / 8)
    assert g["tokens_per_round"] == pytest.approx(8 / 3) and g["mean_gamma"] == pytest.approx(8 / 3)
    assert g["c_loop"] == pytest.approx((400 / 8) / (600 / 3)) and g["c_plain"] == 0.5  # 50 ms/guess, 200/pass
    assert g["predicted_speedup"] == pytest.approx(leviathan_speedup(5 / 6, 8 / 3, 0.25))
    assert g["d/a"] == pytest.approx(8 / (40 / 6)) and g["d/b"] == pytest.approx(0.8)


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
        assert r["mean_gamma"] <= r["gamma"]  # the last round of a run is capped by the token budget
        assert r["predicted_speedup"] == pytest.approx(leviathan_speedup(r["alpha"], r["mean_gamma"], r["c_loop"]))
        assert r["measured_speedup"] > 0 and math.isfinite(r["measured_speedup"])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.strip()[:1].isdigit()]
    assert len(lines) == 3


def test_policy_option_runs_our_loop_adaptively_and_predicts_at_its_mean_gamma(tmp_path):
    res = _bench(tmp_path, "--policy", "expected", "--modes", "greedy", "--kinds", "code")
    assert res["policy"] == "expected"
    g = res["groups"]["all"]
    assert g["predicted_speedup"] == pytest.approx(leviathan_speedup(g["alpha"], g["mean_gamma"], g["c_loop"]))


def test_assisted_generation_leaves_the_shared_draft_config_alone(tiny_pair):
    before = tiny_pair.draft.generation_config.to_dict()
    view = assistant_for(tiny_pair.draft, 7)
    assert view.generation_config.num_assistant_tokens == 7 and view.generation_config.assistant_confidence_threshold == 0
    assert tiny_pair.draft.generation_config.to_dict() == before
    assert view.model.embed_tokens.weight is tiny_pair.draft.model.embed_tokens.weight  # same weights, no copy


def test_drafter_bench_runs_transformers_at_its_own_gamma(tmp_path, capsys):
    """`--drafter ngram --equiv-gamma 2`: transformers' prompt lookup at 2, ours at 4, ratios from the run's data."""
    out = tmp_path / "drafter.json"
    argv = ["bench", "--quick", *TINY, "--drafter", "ngram", "--gamma", "4", "--equiv-gamma", "2", "--kinds", "code",
            "--repeats", "1", "--out", str(out)]
    assert main(argv) == 0
    res = json.loads(out.read_text())
    assert (res["gamma"], res["equiv_gamma"]) == (4, 2)
    assert "at gamma 2" in capsys.readouterr().out
    assert {s["contender"] for s in res["samples"]} == {"hf_plain", "hf_equiv", "ours_plain", "ours"}
    g = res["groups"]["greedy/code"]
    assert g["ours/hf_equiv"] == pytest.approx(g["tok_s"]["ours"] / g["tok_s"]["hf_equiv"])
