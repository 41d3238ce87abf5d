"""The hybrid drafter ("auto"): a copy after a strong n-gram match, else (and past the copy) the draft model.

Its proposals and their per-position q (one-hot rows for copied guesses, the model's rows for its own); the draft
model's cache kept to the committed text across copied rounds (each model q equals a fresh full pass); greedy =
plain greedy on the tiny and the real pair; the joint law of the first 3 tokens at T > 0, failing on a planted
wrong q for the copied guesses; and the name "auto" in settings, the CLI, race lanes and traces."""

from __future__ import annotations

import itertools
import json
from collections import Counter

import pytest
import torch

from specdec.core.sampling import OneHot, SamplingConfig, cat_rows, dense, warp
from specdec.core.settings import DRAFTER_LABELS, DRAFTERS, GAMMA_POLICIES, DecodeSettings, encode_prompt
from specdec.drafters import Draft, make_drafter
from specdec.drafters.hybrid import HybridDrafter
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from tests.conftest import REPEATING_CODE
from tests.test_drafters import LOOPY_PROMPT, N_SAMPLES, SAMPLED, joint_chi_square

# "d" then "jjjj": the suffix "jjj" recurs one token back (a strong, 3-token match) with one "j" after it before
# the end of the text, so round one copies one guess and the draft model adds the next; the tiny target gives
# "j" p = 0.48 there, and later rounds mix copied, model and mixed drafts (counted in the test).
MIXED_PROMPT = "djjjj"


def _hybrid(pair, **kw) -> HybridDrafter:
    s = DecodeSettings(drafter="auto", **kw)
    return make_drafter(pair, s.validate(), encode_prompt(pair.tokenizer, "x"))


# ------------------------------------------------------------------------------------------- mixing q rows


def test_cat_rows_keeps_one_hot_ids_and_mixes_with_dense_rows():
    a, b = OneHot(torch.tensor([3, 1]), 5), OneHot(torch.tensor([4]), 5)
    both = cat_rows([a, b])
    assert isinstance(both, OneHot) and both.ids.tolist() == [3, 1, 4]
    d = torch.softmax(torch.randn(2, 5), -1)
    mixed = cat_rows([a, d])
    assert mixed.shape == (4, 5) and mixed.dtype == torch.float32
    assert torch.equal(mixed[:2], dense(a)) and torch.equal(mixed[2:], d)


# ---------------------------------------------------------------------------------------------- proposals


