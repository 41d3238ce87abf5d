"""The suffix drafter (drafters/suffix.py) and copy length by expected gain (drafters/gain.py): the index's counts
and choices, its incremental cost, where a copy came from, exactness (greedy = plain greedy on the tiny fp32 pair
and on the real fp32 pair; the joint law of the first 3 tokens at T = 1 by chi-square, failing on a planted wrong
q), and that one session's earlier runs never reach another session's index."""

from __future__ import annotations

import random

import pytest
import torch

from specdec.core.events import KEPT, REJECTED, DraftNote, Round
from specdec.core.sampling import SamplingConfig, dense
from specdec.core.settings import MAX_GAMMA, DecodeSettings, encode_prompt
from specdec.drafters import make_drafter
from specdec.drafters.gain import PRIOR_WIDTH, CopyGain
from specdec.drafters.ngram import NgramDrafter
from specdec.drafters.suffix import DEPTH, SuffixDrafter, SuffixIndex
from specdec.loop.decoder import SpeculativeDecoder, rerun
from specdec.loop.plain import plain_decode
from tests.conftest import REPEATING_CODE
from tests.test_drafters import N_SAMPLES, SAMPLED, SmoothedQ, _ngram_prompt, joint_chi_square

V = 1000
CFG = SamplingConfig()


def propose(drafter, ids, gamma=8):
    d = drafter.propose(ids, gamma, CFG, None)
    return d.tokens.tolist(), d.note


# ------------------------------------------------------------------------------------------------- the index


def test_the_most_frequent_continuation_wins_and_the_most_recent_breaks_ties():
    # after "5": 6 twice, 7 once (the most recent) -> 6; the copy goes on from "5 6" as it did
    ids = [5, 6, 8, 5, 6, 8, 5, 7, 9, 5]
    toks, note = propose(SuffixDrafter(V, "cpu"), ids, 2)
    assert toks == [6, 8] and note.match_len == 1 and note.source == "prompt" and note.source_start == 4
    # one occurrence each: the most recent (7) wins
    toks, _ = propose(SuffixDrafter(V, "cpu", min_prob=0.0), [5, 6, 5, 7, 5], 1)
    assert toks == [7]


def test_the_walk_stops_when_the_paths_probability_falls_below_min_prob():
    # "1" is followed by 2, 3, 4, 5 once each: the first step already has probability 1/4
    ids = [1, 2, 1, 3, 1, 4, 1, 5, 1]
    assert propose(SuffixDrafter(V, "cpu", min_prob=0.3), ids)[0] == []
    assert propose(SuffixDrafter(V, "cpu", min_prob=0.2), ids, 1)[0] == [5]
    nothing = SuffixDrafter(V, "cpu").propose([4, 5, 6], 4, CFG, None)  # no context ever followed: no draft
    assert nothing.tokens.numel() == 0 and nothing.note.drafter == "suffix" and nothing.note.source is None


def test_a_longer_match_earns_a_longer_draft():
    base = list(range(100, 140))
    one = SuffixDrafter(V, "cpu", spec_factor=2.0)
    assert len(propose(one, [7] + base + [7], 32)[0]) == 2  # a 1-token match: 2 x 1 tokens
    long = SuffixDrafter(V, "cpu", spec_factor=2.0)
    toks, note = propose(long, base + [9] + base[:20], 32)  # a 20-token match, measured past the index's depth
    assert note.match_len == 20 > DEPTH  # measured past the index's depth against the place it was seen
    assert toks == (base[20:] + [9] + base)[:32]  # the rest of the copy, then on into the text's own repeat
    assert len(propose(SuffixDrafter(V, "cpu", spec_factor=1.0), base + [9] + base[:20], 32)[0]) == 20


def test_the_index_is_incremental_and_its_bulk_path_agrees():
    random.seed(0)
    text = [random.randrange(40) for _ in range(3000)]
    bulk = SuffixIndex()
    bulk.add_doc(text)
    step = SuffixIndex()
    doc = step.add_doc()
    for i in range(0, len(text), 5):
        step.extend(doc, text[i:i + 5])
    view = lambda ix: {h: (c.total, c.best, c.best_count, c.best_src) for h, c in ix.table.items()}  # noqa: E731
    assert view(bulk) == view(step)
    # a round's work is depth counts per new token, whatever the length of the text
    d = SuffixDrafter(V, "cpu")
    d.propose(text, 8, CFG, None)
    before = d.index.updates
    d.propose(text + [1, 2, 3], 8, CFG, None)
    assert d.index.updates - before == 3 * DEPTH


