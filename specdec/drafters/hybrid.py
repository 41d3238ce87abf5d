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

That is lead="copy", the default. With lead="model" the draft model goes first every round and a copy takes over
once the model's own guesses extend a strong match: after each guess the text plus the guesses so far is looked up,
and a strong match there ends the model's chain and fills the rest of gamma with what followed the match. A copy
then needs the draft model to agree with it on at least its first token, meant to filter the copies a summary or
a paraphrase breaks at once. Measured (`bench --suite`, int4 draft, gamma 16, two runs, one per lead, against the
draft model alone in the same run): summarization 0.91x (copy lead) and 1.01x (model lead), RAG 1.10x and 1.07x --
no clear winner yet, so "copy" stays the default. Each guess is then
either the model's (its exact q) or part of a copy chosen by a rule on the text and the guesses before it
(one-hot q): exact for the same reason.

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

HYBRID_LEADS = ("copy", "model")  # who goes first in a round: a strong copy, else the model; or the model


class HybridDrafter:
    """Copies after a strong n-gram match (one-hot q), lets the draft model extend or replace the copy (its q)."""

    def __init__(self, model: DraftModelDrafter, vocab_size: int, device, n_max: int = 4, n_min: int = 1,
                 eos_token_ids: tuple[int, ...] = (), strong: int = STRONG_MATCH, lead: str = "copy"):
        if lead not in HYBRID_LEADS:
            raise ValueError(f"lead must be one of {HYBRID_LEADS}, got {lead!r}")
        self.lead = lead
        self.model = model
        self.copier = NgramDrafter(vocab_size, device, n_max, n_min, eos_token_ids)
        self.vocab_size = vocab_size
        self.strong = max(1, min(strong, n_max))
        self.eos = set(eos_token_ids)

    def copy(self, committed: list[int], gamma: int, guesses: list[int] = ()) -> tuple[list[int], int, int] | None:
        """(copied tokens, source_start, match_len) after a strong match, or None: at most gamma tokens, none past
        the end of the earlier text, ending after a copied EOS. With `guesses` the text looked up is the committed
        text plus them."""
        found = self.copier.lookup(committed, gamma, guesses)
        if found is None or found[1] < self.strong:
            return None
        src, n, tokens = found
        tokens, _ = cut_at_stop(tokens[: len(committed) + len(guesses) - src], self.eos)
        return tokens, src, n

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        if self.lead == "model":
            return self.model_then_copy(committed, gamma, cfg, gen)
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

    def model_then_copy(self, committed, gamma, cfg, gen) -> Draft:
        """lead="model": the model's chain, ended by a strong match after its guesses, then that copy. (Its note is
        "auto" as well; the race lanes and the playground run lead="copy", whose notes they describe.)"""
        found = {}  # number of guesses so far -> the copy after them, or None

        def strong_copy(guesses: list[int]) -> bool:
            k = len(guesses)
            found[k] = None if guesses[-1] in self.eos else self.copy(committed, gamma - k, guesses)
            return found[k] is not None

        more = self.model.propose(committed, gamma, cfg, gen, until=strong_copy)
        copied = found.get(len(more.tokens))
        if copied is None:
            return more
        tokens, src, n = copied
        ids = torch.tensor(tokens, dtype=torch.long, device=more.tokens.device)
        return Draft(torch.cat([more.tokens, ids]), cat_rows([more.probs, OneHot(ids, self.vocab_size)]),
                     DraftNote("auto", source_start=src, match_len=n))

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        self.model.feedback(committed, n_accepted, n_drafted)  # the draft's cache keeps the committed text only
