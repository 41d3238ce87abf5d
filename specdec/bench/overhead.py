"""Where a round's time goes outside the model forward passes: `python -m specdec bench --overhead`.

On a GPU a 1.5B target's forward pass takes milliseconds, so Python work per round (drafter bookkeeping, warps,
verification, sampling, cache sync/crop, building the display event) can eat the speedup; CPU timings hide it.

The measurement is non-invasive: the engine code is unchanged. For one decoder at a time it wraps the decoder's
and its caches' bound methods (instance attributes, so other decoders are untouched), wraps the two models'
forward methods, and swaps the engine's module-level functions (warp, sample, verify, the top-k helper) for timed
versions until the run ends. Each timed call records its *exclusive* time (its own time minus the timed calls
inside it), so the categories add up to the round's wall time. On CUDA every boundary synchronizes, so GPU work
is charged to the call that launched it. The wrappers cost time themselves: the same run is also timed without
them and the difference is reported as `profiler_ms`.
"""

from __future__ import annotations

import functools
import sys
from collections import defaultdict
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Callable, Iterator

import torch

from specdec.bench.defaults import resolve
from specdec.bench.harness import log, sampling_for, timed_spec, warm_up, write_result
from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.models.pair import ModelPair

# Category -> what it holds. "model" categories are the forward passes; everything else is overhead.
CATEGORIES = {
    "target_forward": "the target's forward pass (verification of gamma + 1 positions)",
    "draft_forward": "the draft's forward passes (one per guess, the first also catches up)",
    "target_head": "the target's vocabulary projection, which the scorer calls after the model body (model work)",
    "draft_head": "the draft's vocabulary projection, full or reduced, called after the model body (model work)",
    "drafter": "drafter bookkeeping: its own Python around the draft steps (head sync, stacking q rows)",
    "warp": "temperature / top-k / top-p warps of p and q",
    "sample": "drawing a token from q (greedy: argmax and its one-hot q), and the repaired/bonus token",
    "verify": "the accept/reject rule (ratios, uniforms, residual)",
    "cache": "KV cache sync, crop (rollback) and reduced-head bookkeeping",
    "feed": "building input ids and slicing logits around each forward",
    "events": "building the Round event: top-k lists, decoded pieces, probabilities to Python",
    "loop": "the decoder's own glue: gamma choice, committing tokens, EOS checks, statistics",
}
MODEL_WORK = ("target_forward", "draft_forward", "target_head", "draft_head")

# Module-level engine functions timed wherever a specdec module imported them: (home module, name, category).
FUNCTIONS = (
    ("specdec.core.sampling", "distribution", "warp"),
    ("specdec.core.sampling", "sample", "sample"),
    ("specdec.core.sampling", "draw", "sample"),  # greedy: the argmax and its one-hot q; sampled: warp + sample inside
    ("specdec.core.verify", "verify", "verify"),
    ("specdec.loop.display", "round_event", "events"),
    ("specdec.loop.display", "top_candidates", "events"),
)
# Bound methods timed on one decoder: (path from the decoder, category); missing ones are skipped.
METHODS = (
    ("step", "loop"),
    ("drafter.propose", "drafter"),
    ("drafter.feedback", "drafter"),
    ("target.sync", "cache"),
    ("target.crop", "cache"),
    ("target.feed", "feed"),
    ("drafter.lm.sync", "cache"),
    ("drafter.lm.crop", "cache"),
    ("drafter.lm.keep_in_head", "cache"),
    ("drafter.lm.feed", "feed"),
    # The scorer projects the body's hidden states itself, so the heads are model work outside forward.
    ("target.out_head.forward", "target_head"),
    ("target.head.project", "target_head"),
    ("drafter.lm.out_head.forward", "draft_head"),
    ("drafter.lm.head.project", "draft_head"),
)

PROMPTS = (
    "def fibonacci(n):",
    "The history of the printing press begins",
    "Explain what a hash map is in two sentences.",
)


