"""The classic drafter: a smaller causal LM with the target's vocabulary, sampling each guess from its warped q."""

from __future__ import annotations

import torch

from specdec.core.events import DraftNote
from specdec.core.static_cache import open_lm
from specdec.core.sampling import draw, stack_rows
from specdec.drafters.base import Draft


def draft_chain(logits: torch.Tensor, feed, gamma: int, cfg, gen, columns=None, vocab_size=None,
                confidence_threshold: float = 0.0, until=None) -> tuple[list[torch.Tensor], list]:
    """Sample up to gamma guesses, one draft forward pass each (the batched loop's rows too): `logits` [..., V']
    after the committed text, `feed(guess)` feeds the previous guess [...] and returns the next logits. Each q is
    exactly the warped distribution its guess was drawn from. With a confidence threshold the chain ends after a
    guess whose unwarped top probability is below it; `until(guesses)` (ids so far) ends it when it returns True.
    Returns the guesses and their q rows, one entry per guess."""
    tokens, rows = [], []
    for i in range(gamma):
        if i > 0:  # feed the previous guess only when another one is wanted: the last guess is never fed
            logits = feed(tokens[-1])
        token, q = draw(logits, cfg, gen, columns, vocab_size or 0)
        tokens.append(token)
        rows.append(q)
        if confidence_threshold > 0 and float(torch.softmax(logits.float(), -1).max()) < confidence_threshold:
            break
        if until is not None and len(tokens) < gamma and until([int(t) for t in tokens]):
            break
    return tokens, rows


class DraftModelDrafter:
    """A smaller causal LM with its own KV cache, sampling token by token from the warped q.

    `head_vocab` restricts the draft to token ids below it, plus EOS, plus every token of the prompt and of the
    committed text (text repeats its own rare tokens): cheaper per token, and still exact since q is then a
    distribution over that subset and the draft samples from exactly it (the residual covers the rest).
    `confidence_threshold` ends the draft after a token whose draft probability (top of the unwarped softmax)
    is below it: the next guess would likely be rejected, so its forward pass is not worth paying for.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, confidence_threshold: float = 0.0,
                 head_vocab: int = 0, always_keep: tuple[int, ...] = (), engine: str = "eager",
                 max_len: int | None = None):
        """`engine` / `max_len`: the draft's cache (specdec.core.static_cache.open_lm; a static one holds max_len
        committed tokens)."""
        self.lm = open_lm(model, vocab_size, head_vocab, always_keep, engine, max_len)
        self.confidence_threshold = confidence_threshold
        self._head_synced = 0  # committed[:_head_synced] are already in the reduced head

    def propose(self, committed, gamma, cfg, gen, after: list[int] = (), until=None) -> Draft:
        """`after`: guesses already made for the first positions (e.g. copied by the hybrid drafter), which the
        draft continues; they are fed with the committed tail, and the next sync drops the ones not committed.
        `until`: draft_chain's early end, given the guesses so far."""
        self.lm.keep_in_head(committed[self._head_synced :])
        self._head_synced = len(committed)
        # The first step feeds every committed token the cache lacks (the whole prompt in round one, two tokens
        # after a bonus), so the draft catches up without an extra forward pass.
        lm = self.lm
        tokens, rows = draft_chain(lm.logits_after(list(committed) + list(after), all_columns=False)[-1],
                                   lambda prev: lm.feed([int(prev)], all_columns=False)[-1],
                                   gamma, cfg, gen, lm.columns, lm.vocab_size, self.confidence_threshold, until)
        return Draft(torch.stack(tokens), stack_rows(rows), DraftNote("model"))

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        self.lm.sync(committed)
