"""Batched speculative decoding: per-row exactness (greedy equality, chi-square per row), lockstep bookkeeping,
caches, bad input. Fast tests use the tiny random-weight pair; one slow test uses the real pair in fp32."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import specdec.loop.batched as batched
from specdec.loop.batched import (
    MAX_BATCH,
    BatchDecoder,
    encode_batch,
    plain_batch_decode,
    speculative_batch_decode,
)
from specdec.core.settings import DecodeSettings
from specdec.loop.plain import plain_decode
from specdec.core.errors import InvalidInputError
from specdec.learn.lab import chi_square
from specdec.core.sampling import SamplingConfig, warp
from specdec.core.verify import verify_batch

# Different lengths on purpose: the short rows are left-padded in every batch.
PROMPTS = ["def fibonacci(n):", "Hi", "The quick brown fox jumps over the lazy dog", "x = 1\ny"]
CHI_CFG = SamplingConfig(temperature=1.5, top_k=12)  # a spread-out p, so a wrong row is visible quickly


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
def test_greedy_rows_equal_batch1_greedy(tiny_pair, gamma):
    s = DecodeSettings(gamma=gamma, max_new_tokens=30)
    refs = [plain_decode(tiny_pair, p, s).ids for p in PROMPTS]
    spec = speculative_batch_decode(tiny_pair, PROMPTS, s)
    assert spec.ids == refs
    assert plain_batch_decode(tiny_pair, PROMPTS, s).ids == refs
    # rows disagree with the draft at different places: lockstep really threw tokens away (not a trivial pass)
    assert any(r.thrown > 0 for r in spec.rounds) or gamma == 1


def test_lockstep_bookkeeping(no_eos):
    s = DecodeSettings(gamma=4, max_new_tokens=40, sampling=SamplingConfig(temperature=0.8), seed=2)
    dec = lockstep(no_eos, PROMPTS, s)
    rounds = []
    while not dec.done:
        rounds.append(dec.step())
    res = dec.result()
    assert [len(x) for x in res.ids] == [40] * len(PROMPTS)
    assert res.stop_reasons == ["max_new_tokens"] * len(PROMPTS)
    done = 0
    for r in rounds:
        ns = [n for n in r.n_accepted if n is not None]
        assert r.slowest == min(ns)
        k = len(r.committed[0])
        assert all(len(c) == k for c in r.committed) and k == min(r.slowest + 1, 40 - done)
        # a minimal row ends on its own repair/bonus, the others only emit kept guesses
        for n, own in zip(r.n_accepted, r.own):
            assert own == (n == r.slowest and k == r.slowest + 1)
        assert r.thrown == sum(min(n + 1, 40 - done) - k for n in ns)
        done += k
    st = res.stats()
    assert st["tokens_per_round_per_row"] == pytest.approx(40 / len(rounds))
    assert 0 < st["alpha"] < 1 and st["thrown_per_round"] > 0


def lockstep(pair, prompts, settings=DecodeSettings()) -> BatchDecoder:
    return BatchDecoder(pair, prompts, settings, commit="lockstep")


def test_caches_match_a_fresh_forward(no_eos):
    """After rejections and lockstep cuts both caches hold exactly the committed text of every row (pads, cut and
    rejected guesses are holes), and every row has emitted the same count."""
    s = DecodeSettings(gamma=5, max_new_tokens=60, sampling=SamplingConfig(temperature=1.0), seed=4)
    dec = lockstep(no_eos, PROMPTS, s)
    for _ in range(6):
        dec.step()
    assert sum(r.thrown for r in dec.rounds) > 0 and len({len(o) for o in dec.out}) == 1
    for lm, model in ((dec.target, no_eos.target), (dec.draft, no_eos.draft)):
        have = lm.counts(dec.batch)
        assert all(len(dec.text(b)) - 2 <= have[b] <= len(dec.text(b)) - 1 for b in range(dec.batch))
        ids, valid = dec._catch_up(lm)
        cont = lm.score(ids, pad=~valid, n_logits=1)[:, -1]
        for b in range(len(PROMPTS)):
            with torch.inference_mode():
                fresh = model(input_ids=torch.tensor([dec.text(b)])).logits[0, -1, : no_eos.vocab_size]
            assert (cont[b] - fresh).abs().max().item() < 1e-4


def test_rows_stop_at_eos_and_ride_along(tiny_pair):
    s = DecodeSettings(gamma=3, max_new_tokens=25)
    ref = speculative_batch_decode(tiny_pair, PROMPTS, s)
    stop = ref.ids[1][5]  # make a token of row 1 an EOS: row 1 must stop there, the others continue unchanged
    pair = dataclasses.replace(tiny_pair, eos_token_ids=(stop,))
    res = speculative_batch_decode(pair, PROMPTS, s)
    refs = [plain_decode(pair, p, s).ids for p in PROMPTS]
    assert res.ids == refs
    assert res.ids[1] == ref.ids[1][: ref.ids[1].index(stop) + 1] and res.stop_reasons[1] == "eos"
    assert res.latency_ms[1] <= max(res.latency_ms)
    assert plain_batch_decode(pair, PROMPTS, s).ids == refs


def _exact_first_two(pair, prompt, cfg):
    """p(first token) and the exact marginal of the second token, Σ_x p(x) p(. | x), by enumeration."""
    ids = pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    with torch.inference_mode():
        p1 = warp(pair.target(input_ids=torch.tensor([ids])).logits[0, -1, : pair.vocab_size], cfg).double()
        support = torch.nonzero(p1 > 0).flatten().tolist()
        ext = torch.tensor([ids + [x] for x in support])
        p2_given = warp(pair.target(input_ids=ext).logits[:, -1, : pair.vocab_size], cfg).double()
    return p1.numpy(), (p1[support, None] * p2_given).sum(0).numpy()


def _batched_first_two(pair, prompts, copies, runs):
    """Counts of each row's first and second emitted token over many batched runs; every prompt sits in `copies`
    rows of each batch (independent draws), so one run gives `copies` samples per prompt."""
    v = pair.vocab_size
    c1 = np.zeros((len(prompts), v))
    c2 = np.zeros((len(prompts), v))
    batch = [p for p in prompts for _ in range(copies)]
    for seed in range(runs):
        res = speculative_batch_decode(pair, batch, DecodeSettings(gamma=3, max_new_tokens=2, sampling=CHI_CFG,
                                                                   seed=seed))
        for row, out in enumerate(res.ids):
            c1[row // copies, out[0]] += 1
            c2[row // copies, out[1]] += 1
    return c1, c2


CHI_PROMPTS = ["ab", "hello wo", "x = 1\nyz", "The quick"]


def _chi_pvalues(pair, runs=150, copies=4):
    c1, c2 = _batched_first_two(pair, CHI_PROMPTS, copies, runs)
    out = []
    for i, prompt in enumerate(CHI_PROMPTS):
        p1, p2 = _exact_first_two(pair, prompt, CHI_CFG)
        out.append((chi_square(c1[i], p1).p_value, chi_square(c2[i], p2).p_value))
    return out


@pytest.mark.stat
def test_chi_square_per_row_first_two_tokens(no_eos):
    """Each row's first token follows its own target p, and so does its second token (marginally), although rows
    are cut to the batch's smallest kept count + 1: the cut does not bias what a row emits."""
    for prompt, (pv1, pv2) in zip(CHI_PROMPTS, _chi_pvalues(no_eos)):
        assert pv1 > 1e-3, (prompt, pv1)
        assert pv2 > 1e-3, (prompt, pv2)