class RoundProfiler:
    """A stack of timed frames; each closes into exclusive time per category, one dict per outermost call."""

    def __init__(self, device: torch.device):
        self.device = device
        self._stack: list[list] = []  # [category, its Stopwatch, ms spent in timed children]
        self._current: dict[str, float] = defaultdict(float)
        self.rounds: list[dict[str, float]] = []  # ms per category, one dict per round (outermost frame)

    @property
    def top(self) -> str | None:
        return self._stack[-1][0] if self._stack else None

    def push(self, category: str) -> None:
        self._stack.append([category, Stopwatch(self.device), 0.0])

    def pop(self) -> None:
        category, clock, children = self._stack.pop()
        elapsed = clock.total()
        self._current[category] += elapsed - children
        if self._stack:
            self._stack[-1][2] += elapsed
        else:
            self._current["round"] = elapsed
            self.rounds.append(dict(self._current))
            self._current.clear()

    def timed(self, fn: Callable, category: str) -> Callable:
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self.push(category)
            try:
                return fn(*args, **kwargs)
            finally:
                self.pop()

        return wrapper


def _resolve(obj, path: str):
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


@contextmanager
def _patched_functions(prof: RoundProfiler) -> Iterator[None]:
    """Replace each engine function by a timed one in every specdec module that holds it; restore on exit."""
    saved = []
    try:
        for home, name, category in FUNCTIONS:
            original = getattr(sys.modules.get(home), name, None)
            if original is None:
                continue
            wrapper = prof.timed(original, category)
            for mod_name, mod in list(sys.modules.items()):
                if mod_name.startswith("specdec") and getattr(mod, name, None) is original:
                    saved.append((mod, name, original))
                    setattr(mod, name, wrapper)
        yield
    finally:
        for mod, name, original in reversed(saved):
            setattr(mod, name, original)


_ABSENT = object()


def _shadow(stack: ExitStack, prof: RoundProfiler, owner, name: str, category: str) -> None:
    """Shadow `owner.name` by a timed instance attribute until the stack closes, then put back what was there (an
    earlier instance attribute, e.g. accelerate's own forward wrapper, or none). Methods are wrapped rather than
    hooked: a module with hooks takes torch's slower call path, whose extra Python would be charged to the caller.
    An owner shadowed twice (a drafter over the target's own cache) is put back in reverse order."""
    method = getattr(owner, name, None) if owner is not None else None
    if not callable(method):
        return
    own = vars(owner).get(name, _ABSENT)
    setattr(owner, name, prof.timed(method, category))
    stack.callback(lambda: delattr(owner, name) if own is _ABSENT else setattr(owner, name, own))


@contextmanager
def profiled(decoder, prof: RoundProfiler) -> Iterator[RoundProfiler]:
    """Time one SpeculativeDecoder's rounds by category while the block runs; the engine code is unchanged."""
    pair: ModelPair = decoder.pair
    with ExitStack() as stack:
        for path, category in METHODS:
            owner_path, _, name = path.rpartition(".")
            _shadow(stack, prof, _resolve(decoder, owner_path) if owner_path else decoder, name, category)
        stack.enter_context(_patched_functions(prof))
        # Each model's forward, and its base model's, which a cache's scorer calls on its own.
        models = [(pair.target, "target_forward")] + ([(pair.draft, "draft_forward")] if pair.draft is not pair.target
                                                      else [])
        for model, category in models:
            for module in {id(model): model, id(model.base_model): model.base_model}.values():
                _shadow(stack, prof, module, "forward", category)
        yield prof


def _mean(rows: list[dict[str, float]], key: str) -> float:
    return sum(r.get(key, 0.0) for r in rows) / len(rows) if rows else 0.0


def summarize_rounds(rows: list[dict[str, float]]) -> dict:
    """Mean ms per round per category, plus model time, overhead (everything else) and overhead without events."""
    per = {c: _mean(rows, c) for c in CATEGORIES}
    model = sum(per[c] for c in MODEL_WORK)
    round_ms = _mean(rows, "round")
    overhead = round_ms - model
    return {"rounds": len(rows), "round_ms": round_ms, "model_ms": model, "overhead_ms": overhead,
            "engine_overhead_ms": overhead - per["events"], "per_category_ms": per}


