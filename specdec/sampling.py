"""Sampling warps: the one function that turns logits into the distribution a model samples from.

Exactness depends on using the *same* warp for the draft (q) and the target (p) and on the draft sampling from
exactly the q that verification later reads (transformers#32867 and #47932 broke both). Greedy decoding is not a
separate code path: temperature 0 yields one-hot distributions, and the same rule then reduces to "keep the draft
token iff it is the target's argmax, else emit the target's argmax".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .errors import InvalidInputError


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


def warp(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """Return float32 probabilities over the last dim after temperature, top-k, then top-p.

    Top-k uses torch.topk rather than a full-vocabulary sort; top-p alone needs one sort.
    """
    logits = logits.float()
    if cfg.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    # Subtract the max first: softmax is unchanged, and a tiny temperature (1e-39 passes validation) then sends the
    # other logits to -inf instead of overflowing the best one to inf (inf - inf = NaN in the softmax).
    # A temperature below float32's smallest normal number would itself round to 0 in float32: divide in float64.
    shifted = logits - logits.amax(-1, keepdim=True)
    t = cfg.temperature
    logits = shifted / t if t >= torch.finfo(torch.float32).tiny else (shifted.double() / t).float()
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


def _top_p_sorted(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest prefix of descending probs whose mass reaches top_p (always at least one), renormalize."""
    if top_p >= 1.0:
        return sorted_probs
    mass_before = torch.cumsum(sorted_probs, -1) - sorted_probs
    kept = sorted_probs.masked_fill(mass_before >= top_p, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one index per row of probs (shape [..., V]) -> LongTensor[...], by inverting the CDF.

    One uniform per row and a binary search over a float64 cumulative sum: exact up to float64 rounding, and
    20-100x faster on CPU than torch.multinomial over a 150k-token vocabulary (measured 0.23 ms vs 9.4 ms).
    Zero-probability tokens can never be chosen: their cumulative sum equals their predecessor's.
    """
    flat = probs.reshape(-1, probs.shape[-1])
    cdf = torch.cumsum(flat, -1, dtype=torch.float64)
    u = torch.rand(flat.shape[0], 1, generator=generator, device=flat.device, dtype=torch.float64) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, u, right=True).clamp_max_(flat.shape[-1] - 1)
    return idx.reshape(probs.shape[:-1])
