"""The predicted-output drafter: re-alignment to the prediction, its notes, its exactness (greedy = plain target
greedy; the joint law of the first 3 tokens = the target's by chi-square, failing on a planted wrong q), refused
inputs, and (slow) greedy equality on the real pair with a right, a partly right and an unrelated prediction."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from specdec.drafters import make_drafter
from specdec.drafters.predicted import PredictedDrafter, realign, tokenize_prediction
from specdec.core.errors import InvalidInputError
from specdec.core.sampling import SamplingConfig, dense, warp
from specdec.io.trace import dumps_trace, load_trace
from tests.test_drafters import SAMPLED, SmoothedQ, joint_chi_square

POLICIES = ("fixed", "heuristic", "expected")  # confidence is refused: a one-hot q never signals doubt
N_SAMPLES = 500


# ---------------------------------------------------------------------------------------------- re-alignment


@pytest.mark.parametrize("pred,suffix,anchor,expected", [
    ([1, 2, 3, 9, 2, 3, 7], [5, 2, 3], 0, (3, 2)),  # longest match first; the first of two after the anchor
    ([1, 2, 3, 9, 2, 3, 7], [5, 2, 3], 4, (6, 2)),  # the match nearest after the departure point wins
    ([1, 2, 3, 9, 2, 3, 7], [5, 2, 3], 7, (6, 2)),  # none after it: the nearest before
    ([9, 2, 3, 5, 8, 3, 7], [9, 2, 3], 5, (3, 3)),  # a longer match beats a nearer shorter one
    ([4, 5, 6], [1, 6], 0, None),  # the only match is the prediction's last token: nothing would follow
    ([4, 5, 6], [1, 2], 0, None),  # no match
])
def test_realign(pred, suffix, anchor, expected):
    assert realign(np.array(pred), np.array(suffix), 4, 1, anchor) == expected


def test_realign_respects_the_shortest_match():
    assert realign(np.array([1, 2, 3, 4]), np.array([9, 2]), 4, 2, 0) is None  # only a 1-token match
    assert realign(np.array([1, 2, 3, 4]), np.array([1, 2]), 4, 2, 0) == (2, 2)


def _propose(d: PredictedDrafter, committed: list[int], gamma: int = 3):
    out = d.propose(committed, gamma, SamplingConfig(), None)
    return out.tokens.tolist(), (out.note.source_start, out.note.match_len)


def test_follows_the_prediction_then_rejoins_it_after_an_edit(tiny_pair):
    prompt = [90, 91]
    pred = [10, 11, 12, 13, 14, 15, 16, 17]
    d = PredictedDrafter(pred, tiny_pair.vocab_size, "cpu")
    assert _propose(d, prompt) == ([10, 11, 12], (0, 0))  # the output starts at the prediction's start
    assert _propose(d, prompt + [10, 11, 12, 13]) == ([14, 15, 16], (4, 0))  # all kept + a bonus that agrees
    # The model writes 50 where the prediction has 14 (an edit), then 51; the round after that still finds no place
    # to rejoin (neither 50 nor 51 occurs in the prediction): a plain target step.
    empty = d.propose(prompt + [10, 11, 12, 13, 50, 51], 3, SamplingConfig(), None)
    assert empty.tokens.numel() == 0 and empty.note.source_start is None and empty.note.drafter == "predicted"
    # It writes 15: the output rejoins the prediction after its 15.
    assert _propose(d, prompt + [10, 11, 12, 13, 50, 51, 15]) == ([16, 17], (6, 1))  # cut at the prediction's end
    assert _propose(d, prompt + [10, 11, 12, 13, 50, 51, 15, 16, 17]) == ([], (8, 0))  # at the prediction's end


def test_the_rejoin_prefers_the_part_after_the_departure(tiny_pair):
    # Two identical lines in the prediction (e.g. "return x" twice): after an edit in the second, the output must
    # rejoin the second, not go back to the first.
    line = [20, 21, 22]
    pred = [5] + line + [6, 7] + line + [8, 9]
    d = PredictedDrafter(pred, tiny_pair.vocab_size, "cpu", n_max=2)
    out = [90] + [5] + line + [6, 7]  # a prompt, then the prediction up to its second line
    _propose(d, [90])
    assert _propose(d, out, 1)[0] == [20]
    assert _propose(d, out + [20, 99], 4) == ([], (None, None))  # departed at the prediction's index 7
    assert _propose(d, out + [20, 99, 22], 4) == ([8, 9], (9, 1))  # 22 occurs at 3 and 8: the one after index 7


def test_a_different_text_starts_over(tiny_pair):
    d = PredictedDrafter([10, 11, 12], tiny_pair.vocab_size, "cpu")
    _propose(d, [1, 2, 3, 4, 5])
    assert _propose(d, [7], 2) == ([10, 11], (0, 0))  # shorter than the last text seen: a new run


def test_a_predicted_eos_ends_the_proposal(tiny_pair):
    d = PredictedDrafter([10, 1, 12], tiny_pair.vocab_size, "cpu", eos_token_ids=(1,))
    assert _propose(d, [3], 3)[0] == [10, 1]


def test_proposal_is_one_hot_from_the_target_tokenization(tiny_pair):
    s = DecodeSettings(drafter="predicted", prediction="hello world")
    d = make_drafter(tiny_pair, s, [5])
    assert d.pred.tolist() == tiny_pair.tokenizer("hello world", add_special_tokens=False)["input_ids"]
    out = d.propose([5], 4, SamplingConfig(), None)
    assert torch.equal(dense(out.probs), torch.nn.functional.one_hot(out.tokens, tiny_pair.vocab_size).float())
    assert tiny_pair.tokenizer.decode(out.tokens.tolist()) == "hell" and out.note.one_hot


# ------------------------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("kw,match", [
    ({"drafter": "predicted"}, "needs a prediction"),
    ({"drafter": "predicted", "prediction": ""}, "needs a prediction"),
    ({"drafter": "predicted", "prediction": "x" * 100_001}, "at most 100000 characters"),
    ({"drafter": "predicted", "prediction": "abc", "gamma_policy": "confidence"}, "predicted drafter with the confidence"),
])
def test_bad_prediction_settings_are_refused(tiny_pair, kw, match):
    with pytest.raises(InvalidInputError, match=match):
        SpeculativeDecoder(tiny_pair, "abc", DecodeSettings(**kw))


def test_tokenize_prediction_refuses_empty_text(tiny_pair):
    with pytest.raises(InvalidInputError, match="needs a prediction"):
        tokenize_prediction(tiny_pair.tokenizer, "")


# ------------------------------------------------------------------------------------ greedy = plain greedy

PROMPT = "def area(w, h):\n    return w * h\n\n# the same with type hints\n"


def _edited(text: str) -> str:
    """The text with a few characters changed in its middle: the model departs there and comes back."""
    mid = len(text) // 2
    return text[: mid - 3] + "QZX" + text[mid : mid + 6] + "#" + text[mid + 7 :]


def test_greedy_equals_plain_greedy_with_right_partly_right_and_unrelated_predictions(no_eos, one_thread):
    ref = plain_decode(no_eos, PROMPT, DecodeSettings(max_new_tokens=48))
    predictions = {"right": ref.text, "partly right": _edited(ref.text),
                   "unrelated": "The quick brown fox jumps over the lazy dog. " * 2}
    stats = {}
    for (name, prediction), gamma, policy in itertools.product(predictions.items(), (1, 5), POLICIES):
        s = DecodeSettings(drafter="predicted", prediction=prediction, gamma=gamma, gamma_policy=policy,
                           max_new_tokens=48)
        dec = SpeculativeDecoder(no_eos, PROMPT, s)
        rounds = list(dec)
        assert dec.generated_ids == ref.ids, (name, gamma, policy)
        st = stats.setdefault(name, {"kept": 0, "drafted": 0, "rejected": 0, "rejoined": 0, "rounds": 0})
        st["kept"] += sum(r.kept for r in rounds)
        st["drafted"] += sum(r.gamma for r in rounds)
        st["rejected"] += sum(r.rejected_at is not None for r in rounds)
        st["rejoined"] += sum(bool(r.note.match_len) for r in rounds)
        st["rounds"] += len(rounds)
    # Not a trivial pass: the right prediction is kept whole, the edited one departs and rejoins, the unrelated one
    # gets refused guesses.
    right = stats["right"]
    assert right["kept"] == right["drafted"] > 0 and right["rejected"] == 0
    assert stats["partly right"]["rejected"] > 0 and stats["partly right"]["rejoined"] > 0
    assert stats["partly right"]["kept"] > stats["partly right"]["drafted"] // 2
    assert stats["unrelated"]["rejected"] > 0


def test_a_right_prediction_commits_gamma_plus_one_tokens_per_target_pass(no_eos):
    ref = plain_decode(no_eos, PROMPT, DecodeSettings(max_new_tokens=30))
    dec = SpeculativeDecoder(no_eos, PROMPT, DecodeSettings(drafter="predicted", prediction=ref.text, gamma=4,
                                                            max_new_tokens=30))
    rounds = list(dec)
    assert dec.generated_ids == ref.ids
    assert len(rounds) == 6 and dec.totals.target_passes == 6  # 30 tokens = 6 rounds of 4 guesses + 1 bonus
    assert [r.note.source_start for r in rounds] == [0, 5, 10, 15, 20, 25]


def test_a_predicted_run_survives_a_trace_round_trip(no_eos):
    s = DecodeSettings(drafter="predicted", prediction="    return w * h\n", max_new_tokens=12)
    dec = SpeculativeDecoder(no_eos, PROMPT, s)
    list(dec)
    back = load_trace(dumps_trace(dec.record()))
    assert back.settings.prediction == s.prediction and back.settings.drafter == "predicted"
    assert [r.note for r in back.rounds] == [r.note for r in dec.rounds]


# --------------------------------------------------------------------------- the joint law of the first 3 tokens


def _branching_case(pair):
    """A prompt whose next token is uncertain (two candidates under SAMPLED, the first with a mid probability)
    and a prediction that holds the first candidate's continuation followed by the second candidate's: a run that
    takes the second branch departs at once and must re-align further on in the prediction."""
    for a, b, c in itertools.permutations("abcdefgh", 3):
        prompt = f"{a}{b}{c}{a}"
        ids = encode_prompt(pair.tokenizer, prompt)
        with torch.inference_mode():
            p = warp(pair.target(input_ids=torch.tensor([ids])).logits[0, -1, : pair.vocab_size], SAMPLED)
        top = torch.topk(p, 2)
        if 0.25 < float(top.values[0]) < 0.75:
            first, second = top.indices.tolist()
            cont = lambda t: plain_decode(pair, pair.tokenizer.decode(ids + [t]),  # noqa: E731
                                          DecodeSettings(max_new_tokens=3)).ids
            return prompt, [first] + cont(first) + [second] + cont(second)
    raise AssertionError("no prompt with a mid-probability next token")


@pytest.mark.stat
@pytest.mark.parametrize("policy", POLICIES)
def test_first_three_tokens_follow_the_target(no_eos, one_thread, policy):
    prompt, pred = _branching_case(no_eos)
    s = DecodeSettings(drafter="predicted", prediction="x", gamma=2, gamma_policy=policy, sampling=SAMPLED)
    test = joint_chi_square(no_eos, prompt, s, N_SAMPLES,
                            lambda st: PredictedDrafter(pred, no_eos.vocab_size, "cpu"))
    assert test.p_value > 1e-3, (policy, test)


@pytest.mark.stat
def test_the_chi_square_catches_a_smoothed_q_for_the_prediction(no_eos, one_thread):
    prompt, pred = _branching_case(no_eos)
    s = DecodeSettings(drafter="predicted", prediction="x", gamma=2, sampling=SAMPLED)
    wrong = joint_chi_square(no_eos, prompt, s, N_SAMPLES,
                             lambda st: SmoothedQ(PredictedDrafter(pred, no_eos.vocab_size, "cpu"), no_eos.vocab_size))
    assert wrong.p_value < 1e-6, wrong


# ---------------------------------------------------------------------------------------------- the real pair

REAL_PROMPT = [{"role": "user", "content": "Add type hints to this function and change nothing else:\n\n"
                "def scale(values, factor):\n    out = []\n    for v in values:\n        out.append(v * factor)\n"
                "    return out\n"}]


@pytest.mark.slow
def test_real_pair_greedy_equals_plain_greedy(real_pair_fp32):
    pair = real_pair_fp32
    base = DecodeSettings(max_new_tokens=24, chat=True)
    ref = plain_decode(pair, REAL_PROMPT, base)
    words = ref.text.split(" ")
    edited = " ".join(w if i % 5 != 2 else w + "_x" for i, w in enumerate(words))  # a few words changed
    for name, prediction in (("right", ref.text), ("partly right", edited),
                             ("unrelated", "Paris is the capital of France. It lies on the Seine.")):
        dec = SpeculativeDecoder(pair, REAL_PROMPT, dataclasses.replace(base, drafter="predicted",
                                                                        prediction=prediction, gamma=6))
        rounds = list(dec)
        assert dec.generated_ids == ref.ids, name
        if name == "right":  # nearly every guess kept: far fewer target passes than tokens
            assert dec.totals.target_passes <= len(ref.ids) // 3, [r.n_accepted for r in rounds]


# ---------------------------------------------------------------------------------------------------- bench


def test_coverage_counts_output_tokens_shared_in_order_with_the_prediction():
    from specdec.bench.predicted import coverage

    assert coverage([1, 2, 3, 4], [1, 2, 3, 4]) == 1.0
    assert coverage([1, 2, 9, 4, 5], [1, 2, 3, 4, 5]) == 0.8  # one token edited
    assert coverage([7, 8], [1, 2]) == 0.0 and coverage([], [1]) == 0.0


def test_bench_task_row_on_the_tiny_pair(tiny_pair):
    from specdec.bench.predicted import pooled, run_task

    row = run_task(tiny_pair, "def f(x):\n    return x\n", "def f(x):\n    return x\n", 4, 12, 1, 0)
    assert all(row[k]["same_text"] and row[k]["tokens"] == row["tokens"] for k in ("plain", "ngram", "predicted"))
    assert row["plain"]["tokens_per_pass"] == 1.0 and row["predicted"]["passes"] <= row["tokens"]
    p = pooled([row])
    assert p["predicted/plain"] == pytest.approx(row["predicted"]["tok_s"] / row["plain"]["tok_s"])


# ------------------------------------------------------------------------------------------------ playground


def test_playground_takes_a_prediction_and_the_token_view_names_its_span(monkeypatch):
    import ui.session as session_mod
    from components.tokens import round_chips
    from tests.test_app_wiring import RECORDED, STATUS, controls, last
    from ui.loader import PairLoader, PairRequest
    from ui.playground import Playground, guarded

    monkeypatch.setattr(session_mod, "MIN_ROUND_INTERVAL_S", 0.0)
    pg = Playground(PairLoader(dtype="float32", device="cpu"), PairRequest("tiny"))
    out = last(guarded(pg.generate)(None, *controls(), "predicted", "fixed", "Hello world, hello"))
    session = out[0]
    assert session.decoder.settings.prediction == "Hello world, hello"
    assert out[RECORDED][0].settings.prediction == "Hello world, hello"  # the trace carries it
    assert session.rounds[0].asked_nothing  # round one: plain decoding's first step
    first = round_chips(session.rounds[1])
    assert "drew prediction tokens " in first[0].tooltip
    assert any("departs from the prediction" in ch.tooltip for r in session.rounds for ch in round_chips(r)
               if ch.kind == "rej")
    out = last(guarded(pg.generate)(None, *controls(), "predicted", "fixed", ""))
    assert "sd-status-error" in out[STATUS] and "needs a prediction" in out[STATUS]
    # API callers that send only the first thirteen controls get no prediction (the draft model needs none)
    assert last(guarded(pg.generate)(None, *controls(), "model", "fixed"))[0].decoder.settings.prediction == ""
