"""A causal LM plus its KV cache, kept in step with the token ids the cache holds.

Both the target and the draft model go through this: it feeds only the tokens the cache has not seen, and
rolls the cache back (DynamicCache.crop) to the longest prefix that is still part of the committed text.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

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


def _apply(hidden: torch.Tensor, rows) -> torch.Tensor:
    """hidden @ rows.T for a weight tensor, or rows(hidden) for a quantized head's row subset."""
    return torch.nn.functional.linear(hidden, rows) if isinstance(rows, torch.Tensor) else rows(hidden)


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
        self._rows = None
        if 0 < cut < vocab_size:
            if model.config.model_type not in PLAIN_HEAD_TYPES:
                raise ValueError(f"a reduced draft vocabulary is not supported for {model.config.model_type} models")
            self.cut = cut
            out = model.get_output_embeddings()
            # A quantized head (models.quant.Int8Linear) gives its own row subsets, applied by calling them.
            self._rows = getattr(out, "select_rows", None)
            if self._rows:
                self.weight, self.extra_weight = self._rows(slice(0, cut)), self._rows(slice(0, 0))
            else:
                self.weight = out.weight[:cut]  # a view: no copy of the projection
                self.extra_weight = out.weight[:0]
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
            out = self.model.get_output_embeddings()
            self.extra_weight = (self._rows(self._extra_index) if self._rows
                                 else out.weight.index_select(0, self._extra_index))
            self.columns = torch.cat([torch.arange(self.cut, device=self.device), self._extra_index])

    def project(self, hidden: torch.Tensor, all_columns: bool = True) -> torch.Tensor:
        """Logits [..., V] for final hidden states [..., d] (-inf outside the kept ids); all_columns=False gives
        only the scored columns, [..., len(self.columns)]."""
        head = _apply(hidden, self.weight)
        extra = _apply(hidden, self.extra_weight) if self.extra_ids else None
        if not all_columns:
            return head if extra is None else torch.cat([head, extra], -1)
        logits = torch.full((*hidden.shape[:-1], self.vocab_size), float("-inf"), dtype=hidden.dtype,
                            device=hidden.device)
        logits[..., : self.cut] = head
        if extra is not None:
            logits[..., self._extra_index] = extra
        return logits


# ---------------------------------------------------------------------------------------------- token-tree masks
#
# How transformers 5.24 takes a custom attention mask (read in the installed source):
# - masking_utils._preprocess_mask_arguments: "If the mask is already 4D, simply return as-is (it was already
#   prepared, or it is custom)". create_causal_mask and create_sliding_window_causal_mask both start with it, so
#   a [B, 1, q_len, kv_len] tensor reaches every attention layer untouched: no causal part, no sliding window, no
#   padding and no dtype conversion is added to it. It must therefore say everything itself.
# - models/qwen2/modeling_qwen2.py, Qwen2Model.forward: `attention_mask` may also be a dict {layer kind: mask},
#   used as the per-kind mapping as is ("It may already have been prepared by e.g. `generate`"); Qwen3, SmolLM3
#   and Gemma2 do the same. Llama, Mistral, Phi-3, GPT-2, Granite and OLMo2 build one mask and take a tensor only.
# - What the tensor means depends on the attention implementation: eager_attention_forward (modeling_qwen2.py)
#   does `attn_weights = attn_weights + attention_mask`, so a boolean mask is ADDED as 0/1 and hides nothing
#   (silently wrong logits); integrations/sdpa_attention.py, sdpa_attention_forward, hands it to torch's
#   scaled_dot_product_attention as attn_mask (bool: attend where True; float: added) and uses is_causal=False
#   whenever a mask is given. An additive float mask in the model's dtype (0 visible, finfo(dtype).min hidden)
#   means the same to both, so that is what tree_attention_mask builds. The tiny test models run sdpa
#   (config._attn_implementation); tests/test_tree_scoring.py checks eager as well.

KEEP_STRATEGIES = ("gather", "refeed")


