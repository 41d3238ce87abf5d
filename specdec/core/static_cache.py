"""The static-cache engine: a `CachedLM` whose keys and values live in preallocated tensors addressed by position,
so the decode and verify passes have a few fixed shapes that torch.compile can capture (CUDA graphs on a GPU).

Glossary
- slot: one position of the preallocated cache ([batch, heads, max_len, head_dim] per layer, transformers'
  `StaticCache`). Slot i holds the key/value of the token at position i.
- length: how many slots are committed; the cache's own counter (`StaticLayer.cumulative_length`, a tensor, so a
  compiled graph reads it without recompiling). Rolling back after a rejected guess moves the length back
  (`StaticCache.crop`); nothing is copied or freed.
- stale slot: a slot past the length. It still holds an old key/value, but no query can see it: the causal mask
  transformers builds for a static cache hides every slot past the query's own position, and the next pass writes
  its own keys into the slots it attends to before attention reads them.
- cache length: the slots allocated, the run's prompt + budget + SLACK rounded up to a power of two (at least
  MIN_SLOTS), so runs of similar length share the compiled graphs (a graph is specialized to the cache's shape).
  Attention reads every slot, masked ones too, so on a CPU a cache much longer than the text costs real time
  (bench --engines, embedded pair, bf16: compiled plain decoding on a 2,048-slot cache ran at 0.63x the eager
  engine's speed, on 256 slots at 1.02x); on a GPU it is noise. `precompile` takes the length the runs will use.
- bucket: a pass feeding n tokens is padded to the next size in BUCKETS (the padding's slots are stale at once:
  the length moves back over them), so a compiled run sees at most len(BUCKETS) shapes. Passes longer than the
  largest bucket (a long prompt) run eagerly on the same cache, as does the first pass (it allocates the cache).

Engines (`ENGINES`): "eager" is `CachedLM` (transformers' DynamicCache); "static" is this cache with eager
passes; "compiled" is this cache with the model body under torch.compile (mode "reduce-overhead" on CUDA: CUDA
graphs; inductor's default on a CPU). The logits are the same computation in all three, so every decoding rule
and every test applies unchanged; `tests/test_static_cache.py` checks greedy equality and the caches.
Token trees run on all three (their mask spans the allocated slots, the stale ones hidden; bucketed passes pad
the node count); ragged and lockstep batches hold B rows and run on the eager engine.
"""

from __future__ import annotations

import os
import weakref

import torch
from transformers import StaticCache

from specdec.core.errors import InvalidInputError, UnsupportedModelError
from specdec.core.kvcache import PLAIN_HEAD_TYPES, CachedLM
from specdec.core.settings import ENGINES, MAX_GAMMA

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
SLACK = 2 * MAX_GAMMA + BUCKETS[-1]  # slots past a run's budget: a draft of up to MAX_GAMMA guesses, a catch-up, padding
MIN_SLOTS = 256
WARM_BUCKETS = BUCKETS[:5]  # the pass sizes chains use (1..16 tokens), compiled ahead by `precompile`

_COMPILED: "weakref.WeakKeyDictionary[torch.nn.Module, object]" = weakref.WeakKeyDictionary()


def resolve_engine(engine: str | None = None) -> str:
    """None reads SPECDEC_COMPILE: unset, "", "0", "off" or "eager" -> eager; "1", "on", "compiled" -> compiled;
    "static" -> static. Anything else is refused with the choices."""
    if engine is None:
        raw = os.environ.get("SPECDEC_COMPILE", "").strip().lower()
        engine = {"": "eager", "0": "eager", "off": "eager", "false": "eager", "no": "eager",
                  "1": "compiled", "on": "compiled", "true": "compiled", "yes": "compiled"}.get(raw, raw)
    if engine not in ENGINES:
        raise InvalidInputError(f"unknown engine {engine!r}; choose {', '.join(ENGINES)} (SPECDEC_COMPILE=1 is "
                                "'compiled')")
    return engine


def compiled_body(model: torch.nn.Module):
    """The model body (`base_model`) under torch.compile, one per model for the life of the process (every run
    and every cache on that model shares the captured graphs). CUDA: mode "reduce-overhead" (CUDA graphs)."""
    fn = _COMPILED.get(model)
    if fn is None:
        device = next(model.parameters()).device
        # One graph per bucket, each possibly twice (the first pass after the cache exists, then the steady one), for
        # causal passes (no mask) and for masked ones (trees).
        torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 8 * len(BUCKETS))
        mode = "reduce-overhead" if device.type == "cuda" else None
        fn = torch.compile(model.base_model, mode=mode, dynamic=False)
        _COMPILED[model] = fn
    return fn


