"""Sampling warps: the one function that turns logits into the distribution a model samples from.

Exactness depends on using the *same* warp for the draft (q) and the target (p) and on the draft sampling from
exactly the q that verification later reads (transformers#32867 and #47932 broke both). Greedy decoding is not a
separate code path: temperature 0 yields one-hot distributions, and the same rule then reduces to "keep the draft
token iff it is the target's argmax, else emit the target's argmax". One-hot distributions are carried as their
token ids (`OneHot`), so that reduction costs no pass over the vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from specdec.core.errors import InvalidInputError


@dataclass(frozen=True)
class SamplingConfig:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def validate(self) -> "SamplingConfig":
        t, k, p = self.temperature, self.top_k, self.top_p
        if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0 or t > 100:
            raise InvalidInputError(f"temperature must be a number between 0 and 100 (0 = greedy), got {t!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise InvalidInputError(f"top_k must be a whole number >= 0 (0 = off), got {k!r}")
        if not isinstance(p, (int, float)) or not math.isfinite(p) or not 0 < p <= 1:
            raise InvalidInputError(f"top_p must be in (0, 1] (1 = off), got {p!r}")
        return self


@dataclass(frozen=True)
class OneHot:
    """Rows [..., vocab] that are 1 at `ids` [...] and 0 elsewhere, kept as the ids: greedy warps and deterministic
    proposals (copied or re-tokenized text). An id of -1 stands for an all-zero row (no guess at that position).

    Dense, each such row is a 152k-entry vector on the embedded pair, and every pass over one costs 0.05-0.15 ms
    on a CPU; a greedy round would build and read ~50 of them. As ids, the rule's arithmetic on them is exact and
    takes microseconds: p(x) is 1 or 0, and normalize(max(0, p - q)) of a one-hot p is p again.
    """

    ids: torch.Tensor  # LongTensor [...]
    vocab: int

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.ids.shape, self.vocab)

    def __getitem__(self, key) -> "OneHot":
        """Index the rows (not the vocabulary), as on the dense tensor."""
        return OneHot(self.ids[key], self.vocab)

    def dense(self) -> torch.Tensor:
        hot = self.ids >= 0
        out = torch.zeros(*self.ids.shape, self.vocab, device=self.ids.device)
        return out.scatter_(-1, self.ids.clamp_min(0).unsqueeze(-1), hot.unsqueeze(-1).to(out.dtype))


Probs = torch.Tensor | OneHot  # distributions over the vocabulary, one per row


def dense(probs: Probs) -> torch.Tensor:
    """The float32 tensor [..., V] that probs stands for."""
    return probs.dense() if isinstance(probs, OneHot) else probs


def prob_at(probs: Probs, tokens: torch.Tensor) -> torch.Tensor:
    """probs[..., i, tokens[..., i]] for the first n = tokens.shape[-1] rows: what each row gives its token."""
    n = tokens.shape[-1]
    if isinstance(probs, OneHot):
        return (probs.ids[..., :n] == tokens).float()
    return probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)  # gather reads only the first n rows


def take_rows(probs: Probs, index: torch.Tensor) -> Probs:
    """Row index[b] of each batch entry: [B, n, V] -> [B, V] (a copy) or OneHot [B, n] -> [B]."""
    if isinstance(probs, OneHot):
        return OneHot(probs.ids.gather(1, index.unsqueeze(1)).squeeze(1), probs.vocab)
    b, n = probs.shape[:2]
    # index_select on a flattened view: a contiguous row copy, where advanced indexing measured ~0.1 ms per
    # 152k-token row on a CPU.
    flat_index = torch.arange(b, device=index.device) * n + index
    return probs.reshape(b * n, -1).index_select(0, flat_index)


def zero_rows(probs: Probs, mask: torch.Tensor) -> Probs:
    """probs with the rows where mask [B] is true set to all zeros (in place for a dense tensor)."""
    if isinstance(probs, OneHot):
        return OneHot(probs.ids.masked_fill(mask, -1), probs.vocab)
    return probs.mul_(~mask.unsqueeze(-1))


def stack_rows(rows: list[Probs], dim: int = 0) -> Probs:
    """torch.stack for distributions: one-hot rows stay ids."""
    if all(isinstance(r, OneHot) for r in rows) and rows:
        return OneHot(torch.stack([r.ids for r in rows], dim), rows[0].vocab)
    return torch.stack([dense(r) for r in rows], dim)


def cat_rows(parts: list[Probs]) -> Probs:
    """torch.cat along the rows for distributions [n_i, V] -> [sum n_i, V]: all one-hot parts stay ids; any dense
    part makes the whole dense (one-hot rows written out as 0/1 float32 rows), e.g. a draft whose first guesses
    were copied (one-hot q) and whose last ones a model sampled (its warped q)."""
    if not parts:
        raise ValueError("cat_rows needs at least one part")
    if all(isinstance(q, OneHot) for q in parts):
        return OneHot(torch.cat([q.ids for q in parts]), parts[0].vocab)
    return torch.cat([dense(q).to(torch.float32) for q in parts], 0)


def distribution(logits: torch.Tensor, cfg: SamplingConfig) -> Probs:
    """What a model samples from: float32 probabilities over the last dim after temperature, top-k, then top-p;
    greedy's one-hot rows kept as OneHot ids. The engine's one warp, for the draft's q and the target's p alike.

    Top-k uses torch.topk rather than a full-vocabulary sort; top-p alone needs one sort.
    """
    if cfg.greedy:
        return OneHot(argmax(logits), logits.shape[-1])
    # Subtract the max first: softmax is unchanged, and a tiny temperature (1e-39 passes validation) then sends the
    # other logits to -inf instead of overflowing the best one to inf (inf - inf = NaN in the softmax).
    # A temperature below float32's smallest normal number would itself round to 0 in float32: divide in float64.
    # In place on one float32 copy: each new 152k-entry tensor costs page faults on top of its pass.
    shifted = logits.to(torch.float32, copy=True)
    shifted -= shifted.amax(-1, keepdim=True)
    t = cfg.temperature
    logits = shifted.div_(t) if t >= torch.finfo(torch.float32).tiny else (shifted.double() / t).float()
    vocab = logits.shape[-1]
    if 0 < cfg.top_k < vocab:
        vals, idx = torch.topk(logits, cfg.top_k, dim=-1)  # sorted, descending
        probs = _top_p_sorted(torch.softmax(vals, -1), cfg.top_p)
        return torch.zeros_like(logits).scatter_(-1, idx, probs)
    if cfg.top_p < 1.0:
        vals, idx = torch.sort(logits, dim=-1, descending=True)
        probs = _top_p_sorted(torch.softmax(vals, -1), cfg.top_p)
        return torch.zeros_like(logits).scatter_(-1, idx, probs)
    return torch.softmax(logits, -1)


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """`distribution` as a dense float32 tensor [..., V] (greedy: one-hot rows), for tools that read whole rows."""
    return dense(distribution(logits, cfg))


def _top_p_sorted(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of descending probs whose mass reaches top_p (always at least one), renormalize."""
    if top_p >= 1.0:
        return sorted_probs
    mass_before = torch.cumsum(sorted_probs, -1) - sorted_probs
    kept = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return kept / kept.sum(-1, keepdim=True)


