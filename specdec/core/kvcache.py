"""A causal LM plus its KV cache, kept in step with the token ids the cache holds.

Both the target and the draft model go through this: it feeds only the tokens the cache has not seen, and
rolls the cache back (DynamicCache.crop) to the longest prefix that is still part of the committed text.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from specdec.core.errors import UnsupportedModelError


# Architectures whose logits are exactly lm_head(final hidden state): no soft-capping or logit scaling, so a
# sliced head gives the same numbers as the full one on the kept rows.
PLAIN_HEAD_TYPES = {"qwen2", "qwen3", "llama", "mistral", "gpt2", "phi3", "granite_dense", "olmo2", "smollm3"}
# Attention layer kinds whose cache is a plain key/value list that can be cut back after a rejection.
ROLLBACK_LAYER_TYPES = {"full_attention", "sliding_attention", "chunked_attention"}


def check_rollback(config) -> None:
    """Refuse models whose cache cannot be rolled back to an earlier length (e.g. linear-attention or state-space
    layers keep a running state, not a list of past keys/values): speculation must discard rejected guesses."""
    kinds = set(getattr(config, "layer_types", None) or ())
    bad = sorted(kinds - ROLLBACK_LAYER_TYPES)
    if bad:
        raise UnsupportedModelError(
            f"{config.model_type} models have {', '.join(bad)} layers, whose cache cannot be rolled back after a "
            "rejected guess; speculative decoding here needs attention layers only"
        )


def rollback_cache() -> DynamicCache:
    """A cache that can always crop. A config-built cache would give sliding-window models (Mistral, Phi-3, ...)
    sliding layers that drop old keys and then refuse to crop once the text outgrows the window; full layers keep
    every key, and the model's attention mask still applies the window, so the logits are the same."""
    return DynamicCache()


class ReducedHead:
    """The last projection of a drafting model restricted to some vocabulary ids: every id below `cut`, plus the ids
    added with `keep` (EOS, every token of the prompt and the committed text). Logits of the other ids are -inf, so
    q stays an exact distribution (zero outside the kept ids) that the draft samples from; the vocabulary
    projection is a large share of a small model's per-token cost. `cut` = 0 is the full head.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, cut: int = 0, always_keep=()):
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.cut = 0  # > 0: a reduced head over ids < cut plus self.extra_ids
        self.extra_ids: list[int] = []
        self._extra_set: set[int] = set()
        self.columns: torch.Tensor | None = None  # the vocabulary ids a reduced head scores, in order (None: all)
        if 0 < cut < vocab_size:
            if model.config.model_type not in PLAIN_HEAD_TYPES:
                raise ValueError(f"a reduced draft vocabulary is not supported for {model.config.model_type} models")
            self.cut = cut
            weight = model.get_output_embeddings().weight
            self.weight = weight[:cut]  # a view: no copy of the projection
            self.extra_weight = weight[:0]
            self.columns = torch.arange(cut, device=self.device)
            self.keep(always_keep)

    def keep(self, ids) -> None:
        """Add token ids to a reduced head (no-op for a full one).

        Text tends to repeat its own rare tokens (names, identifiers), so the drafter adds every prompt and
        committed token: the draft can then propose them again even when their ids are above the cut.
        """
        if not self.cut:
            return
        new = {int(i) for i in ids if self.cut <= int(i) < self.vocab_size} - self._extra_set
        if new:
            self._extra_set |= new
            # Kept in id order, so the head's columns are in vocabulary order and a draw over them inverts the same
            # cumulative sum as one over the full row.
            self.extra_ids = sorted(self.extra_ids + list(new))
            self._extra_index = torch.tensor(self.extra_ids, device=self.device)
            self.extra_weight = self.model.get_output_embeddings().weight.index_select(0, self._extra_index)
            self.columns = torch.cat([torch.arange(self.cut, device=self.device), self._extra_index])

    def project(self, hidden: torch.Tensor, all_columns: bool = True) -> torch.Tensor:
        """Logits [..., V] for final hidden states [..., d] (-inf outside the kept ids); all_columns=False gives
        only the scored columns, [..., len(self.columns)]."""
        head = torch.nn.functional.linear(hidden, self.weight)
        extra = torch.nn.functional.linear(hidden, self.extra_weight) if self.extra_ids else None
        if not all_columns:
            return head if extra is None else torch.cat([head, extra], -1)
        logits = torch.full((*hidden.shape[:-1], self.vocab_size), float("-inf"), dtype=hidden.dtype,
                            device=hidden.device)
        logits[..., : self.cut] = head
        if extra is not None:
            logits[..., self._extra_index] = extra
        return logits


class CachedLM:
    def __init__(self, model: torch.nn.Module, vocab_size: int, head_vocab: int = 0, always_keep: tuple[int, ...] = ()):
        """head_vocab > 0 computes logits only for token ids < head_vocab (plus `always_keep`, e.g. EOS, plus any id
        later passed to `keep_in_head`): a `ReducedHead`. Used for drafts.
        """
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        check_rollback(model.config)
        self.cache = rollback_cache()
        self.ids: list[int] = []  # tokens whose keys/values are in the cache, in order
        self.head = ReducedHead(model, vocab_size, head_vocab, always_keep)

    @property
    def head_cut(self) -> int:
        return self.head.cut

    @property
    def columns(self) -> torch.Tensor | None:
        """The vocabulary ids the head scores, in order (None: all)."""
        return self.head.columns

    def keep_in_head(self, ids) -> None:
        self.head.keep(ids)

    def __len__(self) -> int:
        return len(self.ids)

    def crop(self, n: int) -> None:
        if n < len(self.ids):
            self.cache.crop(n - len(self.ids))  # transformers 5: a negative count of tokens to drop
            del self.ids[n:]

    def sync(self, committed: list[int]) -> None:
        """Drop cached tokens that are not a prefix of `committed`; keep at least one token unfed.

        The last committed token is always left out so the next forward has an input whose logits predict the
        next position.
        """
        limit = min(len(self.ids), len(committed) - 1)
        n = 0
        while n < limit and self.ids[n] == committed[n]:
            n += 1
        self.crop(n)

    @torch.inference_mode()
    def feed(self, ids: list[int], n_logits: int = 1, all_columns: bool = True) -> torch.Tensor:
        """Append ids to the cache; return logits [n_logits, V] for the last n_logits fed positions.

        With a reduced head, all_columns=False returns only the scored columns, [n_logits, len(self.columns)]: a
        drafter that draws over them skips writing and reading the -inf rest of each row (86k of 152k entries on
        the embedded pair, ~0.3 ms per guess on a CPU).
        """
        inp = torch.tensor([ids], dtype=torch.long, device=self.device)
        if not self.head.cut:
            out = self.model(input_ids=inp, cache=self.cache, use_cache=True, logits_to_keep=n_logits)
            self.ids.extend(ids)
            return out.logits[0, -n_logits:, : self.vocab_size]
        hidden = self.model.base_model(input_ids=inp, cache=self.cache, use_cache=True).last_hidden_state[0, -n_logits:]
        self.ids.extend(ids)
        return self.head.project(hidden, all_columns)

    def logits_after(self, committed: list[int], extra: list[int] = (), n_logits: int = 1,
                     all_columns: bool = True) -> torch.Tensor:
        """Sync to committed, then feed the unseen committed tail plus `extra` in one forward pass."""
        self.sync(committed)
        return self.feed(committed[len(self.ids) :] + list(extra), n_logits, all_columns)