def tree_attention_mask(n_cached: int, n_tail: int, visible: torch.Tensor, positions: torch.Tensor,
                        window: int | None, dtype: torch.dtype, device) -> torch.Tensor:
    """Additive mask [1, 1, n_tail + n, n_cached + n_tail + n] for one forward of a committed tail plus n nodes.

    The tail (n_tail tokens after n_cached cached ones) attends causally; node i attends to every cached and tail
    slot plus the fed nodes j where visible[i, j] (itself and its ancestors, for a tree). positions: the position
    id of every fed token, [n_tail + n]; with a sliding `window` a query also hides the keys `window` or more
    positions back (as masking_utils.sliding_window_overlay: visible where kv > q - window).
    """
    n = int(visible.shape[0])
    prefix = n_cached + n_tail
    keep = torch.zeros(n_tail + n, prefix + n, dtype=torch.bool, device=device)
    keep[:n_tail, :n_cached] = True
    keep[:n_tail, n_cached:prefix] = torch.ones(n_tail, n_tail, dtype=torch.bool, device=device).tril_()
    keep[n_tail:, :prefix] = True
    keep[n_tail:, prefix:] = visible.to(device=device, dtype=torch.bool)
    if window is not None:
        positions = positions.to(device)
        key_pos = torch.cat([torch.arange(n_cached, device=device), positions])
        keep &= (positions[:, None] - key_pos[None, :]) < window
    mask = torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill_(~keep, torch.finfo(dtype).min)
    return mask[None, None]


