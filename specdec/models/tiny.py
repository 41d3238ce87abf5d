"""The tiny random-weight test pair: a character-level tokenizer and two 2-layer Qwen2 models.

Nothing is fetched or read from disk, so tests and the browser test app start in seconds. The draft is the
target plus a little noise, so it agrees with the target often but not always (partial acceptance).
"""

from __future__ import annotations

import torch


def tiny_tokenizer(vocab_size: int = 0):
    """A character-level tokenizer with no files to fetch, for fast tests and the browser test pair.

    vocab_size > 101 pads the vocabulary with filler entries "<|fill:N|>" that text never encodes to, so
    random-weight models with a real vocabulary width (e.g. Qwen's 151 936) can be timed with it.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_end|>", "<|im_start|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    base = specials + chars
    filler = [f"<|fill:{i}|>" for i in range(len(base), vocab_size)]
    vocab = {tok: i for i, tok in enumerate(base + filler)}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=tk,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
    )
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tok.chat_template = (
        "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    return tok


def tiny_models(vocab_size: int, seed: int = 0):
    """Random-weight target and a draft that is the target plus noise, so acceptance is partial."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        initializer_range=0.2,
        bos_token_id=0,
        eos_token_id=1,
    )
    torch.manual_seed(seed)
    target = Qwen2ForCausalLM(cfg)
    draft = Qwen2ForCausalLM(cfg)
    draft.load_state_dict(target.state_dict())
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in draft.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.007)
    return target, draft


def tiny_seed(model_id: str) -> int:
    """The seed of a tiny model id: "tiny:target" is seed 0, "tiny:target:3" seed 3 (a distinct random pair)."""
    from specdec.core.errors import ModelLoadError

    parts = model_id.split(":")
    if len(parts) == 2:
        return 0
    if len(parts) == 3 and parts[2].isdigit():
        return int(parts[2])
    raise ModelLoadError(f"tiny model ids look like 'tiny:target' or 'tiny:target:<seed>', got {model_id[:60]!r}")
