"""The embedded Qwen2.5-Coder pair (1.5B target, 0.5B draft) in fp32: exactness where it is checkable by equality.

bf16 on CPU changes matmul rounding between one-token and many-token passes, so token-for-token equality with
plain greedy decoding is asserted in fp32 only ("lossless up to hardware numerics").
"""

from __future__ import annotations

import json

import pytest
import torch

from specdec.cli import main as cli_main
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.loop.decoder import SpeculativeDecoder
from specdec.core.sampling import SamplingConfig

from .test_engine import check_caches_hold_committed

pytestmark = pytest.mark.slow

PROMPTS = [  # two code, two prose, two chat prompts, in pairs: every other one is one of each kind
    ("def fibonacci(n):", False),
    ("import numpy as np\n\ndef moving_average(x, k):", False),
    ("The history of the printing press begins", False),
    ("Once upon a time, in a small village by the sea,", False),
    ("Explain what a hash map is in two sentences.", True),
    ("Give three tips for writing clear commit messages.", True),
]
NEW = 12


@pytest.fixture(scope="module")
def references(real_pair_fp32):
    """Plain greedy continuations from transformers' own generate(), one per prompt."""
    pair = real_pair_fp32
    refs = {}
    for prompt, chat in PROMPTS:
        ids = torch.tensor([encode_prompt(pair.tokenizer, prompt, chat)])
        out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                                   pad_token_id=pair.tokenizer.pad_token_id)
        refs[prompt] = out[0, ids.shape[1]:].tolist()
    return refs


@pytest.mark.parametrize("gamma", [1, 8])  # the edges; γ 4, the default, is what the other real-pair tests run
def test_greedy_equals_target_generate(real_pair_fp32, references, gamma):
    # each γ meets half the prompts (a code, a prose and a chat one; PROMPTS alternates them): ~1 s a token here
    for prompt, chat in PROMPTS[gamma == 8::2]:
        dec = SpeculativeDecoder(real_pair_fp32, prompt, DecodeSettings(gamma=gamma, max_new_tokens=NEW, chat=chat))
        list(dec)
        assert dec.generated_ids == references[prompt], (prompt, gamma)


def test_real_caches_after_rejections(real_pair_fp32):
    settings = DecodeSettings(gamma=5, max_new_tokens=40, sampling=SamplingConfig(temperature=1.0), seed=5)
    dec = SpeculativeDecoder(real_pair_fp32, "Once upon a time, in a small village by the sea,", settings)
    while len(dec.rounds) < 6 and not dec.done:
        dec.step()
    assert any(r.rejected_at is not None for r in dec.rounds)
    check_caches_hold_committed(real_pair_fp32, dec, tol=2e-3)  # fp32, 1.5B: batched vs one-pass matmul order


def test_cli_json_compare(real_pair_fp32, capsys):
    rc = cli_main(["generate", "--prompt", "def fibonacci(n):", "--temperature", "0", "--compare", "--json",
                   "--max-new-tokens", "8", "--dtype", "float32", "--device", "cpu"])
    assert rc == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.strip().splitlines()]
    final = lines[-1]
    for key in ("text", "tokens", "rounds", "acceptance_rate", "tokens_per_round", "baseline_text",
                "baseline_tok_s", "speculative_tok_s", "speedup"):
        assert key in final
    assert final["rounds"] == len(lines) - 1 and final["tokens"] == 8
    assert final["text"] == final["baseline_text"]
    assert 0 <= final["acceptance_rate"] <= 1 and 1 <= final["tokens_per_round"] <= 5


def test_the_bf16_copy_of_an_embedded_model_holds_the_bits_its_float32_folder_loads_as():
    """The bf16 folder a CPU start reads (embedded.cast_copy, made once) equals the float32 folder loaded with
    dtype=bfloat16, tensor for tensor: keeping the copy changes only how many bytes a start reads."""
    from transformers import AutoModelForCausalLM

    from specdec.models.embedded import embedded_folder

    slug = "qwen2.5-coder-0.5b-instruct"
    full, copy = embedded_folder(slug), embedded_folder(slug, dtype=torch.bfloat16)
    assert copy != full and (copy / "specdec.json").exists() and (copy / "tokenizer.json").exists()
    cast = AutoModelForCausalLM.from_pretrained(str(full), dtype=torch.bfloat16).state_dict()
    kept = AutoModelForCausalLM.from_pretrained(str(copy), dtype=torch.bfloat16).state_dict()
    assert cast.keys() == kept.keys()
    assert all(kept[k].dtype == torch.bfloat16 and torch.equal(cast[k], kept[k]) for k in cast)
    assert embedded_folder(slug, dtype=torch.float32) == full