def test_sources_prompt_output_and_an_earlier_run():
    prompt = [10, 11, 12, 13, 14]
    d = SuffixDrafter(V, "cpu", history=[[50, 51, 52, 53, 54, 55]])
    assert propose(d, prompt + [10, 11])[1].source == "prompt"
    toks, note = propose(d, prompt + [10, 11, 20, 21, 22, 20, 21])  # "20 21" was written in the output
    assert note.source == "output" and note.source_start == 9 and toks[0] == 22
    toks, note = propose(d, prompt + [10, 11, 20, 21, 22, 20, 21, 50, 51])
    assert note.source == "earlier run" and note.source_start == 2 and toks[:4] == [52, 53, 54, 55]


def test_proposals_are_one_hot_and_end_after_a_copied_eos():
    d = SuffixDrafter(V, "cpu", eos_token_ids=(1,))
    draft = d.propose([10, 11, 12, 1, 13, 10, 11], 5, CFG, None)
    assert draft.tokens.tolist() == [12, 1]
    assert torch.equal(dense(draft.probs), torch.nn.functional.one_hot(draft.tokens, V).float())


def test_the_tree_has_a_branch_per_continuation_most_frequent_first():
    d = SuffixDrafter(V, "cpu", min_prob=0.0)
    tree = d.propose_tree([5, 6, 8, 5, 6, 8, 5, 7, 9, 5], 2, 16, CFG, None)
    assert tree.tokens.tolist() == [6, 8, 7, 9] and tree.parents == [-1, 0, -1, 2]


def test_the_token_view_says_where_a_copy_came_from(tiny_pair):
    from components.tokens import copy_source_note, render_round

    prompt = REPEATS[0]
    earlier = tiny_pair.tokenizer.decode(plain_decode(tiny_pair, prompt, DecodeSettings(max_new_tokens=16)).ids)
    dec = SpeculativeDecoder(tiny_pair, prompt, DecodeSettings(drafter="suffix", gamma=8, max_new_tokens=16),
                             history=[earlier])
    rounds = [r for r in dec if r.gamma]
    assert {r.note.source for r in rounds} >= {"prompt", "earlier run"}
    for r in rounds:
        html = render_round(r)
        assert f'data-src="{r.note.source}"' in html and html.count("suffix index: copied from") == r.gamma
    assert "an earlier run of yours" in copy_source_note(next(r for r in rounds if r.note.source == "earlier run"))


# ------------------------------------------------------------------------------------------- expected gain


def _round(index: int, gamma: int, kept: int, match: int, ms: float) -> Round:
    r = Round(index, 0, gamma, [0] * gamma, [""] * gamma, [1.0] * gamma, [1.0] * gamma, [1.0] * gamma,
              [0.0] * gamma, kept, kept if kept < gamma else None, 0, "", kept == gamma, 1.0, [], [], None,
              [0] * (kept + 1), [""] * (kept + 1), 0.0, ms, note=DraftNote("suffix", True, 0, match))
    r.round_ms = ms
    return r


def test_gain_copies_far_when_copies_hold_and_width_is_cheap_and_little_otherwise():
    good, bad = CopyGain(), CopyGain()
    for i in range(1, 30):
        g = 8 if i % 2 else 16
        good.observe(_round(i, g, g, 8, 100.0 + 0.01 * g))  # every guess kept; width ~free
        g = 4 if i % 2 else 12
        bad.observe(_round(i, g, 0, 1, 100.0 + 10.0 * g))  # every first guess refused; 10 % of a round a token
    assert good.width_cost() < PRIOR_WIDTH < 2 * PRIOR_WIDTH < bad.width_cost()
    assert good.choose(8, MAX_GAMMA) > 24  # past the 16 positions seen, on the prior's 0.85 a guess
    assert bad.choose(1, MAX_GAMMA) == 1
    assert good.expected(8, 16) > 15 and bad.expected(1, 4) < 1.2
    assert [f for f in _round(1, 4, 2, 1, 1.0).fates][:3] == [KEPT, KEPT, REJECTED]


