"""Which guesses count: the one stop rule every loop shares, the fates of a round's guesses, and the kept / tested
statistics of single and batched runs, which count only guesses that reached the text (not those past a committed
EOS or thrown away by the lockstep cut)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specdec.core.events import CUT, DISCARDED, KEPT, REJECTED, Round, Totals, draft_fates
from specdec.core.metrics import summarize
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings
from specdec.core.stop import STOP_LABELS, StopReason, cut_at_stop, stop_label
from specdec.core.verify import BatchVerdict
from specdec.loop import batched
from specdec.loop.batched import BatchDecoder
from specdec.loop.decoder import SpeculativeDecoder


PROMPTS = ["def add(a, b):", "hello world", "the cat sat", "x = [1, 2, 3]"]


# ------------------------------------------------------------------------------------------------------- the stop rule


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
    assert draft_fates(4, 2, 2, 2) == [KEPT, KEPT, CUT, DISCARDED]
    assert draft_fates(4, 2, 2, 3) == [KEPT, KEPT, REJECTED, DISCARDED]
    t = Totals()
    t.count(draft_fates(4, 2, 2, 2), 2)
    assert (t.kept, t.tested, t.drafted, t.generated) == (2, 2, 4, 2)


# --------------------------------------------------------------------------- single runs: guesses past a committed EOS


# Statistics once counted guesses kept past a committed EOS.
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
    assert cut.fates == [KEPT, KEPT, CUT, CUT]
    m = summarize([cut, _round(gamma=4, n_accepted=1, committed=2)])
    assert m.kept == 2 + 1
    assert m.tested == 2 + 2  # the second round tested its kept guess and its rejection
    assert m.alpha == pytest.approx(3 / 4)
    assert m.kept_histogram == [0, 1, 1, 0, 0]
    assert m.kept_per_position[:2] == [1.0, 0.5] and m.kept_per_position[2] == 0.0


def test_decoder_totals_match_the_rounds(tiny_pair):
    dec = SpeculativeDecoder(tiny_pair, "hello", DecodeSettings(max_new_tokens=30, sampling=SamplingConfig(0.9)))
    list(dec)
    m = summarize(dec.rounds)
    assert dec.totals.kept == m.kept and dec.totals.tested == m.tested


# ------------------------------------------------------------------------------- batched statistics follow Round.fates


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
    res = BatchDecoder(tiny_pair, PROMPTS, s, commit="lockstep").run()
    kept, tested = _independent_counts(res.rounds)
    st = res.stats()
    assert (st["kept"], st["tested"]) == (kept, tested)
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
    dec = BatchDecoder(pair, PROMPTS[:2], DecodeSettings(gamma=4, max_new_tokens=20, seed=0), commit="lockstep")
    dec.draft.keep_in_head([eos, 11])
    rnd = dec.step()
    assert rnd.committed[0] == [eos] and dec.stop[0] == StopReason.EOS
    assert len(rnd.committed[1]) == 5, "row 1 must keep its 4 accepted guesses and its bonus token"
    assert rnd.slowest == 4 and rnd.held == [0, 0] and rnd.own == [True, True]


def test_post_eos_guesses_are_cut_in_the_batched_counts(no_eos, monkeypatch):
    pair = dataclasses.replace(no_eos, eos_token_ids=(7,))
    s = DecodeSettings(gamma=4, max_new_tokens=20, seed=0)
    dec = BatchDecoder(pair, PROMPTS[:2], s, commit="lockstep")
    # Force row 0's first guess to be EOS: every row's guesses are drawn, then the script accepts all of them.
    real_score = dec.draft.score

    def score(ids, **kw):
        out = real_score(ids, **kw).clone()
        out[0, -1, :] = -float("inf")
        out[0, -1, 7] = 0.0  # row 0 always guesses EOS
        return out

    dec.draft.score = score
    _scripted_verdicts(monkeypatch, [([4, 4], [3, 3])])
    rnd = dec.step()
    assert rnd.committed[0] == [7]
    assert rnd.row_fates(0) == [KEPT, CUT, CUT, CUT]
    st = dec.result().stats()
    assert st["kept"] == 1 + len(rnd.committed[1]) - 1 and st["tested"] == st["kept"]
