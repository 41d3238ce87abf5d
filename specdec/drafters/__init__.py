"""Drafters: anything that proposes up to gamma tokens together with the exact distributions q it drew them from.

The decoder only needs `propose`; `feedback` lets a drafter adapt (draft length, statistics) after each round.
A deterministic proposal (copied or re-tokenized text) has a one-hot q: the rule then keeps a guess x with
probability p(x) and repairs from p with x removed, which is exact at any temperature. A drafter may propose
nothing (tokens of length 0): the round is then a plain target step (its "bonus" token is drawn from p).
`make_drafter` picks one by `DecodeSettings.drafter`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from ..events import DraftNote
from ..sampling import SamplingConfig

if TYPE_CHECKING:
    from ..models import ModelPair
    from ..settings import DecodeSettings


@dataclass
class Draft:
    tokens: torch.Tensor  # LongTensor [g], g may be 0
    probs: torch.Tensor  # [g, V] the warped q each token was sampled from (one-hot for a deterministic proposal)
    note: DraftNote | None = None  # where the guesses came from, for display


def no_draft(vocab_size: int, device, note: DraftNote | None = None) -> Draft:
    """An empty proposal: the round becomes one plain target step."""
    return Draft(torch.zeros(0, dtype=torch.long, device=device), torch.zeros(0, vocab_size, device=device), note)


def one_hot_draft(tokens: list[int], vocab_size: int, device, note: DraftNote) -> Draft:
    """A deterministic proposal: q is 1 on each proposed token and 0 elsewhere, exactly what it was "drawn" from."""
    t = torch.tensor(tokens, dtype=torch.long, device=device)
    q = torch.zeros(len(tokens), vocab_size, device=device)
    if tokens:
        q[torch.arange(len(tokens), device=device), t] = 1.0
    return Draft(t, q, note)


class Drafter(Protocol):
    def propose(self, committed: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Draft:
        """Propose up to gamma tokens that would follow `committed` (prompt + text so far)."""

    def feedback(self, committed: list[int], n_accepted: int, n_drafted: int) -> None:
        """Told after verification how many of the proposed tokens were kept; `committed` is the new text."""


def make_drafter(pair: "ModelPair", settings: "DecodeSettings", prompt_ids: list[int]) -> Drafter:
    """The drafter `settings.drafter` names, set up for this pair and prompt."""
    from .model import DraftModelDrafter
    from ..decoder import resolve_draft_vocab

    if settings.drafter == "model":
        threshold = settings.confidence_threshold if settings.gamma_policy == "confidence" else 0.0
        return DraftModelDrafter(pair.draft, pair.vocab_size, threshold,
                                 resolve_draft_vocab(pair, settings.draft_vocab), pair.eos_token_ids)
    from ..errors import InvalidInputError

    raise InvalidInputError(f"the {settings.drafter!r} drafter is not available yet")


__all__ = ["Draft", "DraftModelDrafter", "Drafter", "make_drafter", "no_draft", "one_hot_draft"]
from .model import DraftModelDrafter  # noqa: E402  (after Draft: model.py imports it from here)
