"""Drafters: anything that proposes up to gamma tokens together with the exact distributions q it drew them from.

The decoder only needs `propose`; `feedback` lets a drafter adapt (draft length, statistics) after each round.
A deterministic proposal (copied or re-tokenized text) has a one-hot q: the rule then keeps a guess x with
probability p(x) and repairs from p with x removed, which is exact at any temperature. A drafter may propose
nothing (tokens of length 0): the round is then a plain target step (its "bonus" token is drawn from p).
`make_drafter` picks one by `DecodeSettings.drafter`: "model" (model.py), "ngram" (prompt lookup, ngram.py),
"early-exit" (the target's first layers, early_exit.py), "cross" (a draft with another tokenizer, cross.py),
"predicted" (the user's expected output, predicted.py), "auto" (a copy after a strong n-gram match, else the
draft model, hybrid.py).
Every drafter works with every warp and gamma policy, except the pairs in REFUSED (ngram and predicted have no
confidence).
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
    ("predicted", "confidence"): "the confidence policy ends a draft after a guess the draft model is unsure of, "
                                 "and the predicted drafter has no such probability: it copies the prediction, so "
                                 "its q is 1 on every guess and the policy would never stop it (the same as fixed); "
                                 "choose fixed, heuristic or expected",
}


def check_combination(settings: "DecodeSettings") -> None:
    """Raise InvalidInputError for a drafter / gamma policy pair that cannot work as asked (see REFUSED)."""
    why = REFUSED.get((settings.drafter, settings.gamma_policy))
    if why:
        raise InvalidInputError(f"{settings.drafter} drafter with the {settings.gamma_policy} gamma policy: {why}")


def make_drafter(pair: "ModelPair", settings: "DecodeSettings", prompt_ids: list[int],
                 cross_draft: "CrossDraft | None" = None, hybrid_lead: str = "copy") -> Drafter:
    """The drafter `settings.drafter` names, set up for this pair and prompt.

    `hybrid_lead`: who goes first in a hybrid ("auto") round, HybridDrafter's `lead` ("copy"; "model" in the suite).

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

        return NgramDrafter(pair.vocab_size, pair.device, settings.ngram_max, settings.ngram_min, pair.eos_token_ids)
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


__all__ = ["Draft", "DraftModelDrafter", "Drafter", "check_combination", "make_drafter", "no_draft", "one_hot_draft",
           "resolve_draft_vocab"]