def slots_for(max_len: int) -> int:
    """Slots to allocate for max_len committed tokens: max_len + SLACK rounded up to a power of two, >= MIN_SLOTS."""
    need = max(int(max_len) + SLACK, MIN_SLOTS)
    return 1 << (need - 1).bit_length()


def bucket_for(n: int) -> int | None:
    """The smallest bucket that holds n fed tokens (None: longer than every bucket, run eagerly)."""
    return next((b for b in BUCKETS if b >= n), None)


class StaticCachedLM(CachedLM):
    """`CachedLM` over a preallocated cache of at least `max_len` committed slots (plus SLACK for guesses and
    padding; `slots_for`), one row.

    The same scorer as CachedLM (score, feed, logits_after, sync, crop, keep_in_head, logits_for_tree, keep_path):
    only the cache and the pass sizes differ. A pass with a mask (a token tree) covers every slot, those past the
    row's length hidden (stale). `bucketed` (set for the compiled engine) pads every pass after the first to the
    next size in BUCKETS, the padding seeing only itself and dropped at once, so a chain pass and a tree pass of
    up to BUCKETS[-1] fed tokens (a committed tail plus the nodes) each run one of a few shapes; `compiled` runs
    the bucketed passes through `compiled_body`.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, head_vocab: int = 0,
                 always_keep: tuple[int, ...] = (), max_len: int = 2048, compiled: bool = False):
        if model.config.model_type not in PLAIN_HEAD_TYPES:
            raise UnsupportedModelError(f"the static-cache engine needs a plain output head; {model.config.model_type} "
                                        "models run on the eager engine")
        self.slots = slots_for(max_len)
        self.max_len = self.slots - SLACK  # what the rounding allows, at least the max_len asked for
        super().__init__(model, vocab_size, head_vocab, always_keep)
        self.compiled = compiled
        self.bucketed = compiled
        self.fast_body = compiled_body(model) if compiled else model.base_model
        self.passes = {"eager": 0, "bucketed": 0}  # how the passes ran (tests and the bench read it)
        self._bucket = False

    def new_cache(self):
        # Built outside inference mode wherever the caller is: the layers' length counters are then ordinary tensors
        # for every cache, and a graph guarded on one kind is never recompiled for the other.
        with torch.inference_mode(False):
            return StaticCache(config=self.model.config, max_cache_len=self.slots)

    def mask_width(self, n: int) -> int:
        return self.slots

    def _padding(self, batch: int, n: int) -> int:
        if batch != 1:
            raise UnsupportedModelError("the static cache holds one row; batched decoding runs on the eager engine")
        if self.width + n > self.slots - BUCKETS[-1]:
            raise InvalidInputError(f"the static cache holds {self.max_len} tokens plus a draft; this run needs more "
                                    "(use the eager engine, or a shorter prompt or budget)")
        size = bucket_for(n) if (self.bucketed and self.width > 0) else None
        # eager: the first pass (it allocates the cache), long passes, or the static engine
        self._bucket = size is not None
        self.passes["bucketed" if self._bucket else "eager"] += 1
        return size - n if self._bucket else 0

    def _body(self):
        return self.fast_body if self._bucket else self.model.base_model


@torch.inference_mode()
def precompile(model: torch.nn.Module, vocab_size: int, max_len: int = MIN_SLOTS - SLACK, sizes=WARM_BUCKETS) -> float:
    """Compile the body for every bucket in `sizes` on the cache a run of `max_len` tokens (prompt + budget) gets,
    before any run needs it, so no run pays a compilation midway (a new shape near the end of a budget, when γ
    shrinks). Returns the seconds it took (nothing left to compile: ~0)."""
    import time

    t0 = time.perf_counter()
    lm = StaticCachedLM(model, vocab_size, max_len=max_len, compiled=True)
    lm.feed([0])  # eager: allocates the cache
    for size in sizes:
        lm.feed([0] * size)
        lm.crop(1)
    return time.perf_counter() - t0


def open_lm(model: torch.nn.Module, vocab_size: int, head_vocab: int = 0, always_keep: tuple[int, ...] = (),
            engine: str = "eager", max_len: int | None = None) -> CachedLM:
    """The cached LM the engine names: CachedLM (eager), or StaticCachedLM for `max_len` committed tokens."""
    if engine == "eager":
        return CachedLM(model, vocab_size, head_vocab, always_keep)
    if max_len is None:
        raise ValueError("the static-cache engines need max_len (prompt + budget)")
    return StaticCachedLM(model, vocab_size, head_vocab, always_keep, max_len, compiled=engine == "compiled")
