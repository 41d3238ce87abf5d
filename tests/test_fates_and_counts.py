"""Defects a second audit found in the engine (none broke exactness), each pinned by a test that failed on 1c256d7:
the batched statistics counted guesses that never reached the text (a), the heuristic gamma policy read an empty
proposal as a fully kept round (c), and a rerun replayed the guesses drafted instead of the gamma asked for (f).
Plus the one stop rule every loop now shares."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specdec.core.events import ACCEPTED, CUT, DISCARDED, REJECTED, Round, Totals, draft_fates
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings
from specdec.core.stop import STOP_LABELS, StopReason, cut_at_stop, stop_label
from specdec.core.verify import BatchVerdict
from specdec.drafters.cross import CrossTokenizerDrafter
from specdec.loop import batched
from specdec.loop.batched import BatchedSpeculativeDecoder
from specdec.loop.decoder import SpeculativeDecoder, rerun
from specdec.loop.gamma import HeuristicGamma
from specdec.models.cross import CrossDraft, tiny_cross_draft

PROMPTS = ["def add(a, b):", "hello world", "the cat sat", "x = [1, 2, 3]"]


# ------------------------------------------------------------------------------------------------ the stop rule


def test_cut_at_stop_ends_after_eos_then_at_the_budget():
    assert cut_at_stop([5, 2, 7], {2}) == ([5, 2], StopReason.EOS)
    assert cut_at_stop([5, 6, 7], {2}, budget=2) == ([5, 6], StopReason.MAX_NEW_TOKENS)
    assert cut_at_stop([5, 6, 2], {2}, budget=2) == ([5, 6], StopReason.MAX_NEW_TOKENS)  # EOS past the budget
    assert cut_at_stop([5, 2], {2}, budget=2) == ([5, 2], StopReason.EOS)  # EOS on the last allowed token
    assert cut_at_stop([5, 6], {2}, budget=3) == ([5, 6], None)
    assert StopReason.EOS == "eos" and f"{StopReason.MAX_NEW_TOKENS}" == "max_new_tokens"
    assert stop_label("eos") == STOP_LABELS[StopReason.EOS] and stop_label(None) == ""


def test_fates_are_one_definition_for_rounds_and_batch_rows():
    # gamma 4, the rule accepted 2 and refused the third; 2 tokens reached the text (an EOS was the second)
    assert draft_fates(4, 2, 2, 2) == [ACCEPTED, ACCEPTED, CUT, DISCARDED]
    assert draft_fates(4, 2, 2, 3) == [ACCEPTED, ACCEPTED, REJECTED, DISCARDED]
    t = Totals()
    t.count(draft_fates(4, 2, 2, 2), 2)
    assert (t.kept, t.tested, t.drafted, t.generated) == (2, 2, 4, 2)


# ------------------------------------------------------- a. batched statistics follow Round.fates


def _independent_counts(rounds) -> tuple[int, int]:
    """kept / tested per row-round from first principles: a guess counts if it is in the row's text; a refusal
    counts if the repair token that replaced it is in the text."""
    kept = tested = 0
    for r in rounds:
        for n, c in zip(r.n_accepted, r.committed):
            if n is None:
                continue
            k = min(n, len(c))
            kept += k
            tested += k + (n < r.gamma and len(c) > n)
    return kept, tested


@pytest.mark.parametrize("seed", [0, 3])
def test_batched_alpha_counts_only_what_reached_the_text(tiny_pair, seed):
    s = DecodeSettings(gamma=4, max_new_tokens=24, sampling=SamplingConfig(temperature=1.0), seed=seed)
    res = BatchedSpeculativeDecoder(tiny_pair, PROMPTS, s).run()
    kept, tested = _independent_counts(res.rounds)
    st = res.stats()
    assert (st["accepted"], st["tested"]) == (kept, tested)
    assert st["alpha"] == pytest.approx(kept / tested)
    # the lockstep cut threw accepted guesses away in these runs: counting the rule's verdicts would differ
    assert sum(n for r in res.rounds for n in r.n_accepted if n is not None) > kept


def _scripted_verdicts(monkeypatch, plan):
    """verify_batch replaced by a script: per round, (n_accepted per row, next token per row)."""
    calls = iter(plan)

    def fake(draft_tokens, q, p, gen, **rule):
        n, nxt = next(calls)
        b, g = draft_tokens.shape
        return BatchVerdict(torch.tensor(n), torch.tensor(nxt), torch.ones(b, g), torch.zeros(b, g), p[:, -1])

    monkeypatch.setattr(batched, "verify_batch", fake)


def test_a_row_that_ends_does_not_hold_the_others_back(no_eos, monkeypatch):
    eos = 7
    pair = dataclasses.replace(no_eos, eos_token_ids=(eos,))
    # Round 1: row 0 accepts nothing and its repair token is EOS (it ends); row 1 accepts all 4 guesses.
    _scripted_verdicts(monkeypatch, [([0, 4], [eos, 11])])
    dec = BatchedSpeculativeDecoder(pair, PROMPTS[:2], DecodeSettings(gamma=4, max_new_tokens=20, seed=0))
    dec.draft.keep_in_head([eos, 11])
    rnd = dec.step()
    assert rnd.committed[0] == [eos] and dec.rows.stop[0] == StopReason.EOS
    assert len(rnd.committed[1]) == 5, "row 1 must keep its 4 accepted guesses and its bonus token"
    assert rnd.slowest == 4 and rnd.held == [0, 0] and rnd.own == [True, True]


def test_post_eos_guesses_are_cut_in_the_batched_counts(no_eos, monkeypatch):
    pair = dataclasses.replace(no_eos, eos_token_ids=(7,))
    s = DecodeSettings(gamma=4, max_new_tokens=20, seed=0)
    dec = BatchedSpeculativeDecoder(pair, PROMPTS[:2], s)
    # Force row 0's first guess to be EOS: every row's guesses are drawn, then the script accepts all of them.
    real_forward = dec.draft.forward

    def forward(ids, mask, n_logits):
        out = real_forward(ids, mask, n_logits).clone()
        out[0, -1, :] = -float("inf")
        out[0, -1, 7] = 0.0  # row 0 always guesses EOS
        return out

    dec.draft.forward = forward
    _scripted_verdicts(monkeypatch, [([4, 4], [3, 3])])
    rnd = dec.step()
    assert rnd.committed[0] == [7]
    assert rnd.row_fates(0) == [ACCEPTED, CUT, CUT, CUT]
    st = dec.result().stats()
    assert st["accepted"] == 1 + len(rnd.committed[1]) - 1 and st["tested"] == st["accepted"]


# ------------------------------------------------------------- c. an empty proposal says nothing


def _round(gamma: int, n_accepted: int) -> Round:
    return Round(index=1, position=0, gamma=gamma, draft_ids=[1] * gamma, draft_pieces=["a"] * gamma,
                 q_draft=[1.0] * gamma, p_draft=[0.5] * gamma, accept_probs=[0.5] * gamma, uniforms=[0.1] * gamma,
                 n_accepted=n_accepted, rejected_at=None if n_accepted == gamma else n_accepted, emitted_id=2,
                 emitted_piece="b", is_bonus=n_accepted == gamma, emitted_p=0.5, q_top=[], p_top=[],
                 residual_top=None, committed_ids=[1] * n_accepted + [2], committed_pieces=[], draft_ms=1.0,
                 verify_ms=1.0)


def test_heuristic_gamma_ignores_rounds_without_a_proposal():
    policy = HeuristicGamma(4)
    for _ in range(5):
        policy.observe(_round(0, 0))
    assert policy.gamma == 4
    policy.observe(_round(4, 4))
    assert policy.gamma == 6
    policy.observe(_round(6, 2))
    assert policy.gamma == 5


class AskedRecorder:
    """Wraps a drafter and records the gamma each round asked it for."""

    def __init__(self, inner):
        self.inner, self.asked = inner, []

    def propose(self, committed, gamma, cfg, gen):
        self.asked.append(gamma)
        return self.inner.propose(committed, gamma, cfg, gen)

    def feedback(self, committed, n_accepted, n_drafted):
        self.inner.feedback(committed, n_accepted, n_drafted)


def test_ngram_rounds_without_a_match_do_not_inflate_gamma(tiny_pair):
    from specdec.drafters import make_drafter

    s = DecodeSettings(gamma=4, max_new_tokens=24, drafter="ngram", gamma_policy="heuristic", seed=0)
    dec = SpeculativeDecoder(tiny_pair, "qwertyuiop", s)
    rec = AskedRecorder(make_drafter(tiny_pair, s, dec.prompt_ids))
    dec.drafter = rec
    list(dec)
    empty = [i for i, r in enumerate(dec.rounds) if r.gamma == 0]
    assert empty, "the test needs rounds where ngram found no match"
    for i in empty:
        if i + 1 < len(dec.rounds):
            assert rec.asked[i + 1] <= rec.asked[i], f"gamma grew after the empty round {i}: {rec.asked}"


# ------------------------------------------------- f. a rerun asks for the gamma that was asked


@pytest.fixture(scope="module")
def merging_pair(tiny_pair):
    """A target whose tokenizer merges characters ("th", " t", "return", ...): the tiny cross draft's BPE model,
    with a character-level cross draft (the tiny draft and its tokenizer). A few drafted characters then
    re-tokenize into fewer target tokens than the gamma asked for."""
    bpe = tiny_cross_draft(tiny_pair)
    tok = bpe.tokenizer
    pair = dataclasses.replace(tiny_pair, target=bpe.model, draft=bpe.model, tokenizer=tok, name="merging",
                               target_id="test:merging", draft_id="test:merging", vocab_size=len(tok),
                               eos_token_ids=(tok.eos_token_id,))
    return pair, CrossDraft(tiny_pair.draft, tiny_pair.tokenizer, "character draft")


def test_rerun_reproduces_a_run_whose_drafts_merged(merging_pair, monkeypatch):
    pair, chars = merging_pair
    import specdec.models.cross as cross_mod

    monkeypatch.setattr(cross_mod, "load_cross_draft", lambda _pair: chars)
    s = DecodeSettings(gamma=6, max_new_tokens=40, drafter="cross", sampling=SamplingConfig(temperature=1.0), seed=0)
    dec = SpeculativeDecoder(pair, "the theme then", s)
    assert isinstance(dec.drafter, CrossTokenizerDrafter)
    list(dec)
    record = dec.record()
    merged = [r for r in record.rounds if 0 < r.gamma < r.asked]
    assert merged, "the test needs rounds whose characters merged into fewer target tokens"
    again = rerun(record, pair)
    assert again.generated_ids == dec.generated_ids
    assert [r.asked for r in again.rounds] == record.gamma_schedule
