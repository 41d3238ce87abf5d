"""Self-speculative early exit: the target's own first k layers, plus its final norm and head, are the draft.

What is shared and what it saves:
- Weights: everything. `shallow_view` builds a module whose embedding, first k decoder layers, rotary embedding,
  final norm and lm_head ARE the target's modules (same objects, zero extra parameters, no copy): memory for a
  second model is saved, and nothing needs downloading or loading.
- q: the shallow model's logits warped with the run's warp, sampled from exactly that q token by token (the
  `DraftModelDrafter` loop, through `CachedLM`), so the rule stays exact at every temperature; the confidence
  policy and the reduced head work as for a draft model.
- KV cache: for committed tokens, the keys/values of layers 0..k-1 are by construction identical to the target's
  own layers 0..k-1 (same weights, same inputs, same positions). The drafter keeps its own k-layer cache because
  the decoder owns the target's cache and verifies after the draft; sharing it would save k/L of the target's KV
  memory and round one's prompt pass through k layers (once per run; later rounds feed the drafter only the 1-2
  tokens it lacks, in the same forward pass as its first guess). The larger possible saving -- verification
  resuming the guesses from the drafter's layer-k hidden states, skipping k/L of each verify pass (LayerSkip) --
  needs a verification hook in the decoder and is not done here.

An untrained shallow exit is a weak guesser (layers trained to feed further layers, not the head): expect low
acceptance unless the model was trained for early exit (e.g. LayerSkip checkpoints); the outputs stay exact.
"""

from __future__ import annotations

import copy

import torch

from specdec.core.errors import InvalidInputError
from specdec.core.events import DraftNote
from specdec.drafters.model import DraftModelDrafter


def total_layers(model: torch.nn.Module) -> int:
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise InvalidInputError(
            f"early exit needs a decoder with a list of layers; {model.config.model_type} models are not supported"
        )
    return len(layers)


def resolve_exit_layer(model: torch.nn.Module, exit_layer: int) -> int:
    """k from the settings: 0 = a quarter of the layers (at least 1); must leave at least one layer out."""
    n = total_layers(model)
    k = exit_layer or max(1, n // 4)
    if not 1 <= k < n:
        raise InvalidInputError(f"exit layer must be from 1 to {n - 1} for this {n}-layer target "
                                f"(0 = {max(1, n // 4)}), "
                                f"got {exit_layer}")
    return k


def shallow_view(model: torch.nn.Module, k: int) -> torch.nn.Module:
    """A module that runs only the first k decoder layers of `model`, sharing every submodule (no weight copy).

    Shallow copies of the outer model and its base model get their own module table and a config saying k layers
    (transformers' decoders run `layers[: config.num_hidden_layers]`); the target object itself is never changed,
    so sessions sharing it are unaffected.
    """
    base = model.base_model
    cfg = copy.deepcopy(base.config)
    cfg.num_hidden_layers = k
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = list(cfg.layer_types[:k])
    view_base = copy.copy(base)
    view_base._modules = dict(base._modules)
    view_base.config = cfg
    if base is model:
        return view_base
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view._modules[model.base_model_prefix] = view_base
    view.config = cfg
    return view


class EarlyExitDrafter(DraftModelDrafter):
    """The target's first k of L layers draft, sampling from their warped q (see the module docstring)."""

    def __init__(self, target: torch.nn.Module, vocab_size: int, exit_layer: int = 0, confidence_threshold: float = 0.0,
                 head_vocab: int = 0, always_keep: tuple[int, ...] = ()):
        self.layers = resolve_exit_layer(target, exit_layer)
        self.total_layers = total_layers(target)
        super().__init__(shallow_view(target, self.layers), vocab_size, confidence_threshold, head_vocab, always_keep)

    def propose(self, committed, gamma, cfg, gen):
        draft = super().propose(committed, gamma, cfg, gen)
        draft.note = DraftNote("early-exit", layers=self.layers, total_layers=self.total_layers)
        return draft
