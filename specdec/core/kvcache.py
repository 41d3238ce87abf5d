"""The scorer: a causal LM plus its KV cache over B rows, fed through one primitive (`CachedLM.score`).

Every loop goes through it -- chains, token trees, lockstep and ragged batches, eager and static caches: a pass
feeds token ids at given positions with a given visibility, and afterwards the cache keeps exactly what the rule
committed (a crop, a tree's accepted path, a row's holes masked). Batch 1 also keeps the token ids the cache holds,
so it feeds only the tokens the cache has not seen and rolls back to the longest prefix still committed.
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


# ---------------------------------------------------------------------------------------------- the scorer
#
# How transformers 5.24 takes a custom attention mask (read in the installed source):
# - masking_utils._preprocess_mask_arguments: "If the mask is already 4D, simply return as-is (it was already
#   prepared, or it is custom)". create_causal_mask and create_sliding_window_causal_mask both start with it, so
#   a [B, 1, q_len, kv_len] tensor reaches every attention layer untouched: no causal part, no sliding window, no
#   padding and no dtype conversion is added to it. It must therefore say everything itself.
# - models/qwen2/modeling_qwen2.py, Qwen2Model.forward: `attention_mask` may also be a dict {layer kind: mask},
#   used as the per-kind mapping as is ("It may already have been prepared by e.g. `generate`"); Qwen3, SmolLM3
#   and Gemma2 do the same. Llama, Mistral, Phi-3, GPT-2, Granite and OLMo2 build one mask and take a tensor only.
# - With no mask and no position ids, Qwen2Model.forward numbers the fed tokens from cache.get_seq_length() and
#   create_causal_mask builds the causal mask itself (sdpa may then run with is_causal and no mask at all): that is
#   the scorer's fast path, taken whenever every row is plain text at the same length and the fed block is causal.
# - What the tensor means depends on the attention implementation: eager_attention_forward (modeling_qwen2.py)
#   does `attn_weights = attn_weights + attention_mask`, so a boolean mask is ADDED as 0/1 and hides nothing
#   (silently wrong logits); integrations/sdpa_attention.py, sdpa_attention_forward, hands it to torch's
#   scaled_dot_product_attention as attn_mask (bool: attend where True; float: added) and uses is_causal=False
#   whenever a mask is given. An additive float mask in the model's dtype (0 visible, finfo(dtype).min hidden)
#   means the same to both, so that is what visibility_mask builds. A static cache's keys span every allocated
#   slot, so its mask has one column per slot (the ones past the text hidden). The tiny test models run sdpa
#   (config._attn_implementation); tests/test_tree_scoring.py checks eager as well.

KEEP_STRATEGIES = ("gather", "refeed")


def tail_and_nodes(n_tail: int, visible: torch.Tensor) -> torch.Tensor:
    """The fed block [n_tail + n, n_tail + n] of a tree pass: a committed tail that attends causally, then n nodes
    that see the whole tail, and each other where visible [n, n] (itself and its ancestors, for a tree)."""
    n = int(visible.shape[-1])
    keep = torch.ones(n_tail + n, n_tail + n, dtype=torch.bool, device=visible.device).tril_()
    keep[n_tail:, n_tail:] = visible.to(torch.bool)
    return keep


def visibility_mask(cached: torch.Tensor, visible: torch.Tensor, positions: torch.Tensor,
                    key_positions: torch.Tensor, window: int | None, dtype: torch.dtype,
                    width: int | None = None) -> torch.Tensor:
    """The one attention-mask builder: additive [B, 1, n, width] in `dtype` (0 visible, finfo(dtype).min hidden) for
    n fed tokens after L cached slots, never more than the n new rows.

    cached [B, L] bool: which cached slots hold the row's text (False: a hole), or [B, n, L]: which cached slots each
    fed token sees (a tree grown depth by depth: a node sees its ancestors' slots, not its cousins');
    visible [B, n, n] bool: which fed tokens each fed token sees; positions [B, n]: the fed tokens' position ids;
    key_positions [B, L]: the cached slots'. With a sliding `window` a query also hides the keys `window` or more
    positions back (as masking_utils.sliding_window_overlay: visible where kv > q - window). Columns L + n .. width
    (a static cache's slots past the text) are hidden.
    """
    b, n = positions.shape
    cols = int(cached.shape[-1]) + n
    keep = torch.zeros(b, n, width or cols, dtype=torch.bool, device=positions.device)
    keep[:, :, : cols - n] = cached[:, None, :] if cached.dim() == 2 else cached
    keep[:, :, cols - n : cols] = visible
    if window is not None:
        kpos = torch.cat([key_positions, positions], 1)
        keep[:, :, :cols] &= (positions[:, :, None] - kpos[:, None, :]) < window
    return torch.zeros(keep.shape, dtype=dtype, device=keep.device).masked_fill_(
        ~keep, torch.finfo(dtype).min)[:, None]


def tree_attention_mask(n_cached: int, n_tail: int, visible: torch.Tensor, positions: torch.Tensor,
                        window: int | None, dtype: torch.dtype, device) -> torch.Tensor:
    """visibility_mask of one tree pass over n_cached plain slots: [1, 1, n_tail + n, n_cached + n_tail + n] for a
    committed tail (causal) plus n nodes (visible [n, n]); positions [n_tail + n]."""
    cached = torch.ones(1, n_cached, dtype=torch.bool, device=device)
    block = tail_and_nodes(n_tail, visible.to(device))[None]
    return visibility_mask(cached, block, positions.to(device)[None], torch.arange(n_cached, device=device)[None],
                           window, dtype)


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


def _slot_layers(cache) -> list | None:
    """The cache's layers when every one keeps plain [B, heads, slots, dim] tensors that slots can be moved in
    (DynamicLayer, StaticLayer); None otherwise."""
    from transformers.cache_utils import StaticLayer

    layers = list(getattr(cache, "layers", ()))
    return layers if all(type(layer) in (DynamicLayer, StaticLayer) for layer in layers) else None


class CachedLM:
    """A causal LM and its KV cache over B rows: the one scorer every loop calls (chains, trees, lockstep and
    ragged batches; `StaticCachedLM` is the same over preallocated slots).

    One primitive feeds the model: `score(ids [B, n], positions [B, n] | None, visible [B, n, n] | None)` ->
    logits [B, n, V]. The cache is a set of slots per row: `valid` [B, T] says which hold the row's text (None: all
    of them, in order, every row at the same length) and `kpos` their position ids. With no `visible`, no padding
    and no holes the pass is causal and goes to the model with no mask at all (a chain, or a rectangle of rows at
    one length); otherwise `visibility_mask` builds the n new rows x (T + n) columns, in the model's dtype.

    After the rule decides, what was committed is kept: `crop` (a chain), `keep_path` (a tree's accepted path:
    gathered into place, or cropped to be fed again), `drop` / `finish_row` (a row's discarded slots become holes,
    masked), `trim` (trailing holes cropped) and `compact` (a gather so each row's text is right-aligned again).

    Batch 1 (the chain decoders and the tree decoder) also keeps `ids`, the tokens whose slots are cached, in order:
    `sync`, `feed`, `logits_after` and `logits_for_tree` feed only what the cache has not seen.
    `head_vocab` > 0 computes logits only for token ids < head_vocab (plus `always_keep`, e.g. EOS, plus any id
    later passed to `keep_in_head`): a `ReducedHead`. Used for drafts.
    """

    # keep_path's default. scripts/tree_keep_bench.py, on a random Qwen2.5-0.5B-shaped model (fp32, CPU, one thread,
    # 256 committed tokens, trees of 8 and 16 nodes): a gather costs ~0.4 ms against ~0.1 ms for the crop, while
    # re-feeding k = 1..4 accepted tokens adds ~3-31 ms to a ~390-500 ms next pass (refeed / gather 1.01-1.08 per
    # round); on the tiny pair the two tie (passes of ~1.5 ms either way).
    KEEP_PATH = "gather"

    def __init__(self, model: torch.nn.Module, vocab_size: int, head_vocab: int = 0, always_keep: tuple[int, ...] = ()):
        self.model = model
        self.vocab_size = vocab_size
        self.device = next(model.parameters()).device
        check_rollback(model.config)
        self.cache = self.new_cache()
        self.ids: list[int] = []  # batch 1: tokens whose keys/values are in the cache, in order
        self.head = ReducedHead(model, vocab_size, head_vocab, always_keep)
        self.plain_head = model.config.model_type in PLAIN_HEAD_TYPES
        self.out_head = model.get_output_embeddings()
        self.dtype = model.get_input_embeddings().weight.dtype
        self.window, self.mixed = sliding_window_of(model.config)
        self.width = 0  # slots held per row
        self.valid: torch.Tensor | None = None  # [B, width] bool: the slot holds the row's text (None: every slot)
        self.kpos: torch.Tensor | None = None  # [B, width] position id of every slot (None: its index)
        self.compactions = 0
        # (node tokens, parents) while the slots of a tree scored by logits_for_tree follow self.ids in the cache
        self._tree: tuple[list[int], list[int]] | None = None

    def new_cache(self):
        return rollback_cache()

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

    # ------------------------------------------------------------------------------------------ the primitive

    def lengths(self, batch: int = 1) -> torch.Tensor:
        """Text slots cached per row, [B] (the next position of each row)."""
        if self.valid is None:
            return torch.full((batch,), self.width, dtype=torch.long, device=self.device)
        return self.valid.sum(1)

    def counts(self, batch: int) -> list[int]:
        """Committed tokens cached per row."""
        return self.lengths(batch).tolist()

    @torch.inference_mode()
    def score(self, ids: torch.Tensor, positions: torch.Tensor | None = None, visible: torch.Tensor | None = None,
              pad: torch.Tensor | None = None, n_logits: int | None = None, all_columns: bool = True,
              sees: torch.Tensor | None = None) -> torch.Tensor:
        """Feed ids [B, n]; logits [B, n_logits, V] of the last n_logits fed tokens (all n by default).

        positions [B, n]: each fed token's position id (None: each row's next positions, counting only real
        tokens); visible [B, n, n] (or [n, n]) bool: which fed tokens each one attends to besides the row's cached
        text (None: causal); pad [B, n] bool: fed tokens that are not text (a row's padding, or a stopped row's
        filler), seen by no query and holes in the cache from the start. With none of the three and no holes, the
        pass is the causal fast path (no mask). sees [B, n, L] bool: which cached slots each fed token may see
        (None: all of its row's text). The fed slots stay cached until a keep call changes them.
        """
        b, n = ids.shape
        n_logits = n if n_logits is None else n_logits
        real = None if pad is None else ~pad.to(device=self.device, dtype=torch.bool)
        if positions is None:
            steps = (torch.arange(1, n + 1, device=self.device)[None] if real is None else real.long().cumsum(1))
            positions = (self.lengths(b)[:, None] + steps - 1).clamp_min(0)
        positions = positions.to(self.device)
        extra = self._padding(b, n)
        if extra:  # padded to a bucket: the padding sees only itself and is dropped again below
            ids = torch.cat([ids, ids[:, -1:].expand(b, extra)], 1)
            positions = torch.cat([positions, positions[:, -1:].expand(b, extra)], 1)
            if visible is not None:
                visible = torch.block_diag(visible.reshape(n, n).to(torch.bool),
                                           torch.eye(extra, dtype=torch.bool, device=visible.device))[None]
            if real is not None:
                real = torch.cat([real, torch.zeros(b, extra, dtype=torch.bool, device=self.device)], 1)
            if sees is not None:  # the padding sees no cached slot (only itself)
                sees = torch.cat([sees, sees.new_zeros(b, extra, sees.shape[-1])], 1)
        mask = None
        if visible is not None or real is not None or self.valid is not None or sees is not None:
            mask = self._mask(b, positions, visible, real, sees)
        logits = self._forward(ids, positions, mask, n, n_logits, all_columns)
        self._appended(b, real, positions)
        if extra:
            self._truncate(self.width - extra)
        return logits

    def _padding(self, batch: int, n: int) -> int:
        """Fed tokens to add to a pass of n (a static cache's bucket); 0 here."""
        return 0

    def _body(self):
        """The model body this pass runs on (a static cache's compiled one, for bucketed passes)."""
        return self.model.base_model

    def _mask(self, b: int, positions: torch.Tensor, visible: torch.Tensor | None,
              real: torch.Tensor | None, sees: torch.Tensor | None = None) -> torch.Tensor | dict:
        n, dev = positions.shape[1], self.device
        if visible is None:
            visible = torch.ones(n, n, dtype=torch.bool, device=dev).tril_()
        visible = visible.to(device=dev, dtype=torch.bool).expand(b, n, n)
        if real is not None:  # padding is seen by nobody; a padding query sees itself (its output is never read)
            visible = (visible & real[:, None, :]) | torch.eye(n, dtype=torch.bool, device=dev)
        cached = (self.valid if self.valid is not None
                  else torch.ones(b, self.width, dtype=torch.bool, device=dev))
        if sees is not None:
            cached = cached[:, None, :] & sees.to(device=dev, dtype=torch.bool)
        kpos = (self.kpos if self.kpos is not None
                else torch.arange(self.width, device=dev)[None].expand(b, -1))
        width = self.mask_width(n)
        mask = visibility_mask(cached, visible, positions, kpos, self.window, self.dtype, width)
        if self.mixed:  # full and sliding layers: one mask per kind (Qwen2-style models take the dict as is)
            full = visibility_mask(cached, visible, positions, kpos, None, self.dtype, width)
            return {"full_attention": full, "sliding_attention": mask}
        return mask

    def mask_width(self, n: int) -> int | None:
        """Key columns of a pass feeding n tokens (None: the cached slots + n)."""
        return None

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask, n: int, n_logits: int,
                 all_columns: bool) -> torch.Tensor:
        """The one forward body: the model over the cache, logits of fed tokens n - n_logits .. n - 1."""
        kw = dict(input_ids=ids, cache=self.cache, use_cache=True)
        if mask is not None:
            kw.update(attention_mask=mask, position_ids=positions)
        if not self.head.cut and not self.plain_head:  # soft-capped or scaled heads: the model's own head
            return self.model(**kw, logits_to_keep=n_logits).logits[:, -n_logits:, : self.vocab_size]
        hidden = self._body()(**kw).last_hidden_state[:, n - n_logits : n]
        if self.head.cut:
            return self.head.project(hidden, all_columns)
        return self.out_head(hidden)[..., : self.vocab_size]

    def _appended(self, b: int, real: torch.Tensor | None, positions: torch.Tensor) -> None:
        n = positions.shape[1]
        if self.valid is not None or real is not None:
            if self.valid is None:
                self.valid = torch.ones(b, self.width, dtype=torch.bool, device=self.device)
                self.kpos = torch.arange(self.width, device=self.device)[None].repeat(b, 1)
            new = real if real is not None else torch.ones(b, n, dtype=torch.bool, device=self.device)
            self.valid = torch.cat([self.valid, new], 1)
            self.kpos = torch.cat([self.kpos, positions], 1)
        self.width += n

    def _truncate(self, n: int) -> None:
        """Keep the first n slots of every row (a static cache moves its length back; the rest stay, masked)."""
        if n < self.width:
            self.cache.crop(n - self.width)  # transformers 5: a negative count of slots to drop
            self.width = n
            if self.valid is not None:
                self.valid, self.kpos = self.valid[:, :n], self.kpos[:, :n]

    # ------------------------------------------------------------------------------------------ rows

    @property
    def holes(self) -> float:
        """Share of cached slots that hold no row's text (left padding included)."""
        if not self.width or self.valid is None:
            return 0.0
        return 1.0 - float(self.valid.float().mean())

    @property
    def reclaimable(self) -> float:
        """Share of cached slots that compaction would free: the width beyond the longest row's text."""
        if not self.width or self.valid is None:
            return 0.0
        return 1.0 - int(self.valid.sum(1).max()) / self.width

    @torch.inference_mode()
    def drop(self, row: int, slots) -> None:
        """Make the given cached slots of one row holes."""
        slots = list(slots)
        if slots:
            self.valid[row, slots] = False

    @torch.inference_mode()
    def finish_row(self, row: int) -> None:
        """A row that ended: every slot it holds becomes a hole."""
        if self.valid is not None:
            self.valid[row] = False

    @torch.inference_mode()
    def trim(self) -> None:
        """Crop trailing slots that are holes in every row."""
        if not self.width or self.valid is None:
            return
        used = self.valid.any(0).nonzero()
        self._truncate(int(used[-1]) + 1 if used.numel() else 0)

    @torch.inference_mode()
    def compact(self) -> bool:
        """Gather every layer's keys/values so each row's text slots are right-aligned, holes only on the left; the
        cache shrinks to the longest row. False when the cache's layers are not plain DynamicLayers."""
        layers = list(getattr(self.cache, "layers", ()))
        if not self.width or self.valid is None or not all(type(layer) is DynamicLayer for layer in layers):
            return False
        t = self.width
        w = int(self.valid.sum(1).max())
        order = (self.valid.long() * t + torch.arange(t, device=self.valid.device)).argsort(1)  # holes first
        idx = order[:, t - w :]
        for layer in layers:
            if not layer.is_initialized:
                continue
            for name in ("keys", "values"):
                x = getattr(layer, name)  # [B, heads, T, dim]
                gather = idx[:, None, :, None].expand(x.shape[0], x.shape[1], w, x.shape[3])
                setattr(layer, name, x.gather(2, gather))
        self.valid, self.kpos = self.valid.gather(1, idx), self.kpos.gather(1, idx)
        self.width = w
        self.compactions += 1
        return True

    # ------------------------------------------------------------------------------------------ batch 1

    def crop(self, n: int) -> None:
        self._drop_tree()
        if n < len(self.ids):
            self._truncate(n)
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
        logits = self.score(inp, n_logits=n_logits, all_columns=all_columns)[0]
        self.ids.extend(int(t) for t in ids)
        return logits

    def logits_after(self, committed: list[int], extra: list[int] = (), n_logits: int = 1,
                     all_columns: bool = True) -> torch.Tensor:
        """Sync to committed, then feed the unseen committed tail plus `extra` in one forward pass."""
        self.sync(committed)
        return self.feed(committed[len(self.ids) :] + list(extra), n_logits, all_columns)

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
        inp = torch.tensor([tail + nodes], dtype=torch.long, device=self.device)
        block = tail_and_nodes(n_tail, visible.to(self.device))
        logits = self.score(inp, positions[None], block[None], n_logits=n + 1, all_columns=all_columns)[0]
        self.ids.extend(tail)
        self._tree = (nodes, list(tree.parents))
        return logits

    @torch.inference_mode()
    def tree_root(self, committed: list[int], all_columns: bool = True) -> torch.Tensor:
        """Start a tree grown depth by depth (`grow_tree`): sync to `committed` and feed its unseen tail; logits
        [1, V] after the committed text. The cache then holds the whole committed text, and every node grow_tree
        adds follows it until the next sync, feed or crop drops them all."""
        logits = self.logits_after(committed, n_logits=1, all_columns=all_columns)
        self._tree = ([], [])
        return logits

    @torch.inference_mode()
    def grow_tree(self, tokens: list[int], parents: list[int], all_columns: bool = True) -> torch.Tensor:
        """Add k nodes to the tree begun by tree_root and score only them: logits [k, V], row j after node j.

        parents[j]: the number of a node added by an earlier grow_tree call (in the order added, from 0), or -1
        for a child of the last committed token. Node j sits at position (last committed position + its depth)
        and sees the committed text, its ancestors' slots and itself -- never a sibling, a cousin or another node
        of this call -- so each depth of a tree costs one pass as wide as its new nodes, not the whole tree again.
        """
        if self._tree is None:
            raise RuntimeError("grow_tree needs a tree begun by tree_root, with no cache change since")
        nodes, pars = self._tree
        k, base, old = len(tokens), len(self.ids), len(nodes)
        depth = [0] * old
        for j, par in enumerate(pars):
            depth[j] = 1 if par < 0 else depth[par] + 1
        sees = torch.zeros(1, k, base + old, dtype=torch.bool)
        sees[:, :, :base] = True
        positions = []
        for j, par in enumerate(parents):
            if not -1 <= par < old:
                raise ValueError(f"grow_tree: parent {par} is not a node of the tree so far ({old} nodes)")
            positions.append(base + (0 if par < 0 else depth[par]))
            while par >= 0:
                sees[0, j, base + par] = True
                par = pars[par]
        inp = torch.tensor([tokens], dtype=torch.long, device=self.device)
        eye = torch.eye(k, dtype=torch.bool, device=self.device)[None]
        logits = self.score(inp, torch.tensor([positions], device=self.device), eye, n_logits=k,
                            all_columns=all_columns, sees=sees.to(self.device))[0]
        self._tree = (nodes + [int(t) for t in tokens], pars + [int(p) for p in parents])
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
        layers = _slot_layers(self.cache)
        if how == "gather" and k > m and layers is not None:
            src = torch.tensor([base + p for p in path[m:k]], dtype=torch.long, device=self.device)
            for layer in layers:
                if not layer.is_initialized:
                    continue
                for name in ("keys", "values"):
                    t = getattr(layer, name)  # [batch, heads, slots, head_dim]
                    t[..., base + m : base + k, :] = t.index_select(-2, src)  # a copy first: sources >= targets
            m = k
        self._truncate(base + m)
        self._tree = None
        self.ids.extend(nodes[p] for p in path[:m])
        self.sync(committed_after)

    def _drop_tree(self) -> None:
        """Forget the node slots of a scored tree that no keep_path followed (no-op when there are none)."""
        if self._tree is not None:
            n = len(self._tree[0])
            self._tree = None
            self._truncate(self.width - n)
