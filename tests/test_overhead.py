"""The per-round overhead budget: categories that add up, an engine left exactly as it was, and the CLI flag."""

from __future__ import annotations

import json

import pytest
import torch

import specdec.loop.decoder as decoder_mod
import specdec.loop.display as display_mod
import specdec.core.sampling as sampling_mod
import specdec.core.verify as verify_mod
from specdec.cli import main
from specdec.loop.decoder import SpeculativeDecoder
from specdec.core.errors import InvalidInputError
from specdec.bench.overhead import CATEGORIES, RoundProfiler, measure_overhead, profiled, summarize_rounds
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings

SETTINGS = DecodeSettings(gamma=4, max_new_tokens=16, sampling=SamplingConfig(temperature=0.8), seed=5)


def _profile(pair, settings=SETTINGS):
    dec = SpeculativeDecoder(pair, "def f(x):", settings)
    prof = RoundProfiler(pair.device)
    with profiled(dec, prof):
        for _ in dec:
            pass
    return dec, prof


def test_categories_add_up_to_each_round(tiny_pair):
    dec, prof = _profile(tiny_pair)
    assert len(prof.rounds) == len(dec.rounds)
    for row, rnd in zip(prof.rounds, dec.rounds):
        parts = sum(v for k, v in row.items() if k != "round")
        assert parts == pytest.approx(row["round"], rel=1e-9, abs=1e-9)
        assert set(row) - {"round"} <= set(CATEGORIES)
        # the profiled round encloses the decoder's own round timer
        assert row["round"] >= rnd.round_ms * 0.999
    seen = {k for row in prof.rounds[1:] for k, v in row.items() if v > 0}
    for needed in ("target_forward", "draft_forward", "warp", "sample", "verify", "cache", "feed", "events", "loop",
                   "drafter"):
        assert needed in seen, f"{needed} was never timed"


def test_engine_is_unchanged_after_profiling(tiny_pair):
    originals = (decoder_mod.distribution, decoder_mod.verify, display_mod.top_candidates, sampling_mod.distribution, sampling_mod.sample,
                 verify_mod.verify)
    linear = torch.nn.functional.linear
    dec, _ = _profile(tiny_pair)
    assert (decoder_mod.distribution, decoder_mod.verify, display_mod.top_candidates, sampling_mod.distribution, sampling_mod.sample,
            verify_mod.verify) == originals
    for obj in (dec, dec.target, dec.drafter, dec.drafter.lm, dec.target.head, dec.drafter.lm.head,
                dec.target.out_head, dec.drafter.lm.out_head):
        assert not any(callable(v) for v in vars(obj).values() if hasattr(v, "__wrapped__")), obj
    for model in (tiny_pair.target, tiny_pair.draft, tiny_pair.target.base_model, tiny_pair.draft.base_model):
        assert not model._forward_hooks and not model._forward_pre_hooks and "forward" not in vars(model)
    assert torch.nn.functional.linear is linear


def test_profiled_run_decodes_the_same_text(tiny_pair):
    plain = SpeculativeDecoder(tiny_pair, "def f(x):", SETTINGS)
    for _ in plain:
        pass
    dec, _ = _profile(tiny_pair)
    assert dec.generated_ids == plain.generated_ids


def test_reduced_draft_head_is_model_work(tiny_pair):
    _, prof = _profile(tiny_pair, DecodeSettings(gamma=3, max_new_tokens=10, draft_vocab=50))
    assert sum(r.get("draft_head", 0.0) for r in prof.rounds) > 0


def test_each_models_head_is_its_own_model_work(tiny_pair, monkeypatch):
    """The scorer projects hidden states after the model body: each head's time is model work under its own
    model's name, not feed overhead (and never the target's head under the draft's)."""
    import time

    calls = {"target": 0, "draft": 0}

    def slow_head(lm, who):
        head = lm.out_head.forward

        def forward(x):
            calls[who] += 1
            time.sleep(0.002)
            return head(x)
        monkeypatch.setattr(lm.out_head, "forward", forward)

    dec = SpeculativeDecoder(tiny_pair, "def f(x):", SETTINGS)
    slow_head(dec.target, "target")
    slow_head(dec.drafter.lm, "draft")
    prof = RoundProfiler(tiny_pair.device)
    with profiled(dec, prof):
        for _ in dec:
            pass
    total = lambda key: sum(r.get(key, 0.0) for r in prof.rounds)  # noqa: E731
    assert total("target_head") >= 2.0 * calls["target"] * 0.9 > 0
    assert total("draft_head") >= 2.0 * calls["draft"] * 0.9 > 0
    assert total("feed") < 2.0 * (calls["target"] + calls["draft"])


def test_summary_splits_model_work_from_overhead():
    rows = [{"target_forward": 5.0, "draft_forward": 3.0, "draft_head": 1.0, "events": 2.0, "warp": 0.5,
             "round": 11.5}, {"target_forward": 7.0, "draft_forward": 3.0, "events": 0.0, "warp": 0.5, "round": 10.5}]
    s = summarize_rounds(rows)
    assert s["model_ms"] == pytest.approx(9.5)
    assert s["overhead_ms"] == pytest.approx(1.5)
    assert s["engine_overhead_ms"] == pytest.approx(0.5)
    assert s["per_category_ms"]["events"] == pytest.approx(1.0)


def test_measure_overhead_result(tiny_pair):
    r = measure_overhead(tiny_pair, ("hello",), gamma=2, max_new_tokens=8)
    assert r["rounds"] > 0 and r["same_text_profiled"]
    assert r["round_ms"] > r["model_ms"] > 0 and r["plain_round_ms"] > 0
    with pytest.raises(InvalidInputError):
        measure_overhead(tiny_pair, ("hello",), gamma=0)


def test_cli_flag_writes_json(tmp_path, capsys):
    out = tmp_path / "oh.json"
    rc = main(["bench", "--overhead", "--quick", "--modes", "greedy", "--max-new-tokens", "8", "--pair", "tiny",
               "--dtype", "float32", "--device", "cpu", "--out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["modes"]["greedy"]["gamma"] == 4 and data["models"]["name"] == "tiny"
    assert "engine path alone" in capsys.readouterr().out
    assert main(["bench", "--overhead", "--gamma", "auto", "--pair", "tiny", "--device", "cpu"]) == 2
