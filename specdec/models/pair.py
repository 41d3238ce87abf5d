"""Loading draft/target pairs, and the bounded cache of loaded pairs that an app shares between sessions.

A pair is named by a preset (`PAIRS`) or by explicit target/draft ids: "embedded:<slug>" (the registry-shipped
Qwen pair, see `specdec.models.embedded`), "tiny:<role>[:seed]" (the random-weight test pair, see `specdec.models.tiny`), or a
hub id / local folder loaded the usual transformers way (hub access only for ids that are not local folders).

Memory: `load_pair(shared=True)` keeps the startup pair (the first one loaded, and the preset named by
SPECDEC_PAIR) for the life of the process, plus the most recently used other pairs up to SPECDEC_MAX_PAIRS
(default 2). Evicted pairs are forgotten by the cache and freed once their last user lets go; a caller that
decodes on a pair holds `pair_lease(pair)` meanwhile, and a leased pair is never evicted.
"""

from __future__ import annotations

import copy
import dataclasses
import gc
import json
import os
import platform
import re
import tempfile
import threading
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch

from specdec.models.embedded import EMBEDDED, Progress, embedded_folder
from specdec.models.embedded import say as _say
from specdec.core.errors import ModelLoadError, UnsupportedModelError, VocabularyMismatchError
from specdec.models.prepack import check_widths, drop_plain_pages, prepack, prepack_supported, prepacked
from specdec.models.quant import check_quant_support, quantize, resolve_quant, settle_dense_rows
from specdec.core.record import PairInfo
from specdec.core.static_cache import resolve_engine
from specdec.models.tiny import tiny_models, tiny_seed, tiny_tokenizer

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")  # accelerate's automatic placements
DEFAULT_MAX_PAIRS = 2

# Named pairs: (target, draft). "embedded:" ids resolve to the registry packages (specdec.models.embedded), "tiny:" to the
# random-weight test pair built in memory (specdec.models.tiny), anything else is a hub id or a local folder.
PAIRS: dict[str, tuple[str, str]] = {
    "default": ("embedded:qwen2.5-coder-1.5b-instruct", "embedded:qwen2.5-coder-0.5b-instruct"),
    "default-int8": ("embedded:qwen2.5-coder-1.5b-instruct", "embedded:qwen2.5-coder-0.5b-instruct"),
    "default-int4": ("embedded:qwen2.5-coder-1.5b-instruct", "embedded:qwen2.5-coder-0.5b-instruct"),
    "tiny": ("tiny:target", "tiny:draft"),
    "qwen2.5-coder-0.5b-1.5b": ("Qwen/Qwen2.5-Coder-1.5B-Instruct", "Qwen/Qwen2.5-Coder-0.5B-Instruct"),
    "smollm2-135m-360m": ("HuggingFaceTB/SmolLM2-360M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "smollm2-135m-1.7b": ("HuggingFaceTB/SmolLM2-1.7B-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct"),
    "qwen2.5-0.5b-1.5b": ("Qwen/Qwen2.5-1.5B-Instruct", "Qwen/Qwen2.5-0.5B-Instruct"),
    "distilgpt2-gpt2-large": ("gpt2-large", "distilgpt2"),
}
# Presets whose draft is quantized (specdec.models.quant): the default pair with a weight-only int8 or int4 draft,
# which needs bfloat16 activations on the CPU ("auto" dtype then picks bfloat16 there).
PAIR_DRAFT_QUANT: dict[str, str] = {"default-int8": "int8", "default-int4": "int4"}


@dataclass(eq=False)  # identity equality: two loads of the same ids are still two copies in memory
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object
    device: torch.device  # where token ids go in and logits come out (the target's input embeddings)
    dtype: torch.dtype
    name: str
    target_id: str = ""
    draft_id: str = ""
    vocab_size: int = 0  # logits are sliced to this width so p and q index the same tokens
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)
    device_map: dict | None = None  # the target's accelerate placement (module -> device); None: one device
    draft_quant: str = ""  # the draft's weights ("int8", "int4", "int4-all": specdec.models.quant); "": as loaded
    # How chain passes run (specdec.core.static_cache.ENGINES): "eager", "static" or "compiled"; $SPECDEC_COMPILE
    # when the pair is built. A speed choice only: the three compute the same logits.
    engine: str = field(default_factory=resolve_engine)
    leases: int = field(default=0, repr=False)  # users decoding on it right now (see pair_lease)

    @property
    def prepacked(self) -> bool:
        """Whether the target's linear layers run on prepacked CPU kernels (specdec.models.prepack)."""
        return bool(prepacked(self.target))

    def info(self) -> PairInfo:
        """What a record says about this pair."""
        return PairInfo(self.name, self.target_id, self.draft_id, str(self.device),
                        str(self.dtype).replace("torch.", ""), self.vocab_size, self.draft_quant, self.engine,
                        self.prepacked)

    def describe(self) -> dict:
        """What a record says about this pair (`PairInfo`), as the JSON the bench and the CLI print."""
        return asdict(self.info())


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