@pytest.mark.parametrize("drafter", ["ngram", "suffix"])
def test_under_the_expected_policy_a_copy_chooses_its_length_and_a_replay_keeps_it(tiny_pair, drafter):
    prompt = "a b c d e f a b c d e f a b c d e f a b"
    s = DecodeSettings(drafter=drafter, gamma_policy="expected", max_new_tokens=24, sampling=SamplingConfig(1.0),
                       seed=5)
    dec = SpeculativeDecoder(tiny_pair, prompt, s)
    list(dec)
    assert isinstance(dec.drafter.gain, CopyGain)
    copied = [r for r in dec.rounds if r.gamma]
    assert copied and all(r.asked == r.gamma for r in copied)  # the chosen length is what the round asked for
    again = rerun(dec.record(), tiny_pair)  # the recorded lengths, copied as asked: the same text at T = 1
    assert again.drafter.length == "asked" and again.generated_ids == dec.generated_ids
    assert [r.gamma for r in again.rounds] == [r.gamma for r in dec.rounds]


# ---------------------------------------------------------------------------------------------- exactness

REPEATS = ["the cat sat on the mat. the cat sat on the mat. the cat",
           "def f(x):\n    return x + 1\n\ndef g(x):\n    return x + 1\n\ndef h(x):\n    return",
           "1, 2, 3, 4, 1, 2, 3, 4, 1, 2"]


@pytest.mark.parametrize("prompt", REPEATS)
def test_greedy_equals_plain_greedy(tiny_pair, prompt):
    ref = plain_decode(tiny_pair, prompt, DecodeSettings(max_new_tokens=32)).ids
    earlier = tiny_pair.tokenizer.decode(ref[:20])
    for drafter, policy, gamma, history in (("suffix", "fixed", 8, ()), ("suffix", "heuristic", 4, ()),
                                            ("ngram", "expected", 4, ()), ("suffix", "expected", 4, ()),
                                            ("suffix", "fixed", 16, (earlier,))):
        s = DecodeSettings(drafter=drafter, gamma=gamma, gamma_policy=policy, max_new_tokens=32)
        dec = SpeculativeDecoder(tiny_pair, prompt, s, history=history)
        rounds = list(dec)
        assert dec.generated_ids == ref, (prompt[:20], drafter, policy, history)
        assert any(r.gamma for r in rounds)
    with_history = [r.note.source for r in rounds if r.gamma]
    assert "earlier run" in with_history


def test_greedy_tree_rounds_equal_plain_greedy(tiny_pair):
    from specdec.loop.tree import TreeDecoder

    prompt = REPEATS[0]
    ref = plain_decode(tiny_pair, prompt, DecodeSettings(max_new_tokens=24)).ids
    dec = TreeDecoder(tiny_pair, prompt, DecodeSettings(drafter="suffix", max_new_tokens=24), (4, 1, 1, 1))
    while not dec.done:
        dec.step()
    assert dec.ids[len(dec.prompt_ids):] == ref


@pytest.mark.slow
def test_greedy_equals_plain_greedy_on_the_real_pair(real_pair_fp32, real_greedy):
    """fp32 on a CPU: the embedded pair with the suffix drafter (fixed and expected-gain copy lengths, with an earlier
    run in its index) and with prompt lookup under the expected policy writes plain greedy's text, copies kept."""
    prompt = REPEATING_CODE
    n = 24
    ref = real_greedy(prompt, n)
    earlier = real_pair_fp32.tokenizer.decode(ref[:12])
    for drafter, policy, history in (("suffix", "fixed", ()), ("suffix", "expected", (earlier,)),
                                     ("ngram", "expected", ())):
        s = DecodeSettings(drafter=drafter, gamma=16, gamma_policy=policy, max_new_tokens=n)
        dec = SpeculativeDecoder(real_pair_fp32, prompt, s, history=history)
        rounds = list(dec)
        assert dec.generated_ids == ref, (drafter, policy, real_pair_fp32.tokenizer.decode(dec.generated_ids))
        assert sum(r.n_accepted for r in rounds) > 0, (drafter, policy)  # copies were proposed and kept