# Bit patterns of +inf and -inf (as uint16): every NaN reads above one of them -- a positive NaN above +inf as an
# int16, a negative one (torch writes bfloat16 NaN with the sign bit set) above -inf as a uint16.
_INF_BITS = {torch.bfloat16: (0x7F80, 0xFF80), torch.float16: (0x7C00, 0xFC00)}


def argmax(x: torch.Tensor) -> torch.Tensor:
    """Index of the largest value along the last dim, the first one on ties (torch.argmax's rule: a NaN counts
    as the largest value, so a row holding NaN gives the index of its first NaN).

    On a CPU this goes through numpy: torch's CPU argmax is not vectorized and walks a 152k-token row in 0.29 ms,
    numpy's in 0.013 ms (measured here), and greedy decoding takes one per scored position every round.
    numpy has no bfloat16, and converting a verify pass's logits to float32 took longer than the argmax itself
    (~0.26 ms for 5 x 152k in the decoding loop). Positive bfloat16/float16 numbers are ordered like their bit
    patterns read as int16, and every negative one reads as a negative int16, so an int16 argmax over the raw
    bits finds the largest value whenever it is positive (an LM's top logit nearly always is; 0.19 vs 0.66 ms
    measured). The bits do not order NaNs like torch: a positive NaN reads above +inf but NaNs among themselves by
    payload, not position, and a negative NaN reads as a negative int16 below any positive value. So a row whose
    pick is not positive, or that holds a NaN of either sign (one vectorized uint16 max tells), is redone in
    float32, where numpy's argmax takes the first NaN as torch's does.
    """
    if x.device.type != "cpu":
        return x.argmax(-1)
    if x.dtype in (torch.float32, torch.float64):
        return torch.as_tensor(np.asarray(x.numpy().argmax(-1)))
    if x.dtype not in (torch.bfloat16, torch.float16):
        return x.argmax(-1)
    pos_inf, neg_inf = _INF_BITS[x.dtype]
    bits = x.contiguous().view(torch.int16).numpy()
    idx = bits.argmax(-1)
    top = bits.max(-1)
    redo = (top <= 0) | (top > pos_inf) | (bits.view(np.uint16).max(-1) > neg_inf)
    if redo.any():  # some row has no positive value, or a NaN: its pick may be wrong
        idx = np.where(redo, x.float().numpy().argmax(-1), idx)
    return torch.from_numpy(np.asarray(idx))