def cpu_name() -> str:
    """This CPU's model name and the matmul instructions that set its costs, e.g. "AMD EPYC (avx512_bf16, avx512f,
    avx2)": every timing the project reports says which CPU it came from."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    name = re.search(r"model name\s*:\s*(.*)", info)
    flags = set((re.search(r"flags\s*:\s*(.*)", info) or re.match("", "")).group(0).split())
    extra = [f for f in ("amx_bf16", "avx512_bf16", "avx512f", "avx2") if f in flags]
    return f"{name.group(1).strip() if name else 'unknown'} ({', '.join(extra) or 'no AVX2'})"


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


def resolve_device_map(device_map: str | dict | None) -> str | dict | None:
    """None reads SPECDEC_DEVICE_MAP (unset, empty or "none": one device); else a DEVICE_MAPS name or a dict."""
    if device_map is None:
        device_map = os.environ.get("SPECDEC_DEVICE_MAP", "").strip()
    if isinstance(device_map, dict):
        return device_map
    if device_map in ("", "none"):
        return None
    if device_map not in DEVICE_MAPS:
        raise ModelLoadError(f"unknown device map '{device_map}'; choose {', '.join(DEVICE_MAPS)} or none")
    return device_map


# ---------------------------------------------------------------------------------------------- loading


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


def _load_folder(src: str, dtype: torch.dtype, device: torch.device, placement: dict | None = None):
    """Load one causal LM onto `device`, or let accelerate place it when `placement` holds a device_map.

    placement: from_pretrained's device_map / max_memory / offload_folder keywords. accelerate then puts each
    block on a GPU, the CPU or disk and moves activations between them with hooks (outputs come back on the
    device of the input ids), so the decoding loop only has to feed ids where the input embeddings live.
    """
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=dtype, trust_remote_code=False, **(placement or {}))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"weights for '{src}' could not be loaded: {exc}") from exc
    return (model if placement else model.to(device)).eval()


def _load_tokenizer(src: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(src, trust_remote_code=False)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"tokenizer for '{src}' could not be loaded: {exc}") from exc


def _source(model_id: str, progress: Progress | None, dtype: torch.dtype = torch.float32) -> str:
    """Where a model loads from: a folder (embedded models: the converted one, in `dtype` where one is kept) or a
    hub id."""
    if model_id.startswith("embedded:"):
        slug = model_id.split(":", 1)[1]
        if slug not in EMBEDDED:
            raise ModelLoadError(f"unknown embedded model '{slug}'; known: {', '.join(EMBEDDED)}")
        return str(embedded_folder(slug, progress, dtype))
    check_config(model_id)
    return str(Path(model_id).expanduser()) if _local(model_id) else model_id


TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "added_tokens.json", "special_tokens_map.json",
                   "tokenizer.model")  # what defines a vocabulary (tokenizer_config.json: its added_tokens_decoder)


def same_tokenizer_files(src_a: str, src_b: str) -> bool:
    """Whether two local model folders hold byte-identical vocabulary files (and the same added tokens), so the
    second tokenizer would be the first again: loading it only to compare vocabularies can be skipped (~1 s for
    Qwen2.5's). False for hub ids or when anything differs or is unreadable; the caller then loads and compares."""
    a, b = Path(src_a), Path(src_b)
    if not (a.is_dir() and b.is_dir()):
        return False
    try:
        if not (a / "tokenizer.json").is_file():
            return False
        for name in TOKENIZER_FILES:
            fa, fb = a / name, b / name
            if fa.is_file() != fb.is_file() or (fa.is_file() and fa.read_bytes() != fb.read_bytes()):
                return False
        added = [json.loads((d / "tokenizer_config.json").read_text()).get("added_tokens_decoder")
                 if (d / "tokenizer_config.json").is_file() else None for d in (a, b)]
        return added[0] == added[1]
    except (OSError, ValueError):
        return False


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




def _input_device(model: torch.nn.Module) -> torch.device:
    """Where a dispatched model wants its token ids: the device of its input embeddings."""
    dev = model.get_input_embeddings().weight.device
    if dev.type == "meta":
        raise ModelLoadError(
            "the device map offloaded the target's input embeddings to disk; give the first device more memory "
            "(max_memory) so that at least the embeddings fit"
        )
    return dev


def _build_pair(label, target_id, draft_id, dt, dev, progress, device_map=None, max_memory=None,
                draft_quant: str = "", sibling: ModelPair | None = None) -> ModelPair:
    """sibling: a loaded pair with the same target (ids, dtype, device, no device map) whose target and tokenizer
    the new pair shares (models are used read-only), so a second preset of one target loads only its draft."""
    pair = _build_float_pair(label, target_id, draft_id, dt, dev, progress, device_map, max_memory, sibling)
    if draft_quant:
        check_quant_support(dt, pair.device, draft_quant)  # a device map may have put the draft elsewhere than `dev`
    packing = device_map is None and prepack_supported(dt, dev)
    dropped = 0
    # The target is packed before the draft is quantized: reordering its weights ran ~2x slower after quantizing
    # (measured on a 2-core EPYC: 0.75 s before, 1.1-2.2 s after).
    if packing and sibling is None:  # a shared target is packed already
        dropped += _pack_model(pair.target, progress, "prepacking the target's linear layers for the CPU")
    if draft_quant:
        _say(progress, f"quantizing the draft ({draft_quant})")
        quantize(pair.draft, draft_quant)
        settle_dense_rows(pair.draft, say=lambda m: _say(progress, m))
        pair.draft_quant = draft_quant
    if packing:
        dropped += _pack_model(pair.draft, progress)  # a quantized draft has no float linear layers left
    if dropped:
        _say(progress, f"{dropped / 2**20:.0f} MiB of plain weights left to the checkpoint file (packed copies "
                       "serve every pass)")
    release_freed_memory()
    return pair


def _pack_model(model: torch.nn.Module, progress, message: str = "") -> int:
    """prepack, check_widths and drop_plain_pages for one model; returns the bytes of plain weights handed back."""
    if prepack(model) and message:
        _say(progress, message)
    check_widths(model, say=lambda m: _say(progress, m))
    return drop_plain_pages(model)


def release_freed_memory() -> bool:
    """Hand the heap pages that loading freed back to the system (glibc's malloc_trim). Loading reads float32
    checkpoints, casts them and swaps float layers for packed ones: the freed buffers stay in the process's heap,
    and its RSS with them, until trimmed (~0.7 GB for the embedded int4 pair). False where there is no glibc."""
    import ctypes
    import gc

    gc.collect()
    try:
        return bool(ctypes.CDLL("libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def quantized_draft_pair(pair: ModelPair, mode: str = "int8", dtype: torch.dtype | None = None) -> ModelPair:
    """A new pair with the same target (the same object) and a quantized copy of `pair`'s draft; `pair` itself is
    unchanged. dtype: the quantized draft's activations (default the pair's dtype), e.g. bfloat16 beside a float32
    target; the pair then records draft_quant as "int8:bfloat16". Outside the pair cache."""
    mode = resolve_quant(mode)
    if not mode:
        raise ModelLoadError("quantized_draft_pair needs a quantization mode, e.g. 'int8'")
    if pair.draft_quant:
        raise ModelLoadError(f"this pair's draft is already quantized ({pair.draft_quant})")
    dtype = dtype or pair.dtype
    check_quant_support(dtype, pair.device, mode)
    draft = quantize(copy.deepcopy(pair.draft), mode, dtype)
    settle_dense_rows(draft)
    label = mode if dtype == pair.dtype else f"{mode}:{str(dtype).replace('torch.', '')}"
    return dataclasses.replace(pair, draft=draft, draft_quant=label, leases=0)


def _build_float_pair(label, target_id, draft_id, dt, dev, progress, device_map=None, max_memory=None,
                      sibling: ModelPair | None = None) -> ModelPair:
    if target_id.startswith("tiny:") or draft_id.startswith("tiny:"):
        if not (target_id.startswith("tiny:") and draft_id.startswith("tiny:")):
            other = draft_id if target_id.startswith("tiny:") else target_id
            _source(other, progress)  # report an unknown or unusable model before the pairing problem
            raise VocabularyMismatchError("the tiny test models only pair with each other")
        if device_map is not None:
            raise ModelLoadError("a device map needs models loaded from a folder or the hub, not the in-memory "
                                 "tiny pair; save it with save_pretrained and load the folders")
        seed = tiny_seed(target_id)
        if tiny_seed(draft_id) != seed:
            raise ModelLoadError(f"'{target_id}' and '{draft_id}' are different tiny pairs; give both the same seed")
        tok = tiny_tokenizer()
        tgt, drf = tiny_models(len(tok), seed)
        tgt, drf = tgt.to(device=dev, dtype=dt).eval(), drf.to(device=dev, dtype=dt).eval()
        return ModelPair(tgt, drf, tok, dev, dt, label, target_id, draft_id, len(tok), eos_ids(tok))

    t_src = _source(target_id, progress, dt)
    d_src = _source(draft_id, progress, dt)
    if sibling is not None:
        _say(progress, f"sharing the loaded target {target_id}")
        tok = sibling.tokenizer
    else:
        _say(progress, f"loading tokenizer ({target_id})")
        tok = _load_tokenizer(t_src)
    draft_tok = tok if d_src == t_src or same_tokenizer_files(t_src, d_src) else _load_tokenizer(d_src)
    if not same_vocabulary(tok, draft_tok):
        raise VocabularyMismatchError(
            f"draft '{draft_id}' and target '{target_id}' use different vocabularies "
            f"({len(draft_tok)} vs {len(tok)} tokens, or the same size with different entries); "
            "speculative decoding needs one shared tokenizer"
        )
    placement = offload = None
    if device_map is not None:
        # Weights the map sends to "disk" are written here; the folder lives (and is deleted) with the model.
        offload = tempfile.TemporaryDirectory(prefix="specdec-offload-")
        placement = {"device_map": device_map, "max_memory": max_memory, "offload_folder": offload.name}
    where = f"device map {device_map if isinstance(device_map, str) else '(dict)'}" if placement else str(dev)
    if sibling is not None:
        tgt = sibling.target
    else:
        _say(progress, f"loading target {target_id} ({str(dt).replace('torch.', '')}, {where})")
        tgt = _load_folder(t_src, dt, dev, placement)
    hf_map = None
    if placement:
        tgt._specdec_offload_dir = offload  # keeps the offloaded weights on disk exactly as long as the model
        hf_map = {k: str(v) for k, v in (getattr(tgt, "hf_device_map", None) or {}).items()}
        dev = _input_device(tgt)
    # The draft is small by design: whole on the device where the target takes its ids, so p and q, the sampling
    # generator and the draft's reduced head (a view of its weights) all live on one device.
    _say(progress, f"loading draft {draft_id}")
    drf = _load_folder(d_src, dt, dev)
    # Embedding tables are often padded past the tokenizer; p and q are compared over the shared width only.
    vocab = min(tgt.config.vocab_size, drf.config.vocab_size)
    if len(tok) > vocab:
        raise VocabularyMismatchError(f"tokenizer has {len(tok)} tokens but a model has only {vocab} logits")
    _say(progress, "target and draft loaded")
    return ModelPair(tgt, drf, tok, dev, dt, label, target_id, draft_id, vocab, eos_ids(tok, tgt, drf), hf_map)


# ---------------------------------------------------------------------------------------------- pair cache


class PairCache:
    """Loaded pairs by key: pinned ones for good, the others least recently used first out beyond a limit.

    max_pairs: how many unpinned pairs to keep; None reads SPECDEC_MAX_PAIRS (default 2) at every trim, so a
    deployment sets it in the environment. A leased pair (leases > 0) is skipped by eviction, and so is the most
    recently used one, so the cache may hold more than the limit while leases last; it is trimmed when they end.
    """

    def __init__(self, max_pairs: int | None = None):
        self.max_pairs = max_pairs
        self.lock = threading.RLock()
        self._pinned: dict[tuple, ModelPair] = {}
        self._recent: OrderedDict[tuple, ModelPair] = OrderedDict()  # least recently used first
        self._listeners: list[Callable[[ModelPair], None]] = []

    def limit(self) -> int:
        if self.max_pairs is not None:
            return self.max_pairs
        raw = os.environ.get("SPECDEC_MAX_PAIRS", "").strip()
        if not raw:
            return DEFAULT_MAX_PAIRS
        if not raw.isdigit():
            raise ModelLoadError(f"SPECDEC_MAX_PAIRS must be a whole number >= 0, got {raw[:20]!r}")
        return int(raw)

    def get(self, key: tuple) -> ModelPair | None:
        with self.lock:
            if key in self._pinned:
                return self._pinned[key]
            pair = self._recent.get(key)
            if pair is not None:
                self._recent.move_to_end(key)
            return pair

    def put(self, key: tuple, pair: ModelPair, pin: bool) -> None:
        with self.lock:
            if pin:
                self._pinned[key] = pair
            else:
                self._recent[key] = pair
                self._recent.move_to_end(key)
        self.trim()

    def pairs(self) -> list[ModelPair]:
        with self.lock:
            return list(self._pinned.values()) + list(self._recent.values())

    def __contains__(self, pair: ModelPair) -> bool:
        return any(p is pair for p in self.pairs())

    def __len__(self) -> int:
        with self.lock:
            return len(self._pinned) + len(self._recent)

    def on_evict(self, listener: Callable[[ModelPair], None]) -> None:
        """Call listener(pair) when a pair leaves the cache, e.g. so an app drops its own reference to it."""
        self._listeners.append(listener)

    def trim(self) -> int:
        """Evict unleased unpinned pairs, least recently used first, down to limit(); returns how many left."""
        with self.lock:
            limit = self.limit()
            evicted, excess = [], len(self._recent) - limit
            # The most recent pair was just loaded or asked for: keep it even when leased pairs fill the limit.
            candidates = list(self._recent)[: -1 if limit else None]
            for key in candidates:
                if excess <= 0:
                    break
                if self._recent[key].leases == 0:
                    evicted.append(self._recent.pop(key))
                    excess -= 1
        return self._release(evicted)

    def clear(self) -> int:
        """Forget every pair, pinned ones included (tests; an app shutting down)."""
        return self.evict(lambda pair: True)

    def evict(self, which: Callable[[ModelPair], bool]) -> int:
        """Forget every pair, pinned or not, for which `which(pair)` is true; how many went."""
        with self.lock:
            evicted = []
            for held in (self._pinned, self._recent):
                for key in [k for k, pair in held.items() if which(pair)]:
                    evicted.append(held.pop(key))
        return self._release(evicted)

    def _release(self, evicted: list[ModelPair]) -> int:
        n = len(evicted)
        if not n:
            return 0
        on_cuda = any(p.device.type == "cuda" for p in evicted)
        for pair in evicted:
            for listener in self._listeners:
                listener(pair)
        del pair
        evicted.clear()
        # Models hold reference cycles (hooks, tied weights): collect now rather than at the next automatic gc,
        # then hand the freed heap pages and CUDA blocks back so the next pair (or another process) can use them.
        release_freed_memory()
        if on_cuda and torch.cuda.is_available():
            torch.cuda.empty_cache()
        return n


PAIR_CACHE = PairCache()
_LOAD_LOCK = threading.Lock()  # one load at a time: two concurrent loads of big models would double peak memory


def set_max_pairs(n: int | None) -> None:
    """Keep at most n unpinned pairs in the shared cache (None: SPECDEC_MAX_PAIRS, default 2); trims at once."""
    if n is not None and n < 0:
        raise ModelLoadError(f"max pairs must be >= 0, got {n}")
    PAIR_CACHE.max_pairs = n
    PAIR_CACHE.trim()


@contextmanager
def pair_lease(pair: ModelPair) -> Iterator[ModelPair]:
    """Hold a pair while decoding on it: the cache does not evict it meanwhile, and trims it once released.

    Without a lease a pair can leave the cache while someone still uses it: it keeps working (Python keeps it
    alive while referenced), but the next load_pair of the same ids then builds a second copy.
    """
    with PAIR_CACHE.lock:
        pair.leases += 1
    try:
        yield pair
    finally:
        with PAIR_CACHE.lock:
            pair.leases -= 1
        PAIR_CACHE.trim()


def _pinned(name: str, custom: bool) -> bool:
    """The pair an app starts with stays loaded: the process's first pair, and the SPECDEC_PAIR preset where that
    variable names one (unset, nothing else is pinned: every other pair is one of the most recently used)."""
    return len(PAIR_CACHE) == 0 or (not custom and name == os.environ.get("SPECDEC_PAIR", "").strip())


def pair_ids(name: str, target: str | None = None, draft: str | None = None) -> tuple[str, str]:
    """The (target, draft) ids a request means: a preset's, with typed custom ids in place of either (a custom id
    next to an unknown preset name takes the default preset's other model)."""
    if target or draft:
        base_t, base_d = PAIRS.get(name, PAIRS["default"])
        return target or base_t, draft or base_d
    if name not in PAIRS:
        raise ModelLoadError(f"unknown model pair '{name}'; known pairs: {', '.join(PAIRS)}")
    return PAIRS[name]


def load_pair(
    name: str = "default",
    *,
    target: str | None = None,
    draft: str | None = None,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    device_map: str | dict | None = None,
    max_memory: dict | None = None,
    progress: Progress | None = None,
    shared: bool = True,
    draft_quant: str | None = None,
    engine: str | None = None,
) -> ModelPair:
    """Load a draft/target pair by preset name, or by explicit target/draft ids (hub ids or local folders).

    device_map ("auto", "balanced", "balanced_low_0", "sequential" or a module->device dict; None reads
    SPECDEC_DEVICE_MAP): accelerate places the target across the GPUs, the CPU and disk (max_memory caps each,
    e.g. {0: "20GiB", 1: "20GiB", "cpu": "64GiB"}); the draft goes whole onto the device of the target's input
    embeddings, which becomes pair.device. Without a map both models go onto `device`.

    With shared=True the pair is memoized per (ids, dtype, device, placement) in PAIR_CACHE (PairCache says what
    stays loaded): models are used read-only (inference mode; caches live outside them), so every caller and
    every app session can share one copy. shared=False builds a private pair the cache never sees.

    draft_quant (a mode of QUANT_MODES: "int8", "int4", "int4-all"; None: the preset's own, see PAIR_DRAFT_QUANT;
    "" or "none": unquantized) quantizes the draft's weights (specdec.models.quant). Every mode runs on the CPU with
    bfloat16 or float16 activations ("auto" picks bfloat16 on the CPU); any other dtype or device is an
    InvalidInputError, raised before loading.

    engine (None: $SPECDEC_COMPILE, else "eager"; see specdec.core.static_cache) is how chain passes run; the pair
    returned carries it (a copy of the shared pair when it differs, so other users keep theirs).
    """
    pair = _load_pair(name, target, draft, dtype, device, device_map, max_memory, progress, shared, draft_quant)
    want = resolve_engine(engine)
    return pair if pair.engine == want else dataclasses.replace(pair, engine=want, leases=0)


def _load_pair(name, target, draft, dtype, device, device_map, max_memory, progress, shared, draft_quant) -> ModelPair:
    custom = bool(target or draft)
    target_id, draft_id = pair_ids(name, target, draft)
    label = "custom" if custom else name
    quant = resolve_quant(PAIR_DRAFT_QUANT.get(name, "") if draft_quant is None else draft_quant)
    dev = resolve_device(device)
    dt = torch.bfloat16 if quant and dtype == "auto" and dev.type == "cpu" else resolve_dtype(dtype, dev)
    if quant:
        check_quant_support(dt, dev, quant)
    dmap = resolve_device_map(device_map)
    placement = json.dumps([dmap, max_memory], sort_keys=True, default=str) if dmap is not None else ""
    if not shared:
        return _build_pair(label, target_id, draft_id, dt, dev, progress, dmap, max_memory, quant)
    key = (target_id, draft_id, dt, str(dev), placement, quant, prepack_supported(dt, dev))
    with _LOAD_LOCK:
        pair = PAIR_CACHE.get(key)
        if pair is None:
            sibling = None if placement or target_id.startswith("tiny:") else next(
                (p for p in PAIR_CACHE.pairs() if (p.target_id, p.dtype, str(p.device), p.device_map)
                 == (target_id, dt, str(dev), None) and p.prepacked == prepack_supported(dt, dev)), None)
            pair = _build_pair(label, target_id, draft_id, dt, dev, progress, dmap, max_memory, quant, sibling)
            PAIR_CACHE.put(key, pair, pin=_pinned(name, custom))
        return pair
