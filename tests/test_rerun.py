"""Regression tests for the five defects a correctness audit found (issue 10, a-e). Each failed on c6d06f0."""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from specdec.core import clock as clock_mod
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from specdec.core.errors import UnsupportedModelError
from specdec.core.events import ACCEPTED, CUT, Round
from specdec.core.kvcache import check_rollback
from specdec.core.metrics import summarize
from specdec.loop.decoder import rerun
from specdec.core.sampling import SamplingConfig, warp

GREEDY = DecodeSettings(max_new_tokens=12)


# a. A tiny temperature overflowed logits / T to inf: p and q were NaN and both decoders emitted the last id.
@pytest.mark.parametrize("temperature", [1e-39, 5e-324])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.5)])
def test_tiny_temperature_is_greedy_not_nan(temperature, top_k, top_p):
    logits = torch.randn(4, 50) * 10
    probs = warp(logits, SamplingConfig(temperature, top_k, top_p))
    assert not probs.isnan().any()
    assert torch.equal(probs, warp(logits, SamplingConfig()))  # one-hot on the argmax, as greedy


def test_tiny_temperature_decodes_like_greedy_in_both_decoders(tiny_pair):
    tiny = replace(GREEDY, sampling=SamplingConfig(1e-39))
    greedy = plain_decode(tiny_pair, "hello", GREEDY).ids
    assert plain_decode(tiny_pair, "hello", tiny).ids == greedy
    dec = SpeculativeDecoder(tiny_pair, "hello", tiny)
    list(dec)
    assert dec.generated_ids == greedy


# b. Sliding-window configs got cache layers that refuse to crop once the text outgrows the window.
def test_sliding_window_pair_decodes_past_the_window(tiny_pair):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=tiny_pair.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    target = MistralForCausalLM(cfg).eval()
    torch.manual_seed(1)
    draft = MistralForCausalLM(cfg).eval()  # a different model, so rounds reject and caches roll back
    pair = replace(tiny_pair, target=target, draft=draft)
    s = DecodeSettings(gamma=4, max_new_tokens=30, draft_vocab=0)
    dec = SpeculativeDecoder(pair, "abc", s)
    list(dec)
    assert any(r.rejected_at is not None for r in dec.rounds)
    assert dec.generated_ids == plain_decode(pair, "abc", s).ids  # the window is still applied, exactly


def test_layers_that_cannot_roll_back_are_refused_before_loading():
    with pytest.raises(UnsupportedModelError, match="cannot be rolled back"):
        check_rollback(SimpleNamespace(model_type="hybrid", layer_types=["full_attention", "linear_attention"]))
    check_rollback(SimpleNamespace(model_type="mistral", layer_types=["sliding_attention", "full_attention"]))


# c. gamma_policy="expected" follows wall-clock timings, so one seed could give different texts.
def test_expected_policy_reruns_from_its_record(tiny_pair, monkeypatch):
    s = DecodeSettings(gamma=4, max_new_tokens=40, sampling=SamplingConfig(1.0), seed=1, gamma_policy="expected")

    def run_with_clock(draft_s: float, verify_s: float) -> SpeculativeDecoder:
        # step() reads the clock four times a round: start, after drafting, after verifying, at the end.
        steps = itertools.cycle([0.001, draft_s, verify_s, 0.001])
        now = itertools.accumulate(steps)
        monkeypatch.setattr(clock_mod.time, "perf_counter", lambda: next(now))
        dec = SpeculativeDecoder(tiny_pair, "hello", s)
        list(dec)
        return dec

    fast, slow = run_with_clock(0.001, 0.1), run_with_clock(0.1, 0.1)  # a cheap draft, then a costly one
    monkeypatch.undo()
    assert not s.seed_reproducible
    assert [r.gamma for r in fast.rounds] != [r.gamma for r in slow.rounds]  # same seed, timing-driven gammas
    for dec in (fast, slow):
        record = dec.record()
        again = rerun(record, tiny_pair)  # real clock now: only the recorded gammas can reproduce the text
        assert again.generated_ids == dec.generated_ids
        assert [r.asked for r in again.rounds] == record.gamma_schedule  # what each round asked the drafter for


# e. Statistics counted guesses kept past a committed EOS.
def _round(gamma: int, n_accepted: int, committed: int) -> Round:
    rejected = n_accepted if n_accepted < gamma else None
    return Round(index=0, position=0, gamma=gamma, draft_ids=[5] * gamma, draft_pieces=["x"] * gamma,
                 q_draft=[1.0] * gamma, p_draft=[1.0] * gamma, accept_probs=[1.0] * gamma, uniforms=[0.0] * gamma,
                 n_accepted=n_accepted, rejected_at=rejected, emitted_id=6, emitted_piece="y",
                 is_bonus=rejected is None, emitted_p=1.0, q_top=[[] for _ in range(gamma)],
                 p_top=[[] for _ in range(gamma + 1)], residual_top=None if rejected is None else [],
                 committed_ids=[5] * committed, committed_pieces=["x"] * committed, draft_ms=1.0, verify_ms=1.0)


def test_statistics_stop_at_a_committed_eos():
    # EOS accepted at position 1: guesses 2 and 3 were kept by the rule but are not in the text.
    cut = _round(gamma=4, n_accepted=4, committed=2)
    assert cut.fates == [ACCEPTED, ACCEPTED, CUT, CUT]
    m = summarize([cut, _round(gamma=4, n_accepted=1, committed=2)])
    assert m.accepted == 2 + 1
    assert m.tested == 2 + 2  # the second round tested its kept guess and its rejection
    assert m.alpha == pytest.approx(3 / 4)
    assert m.accepted_histogram == [0, 1, 1, 0, 0]
    assert m.per_position_acceptance[:2] == [1.0, 0.5] and m.per_position_acceptance[2] == 0.0


def test_decoder_totals_match_the_rounds(tiny_pair):
    dec = SpeculativeDecoder(tiny_pair, "hello", DecodeSettings(max_new_tokens=30, sampling=SamplingConfig(0.9)))
    list(dec)
    m = summarize(dec.rounds)
    assert dec.totals.kept == m.accepted and dec.totals.tested == m.tested