def test_a_strong_match_is_copied_with_one_hot_q(no_eos):
    h = _hybrid(no_eos)
    ids = [10, 11, 12, 13, 14, 15, 16, 17, 30, 10, 11, 12]  # "10 11 12" recurs: a 3-token match
    d = h.propose(ids, 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert d.tokens.tolist() == [13, 14, 15, 16] and isinstance(d.probs, OneHot)
    assert (d.note.drafter, d.note.one_hot, d.note.source_start, d.note.match_len) == ("ngram", True, 3, 3)
    assert len(h.model.lm) == 0  # the draft model did no work


def test_a_weak_match_goes_to_the_draft_model(no_eos):
    h = _hybrid(no_eos)
    ids = [10, 11, 12, 13, 14, 15, 30, 31, 12]  # only "12" recurs: a 1-token match
    d = h.propose(ids, 3, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(0))
    assert d.note.drafter == "model" and d.tokens.numel() == 3 and not isinstance(d.probs, OneHot)


def test_a_copy_that_reaches_the_end_is_extended_by_the_model_with_its_exact_q(no_eos):
    h = _hybrid(no_eos)
    ids = [10, 20, 21, 22, 20, 21, 22]  # "20 21 22" recurs, and what followed it is the text's own end
    cfg = SamplingConfig(temperature=1.0)
    d = h.propose(ids, 5, cfg, torch.Generator().manual_seed(0))
    assert d.tokens[:3].tolist() == [20, 21, 22] and d.tokens.numel() == 5  # 3 copied, 2 from the model
    assert (d.note.drafter, d.note.one_hot, d.note.source_start, d.note.match_len) == ("auto", False, 4, 3)
    q = dense(d.probs)
    assert torch.equal(q[:3], dense(OneHot(d.tokens[:3], no_eos.vocab_size)))
    for i in (3, 4):  # the model's rows: what a fresh full pass of the draft gives after the copied guesses
        with torch.inference_mode():
            fresh = warp(no_eos.draft(input_ids=torch.tensor([ids + d.tokens[:i].tolist()])).logits[0, -1], cfg)
        torch.testing.assert_close(q[i], fresh, atol=1e-5, rtol=1e-4)
    assert h.copy(ids, 2) == ([20, 21], 4, 3)  # a gamma the copy covers: no model at all


def test_a_copied_eos_ends_the_draft(tiny_pair):
    h = _hybrid(tiny_pair)
    ids = [10, 11, 12, 1, 40, 41, 10, 11, 12]  # "10 11 12" was followed by EOS (id 1)
    d = h.propose(ids, 4, SamplingConfig(), None)
    assert d.tokens.tolist() == [1] and d.note.drafter == "ngram"


@pytest.mark.parametrize("n_max,strong", [(4, 3), (2, 2), (1, 1)])
def test_the_strong_threshold_is_capped_at_n_max(no_eos, n_max, strong):
    s = DecodeSettings(drafter="auto", ngram_max=n_max, ngram_min=1)
    assert make_drafter(no_eos, s, [5]).strong == strong


# ------------------------------------------------------------------------------- the draft model's KV cache


def test_the_draft_cache_follows_the_committed_text_through_copied_rounds(no_eos, one_thread):
    """At T > 0 every q the draft model reports equals a fresh full pass over the committed text plus the guesses
    before it: its cache never holds a stale or missing token, whatever the earlier rounds copied."""
    cfg = SamplingConfig(temperature=1.0)
    kinds = Counter()
    for prompt in (LOOPY_PROMPT, MIXED_PROMPT, "abcabcabcab"):
        dec = SpeculativeDecoder(no_eos, prompt, DecodeSettings(drafter="auto", gamma=4, sampling=cfg, seed=1,
                                                                max_new_tokens=40))
        h = dec.drafter
        while not dec.done:
            before = list(dec.ids)
            rnd = dec.step()
            kinds[rnd.drafter] += 1
            lm = h.model.lm
            assert lm.ids == dec.ids[: len(lm.ids)] and len(lm.ids) < len(dec.ids)
            copied = {"ngram": rnd.gamma, "auto": None, "model": 0}[rnd.drafter]
            if copied is None:
                copied = len(h.copy(before, rnd.gamma)[0])
            for i in range(copied, rnd.gamma):
                with torch.inference_mode():
                    logits = no_eos.draft(input_ids=torch.tensor([before + rnd.draft_ids[:i]])).logits[0, -1]
                assert rnd.q_draft[i] == pytest.approx(float(warp(logits, cfg)[rnd.draft_ids[i]]), abs=1e-5)
            for i in range(copied):
                assert rnd.q_draft[i] == 1.0
    assert kinds["ngram"] and kinds["model"] and kinds["auto"], kinds


# ---------------------------------------------------------------------------------------- greedy = plain greedy


@pytest.mark.parametrize("pair_name", ["tiny_pair", "no_eos"])
def test_greedy_equals_plain_greedy_for_every_gamma_and_policy(request, one_thread, pair_name):
    pair = request.getfixturevalue(pair_name)
    kinds, kept = Counter(), 0
    prompts = (LOOPY_PROMPT, MIXED_PROMPT, "abcabcabcab")
    refs = {prompt: plain_decode(pair, prompt, DecodeSettings(max_new_tokens=32)).ids for prompt in prompts}  # deterministic
    for prompt, (gamma, policy), n_max in itertools.product(prompts, itertools.product((1, 3, 6), GAMMA_POLICIES),
                                                            (4, 2)):
        ref = refs[prompt]
        s = DecodeSettings(drafter="auto", gamma=gamma, gamma_policy=policy, ngram_max=n_max, max_new_tokens=32)
        dec = SpeculativeDecoder(pair, prompt, s)
        rounds = list(dec)
        assert dec.generated_ids == ref, (prompt[:20], gamma, policy, n_max)
        kinds.update(r.drafter for r in rounds)
        kept += sum(r.kept for r in rounds)
    assert kept > 0 and kinds["ngram"] and kinds["model"] and kinds["auto"], kinds


# --------------------------------------------------------------------------- the joint law of the first 3 tokens


@pytest.mark.stat
def test_first_three_tokens_follow_the_target(no_eos, one_thread):
    kinds = Counter()
    for seed in range(40):  # the runs the chi-square counts mix all three kinds of drafts
        dec = SpeculativeDecoder(no_eos, MIXED_PROMPT, DecodeSettings(drafter="auto", gamma=2, sampling=SAMPLED,
                                                                      seed=seed, max_new_tokens=3))
        kinds.update(r.drafter for r in dec)
    assert kinds["ngram"] and kinds["model"] and kinds["auto"], kinds
    s = DecodeSettings(drafter="auto", gamma=2, sampling=SAMPLED)
    test = joint_chi_square(no_eos, MIXED_PROMPT, s, N_SAMPLES)
    assert test.p_value > 1e-3, test


class ModelQForCopies:
    """A planted bug: the copied guesses report the draft model's q at their position (what it would have
    sampled from there) instead of the one-hot q they were chosen with."""

    def __init__(self, inner: HybridDrafter, pair):
        self.inner, self.pair = inner, pair

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        copied = self.inner.copy(committed, gamma)
        d = self.inner.propose(committed, gamma, cfg, gen)
        if copied is None:
            return d
        q = dense(d.probs).clone()
        for i in range(len(copied[0])):
            with torch.inference_mode():
                logits = self.pair.draft(input_ids=torch.tensor([committed + d.tokens[:i].tolist()])).logits[0, -1]
            q[i] = warp(logits, cfg)
        return Draft(d.tokens, q, d.note)

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        self.inner.feedback(committed, n_accepted, n_drafted)


@pytest.mark.stat
def test_the_chi_square_catches_copied_guesses_given_the_models_q(no_eos, one_thread):
    s = DecodeSettings(drafter="auto", gamma=2, sampling=SAMPLED)
    ids = encode_prompt(no_eos.tokenizer, MIXED_PROMPT)
    wrong = joint_chi_square(no_eos, MIXED_PROMPT, s, N_SAMPLES,
                             lambda st: ModelQForCopies(make_drafter(no_eos, st, ids), no_eos))
    assert wrong.p_value < 1e-3, wrong


# ------------------------------------------------------------------------------ the name in every entry point


def test_auto_is_a_drafter_everywhere(no_eos, tiny_pair, capsys):
    from components.race import render_race
    from specdec.cli import main
    from specdec.io.trace import dumps_trace, load_trace
    from specdec.loop.race import LaneSpec, Race, parse_lanes

    assert "auto" in DRAFTERS and DRAFTER_LABELS["auto"] == "hybrid (copy, else model)"
    assert parse_lanes("auto:6, auto:expected") == [LaneSpec("auto", 6), LaneSpec("auto", 4, "expected")]
    race = Race(no_eos, MIXED_PROMPT, DecodeSettings(max_new_tokens=10), parse_lanes("auto:3"))
    mixed = None
    for _ in race:
        rnd = race.lanes[1].rounds[-1] if race.lanes[1].rounds else None
        if rnd is not None and rnd.drafter == "auto" and mixed is None:
            mixed = render_race(race.view())  # the lane's detail while its last proposal is a mixed one
    assert race.texts_identical and race.lanes[1].spec.label.startswith("hybrid (copy, else model)")
    assert mixed is not None and "copied 1 token after a 3-token match" in mixed and "sampled 2 more" in mixed
    dec = SpeculativeDecoder(no_eos, LOOPY_PROMPT, DecodeSettings(drafter="auto", gamma=4, max_new_tokens=24))
    list(dec)
    back = load_trace(dumps_trace(dec.record()))
    assert back.settings.drafter == "auto" and {r.drafter for r in back.rounds} == {r.drafter for r in dec.rounds}
    assert main(["generate", "--pair", "tiny", "--dtype", "float32", "--prompt", LOOPY_PROMPT, "--drafter", "auto",
                 "--max-new-tokens", "12", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["text"] == plain_decode(tiny_pair, LOOPY_PROMPT, DecodeSettings(max_new_tokens=12)).text


# ------------------------------------------------------------------------------------------------ real pair


@pytest.mark.slow
def test_real_pair_greedy_hybrid_equals_plain_greedy(real_pair_fp32, real_greedy):
    """fp32 on a CPU: the embedded pair's hybrid rounds (copied, model and mixed) write plain greedy's text."""
    prompt = REPEATING_CODE
    s = DecodeSettings(drafter="auto", gamma=6, max_new_tokens=24)
    ref = real_greedy(prompt, s.max_new_tokens)
    dec = SpeculativeDecoder(real_pair_fp32, prompt, s)
    rounds = list(dec)
    assert dec.generated_ids == ref, real_pair_fp32.tokenizer.decode(dec.generated_ids)
    assert sum(r.kept for r in rounds) > 0 and {r.drafter for r in rounds} & {"ngram", "auto"}


# ------------------------------------------------------------------ lead="model": the model first, then a copy


# "ififif": the tiny draft's top two guesses after it (its SAMPLED, top-k 2, candidates) are "i" about half the time,
# which extends the 3-token match "fif" -> the round hands over to a copy.
RUN_PROMPT = "ififif"


def _model_lead(pair, s: DecodeSettings, prompt: str) -> HybridDrafter:
    return make_drafter(pair, s, encode_prompt(pair.tokenizer, prompt), hybrid_lead="model")


def test_the_model_leads_and_a_strong_match_after_its_guesses_hands_over_to_a_copy(no_eos, one_thread):
    """Every round starts with the model's guess (its exact q, equal to a fresh full pass); a round whose guesses
    then extend a strong match ends in one-hot copied rows; the draft never stops short of gamma for a copy."""
    cfg = SAMPLED
    kinds = Counter()
    for seed, prompt in itertools.product(range(6), (RUN_PROMPT, MIXED_PROMPT)):
        s = DecodeSettings(drafter="auto", gamma=4, sampling=cfg, seed=seed, max_new_tokens=12)
        dec = SpeculativeDecoder(no_eos, prompt, s, drafter=_model_lead(no_eos, s, prompt))
        while not dec.done:
            before = list(dec.ids)
            rnd = dec.step()
            kinds[rnd.drafter] += 1
            assert rnd.drafter in ("model", "auto")
            one_hot = [q == 1.0 for q in rnd.q_draft]
            n_model = one_hot.index(True) if rnd.drafter == "auto" else len(one_hot)
            assert n_model >= 1 and all(one_hot[n_model:])  # the model's guesses first, then the copy's
            for i in range(n_model):
                with torch.inference_mode():
                    logits = no_eos.draft(input_ids=torch.tensor([before + rnd.draft_ids[:i]])).logits[0, -1]
                assert rnd.q_draft[i] == pytest.approx(float(warp(logits, cfg)[rnd.draft_ids[i]]), abs=1e-5)
    assert kinds["model"] and kinds["auto"], kinds


@pytest.mark.parametrize("pair_name", ["tiny_pair", "no_eos"])
def test_model_lead_greedy_equals_plain_greedy(request, one_thread, pair_name):
    pair = request.getfixturevalue(pair_name)
    kinds = Counter()
    prompts = (LOOPY_PROMPT, MIXED_PROMPT, "abcabcabcab")
    refs = {prompt: plain_decode(pair, prompt, DecodeSettings(max_new_tokens=32)).ids for prompt in prompts}  # deterministic
    for prompt, gamma, policy in itertools.product(prompts, (3, 6), ("fixed", "confidence")):
        ref = refs[prompt]
        s = DecodeSettings(drafter="auto", gamma=gamma, gamma_policy=policy, max_new_tokens=32)
        dec = SpeculativeDecoder(pair, prompt, s, drafter=_model_lead(pair, s, prompt))
        kinds.update(r.drafter for r in dec)
        assert dec.generated_ids == ref, (prompt[:20], gamma, policy)
    assert kinds["model"] and kinds["auto"], kinds


class ModelQForOneHotRows:
    """A planted bug for either lead: every copied (one-hot) guess reports the draft model's q at its position."""

    def __init__(self, inner: HybridDrafter, pair):
        self.inner, self.pair = inner, pair

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        d = self.inner.propose(committed, gamma, cfg, gen)
        q = dense(d.probs).clone()
        for i in range(len(d.tokens)):
            if float(q[i].max()) == 1.0:
                with torch.inference_mode():
                    ids = torch.tensor([list(committed) + d.tokens[:i].tolist()])
                    q[i] = warp(self.pair.draft(input_ids=ids).logits[0, -1], cfg)
        return Draft(d.tokens, q, d.note)

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        self.inner.feedback(committed, n_accepted, n_drafted)


@pytest.mark.stat
def test_model_lead_first_three_tokens_follow_the_target_and_the_chi_square_catches_a_planted_q(no_eos, one_thread):
    s = DecodeSettings(drafter="auto", gamma=3, sampling=SAMPLED)
    ok = joint_chi_square(no_eos, RUN_PROMPT, s, N_SAMPLES, lambda st: _model_lead(no_eos, st, RUN_PROMPT))
    assert ok.p_value > 1e-3, ok
    wrong = joint_chi_square(no_eos, RUN_PROMPT, s, N_SAMPLES,
                             lambda st: ModelQForOneHotRows(_model_lead(no_eos, st, RUN_PROMPT), no_eos))
    assert wrong.p_value < 1e-3, wrong


def test_an_unknown_lead_is_refused(no_eos):
    with pytest.raises(ValueError, match="lead"):
        HybridDrafter(_hybrid(no_eos).model, no_eos.vocab_size, no_eos.device, lead="target")
