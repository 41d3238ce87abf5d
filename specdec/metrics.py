"""Metrics over a run's rounds, and the Leviathan et al. speedup model they are compared with.

Conventions (stated because projects differ):
- acceptance rate = accepted draft tokens / drafted tokens (llama.cpp "accept %", vLLM "draft acceptance rate").
- tokens per round = committed tokens / rounds; it COUNTS the repaired or bonus token, so it lies in [1, gamma+1]
  (vLLM "mean acceptance length").
- per-position acceptance[i] = P(draft token i was kept) over rounds that drafted position i.
- alpha = per-token acceptance probability, estimated as accepted / verified positions, where a round verifies its
  kept prefix plus the first rejected guess (guesses after a rejection are never tested). This, not
  accepted / drafted, is the alpha in the Leviathan formula: with gamma = 4 and alpha = 0.63, accepted / drafted is
  only (a + a^2 + a^3 + a^4) / 4 = 0.36.
- measured speedup = speculative tok/s / plain target tok/s on the same machine and settings.
- predicted speedup = (1 - a^(g+1)) / ((1 - a)(g c + 1)) with a = the alpha above, c = draft step cost /
  target step cost (Leviathan et al. 2022, assuming i.i.d. acceptances and a verify pass costing one target step).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .events import Round


def expected_tokens_per_round(alpha: float, gamma: int) -> float:
    if alpha >= 1.0:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, gamma: int, c: float) -> float:
    return expected_tokens_per_round(alpha, gamma) / (gamma * c + 1)


def alpha_estimate(accepted: int, rejections: int) -> float:
    """Per-token acceptance probability from counts: kept guesses / guesses actually tested."""
    tested = accepted + rejections
    return accepted / tested if tested else 0.0


@dataclass
class RunMetrics:
    rounds: int
    generated: int
    drafted: int
    accepted: int
    acceptance_rate: float  # accepted / drafted
    alpha: float  # per-token acceptance probability (see module docstring)
    tokens_per_round: float  # counts the repaired/bonus token
    per_position_acceptance: list[float]
    accepted_histogram: list[int]  # rounds that kept exactly k draft tokens, k = 0..max gamma
    tok_s: float
    mean_gamma: float
    baseline_tok_s: float | None = None
    speedup: float | None = None
    c: float | None = None
    predicted_speedup: float | None = None
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(
    rounds: list[Round],
    baseline_ms_per_token: float | None = None,
    draft_ms_per_token: float | None = None,
) -> RunMetrics:
    """Aggregate rounds; pass the plain target (and draft) per-token cost to get measured and predicted speedup."""
    if not rounds:
        return RunMetrics(0, 0, 0, 0, 0.0, 0.0, 0.0, [], [], 0.0, 0.0)
    g_max = max(r.gamma for r in rounds)
    drafted = sum(r.gamma for r in rounds)
    accepted = sum(r.n_accepted for r in rounds)
    generated = sum(len(r.committed_ids) for r in rounds)
    hist = [0] * (g_max + 1)
    for r in rounds:
        hist[r.n_accepted] += 1
    per_pos = []
    for i in range(g_max):
        tried = [r for r in rounds if r.gamma > i]
        per_pos.append(sum(r.n_accepted > i for r in tried) / len(tried))
    elapsed_ms = sum(r.round_ms or (r.draft_ms + r.verify_ms) for r in rounds)
    tok_s = 1e3 * generated / elapsed_ms if elapsed_ms else 0.0
    alpha = alpha_estimate(accepted, sum(r.rejected_at is not None for r in rounds))
    mean_gamma = drafted / len(rounds)
    m = RunMetrics(
        rounds=len(rounds),
        generated=generated,
        drafted=drafted,
        accepted=accepted,
        acceptance_rate=accepted / drafted,
        alpha=alpha,
        tokens_per_round=generated / len(rounds),
        per_position_acceptance=per_pos,
        accepted_histogram=hist,
        tok_s=tok_s,
        mean_gamma=mean_gamma,
    )
    if baseline_ms_per_token:
        m.baseline_tok_s = 1e3 / baseline_ms_per_token
        m.speedup = tok_s / m.baseline_tok_s
        if draft_ms_per_token:
            m.c = draft_ms_per_token / baseline_ms_per_token
            m.predicted_speedup = predicted_speedup(alpha, round(mean_gamma), m.c)
    return m


def running_speedup(rounds: list[Round], baseline_ms_per_token: float) -> list[float]:
    """Cumulative measured speedup after each round: plain time for the same tokens / speculative time so far."""
    out, toks, ms = [], 0, 0.0
    for r in rounds:
        toks += len(r.committed_ids)
        ms += r.round_ms or (r.draft_ms + r.verify_ms)
        out.append(toks * baseline_ms_per_token / ms if ms else 0.0)
    return out
