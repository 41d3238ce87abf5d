"""KV-cache rollback: sliding-window configs get cache layers that crop past the window (and decode exactly), and layer
kinds that cannot be rolled back are refused before any weights load."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from specdec.core.errors import UnsupportedModelError
from specdec.core.kvcache import check_rollback
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode


# Sliding-window configs once got cache layers that refuse to crop once the text outgrows the window.
def test_sliding_window_pair_decodes_past_the_window(tiny_pair):
    from transformers import MistralConfig, MistralForCausalLM

    cfg = MistralConfig(vocab_size=tiny_pair.vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, sliding_window=8, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(0)
    target = MistralForCausalLM(cfg).eval()
    torch.manual_seed(1)
    draft = MistralForCausalLM(cfg).eval()  # a different model, so rounds reject and caches roll back
    pair = replace(tiny_pair, target=target, draft=draft)
    s = DecodeSettings(gamma=4, max_new_tokens=30, draft_vocab=0)
    dec = SpeculativeDecoder(pair, "abc", s)
    list(dec)
    assert any(r.rejected_at is not None for r in dec.rounds)
    assert dec.generated_ids == plain_decode(pair, "abc", s).ids  # the window is still applied, exactly


def test_layers_that_cannot_roll_back_are_refused_before_loading():
    with pytest.raises(UnsupportedModelError, match="cannot be rolled back"):
        check_rollback(SimpleNamespace(model_type="hybrid", layer_types=["full_attention", "linear_attention"]))
    check_rollback(SimpleNamespace(model_type="mistral", layer_types=["sliding_attention", "full_attention"]))
