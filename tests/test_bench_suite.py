"""The suite, tree and verification-mode benches run end to end on the tiny pair and write consistent JSON."""

from __future__ import annotations

import argparse
import json

import pytest

from specdec.bench.cli import add_bench_args, cmd_bench


def _args(tmp_path, *flags):
    ap = argparse.ArgumentParser()
    add_bench_args(ap)
    return ap.parse_args([*flags, "--out", str(tmp_path / "out.json")])


def _tiny():
    from specdec.models.pair import load_pair

    return load_pair("tiny", dtype="float32", device="cpu")


def test_suite_counts_every_contenders_target_passes(tmp_path, one_thread, capsys):
    assert cmd_bench(_args(tmp_path, "--suite", "--quick", "--kinds", "translation,math", "--max-new-tokens", "6"),
                     _tiny) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert set(doc["kinds"]) == {"translation", "math"}
    assert {"model", "model_expected", "ngram", "ngram_gain", "suffix", "auto", "model_int8", "model_int4", "auto_int4",
            "hf_lookup_5", "hf_lookup_10", "hf_lookup_20"} <= set(doc["contenders"])
    assert doc["split"] == "test"
    for kind in doc["kinds"].values():
        assert kind["speedup"]["hf_plain"] == pytest.approx(1.0)
        assert kind["tokens_per_pass"]["hf_plain"] == pytest.approx(1.0)  # one pass per token, prefill included
        best, theirs = kind["best_ours"], kind["best_theirs"]
        assert kind["best_vs_best"] == pytest.approx(kind["speedup"][best] / kind["speedup"][theirs])
        assert all(v is None or v >= 1.0 for v in kind["tokens_per_pass"].values())
    assert all(s["passes"] >= 1 for s in doc["samples"])
    assert "best ours / best theirs" in capsys.readouterr().out


def test_suite_runs_only_the_contenders_asked_for_beside_plain_generate(tmp_path, one_thread, capsys):
    assert cmd_bench(_args(tmp_path, "--suite", "--quick", "--kinds", "math", "--max-new-tokens", "4",
                           "--contenders", "model,hf_assisted"), _tiny) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    assert doc["contenders"] == ["hf_plain", "hf_assisted", "model"]
    assert {s["contender"] for s in doc["samples"]} == {"hf_plain", "hf_assisted", "model"}
    assert cmd_bench(_args(tmp_path, "--suite", "--quick", "--kinds", "math", "--contenders", "modle"), _tiny) == 2
    assert "unknown suite contenders ['modle']" in capsys.readouterr().err


def test_tree_bench_puts_chains_beside_trees(tmp_path, one_thread):
    assert cmd_bench(_args(tmp_path, "--tree", "--quick", "--kinds", "code", "--modes", "greedy",
                           "--max-new-tokens", "6"), _tiny) == 0
    doc = json.loads((tmp_path / "out.json").read_text())
    g = doc["groups"]["greedy/code"]
    assert g["speedup"]["plain"] == pytest.approx(1.0)
    for name in ("model_chain", "model_tree_321", "model_tree_2111", "ngram_chain", "ngram_tree"):
        assert g["tokens_per_pass"][name] >= 1.0


def test_verify_modes_bench_pools_the_same_drafts(tmp_path, one_thread):
    from specdec.bench.verify_modes import load

    assert cmd_bench(_args(tmp_path, "--verify-modes", "--max-new-tokens", "6"), _tiny) == 0
    label, points = load(tmp_path / "out.json")
    assert "tiny" in label
    by = {(p.temperature, p.mode): p for p in points}
    for t in (0.0, 0.3, 0.7, 1.0):
        assert by[(t, "pq")].drafted == by[(t, "strict")].drafted == by[(t, "block")].drafted > 0
    for mode in ("strict", "block"):  # greedy: every rule keeps the same guesses
        assert by[(0.0, mode)].kept_share == pytest.approx(by[(0.0, "pq")].kept_share)


def test_the_suites_halves_share_no_prompt_and_cover_every_kind():
    from specdec.prompts import SUITE_SPLITS

    tune, test = (SUITE_SPLITS[h] for h in ("tune", "test"))
    assert set(tune) == set(test) and all(len(test[k]) >= 2 for k in test)
    seen = lambda half: {json.dumps(p) for prompts in half.values() for p in prompts}  # noqa: E731
    assert not seen(tune) & seen(test)
