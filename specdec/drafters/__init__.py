"""Drafters: anything that proposes up to gamma tokens together with the exact distributions q it drew them from.

The decoder only needs `propose`; `feedback` lets a drafter adapt (draft length, statistics) after each round.
A deterministic proposal (copied or re-tokenized text) has a one-hot q: the rule then keeps a guess x with
probability p(x) and repairs from p with x removed, which is exact at any temperature. A drafter may propose
nothing (tokens of length 0): the round is then a plain target step (its "bonus" token is drawn from p).
`make_drafter` picks one by `DecodeSettings.drafter`: "model" (model.py), "ngram" (prompt lookup, ngram.py),
"early-exit" (the target's first layers, early_exit.py), "cross" (a draft with another tokenizer, cross.py),
"predicted" (the user's expected output, predicted.py), "auto" (a copy after a strong n-gram match, else the
draft model, hybrid.py), "suffix" (the most frequent continuation in a suffix index over the prompt, the output
and the session's earlier runs, suffix.py).
Every drafter works with every warp and gamma policy, except the pairs in REFUSED (ngram, suffix and predicted have
no confidence). Under the `expected` policy the copying drafters in GAIN_DRAFTERS choose each copy's length by
expected gain (gain.py) and the policy asks for MAX_GAMMA.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specdec.core.errors import InvalidInputError
from specdec.drafters.base import Draft, Drafter, no_draft, one_hot_draft
from specdec.drafters.head import resolve_draft_vocab
from specdec.drafters.model import DraftModelDrafter

if TYPE_CHECKING:
    from specdec.core.settings import DecodeSettings
    from specdec.models.cross import CrossDraft
    from specdec.models.pair import ModelPair


# Why a combination is refused, by (drafter, gamma policy).
REFUSED = {
    ("ngram", "confidence"): "the confidence policy ends a draft after a guess the draft model is unsure of, and "
                             "the ngram drafter has no such probability: it copies text, so its q is 1 on every "
                             "guess and the policy would never stop it (the same as fixed); choose fixed, "
                             "heuristic or expected",
    ("suffix", "confidence"): "the confidence policy ends a draft after a guess the draft model is unsure of, and "
                              "the suffix drafter has no such probability: it copies text, so its q is 1 on every "
                              "guess (its own stop is the copied path's frequency); choose fixed, heuristic or "
                              "expected",
    ("predicted", "confidence"): "the confidence policy ends a draft after a guess the draft model is unsure of, "
                                 "and the predicted drafter has no such probability: it copies the prediction, so "
                                 "its q is 1 on every guess and the policy would never stop it (the same as fixed); "
                                 "choose fixed, heuristic or expected",
}


# Copying drafters that pick their own copy length by expected gain under the `expected` gamma policy (gain.py).
GAIN_DRAFTERS = ("ngram", "suffix")


def copy_length_rule(settings: "DecodeSettings", replay: bool = False) -> str:
    """What limits a copying drafter's copy: "gain" under the expected policy ("asked" when a recorded schedule of
    those lengths is replayed), else "match" (the drafter's own match-length rule)."""
    if settings.drafter in GAIN_DRAFTERS and settings.gamma_policy == "expected":
        return "asked" if replay else "gain"
    return "match"


def check_combination(settings: "DecodeSettings") -> None:
    """Raise InvalidInputError for a drafter / gamma policy pair that cannot work as asked (see REFUSED)."""
    why = REFUSED.get((settings.drafter, settings.gamma_policy))
    if why:
        raise InvalidInputError(f"{settings.drafter} drafter with the {settings.gamma_policy} gamma policy: {why}")


def make_drafter(pair: "ModelPair", settings: "DecodeSettings", prompt_ids: list[int],
                 cross_draft: "CrossDraft | None" = None, hybrid_lead: str = "copy", history=(),
                 replay: bool = False) -> Drafter:
    """The drafter `settings.drafter` names, set up for this pair and prompt.

    `hybrid_lead`: who goes first in a hybrid ("auto") round, HybridDrafter's `lead` ("copy"; "model" in the suite).

    `history`: texts of this visitor's earlier runs (strings), which the suffix drafter indexes besides the prompt
    and the output -- passed in by whoever owns them (the app: one browser session's own runs), never shared.
    `replay`: the rounds' lengths are forced (a recorded schedule), so a copy under the expected policy takes them
    as asked instead of choosing its own (`copy_length_rule`).

    `cross_draft` (a model + tokenizer of another vocabulary) replaces the default cross draft (SmolLM2-135M, or a
    tiny one for the tiny pair), e.g. in tests.
    """
    check_combination(settings)
    threshold = settings.confidence_threshold if settings.gamma_policy == "confidence" else 0.0
    cache = {"engine": getattr(pair, "engine", "eager"), "max_len": len(prompt_ids) + settings.max_new_tokens}
    if settings.drafter == "model":
        return DraftModelDrafter(pair.draft, pair.vocab_size, threshold,
                                 resolve_draft_vocab(pair, settings.draft_vocab), pair.eos_token_ids, **cache)
    if settings.drafter == "auto":
        from specdec.drafters.hybrid import HybridDrafter

        model = DraftModelDrafter(pair.draft, pair.vocab_size, threshold,
                                  resolve_draft_vocab(pair, settings.draft_vocab), pair.eos_token_ids, **cache)
        return HybridDrafter(model, pair.vocab_size, pair.device, settings.ngram_max, settings.ngram_min,
                             pair.eos_token_ids, lead=hybrid_lead)
    if settings.drafter == "ngram":
        from specdec.drafters.ngram import NgramDrafter

        return NgramDrafter(pair.vocab_size, pair.device, settings.ngram_max, settings.ngram_min, pair.eos_token_ids,
                            length=copy_length_rule(settings, replay))
    if settings.drafter == "suffix":
        from specdec.drafters.suffix import SuffixDrafter, tokenize_history

        return SuffixDrafter(pair.vocab_size, pair.device, pair.eos_token_ids,
                             tokenize_history(pair.tokenizer, history), length=copy_length_rule(settings, replay))
    if settings.drafter == "early-exit":
        from specdec.drafters.early_exit import EarlyExitDrafter

        return EarlyExitDrafter(pair.target, pair.vocab_size, settings.exit_layer, threshold,
                                resolve_draft_vocab(pair, settings.draft_vocab, pair.target), pair.eos_token_ids)
    if settings.drafter == "cross":
        from specdec.drafters.cross import CrossTokenizerDrafter
        from specdec.models.cross import load_cross_draft

        return CrossTokenizerDrafter(pair.tokenizer, cross_draft or load_cross_draft(pair), pair.vocab_size,
                                     prompt_ids, threshold, pair.eos_token_ids)
    if settings.drafter == "predicted":
        from specdec.drafters.predicted import PredictedDrafter, tokenize_prediction

        return PredictedDrafter(tokenize_prediction(pair.tokenizer, settings.prediction), pair.vocab_size,
                                pair.device, settings.ngram_max, settings.ngram_min, pair.eos_token_ids)
    raise InvalidInputError(f"unknown drafter {settings.drafter!r}")


__all__ = ["GAIN_DRAFTERS", "Draft", "DraftModelDrafter", "Drafter", "check_combination", "copy_length_rule",
           "make_drafter", "no_draft", "one_hot_draft", "resolve_draft_vocab"]