def sliding_window_of(config) -> tuple[int | None, bool]:
    """(window, mixed): the sliding window the model applies (None: none), and whether only some layers use it."""
    window = getattr(config, "sliding_window", None)
    kinds = set(getattr(config, "layer_types", None) or ())
    if kinds:
        if "sliding_attention" not in kinds or not window:
            return None, False
        return int(window), len(kinds) > 1
    if window and getattr(config, "use_sliding_window", True):  # Mistral, Phi-3: one mask, windowed when set
        return int(window), False
    return None, False


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
        # (node tokens, parents) while the slots of a tree scored by logits_for_tree follow self.ids in the cache
        self._tree: tuple[list[int], list[int]] | None = None

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
        self._drop_tree()
        if n < len(self.ids):
            self.cache.crop(n - len(self.ids))  # transformers 5: a negative count of tokens to drop
            del self.ids[n:]

    def sync(self, committed: list[int]) -> None:
        """Drop cached tokens that are not a prefix of `committed`; keep at least one token unfed.

        The last committed token is always left out so the next forward has an input whose logits predict the
        next position.
        """
        self._drop_tree()
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
        self._drop_tree()
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

    # ------------------------------------------------------------------------------------------ token trees

    # keep_path's default. scripts/tree_keep_bench.py, on a random Qwen2.5-0.5B-shaped model (fp32, CPU, one thread,
    # 256 committed tokens, trees of 8 and 16 nodes): a gather costs ~0.4 ms against ~0.1 ms for the crop, while
    # re-feeding k = 1..4 accepted tokens adds ~3-31 ms to a ~390-500 ms next pass (refeed / gather 1.01-1.08 per
    # round); on the tiny pair the two tie (passes of ~1.5 ms either way).
    KEEP_PATH = "gather"

    @torch.inference_mode()
    def logits_for_tree(self, committed: list[int], tree, all_columns: bool = True,
                        visible: torch.Tensor | None = None) -> torch.Tensor:
        """Score a token tree (`core.tree.TokenTree`) in ONE forward pass: logits [n + 1, V], row 0 after the
        committed text (the last committed token's output), row i + 1 after node i.

        Syncs to `committed` like logits_after, then feeds the unseen committed tail followed by the n nodes, with
        position ids cache length + index for the tail and (last committed position + depth) for node i. The tail
        attends causally; node i to the committed text, itself and its ancestors, never its siblings or cousins
        (`visible` [n, n] bool replaces tree.ancestors_mask(), e.g. to break it on purpose in a test). Afterwards
        the cache holds the committed text plus the n node slots: `keep_path` leaves the accepted ones, and any
        other call (sync, feed, crop, logits_after) drops them all first.
        """
        self.sync(committed)
        tail = committed[len(self.ids) :]
        nodes = [int(t) for t in tree.tokens.tolist()]
        n, n_cached, n_tail = len(nodes), len(self.ids), len(tail)
        if n_tail < 1:
            raise ValueError("logits_for_tree needs at least one committed token")
        visible = tree.ancestors_mask() if visible is None else visible
        depths = torch.tensor(tree.depths, dtype=torch.long)
        positions = torch.cat([torch.arange(n_cached, n_cached + n_tail), len(committed) - 1 + depths])
        dtype = self.model.get_input_embeddings().weight.dtype
        window, mixed = sliding_window_of(self.model.config)
        mask = tree_attention_mask(n_cached, n_tail, visible, positions, window, dtype, self.device)
        if mixed:  # full and sliding layers: one mask per kind (Qwen2-style models take the dict as is)
            full = tree_attention_mask(n_cached, n_tail, visible, positions, None, dtype, self.device)
            mask = {"full_attention": full, "sliding_attention": mask}
        inp = torch.tensor([tail + nodes], dtype=torch.long, device=self.device)
        pos = positions[None].to(self.device)
        if not self.head.cut:
            out = self.model(input_ids=inp, attention_mask=mask, position_ids=pos, cache=self.cache,
                             use_cache=True, logits_to_keep=n + 1)
            logits = out.logits[0, -(n + 1) :, : self.vocab_size]
        else:
            hidden = self.model.base_model(input_ids=inp, attention_mask=mask, position_ids=pos, cache=self.cache,
                                           use_cache=True).last_hidden_state[0, -(n + 1) :]
            logits = self.head.project(hidden, all_columns)
        self.ids.extend(tail)
        self._tree = (nodes, list(tree.parents))
        return logits

    @torch.inference_mode()
    def keep_path(self, committed_after: list[int], path: list[int], how: str | None = None) -> None:
        """After the rule accepted `path` (node numbers from the root's child down, `TreeVerdict.path`) of the
        tree last scored by logits_for_tree, leave the cache holding exactly committed_after minus its last token
        (sync's invariant), committed_after being the committed text plus the round's tokens.

        how="gather": move the accepted nodes' key/value slots (index_select on every layer) to just after the
        committed text and drop the rest; how="refeed": crop back to the committed text, so the next forward feeds
        the accepted tokens again. Both keep for free the leading path nodes already in place (node j at depth
        j + 1, for j < m: a chain, or a path through the first nodes). Only the part of the path that
        committed_after repeats is kept (a stop rule may have cut the round short). None: CachedLM.KEEP_PATH.
        """
        how = how or self.KEEP_PATH
        if how not in KEEP_STRATEGIES:
            raise ValueError(f"keep_path: how must be one of {KEEP_STRATEGIES}, got {how!r}")
        if self._tree is None:
            raise RuntimeError("keep_path needs a tree scored by logits_for_tree, with no cache change since")
        nodes, parents = self._tree
        for j, node in enumerate(path):
            if not 0 <= node < len(nodes) or parents[node] != (path[j - 1] if j else -1):
                raise ValueError(f"keep_path: {list(path)} is not a path from the root of the scored tree")
        base = len(self.ids)
        k = 0  # accepted nodes that committed_after repeats, never its last token
        if committed_after[:base] == self.ids:
            while k < len(path) and base + k < len(committed_after) - 1 and committed_after[base + k] == nodes[path[k]]:
                k += 1
        m = 0  # leading path nodes whose slots are already in place
        while m < k and path[m] == m:
            m += 1
        layers = list(getattr(self.cache, "layers", ()))
        if how == "gather" and k > m and all(type(layer) is DynamicLayer for layer in layers):
            src = torch.tensor([base + p for p in path[m:k]], dtype=torch.long, device=self.device)
            for layer in layers:
                if not layer.is_initialized:
                    continue
                for name in ("keys", "values"):
                    t = getattr(layer, name)  # [batch, heads, slots, head_dim]
                    t[..., base + m : base + k, :] = t.index_select(-2, src)  # a copy first: sources >= targets
                    setattr(layer, name, t[..., : base + k, :])  # a view, as DynamicLayer.crop leaves it
            m = k
        else:
            self.cache.crop(m - len(nodes))
        self._tree = None
        self.ids.extend(nodes[p] for p in path[:m])
        self.sync(committed_after)

    def _drop_tree(self) -> None:
        """Forget the node slots of a scored tree that no keep_path followed (no-op when there are none)."""
        if self._tree is not None:
            n = len(self._tree[0])
            self._tree = None
            self.cache.crop(-n)
