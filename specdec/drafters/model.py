"""The classic drafter: a smaller causal LM with the target's vocabulary, sampling each guess from its warped q."""

from __future__ import annotations

import torch

from ..events import DraftNote
from ..kvcache import CachedLM
from ..sampling import draw, stack_rows
from . import Draft


class DraftModelDrafter:
    """A smaller causal LM with its own KV cache, sampling token by token from the warped q.

    `head_vocab` restricts the draft to token ids below it, plus EOS, plus every token of the prompt and of the
    committed text (text repeats its own rare tokens): cheaper per token, and still exact since q is then a
    distribution over that subset and the draft samples from exactly it (the residual covers the rest).
    `confidence_threshold` ends the draft after a token whose draft probability (top of the unwarped softmax)
    is below it: the next guess would likely be rejected, so its forward pass is not worth paying for.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, confidence_threshold: float = 0.0,
                 head_vocab: int = 0, always_keep: tuple[int, ...] = ()):
        self.lm = CachedLM(model, vocab_size, head_vocab, always_keep)
        self.confidence_threshold = confidence_threshold
        self._head_synced = 0  # committed[:_head_synced] are already in the reduced head

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        self.lm.keep_in_head(committed[self._head_synced :])
        self._head_synced = len(committed)
        # The first step feeds every committed token the cache lacks (the whole prompt in round one, two tokens
        # after a bonus), so the draft catches up without an extra forward pass.
        lm = self.lm
        logits = lm.logits_after(committed, all_columns=False)[-1]
        tokens, rows = [], []
        for i in range(gamma):
            if i > 0:
                # Feed the previous guess only when another one is wanted: the last draft token is never fed.
                logits = lm.feed([int(tokens[-1])], all_columns=False)[-1]
            token, q = draw(logits, cfg, gen, lm.columns, lm.vocab_size)
            tokens.append(token)
            rows.append(q)
            if self.confidence_threshold > 0 and float(torch.softmax(logits.float(), -1).max()) < self.confidence_threshold:
                break
        return Draft(torch.stack(tokens), stack_rows(rows), DraftNote("model"))

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        self.lm.sync(committed)
