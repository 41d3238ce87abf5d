"""The break-even map, measured on this machine: where speculative decoding beats plain decoding, by α and γ.

`measure_costs` times, on the loaded pair, what one round is made of:
- verify_ms[k-1]: one target forward pass over k new tokens (k = 1..K) on top of a KV cache holding a realistic
  prefix, plus the warp, as the decoder's verify step runs it. k = 1 is one plain decoding step; a round with γ
  guesses feeds γ + 1 tokens.
- draft_ms[name]: each drafter's cost per guess, from its own `propose` (γ guesses per call, divided by the
  guesses it returned).
Each number is the median of a few repeats, CUDA-synchronized on a GPU.

`measured_curve_speedup` then puts them in the speedup model (specdec.core.speedup) with the measured verify curve
instead of "a verify pass costs one target step":
    speedup(α, γ) = E[tokens per round](α, γ) · verify_ms(1) / (γ · draft_ms + verify_ms(γ + 1)),
and the per-token delay the system card writes as (verifier turn + draft overhead) / tokens per verifier turn is
    delay(α, γ) = (γ · draft_ms + verify_ms(γ + 1)) / E[tokens per round](α, γ)  [ms per token],
so speedup = verify_ms(1) / delay. Runs are placed with their own α and mean γ from RunRecord.metrics.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from specdec.core.clock import Stopwatch
from specdec.core.settings import encode_prompt
from specdec.drafters import make_drafter
from specdec.core.errors import InvalidInputError, SpecDecError
from specdec.core.kvcache import CachedLM
from specdec.core.speedup import expected_tokens_per_round, solve_break_even, speedup_from_costs
from specdec.core.record import RunRecord
from specdec.core.sampling import SamplingConfig, warp
from specdec.core.settings import DecodeSettings

K_MAX = 16  # verify passes of k = 1..K_MAX tokens: gamma up to K_MAX - 1
DRAFTERS = ("model", "ngram", "early-exit", "cross")
DRAFT_GUESSES = 8  # guesses per timed propose() call
# A realistic prefix: code with repeats (so the ngram drafter finds something to copy), ~150 tokens.
DEFAULT_PREFIX = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
    return fibonacci(n - 1) + fibonacci(n - 2)


def factorial(n):
    """Return n factorial."""
    if n < 2:
        return 1
    return n * factorial(n - 1)


def main():
    for i in range(10):
        print(i, fibonacci(i), factorial(i))


if __name__ == "__main__":
    main()


def fibonacci_memo(n, memo={}):
    """Return the n-th Fibonacci number."""
    if n < 2:
        return n
'''

Progress = Callable[[float, str], None]


@dataclass
class Costs:
    """Measured per-pass costs on one pair (milliseconds)."""

    pair: str
    device: str
    prefix_tokens: int
    verify_ms: list[float]  # index k-1: a target pass over k tokens
    draft_ms: dict[str, float]  # per guess, by drafter
    repeats: int
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def target_step_ms(self) -> float:
        """One plain decoding step (k = 1)."""
        return self.verify_ms[0]

    @property
    def max_gamma(self) -> int:
        return len(self.verify_ms) - 1

    def to_dict(self) -> dict:
        return {"pair": self.pair, "device": self.device, "prefix_tokens": self.prefix_tokens,
                "verify_ms": self.verify_ms, "draft_ms": self.draft_ms, "repeats": self.repeats,
                "seconds": self.seconds, "notes": self.notes}


def _timed(fn, device) -> float:
    clock = Stopwatch(device)
    fn()
    return clock.lap()


def _continuation(ids: list[int], k: int) -> list[int]:
    """k token ids to feed after the prefix (their values do not change the cost): the prefix's own start."""
    return [ids[i % len(ids)] for i in range(k)]