def sample(probs: Probs, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one index per row of probs (shape [..., V]) -> LongTensor[...], by inverting the CDF.

    One uniform per row and a binary search over a float64 cumulative sum: exact up to float64 rounding, and
    20-100x faster on CPU than torch.multinomial over a 150k-token vocabulary (measured 0.23 ms vs 9.4 ms).
    Zero-probability tokens can never be chosen: their cumulative sum equals their predecessor's.
    The uniform is drawn even when the rows are one-hot (greedy), so a seed gives the same stream either way.
    """
    if isinstance(probs, OneHot):  # the inversion returns the one id for any u; draw u all the same
        torch.rand(probs.ids.numel(), 1, generator=generator, device=probs.ids.device, dtype=torch.float64)
        return probs.ids
    flat = probs.reshape(-1, probs.shape[-1])
    u = torch.rand(flat.shape[0], 1, generator=generator, device=flat.device, dtype=torch.float64)
    if flat.device.type == "cpu":
        # One-hot rows (greedy, deterministic drafts, a residual left with one token): the inversion returns the
        # single nonzero id for every u, and the float64 cumulative sum is the costly part on a CPU (~0.3 ms per
        # 152k-token row, with its conversion); a max (cheap, rules out most sampled rows) and a count of nonzeros
        # tell. On a GPU the sum takes microseconds and a check would stall on the host.
        if bool((flat.amax(-1) == 1).all()) and bool((torch.count_nonzero(flat, -1) == 1).all()):
            return argmax(flat).reshape(probs.shape[:-1])
    cdf = torch.cumsum(flat, -1, dtype=torch.float64)
    idx = torch.searchsorted(cdf, u * cdf[:, -1:], right=True).clamp_max_(flat.shape[-1] - 1)
    return idx.reshape(probs.shape[:-1])


def draw(logits: torch.Tensor, cfg: SamplingConfig, generator: torch.Generator | None = None,
         columns: torch.Tensor | None = None, vocab: int = 0) -> tuple[torch.Tensor, Probs]:
    """(tokens, probs): one token per row drawn from probs = distribution(logits, cfg) -- what a sampling drafter
    records as q -- and probs itself (OneHot when greedy, drawn without a cumulative sum).

    `columns` [K] says which vocabulary ids the K columns of logits score (a reduced draft head, in id order);
    every other id of the `vocab`-sized vocabulary has probability 0. The draw runs over the K columns -- the
    same distribution and, columns being in id order, the same cumulative sum as over the full row -- and
    tokens and probs come back in vocabulary ids.
    """
    probs = distribution(logits, cfg)
    tokens = sample(probs, generator)
    if columns is None:
        return tokens, probs
    tokens = columns[tokens]
    if isinstance(probs, OneHot):
        return tokens, OneHot(tokens, vocab)
    full = torch.zeros(*probs.shape[:-1], vocab, dtype=probs.dtype, device=probs.device)
    return tokens, full.index_copy_(-1, columns, probs)


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    """The seeded random stream one run draws every sample and every uniform from."""
    return torch.Generator(device=device).manual_seed(seed)