@pytest.mark.stat
def test_first_three_tokens_follow_the_target(no_eos, one_thread):
    prompt = _ngram_prompt(no_eos)
    for policy in ("fixed", "expected"):
        s = DecodeSettings(drafter="suffix", gamma=2, gamma_policy=policy, sampling=SAMPLED)
        test = joint_chi_square(no_eos, prompt, s, N_SAMPLES)
        assert test.p_value > 1e-3, (policy, test)


@pytest.mark.stat
def test_the_chi_square_catches_a_copy_verified_with_q_one_half(no_eos, one_thread):
    prompt = _ngram_prompt(no_eos)
    s = DecodeSettings(drafter="suffix", gamma=2, sampling=SAMPLED)
    ids = encode_prompt(no_eos.tokenizer, prompt)
    drafts = make_drafter(no_eos, s, ids).propose(ids, 2, SAMPLED, None)
    assert drafts.tokens.numel() > 0  # the drafter does propose on this prompt
    wrong = joint_chi_square(no_eos, prompt, s, N_SAMPLES,
                             lambda st: SmoothedQ(make_drafter(no_eos, st, ids), no_eos.vocab_size))
    assert wrong.p_value < 1e-6, wrong


# -------------------------------------------------------------------------------------------------- privacy


def test_a_sessions_history_is_its_own_runs_and_reaches_only_its_own_decoders(tiny_pair):
    from ui.session import MAX_HISTORY_RUNS, Session

    def run(session: Session, prompt: str) -> SpeculativeDecoder:
        s = DecodeSettings(drafter="suffix", max_new_tokens=12, sampling=SamplingConfig(1.0), seed=len(prompt))
        dec = SpeculativeDecoder(tiny_pair, prompt, s, history=session.earlier_texts())  # as the playground does
        session.start(dec)
        list(dec)
        return dec

    a, b = Session(), Session()
    a1 = run(a, "alpha beta gamma")
    assert b.earlier_texts() == [] and a.earlier_texts() == [a1.text]  # the run on screen counts as earlier
    a2 = run(a, "alpha beta gamma")
    b1 = run(b, "alpha beta gamma")
    assert a.history == [a1.text] and b.history == []
    assert a2.drafter.history == [tiny_pair.tokenizer(a1.text, add_special_tokens=False)["input_ids"]]
    assert b1.drafter.history == [] and len(b1.drafter.index.docs) == 1  # B indexes its own prompt and output
    b.clear()
    assert b.history == [b1.text] and a.history == [a1.text]
    for i in range(MAX_HISTORY_RUNS + 2):
        run(a, f"run {i}")
    assert len(a.earlier_texts()) == MAX_HISTORY_RUNS and a1.text not in a.history


def test_one_sessions_earlier_runs_never_reach_another_sessions_index(tiny_pair, monkeypatch):
    import ui.session as session_mod
    from tests.test_app_wiring import CONTROLS, last
    from ui.loader import PairLoader, PairRequest
    from ui.playground import Playground, guarded

    monkeypatch.setattr(session_mod, "MIN_ROUND_INTERVAL_S", 0.0)
    pg = Playground(PairLoader(dtype="float32", device="cpu", measure=False), PairRequest("tiny"))
    suffix = CONTROLS + ["suffix"]
    first = last(guarded(pg.generate)(None, *suffix))[0]  # session A, run 1
    a_text = first.decoder.text
    assert a_text
    a = last(guarded(pg.generate)(first, *suffix))[0]  # session A, run 2: its run 1 is in its index
    b = last(guarded(pg.generate)(None, *suffix))[0]  # session B, same prompt
    assert a is first and b is not a
    assert a.history == [a_text] and b.history == []
    a_docs, b_docs = a.decoder.drafter.index.docs, b.decoder.drafter.index.docs
    a_run1 = tiny_pair.tokenizer(a_text, add_special_tokens=False)["input_ids"]
    assert a_docs[0] == a_run1 and len(a_docs) == 2  # A: its earlier run, then this run's text
    # B: its own prompt and output only (indexed up to the last round's proposal)
    assert len(b_docs) == 1 and b_docs[0] == b.decoder.ids[: len(b_docs[0])]
    assert len(b_docs[0]) > len(b.decoder.prompt_ids)
    assert b.decoder.drafter.history == []
