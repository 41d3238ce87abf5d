"""A causal LM plus its KV cache, kept in step with the token ids the cache holds.

Both the target and the draft model go through this: it feeds only the tokens the cache has not seen, and
rolls the cache back (DynamicCache.crop) to the longest prefix that is still part of the committed text.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache


# Architectures whose logits are exactly lm_head(final hidden state): no soft-capping or logit scaling, so a
# sliced head gives the same numbers as the full one on the kept rows.
PLAIN_HEAD_TYPES = {"qwen2", "qwen3", "llama", "mistral", "gpt2", "phi3", "granite_dense", "olmo2", "smollm3"}


class CachedLM:
    def __init__(self, model: torch.nn.Module, vocab_size: int, head_vocab: int = 0, always_keep: tuple[int, ...] = ()):
        """head_vocab > 0 computes logits only for token ids < head_vocab (plus `always_keep`, e.g. EOS); the
        other logits are -inf. Used for drafts: the vocabulary projection is a large share of a small model's
        per-token cost, and q stays an exact distribution (zero outside the kept ids) that the draft samples from.
        """
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        self.cache = DynamicCache(config=model.config)
        self.ids: list[int] = []  # tokens whose keys/values are in the cache, in order
        self.passes = 0
        self.head_ids = self.head = None
        if 0 < head_vocab < vocab_size:
            if model.config.model_type not in PLAIN_HEAD_TYPES:
                raise ValueError(f"a reduced draft vocabulary is not supported for {model.config.model_type} models")
            keep = sorted(set(range(head_vocab)) | {i for i in always_keep if i < vocab_size})
            self.head_ids = torch.tensor(keep, device=self.device)
            self.head = model.get_output_embeddings().weight.index_select(0, self.head_ids)

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
    def feed(self, ids: list[int], n_logits: int = 1) -> torch.Tensor:
        """Append ids to the cache; return logits [n_logits, V] for the last n_logits fed positions."""
        inp = torch.tensor([ids], dtype=torch.long, device=self.device)
        self.passes += 1
        if self.head is None:
            out = self.model(input_ids=inp, cache=self.cache, use_cache=True, logits_to_keep=n_logits)
            self.ids.extend(ids)
            return out.logits[0, -n_logits:, : self.vocab_size]
        hidden = self.model.base_model(input_ids=inp, cache=self.cache, use_cache=True).last_hidden_state
        self.ids.extend(ids)
        sub = torch.nn.functional.linear(hidden[0, -n_logits:], self.head)
        full = torch.full((n_logits, self.vocab_size), float("-inf"), dtype=sub.dtype, device=sub.device)
        return full.index_copy_(1, self.head_ids, sub)

    def prefill(self, committed: list[int]) -> None:
        """Cache everything but the last committed token (the first round feeds that one)."""
        self.sync(committed)
        todo = committed[len(self.ids) : len(committed) - 1]
        if todo:
            self.feed(todo, 1)
            self.passes -= 1  # prefill is not a decoding pass

    def logits_after(self, committed: list[int], extra: list[int] = (), n_logits: int = 1) -> torch.Tensor:
        """Sync to committed, then feed the unseen committed tail plus `extra` in one forward pass."""
        self.sync(committed)
        return self.feed(committed[len(self.ids) :] + list(extra), n_logits)
