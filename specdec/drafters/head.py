"""How big a drafting model's head is: the vocabulary columns its last projection scores (see `CachedLM`)."""

from __future__ import annotations

import torch

from specdec.core.kvcache import PLAIN_HEAD_TYPES

AUTO_DRAFT_VOCAB = 65536  # draft head size when draft_vocab is None and the vocabulary is at least twice this


def resolve_draft_vocab(pair, draft_vocab: int | None, model: torch.nn.Module | None = None) -> int:
    """The head size for a drafting model (default: the pair's draft): an explicit draft_vocab wins; None picks
    AUTO_DRAFT_VOCAB where it saves a large share of the drafter's projection -- a vocabulary at least twice as
    big, a plain lm_head architecture, and a CPU (on an H200 the sliced head measured slower than the full one,
    22.6 vs 19.4 ms per draft pass, docs/gpu-check-h200.json) -- else the full vocabulary."""
    if draft_vocab is not None:
        return draft_vocab
    model = pair.draft if model is None else model
    big = pair.vocab_size >= 2 * AUTO_DRAFT_VOCAB
    fits = big and model.config.model_type in PLAIN_HEAD_TYPES and pair.device.type == "cpu"
    return AUTO_DRAFT_VOCAB if fits else 0
