"""Draft length by batch size: how many guesses per row pay off at B rows, and where speculation should be off.

Pure functions over measured pass costs; nothing here runs a model. The cost model is the one of
specdec.core.speedup (a round is γ draft passes plus one target pass over γ + 1 tokens per row, compared with one
plain step) with measured batch costs, for a loop where every row keeps its own kept count (the ragged loop,
specdec.loop.batched under its ragged commit rule):

    batch_speedup(B, γ) = E[tokens per round](α, γ) · target(B) / (γ · draft(B) + target(B · (γ + 1)))

E[tokens per round] is the batch-1 Leviathan expectation (`core.speedup.tokens_per_row`), since a ragged row
advances by its own kept count + 1; target(n) is the measured cost of one target pass scoring n tokens (B rows × k
tokens each) and draft(B) one draft pass over B rows. For the lockstep loop a row advances by the batch's smallest
accepted count + 1 instead, 1 + Σ_{k=1..γ} α^(kB) for i.i.d. acceptances (`core.speedup.lockstep_tokens_per_row`).

`gamma_for_batch` picks the γ with the highest predicted speedup; when even that is below `min_speedup`, it returns
0: speculation off, a plain batched step. `gamma_table` does so for every B up to a limit and `off_from` names the
batch size from which speculation stays off.

Measured passes are noisy (a few % on a shared CPU), and a table read straight through them can zig-zag (γ 4, 2, 1,
3, ... as B grows). `BatchCosts.fitted` replaces each cost by its least-squares line (a fixed part plus a part per
token or row, neither negative): the model the bench states, and a table that only shortens the draft as B grows.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from specdec.core.speedup import speedup_from_costs, tokens_per_row


def _interp(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear through sorted (x, y) points; past either end, the nearest segment's line (one point: flat).
    Never below zero."""
    if not points:
        raise ValueError("no measured points to read a cost from")
    if len(points) == 1:
        return max(points[0][1], 0.0)
    xs = [p[0] for p in points]
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0) if x1 != x0 else y1
    return max(y, 0.0)


def _points(pairs: Iterable[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """Sorted (x, y) points, repeated x merged by their mean, None ys dropped."""
    by_x: dict[float, list[float]] = {}
    for x, y in pairs:
        if x is not None and y is not None:
            by_x.setdefault(float(x), []).append(float(y))
    return tuple((x, sum(ys) / len(ys)) for x, ys in sorted(by_x.items()))


def line_fit(xs, ys) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line through the points with both kept >= 0 (scipy's nnls): a pass
    costs a fixed part plus a part per token, neither negative. Timing noise could otherwise fit a negative
    intercept (absurd predictions at small B) or a falling cost. One distinct x gives a flat line at the mean."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if x is not None and y is not None]
    if not pts:
        return None
    if len({x for x, _ in pts}) == 1:
        return float(np.mean([y for _, y in pts])), 0.0
    a = np.array([[1.0, x] for x, _ in pts])
    from scipy.optimize import nnls  # here, not at import: scipy costs the app's start

    (intercept, slope), _ = nnls(a, np.array([y for _, y in pts]))
    return float(intercept), float(slope)


def _on_line(points: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    fit = line_fit([x for x, _ in points], [y for _, y in points])
    return points if fit is None else tuple((x, fit[0] + fit[1] * x) for x, _ in points)


@dataclass(frozen=True)
class BatchCosts:
    """Measured ms per pass on one machine: `target` maps tokens scored in one target pass (rows × tokens per row)
    to ms, `draft` maps rows in one draft pass to ms; both read piecewise-linearly between the measured points."""

    target: tuple[tuple[float, float], ...]
    draft: tuple[tuple[float, float], ...]

    @classmethod
    def from_points(cls, target: Iterable[tuple[float, float]], draft: Iterable[tuple[float, float]]) -> BatchCosts:
        return cls(_points(target), _points(draft))

    def fitted(self) -> BatchCosts:
        """The same measured xs, each cost moved onto its least-squares line (`line_fit`)."""
        return BatchCosts(_on_line(self.target), _on_line(self.draft))

    def target_ms(self, tokens: float) -> float:
        return _interp(self.target, tokens)

    def draft_ms(self, rows: float) -> float:
        return _interp(self.draft, rows)

    def to_dict(self) -> dict:
        return {"target": [list(p) for p in self.target], "draft": [list(p) for p in self.draft]}


def batch_speedup(batch: int, alpha: float, gamma: int, costs: BatchCosts, kind: str = "ragged") -> float:
    """Speculative over plain batched tok/s at B rows with γ guesses per row (γ = 0 is the plain step: 1)."""
    if gamma <= 0:
        return 1.0
    return speedup_from_costs(tokens_per_row(alpha, gamma, batch, kind), gamma, costs.draft_ms(batch),
                              costs.target_ms(batch * (gamma + 1)), costs.target_ms(batch))


def gamma_for_batch(batch: int, alpha: float, costs: BatchCosts, gamma_max: int = 8, min_speedup: float = 1.0,
                    kind: str = "ragged") -> tuple[int, float]:
    """(γ, its predicted speedup) for B rows: the γ in 1..gamma_max with the highest prediction, or (0, 1.0) --
    speculation off -- when that prediction is below min_speedup."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    best = max(range(1, max(1, gamma_max) + 1), key=lambda g: batch_speedup(batch, alpha, g, costs, kind))
    s = batch_speedup(batch, alpha, best, costs, kind)
    return (best, s) if s >= min_speedup else (0, 1.0)


def gamma_table(alpha: float, costs: BatchCosts, up_to: int = 16, gamma_max: int = 8, min_speedup: float = 1.0,
                kind: str = "ragged") -> dict[int, int]:
    """{B: γ} for B = 1..up_to (γ = 0: speculation off at that batch size)."""
    return {b: gamma_for_batch(b, alpha, costs, gamma_max, min_speedup, kind)[0] for b in range(1, up_to + 1)}


def off_from(table: dict[int, int]) -> int | None:
    """The smallest B from which γ is 0 at every larger tabulated B; None when speculation is on at the largest."""
    out = None
    for b in sorted(table, reverse=True):
        if table[b] != 0:
            break
        out = b
    return out


def schedule_fn(table: dict[int, int], fallback: int) -> Callable[[int], int]:
    """γ for a number of active rows: the table's entry, the largest tabulated B below it past the table's end,
    `fallback` for an empty table."""
    if not table:
        return lambda rows: fallback
    keys = sorted(table)

    def gamma(rows: int) -> int:
        if rows in table:
            return table[rows]
        below = [b for b in keys if b <= rows]
        return table[below[-1]] if below else table[keys[0]]

    return gamma
