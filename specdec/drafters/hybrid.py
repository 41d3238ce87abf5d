"""The hybrid drafter ("auto"): copy from the text where it clearly repeats itself, else ask the draft model.

Each round the committed text's suffix is looked up in the text itself (`ngram.find_continuation`, the n-gram
drafter's search: the most recent earlier occurrence of the longest suffix, n from n_max down to n_min):
- a STRONG match -- at least `strong` tokens long (STRONG_MATCH = 3, or n_max when that is smaller: the length at
  which the n-gram drafter trusts a copy for the full gamma; one- and two-token matches are often a common word or
  a bracket) -- proposes what followed it, with a one-hot q; the draft model does no work for those positions;
- the copy stops where the earlier text ends: past it find_continuation repeats the text periodically, a guess
  that the draft model makes instead. The model then extends the copy to gamma guesses, continuing from the
  copied tokens, each sampled from its exact warped q;
- no strong match: the draft model proposes all gamma guesses, as the "model" drafter does.

The rule (`core.verify`) reads q position by position, so a draft whose first k guesses are copied (one-hot rows)
and whose last ones are sampled (the model's rows) is verified exactly: Draft.probs is then one dense [g, V] of
the mixed rows (`core.sampling.cat_rows`). Whether a position is copied depends only on the committed text, never
on a random draw, so each copied guess's q is one-hot given the text it follows.

The draft model's KV cache: after a copied round it holds a prefix of the committed text (its feedback syncs it,
dropping any guesses that were not committed), and the next round that asks the model feeds the tokens it lacks
in the same forward pass as its first guess -- one wider pass instead of one pass per copied token.

Each round's DraftNote says who drafted it: "ngram" (copied only; source_start and match_len as the n-gram
drafter gives them), "model" (the model only), or "auto" (copied, then extended by the model; source_start and
match_len of the copy).
"""

from __future__ import annotations

import torch

from specdec.core.events import DraftNote
from specdec.core.sampling import OneHot, cat_rows
from specdec.core.stop import cut_at_stop
from specdec.drafters.base import Draft
from specdec.drafters.model import DraftModelDrafter
from specdec.drafters.ngram import STRONG_MATCH, NgramDrafter


class HybridDrafter:
    """Copies after a strong n-gram match (one-hot q), lets the draft model extend or replace the copy (its q)."""

    def __init__(self, model: DraftModelDrafter, vocab_size: int, device, n_max: int = 4, n_min: int = 1,
                 eos_token_ids: tuple[int, ...] = (), strong: int = STRONG_MATCH):
        self.model = model
        self.copier = NgramDrafter(vocab_size, device, n_max, n_min, eos_token_ids)
        self.vocab_size = vocab_size
        self.strong = max(1, min(strong, n_max))
        self.eos = set(eos_token_ids)

    def copy(self, committed: list[int], gamma: int) -> tuple[list[int], int, int] | None:
        """(copied tokens, source_start, match_len) after a strong match, or None: at most gamma tokens, none past
        the end of the earlier text, ending after a copied EOS."""
        found = self.copier.lookup(committed, gamma)
        if found is None or found[1] < self.strong:
            return None
        src, n, tokens = found
        tokens, _ = cut_at_stop(tokens[: len(committed) - src], self.eos)
        return tokens, src, n

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        copied = self.copy(committed, gamma)
        if copied is None:
            return self.model.propose(committed, gamma, cfg, gen)
        tokens, src, n = copied
        ids = torch.tensor(tokens, dtype=torch.long, device=self.copier.device)
        q = OneHot(ids, self.vocab_size)
        if len(tokens) == gamma or tokens[-1] in self.eos:
            return Draft(ids, q, DraftNote("ngram", one_hot=True, source_start=src, match_len=n))
        more = self.model.propose(committed, gamma - len(tokens), cfg, gen, after=tokens)
        ids = ids.to(more.tokens.device)
        return Draft(torch.cat([ids, more.tokens]), cat_rows([OneHot(ids, self.vocab_size), more.probs]),
                     DraftNote("auto", source_start=src, match_len=n))

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        self.model.feedback(committed, n_accepted, n_drafted)  # the draft's cache keeps the committed text only