@pytest.mark.stat
def test_chi_square_catches_a_row_verified_against_another_rows_p(no_eos, monkeypatch):
    """Planted bug: every row is verified against the p of the row before it. The same test must fail."""

    def crossed(draft_tokens, draft_probs, target_probs, *a, **kw):
        return verify_batch(draft_tokens, draft_probs, target_probs.roll(1, dims=0), *a, **kw)

    monkeypatch.setattr(batched, "verify_batch", crossed)
    firsts = [pv1 for pv1, _ in _chi_pvalues(no_eos)]
    assert min(firsts) < 1e-6, firsts


def test_sampled_runs_are_reproducible(tiny_pair):
    s = DecodeSettings(gamma=4, max_new_tokens=20, sampling=SamplingConfig(temperature=0.7), seed=9)
    a = speculative_batch_decode(tiny_pair, PROMPTS, s).ids
    assert a == speculative_batch_decode(tiny_pair, PROMPTS, s).ids
    assert a != speculative_batch_decode(tiny_pair, PROMPTS, dataclasses.replace(s, seed=10)).ids


@pytest.mark.parametrize(
    "prompts,match",
    [
        ("just one string", "list of prompts"),
        (None, "list of prompts"),
        ([], "empty"),
        (["a"] * (MAX_BATCH + 1), f"limit is {MAX_BATCH}"),
        (["fine", "   "], "prompt 2 of the batch: the prompt is empty"),
        (["fine", 3], "prompt 2 of the batch is not text"),
    ],
)
def test_bad_batches_are_refused(tiny_pair, prompts, match):
    with pytest.raises(InvalidInputError, match=match):
        encode_batch(tiny_pair.tokenizer, prompts)
    with pytest.raises(InvalidInputError, match=match):
        lockstep(tiny_pair, prompts)
    with pytest.raises(InvalidInputError, match=match):
        plain_batch_decode(tiny_pair, prompts)


def test_bad_settings_are_refused(tiny_pair):
    with pytest.raises(InvalidInputError, match="gamma"):
        lockstep(tiny_pair, ["a"], DecodeSettings(gamma=0))
    with pytest.raises(InvalidInputError, match="fixed gamma"):
        lockstep(tiny_pair, ["a"], DecodeSettings(gamma_policy="heuristic"))
    dec = lockstep(tiny_pair, ["a"], DecodeSettings(max_new_tokens=1))
    dec.run()
    with pytest.raises(InvalidInputError, match="finished"):
        dec.step()


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [4])  # other gammas run on the tiny pair; the real pair is minutes on 2 cores
def test_real_pair_batched_greedy_equals_batch1(real_pair_fp32, real_greedy, gamma):
    """The embedded pair in fp32: each row of a left-padded batch equals that prompt's batch-1 greedy output."""
    prompts = ["def fibonacci(n):", "The history of the printing press begins",
               "import numpy as np\n\ndef moving_average(x, k):"]
    s = DecodeSettings(gamma=gamma, max_new_tokens=16)
    refs = [real_greedy(p, s.max_new_tokens) for p in prompts]
    res = speculative_batch_decode(real_pair_fp32, prompts, s)
    assert res.ids == refs
