"""What every drafter returns and the two methods it has: a `Draft` (guesses plus the exact q each was drawn from)
and the `Drafter` protocol (`propose`, `feedback`), plus the two proposals every copying drafter builds: none, and a
deterministic one (one-hot q).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from specdec.core.events import DraftNote
from specdec.core.sampling import OneHot, Probs, SamplingConfig
from specdec.core.stop import cut_at_stop


@dataclass
class Draft:
    tokens: torch.Tensor  # LongTensor [g], g may be 0
    probs: Probs  # [g, V] the warped q each token was sampled from (OneHot for greedy or a deterministic proposal)
    note: DraftNote | None = None  # where the guesses came from, for display
    # A drafter that chose its own length (a copy cut by expected gain): that length, recorded as the round's
    # `asked` so a replay with the recorded lengths drafts the same guesses; None: the policy's gamma stands
    asked: int | None = None


def no_draft(vocab_size: int, device, note: DraftNote | None = None) -> Draft:
    """An empty proposal: the round becomes one plain target step."""
    empty = torch.zeros(0, dtype=torch.long, device=device)
    return Draft(empty, OneHot(empty, vocab_size), note)


def one_hot_draft(tokens: list[int], vocab_size: int, device, note: DraftNote, stop_ids=()) -> Draft:
    """A deterministic proposal: q is 1 on each proposed token and 0 elsewhere, exactly what it was "drawn" from.

    The proposal ends after the first of `stop_ids` (EOS) in it: nothing after an end of text could be committed.
    """
    tokens, _ = cut_at_stop(tokens, stop_ids)
    t = torch.tensor(tokens, dtype=torch.long, device=device)
    return Draft(t, OneHot(t, vocab_size), note)


class Drafter(Protocol):
    def propose(self, committed: list[int], gamma: int, cfg: SamplingConfig, gen: torch.Generator | None) -> Draft:
        """Propose up to gamma tokens that would follow `committed` (prompt + text so far)."""

    def feedback(self, committed: list[int], n_accepted: int, n_drafted: int) -> None:
        """Told after verification how many of the proposed tokens were kept; `committed` is the new text."""