@torch.inference_mode()
def measure_verify(pair, prefix_ids: list[int], k_max: int = K_MAX, repeats: int = 3, budget_s: float | None = None,
                   progress: Progress | None = None) -> tuple[list[float], int]:
    """Median ms of a target pass over k = 1..k_max new tokens after the cached prefix (+ the warp); also returns
    the repeats completed (at least one full sweep; more while within budget_s)."""
    lm = CachedLM(pair.target, pair.vocab_size)
    cfg = SamplingConfig()
    dev = pair.device
    extra = _continuation(prefix_ids, k_max)
    # The prefill and one full-width pass, untimed: one-time allocations and kernel selection.
    lm.logits_after(prefix_ids)
    warp(lm.logits_after(prefix_ids, extra[: k_max - 1], k_max), cfg)
    times: list[list[float]] = [[] for _ in range(k_max)]
    t0 = time.perf_counter()
    done = 0
    for rep in range(repeats):
        spent = time.perf_counter() - t0
        if rep and budget_s is not None and spent / rep * (rep + 1) > budget_s:  # the next sweep would overrun
            break
        for k in range(1, k_max + 1):
            # The decoder's verify pass: sync back to the prefix, feed its last token plus k-1 guesses, keep k rows.
            times[k - 1].append(_timed(lambda: warp(lm.logits_after(prefix_ids, extra[: k - 1], k), cfg), dev))
            if progress:
                progress((rep * k_max + k) / (repeats * k_max), f"target pass over {k} token(s), repeat {rep + 1}")
        done += 1
    return [statistics.median(t) for t in times], done


@torch.inference_mode()
def measure_drafter(pair, name: str, prefix_ids: list[int], repeats: int = 3, guesses: int = DRAFT_GUESSES) -> float:
    """Median ms per guess of one drafter's propose() after the prefix (its cache warmed first)."""
    settings = DecodeSettings(drafter=name, gamma=guesses, sampling=SamplingConfig(1.0)).validate()
    drafter = make_drafter(pair, settings, prefix_ids)
    gen = torch.Generator(device=pair.device).manual_seed(0)
    cfg = settings.sampling
    # Warm twice: the first call feeds the prefix into the drafter's cache, and on CPU the first call after it
    # still pays one-time kernel setup (measured 10.9 s against 0.58 s later for 8 guesses of the 0.5B draft).
    for _ in range(2):
        drafter.propose(prefix_ids, guesses, cfg, gen)
    per_guess = []
    for _ in range(repeats):
        box = {}
        ms = _timed(lambda: box.setdefault("d", drafter.propose(prefix_ids, guesses, cfg, gen)), pair.device)
        per_guess.append(ms / max(1, int(box["d"].tokens.shape[0])))
    return statistics.median(per_guess)


def prefix_ids_for(pair, records: Sequence[RunRecord] | None = None, max_tokens: int = 400) -> list[int]:
    """The prefix to measure on: the latest run's prompt and text if there is one (the user's own context), else a
    built-in code snippet; at most max_tokens."""
    if records:
        rec = records[0]
        ids = list(rec.prompt_ids) + rec.generated_ids
        if len(ids) >= 16:
            return ids[-max_tokens:]
    return encode_prompt(pair.tokenizer, DEFAULT_PREFIX)[-max_tokens:]


def measure_costs(pair, records: Sequence[RunRecord] | None = None, drafters: Sequence[str] = DRAFTERS,
                  k_max: int = K_MAX, repeats: int = 3, budget_s: float = 30.0,
                  progress: Progress | None = None) -> Costs:
    """Verify costs for k = 1..k_max and each available drafter's per-guess cost on the loaded pair.

    The verify sweep gets most of budget_s (repeats beyond the first are skipped when it runs out); a drafter that
    cannot run here (e.g. the cross drafter's model is not installed) is skipped with a note.
    """
    if not 2 <= k_max <= 64:
        raise InvalidInputError(f"k_max must be from 2 to 64, got {k_max}")
    say = progress or (lambda f, m: None)
    t0 = time.perf_counter()
    ids = prefix_ids_for(pair, records)
    say(0.0, f"timing the target on a {len(ids)}-token prefix")
    verify_ms, done = measure_verify(pair, ids, k_max, repeats, 0.75 * budget_s,
                                     lambda f, m: say(0.8 * f, m))
    notes = []
    if done < repeats:
        notes.append(f"the verify sweep ran {done} of {repeats} repeats within its time budget")
    draft_ms: dict[str, float] = {}
    for i, name in enumerate(drafters):
        say(0.8 + 0.2 * i / len(drafters), f"timing the {name} drafter")
        try:
            draft_ms[name] = measure_drafter(pair, name, ids, repeats=max(1, min(repeats, done + 1)))
        except (SpecDecError, OSError, ValueError, ImportError) as exc:
            notes.append(f"{name} drafter skipped: {exc}")
    say(1.0, "done")
    return Costs(getattr(pair, "name", "?"), str(pair.device), len(ids), verify_ms, draft_ms, done,
                 time.perf_counter() - t0, notes)