def measure_overhead(pair: ModelPair, prompts=PROMPTS, gamma: int = 4, max_new_tokens: int = 48,
                     sampling: SamplingConfig = SamplingConfig(), seed: int = 0, draft_vocab: int | None = None,
                     log: Callable[[str], None] = lambda m: None) -> dict:
    """Decode each prompt twice with the same seed (plain, then profiled) and break the rounds down.

    Round one of each run is left out: it also feeds the prompt, which says nothing about steady rounds.
    """
    if gamma < 1:
        raise InvalidInputError(f"gamma must be >= 1 for an overhead measurement, got {gamma}")
    settings = DecodeSettings(gamma=gamma, max_new_tokens=max_new_tokens, sampling=sampling, seed=seed,
                              draft_vocab=draft_vocab)
    warm_up([partial(timed_spec, pair)], prompts[0], settings)
    profiled_rows, plain_round_ms, same_text = [], [], True
    for prompt in prompts:
        plain = SpeculativeDecoder(pair, prompt, settings)
        plain_round_ms += [r.round_ms for r in list(plain)[1:]]
        dec = SpeculativeDecoder(pair, prompt, settings)
        prof = RoundProfiler(pair.device)
        with profiled(dec, prof):
            for _ in dec:
                pass
        profiled_rows += prof.rounds[1:]
        same_text &= dec.generated_ids == plain.generated_ids
        log(f"  {prompt[:40]!r}: {len(prof.rounds)} rounds")
    out = summarize_rounds(profiled_rows)
    plain_ms = sum(plain_round_ms) / len(plain_round_ms) if plain_round_ms else 0.0
    out.update(gamma=gamma, max_new_tokens=max_new_tokens, temperature=sampling.temperature, draft_vocab=draft_vocab,
               plain_round_ms=plain_ms, profiler_ms=out["round_ms"] - plain_ms,
               same_text_profiled=same_text, models=pair.describe())
    return out


def format_table(result: dict) -> str:
    lines = [f"{'category':16s} {'ms/round':>9s}  what",
             *(f"{c:16s} {result['per_category_ms'][c]:9.3f}  {d}" for c, d in CATEGORIES.items()),
             f"{'round (profiled)':16s} {result['round_ms']:9.3f}",
             f"{'round (plain)':16s} {result['plain_round_ms']:9.3f}  without the timers (profiler cost "
             f"{result['profiler_ms']:+.3f} ms/round)",
             f"{'model work':16s} {result['model_ms']:9.3f}",
             f"{'overhead':16s} {result['overhead_ms']:9.3f}  everything but model work",
             f"{'  w/o events':16s} {result['engine_overhead_ms']:9.3f}  the engine path alone (target <= 2 ms)"]
    return "\n".join(lines)


def cmd_overhead(args, load) -> int:
    """`python -m specdec bench --overhead`: the per-round overhead budget of our loop on the loaded pair."""
    run = resolve(args, "overhead")
    if run.gamma is None:
        raise InvalidInputError(f"--overhead needs a fixed --gamma, got {args.gamma!r}")
    gamma, max_new, modes = run.gamma, run.max_new_tokens, run.modes
    pair = load()
    result = {"models": pair.describe(), "torch_threads": torch.get_num_threads(), "modes": {}}
    prompts = PROMPTS[:1] if run.quick else PROMPTS
    for mode in modes:
        sampling = sampling_for(mode)
        log(f"overhead, {mode}, gamma={gamma}, {max_new} tokens x {len(prompts)} prompts")
        r = measure_overhead(pair, prompts, gamma, max_new, sampling, draft_vocab=args.draft_vocab, log=log)
        result["modes"][mode] = r
        print(f"\n== {pair.name} ({pair.describe()['dtype']}, {pair.device}), {mode}, gamma={gamma}: "
              f"{r['rounds']} rounds")
        print(format_table(r))
    write_result(result, run.out)
    return 0
