"""The speedup model, in one place: a round's cost against the plain steps it replaces.

Every predicted speedup in the project is this one formula (`speedup_from_costs`):

    speedup = E[tokens a row commits per round] · plain_ms / (γ · draft_ms + verify_ms)

with plain_ms one plain decoding step, draft_ms one draft pass (per guess), verify_ms the target's pass over the
γ + 1 tokens per row that a round scores (Leviathan et al. 2022: a verify pass costing one target step, i.i.d.
acceptances). What differs between its callers is where the three costs come from and which expectation counts
the tokens:

- `leviathan_speedup(α, γ, c)`: costs in target steps (plain = verify = 1, draft = c). A run's predicted speedup
  (`run_predicted_speedup`, read by the playground, the CLI and the bench), the "expected" gamma policy and the
  lab's curves.
- the break-even map (`specdec.learn.breakeven.measured_curve_speedup`): the measured verify curve verify_ms(k)
  and each drafter's ms per guess.
- the batch schedule (`specdec.loop.schedule.batch_speedup`): measured passes over B rows, target(B),
  draft(B) and target(B(γ + 1)), with the ragged or the lockstep loop's tokens per row.
- the batch bench's prediction (`specdec.bench.batch.predict`): straight-line fits of its measured passes.

Tokens per round, per row: `expected_tokens_per_round(α, γ)` = (1 - α^(γ+1)) / (1 - α), the kept guesses plus the
repair or bonus token of one row (a ragged batch row keeps its own count, so the same); `lockstep_tokens_per_row`
= 1 + Σ_{k=1..γ} α^(kB), a lockstep batch, where every row commits the smallest accepted count of B rows plus one.
"""

from __future__ import annotations

from typing import Callable

BATCH_LOOPS = ("ragged", "lockstep")  # the batched loops `tokens_per_row` knows


def expected_tokens_per_round(alpha: float, gamma: float) -> float:
    """Expected tokens one row commits per round with gamma guesses at per-token acceptance alpha."""
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def lockstep_tokens_per_row(alpha: float, gamma: int, batch: int) -> float:
    """1 + E[the smallest kept count over B rows] for i.i.d. acceptances: 1 + Σ_{k=1..γ} α^(kB)."""
    return 1.0 + sum(alpha ** (k * batch) for k in range(1, gamma + 1))


def tokens_per_row(alpha: float, gamma: int, batch: int, loop: str = "ragged") -> float:
    """Expected tokens a row commits per round with γ guesses: its own kept count + 1 (ragged), or the batch's
    smallest accepted count + 1 (lockstep)."""
    if loop == "ragged":
        return expected_tokens_per_round(alpha, gamma)
    if loop == "lockstep":
        return lockstep_tokens_per_row(alpha, gamma, batch)
    raise ValueError(f"kind must be one of {BATCH_LOOPS}, got {loop!r}")


def speedup_from_costs(tokens_per_round: float, gamma: float, draft_ms: float, verify_ms: float,
                       plain_ms: float) -> float:
    """The one speedup formula: tokens per round × one plain step over one round (γ draft passes and a verify
    pass), in any unit shared by the three costs. A round that costs nothing is infinitely fast."""
    round_ms = gamma * draft_ms + verify_ms
    return tokens_per_round * plain_ms / round_ms if round_ms > 0 else float("inf")


def leviathan_speedup(alpha: float, gamma: float, c: float) -> float:
    """(1 - α^(γ+1)) / ((1 - α)(γc + 1)): costs in target steps, a draft pass costing c of one."""
    return speedup_from_costs(expected_tokens_per_round(alpha, gamma), gamma, c, 1.0, 1.0)


def run_predicted_speedup(alpha: float, mean_gamma: float, c_loop: float | None,
                          c_plain: float | None) -> float | None:
    """The one convention for a run's predicted speedup (`RunMetrics.predicted_speedup`, see core.metrics): the
    Leviathan model at the run's per-token alpha and mean draft length, with c = c_loop when the rounds carry
    timings, else c_plain; None without any cost ratio or without drafting."""
    c = c_loop if c_loop is not None else c_plain
    if c is None or mean_gamma <= 0:
        return None
    return leviathan_speedup(alpha, mean_gamma, c)


def solve_break_even(speedup_at: Callable[[float], float]) -> float | None:
    """The per-token acceptance at which a speedup that rises with alpha only ties plain decoding (= 1), by
    bisection: 0.0 when even alpha = 0 wins, None when even alpha = 1 loses."""
    if speedup_at(1.0) <= 1.0:
        return None
    if speedup_at(0.0) >= 1.0:
        return 0.0
    lo, hi = 0.0, 1.0
    for _ in range(50):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup_at(mid) < 1.0 else (lo, mid)
    return hi


def leviathan_break_even(gamma: float, c: float) -> float | None:
    """The alpha at which gamma guesses at cost ratio c only tie plain decoding (`leviathan_speedup` = 1); None
    when even alpha = 1 loses ((gamma + 1) / (gamma c + 1) <= 1) or nothing is drafted."""
    if gamma <= 0:
        return None
    return solve_break_even(lambda a: leviathan_speedup(a, gamma, c))