# ------------------------------------------------------------------------------------------ the model


def _measured(costs: Costs, gamma: int) -> int:
    if not 0 <= gamma <= costs.max_gamma:
        raise InvalidInputError(f"gamma must be from 0 to {costs.max_gamma} for these measurements, got {gamma}")
    return gamma


def round_ms(costs: Costs, drafter: str, gamma: int) -> float:
    """Time of one round: gamma guesses plus a target pass over gamma + 1 tokens."""
    return _measured(costs, gamma) * costs.draft_ms[drafter] + costs.verify_ms[gamma]


def delay_ms(costs: Costs, drafter: str, alpha: float, gamma: int) -> float:
    """Expected ms per emitted token: (verify + draft) / tokens per round."""
    return round_ms(costs, drafter, gamma) / expected_tokens_per_round(alpha, gamma)


def measured_curve_speedup(costs: Costs, drafter: str, alpha: float, gamma: int) -> float:
    """Plain ms per token / speculative ms per token, with the measured verify curve and draft costs (the
    textbook model with a verify pass costing one target step is `core.speedup.leviathan_speedup`)."""
    return speedup_from_costs(expected_tokens_per_round(alpha, gamma), _measured(costs, gamma),
                              costs.draft_ms[drafter], costs.verify_ms[gamma], costs.target_step_ms)


def speedup_grid(costs: Costs, drafter: str, alphas: Sequence[float]) -> np.ndarray:
    """[gammas, alphas] predicted speedup for gamma = 1..max_gamma."""
    return np.array([[measured_curve_speedup(costs, drafter, float(a), g) for a in alphas]
                     for g in range(1, costs.max_gamma + 1)])


def best_gamma(costs: Costs, drafter: str, alpha: float) -> tuple[int, float]:
    """(gamma with the highest predicted speedup at alpha, that speedup)."""
    g = max(range(1, costs.max_gamma + 1), key=lambda g: measured_curve_speedup(costs, drafter, alpha, g))
    return g, measured_curve_speedup(costs, drafter, alpha, g)


def measured_break_even(costs: Costs, drafter: str, gamma: int) -> float | None:
    """Smallest alpha at which gamma guesses beat plain decoding on the measured curve; None if even alpha = 1
    does not (the speedup rises with alpha: `core.speedup.solve_break_even`)."""
    return solve_break_even(lambda a: measured_curve_speedup(costs, drafter, a, gamma))


@dataclass
class PlacedRun:
    """One recorded run on the map: its metrics (RunRecord.metrics, not recomputed) and the model's advice."""

    label: str
    drafter: str
    alpha: float
    mean_gamma: float
    measured_speedup: float | None
    predicted_here: float | None  # the map's prediction at the run's alpha and (rounded) mean gamma
    best_gamma: int | None
    best_speedup: float | None


def place_runs(costs: Costs, records: Sequence[RunRecord]) -> list[PlacedRun]:
    """Every run that drafted anything, with the map's prediction at its α and mean γ and the γ it recommends."""
    out = []
    for rec in records:
        m = rec.metrics
        if not m.drafted:
            continue
        name = rec.settings.drafter
        known = name in costs.draft_ms
        g_here = min(costs.max_gamma, max(1, round(m.mean_gamma)))
        bg = best_gamma(costs, name, m.alpha) if known else (None, None)
        out.append(PlacedRun(rec.display_label, name, m.alpha, m.mean_gamma, m.speedup,
                             measured_curve_speedup(costs, name, m.alpha, g_here) if known else None, bg[0], bg[1]))
    return out
