"""Metrics over a run's rounds, beside the speedup model's prediction for them (specdec.core.speedup).

Conventions (stated because projects differ), every one computed here and nowhere else:
- statistics count what was tested and committed: a guess the rule accepted past a committed EOS (or the token
  budget) is not kept (see `Round.fates` and the glossary in specdec.core.events). Inside the engine the counts are
  named "kept"; the JSON a run writes (`RunMetrics.to_dict`) keeps the names readers of vLLM and llama.cpp
  expect (`JSON_NAMES`).
- kept rate = kept draft tokens / drafted tokens (JSON "acceptance_rate"; llama.cpp "accept %", vLLM "draft
  acceptance rate").
- tokens per round = committed tokens / rounds; it COUNTS the repaired or bonus token, so it lies in [1, gamma+1]
  (vLLM "mean acceptance length").
- kept per position[i] = P(draft token i was kept) over rounds whose position i was tested or discarded.
- alpha = per-token acceptance probability, estimated as kept / tested guesses, where a round tests its kept
  prefix plus the first rejected guess (guesses after a rejection are never tested). This, not kept / drafted,
  is the alpha in the Leviathan formula: with gamma = 4 and alpha = 0.63, kept / drafted is only 0.36.
- two cost ratios, two names:
  * c_plain = draft ms per token / target ms per token in plain decoding, measured once when the pair loads
    (`StepCosts`): a property of the pair on this machine.
  * c_loop = draft ms per drafted guess / verify ms per round, from the rounds' own timings: the ratio the loop
    actually paid (verification of gamma+1 tokens can cost more than one plain step, e.g. in fp32 on a CPU).
- measured speedup = speculative tok/s / plain target tok/s (plain cost from `StepCosts`, or a plain lane run
  side by side in a race).
- predicted speedup = (1 - a^(g+1)) / ((1 - a)(g c + 1)) (Leviathan et al. 2022, i.i.d. acceptances, a verify pass
  costing one target step) with a = alpha above, g = the mean draft length of the run (gamma varies under the
  adaptive policies), c = c_loop when the rounds carry timings, else c_plain. App, CLI and bench all call
  `run_predicted_speedup` for it; the formula and every other speedup model live in specdec.core.speedup.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from specdec.core.events import CUT, KEPT, Round
from specdec.core.speedup import leviathan_break_even, run_predicted_speedup


def alpha_estimate(kept: int, tested: int) -> float:
    """Per-token acceptance probability from counts: kept guesses / guesses actually tested."""
    return kept / tested if tested else 0.0


def loop_cost_ratio(draft_ms: float, drafted: int, verify_ms: float, rounds: int) -> float | None:
    """c_loop: draft ms per drafted guess over verify ms per round (None when there is nothing to divide)."""
    if drafted <= 0 or rounds <= 0 or verify_ms <= 0:
        return None
    return (draft_ms / drafted) / (verify_ms / rounds)


def rounds_cost_ratio(rounds: list[Round]) -> float | None:
    """c_loop over a run's rounds."""
    return loop_cost_ratio(sum(r.draft_ms for r in rounds), sum(r.gamma for r in rounds),
                           sum(r.verify_ms for r in rounds), len(rounds))


@dataclass(frozen=True)
class StepCosts:
    """Median per-token cost of plain decoding with each model on this machine, measured when the pair loads."""

    target_ms: float
    draft_ms: float

    @property
    def c_plain(self) -> float:
        return self.draft_ms / self.target_ms if self.target_ms else 0.0


@dataclass
class RunMetrics:
    rounds: int
    generated: int
    drafted: int
    kept: int  # guesses accepted AND committed
    tested: int
    kept_rate: float  # kept / drafted
    alpha: float  # per-token acceptance probability (see module docstring)
    tokens_per_round: float  # counts the repaired/bonus token
    kept_per_position: list[float]
    kept_histogram: list[int]  # rounds that kept exactly k draft tokens, k = 0..max gamma
    tok_s: float
    mean_gamma: float
    c_loop: float | None = None
    c_plain: float | None = None
    baseline_tok_s: float | None = None  # plain target decoding of the same tokens (its prompt pass included if timed)
    speedup: float | None = None
    predicted_speedup: float | None = None
    baseline_step_ms: float | None = None  # the plain step cost under the measured speedup
    baseline_prompt_ms: float | None = None  # ... and its prompt pass, where timed in the run
    extra: dict = field(default_factory=dict)

    # The JSON names of the kept counts, as vLLM and llama.cpp readers know them (traces, the CLI's --json).
    JSON_NAMES = {"kept": "accepted", "kept_rate": "acceptance_rate", "kept_per_position": "per_position_acceptance",
                  "kept_histogram": "accepted_histogram"}

    def to_dict(self) -> dict:
        """The JSON-ready metrics, the kept counts under their JSON names (`JSON_NAMES`)."""
        return {self.JSON_NAMES.get(k, k): v for k, v in asdict(self).items()}


def plain_ms_for(tokens: int, step_ms: float, prompt_ms: float | None = None) -> float:
    """What plain target decoding pays for its first `tokens` tokens: one step each, where the first step runs the
    prompt and costs `prompt_ms` when that pass was timed (SpeculativeDecoder(plain_probe=True)); without it every
    token costs `step_ms` (a race lane's mean already holds its prompt pass; a load-time cost holds none)."""
    if tokens <= 0:
        return 0.0
    return (prompt_ms + (tokens - 1) * step_ms) if prompt_ms else tokens * step_ms


def summarize(rounds: list[Round], costs: StepCosts | None = None, baseline_ms_per_token: float | None = None,
              baseline_prompt_ms: float | None = None) -> RunMetrics:
    """Aggregate rounds. The plain target cost for the measured speedup comes from `baseline_ms_per_token` (e.g. a
    plain lane run side by side) or else from `costs` (measured at load); `baseline_prompt_ms`, where timed, is plain
    decoding's first step (the prompt pass), so both sides of the speedup pay the prompt (plain_ms_for)."""
    if not rounds:
        return RunMetrics(0, 0, 0, 0, 0, 0.0, 0.0, 0.0, [], [], 0.0, 0.0)
    fates = [r.fates for r in rounds]
    g_max = max(r.gamma for r in rounds)
    drafted = sum(r.gamma for r in rounds)
    kept = sum(r.kept for r in rounds)
    tested = sum(r.tested for r in rounds)
    generated = sum(len(r.committed_ids) for r in rounds)
    hist = [0] * (g_max + 1)
    for r in rounds:
        hist[r.kept] += 1
    per_pos = []
    for i in range(g_max):
        seen = [f[i] for f in fates if len(f) > i and f[i] != CUT]
        per_pos.append(sum(x == KEPT for x in seen) / len(seen) if seen else 0.0)
    elapsed_ms = sum(r.round_ms or (r.draft_ms + r.verify_ms) for r in rounds)
    tok_s = 1e3 * generated / elapsed_ms if elapsed_ms else 0.0
    alpha = alpha_estimate(kept, tested)
    mean_gamma = drafted / len(rounds)
    c_loop = rounds_cost_ratio(rounds)
    c_plain = costs.c_plain if costs and costs.target_ms and costs.draft_ms else None
    base_ms = baseline_ms_per_token or (costs.target_ms if costs else None)
    plain_ms = plain_ms_for(generated, base_ms, baseline_prompt_ms if baseline_ms_per_token else None) if base_ms else 0
    baseline_tok_s = 1e3 * generated / plain_ms if plain_ms else None
    return RunMetrics(
        rounds=len(rounds),
        generated=generated,
        drafted=drafted,
        kept=kept,
        tested=tested,
        kept_rate=kept / drafted if drafted else 0.0,
        alpha=alpha,
        tokens_per_round=generated / len(rounds),
        kept_per_position=per_pos,
        kept_histogram=hist,
        tok_s=tok_s,
        mean_gamma=mean_gamma,
        c_loop=c_loop,
        c_plain=c_plain,
        baseline_tok_s=baseline_tok_s,
        speedup=tok_s / baseline_tok_s if baseline_tok_s else None,
        predicted_speedup=run_predicted_speedup(alpha, mean_gamma, c_loop, c_plain),
        baseline_step_ms=base_ms,
        baseline_prompt_ms=baseline_prompt_ms if baseline_ms_per_token else None,
    )


def running_speedup(rounds: list[Round], baseline_ms_per_token: float,
                    baseline_prompt_ms: float | None = None) -> list[float]:
    """Cumulative measured speedup after each round: plain time for the same tokens / speculative time so far."""
    out, toks, ms = [], 0, 0.0
    for r in rounds:
        toks += len(r.committed_ids)
        ms += r.round_ms or (r.draft_ms + r.verify_ms)
        out.append(plain_ms_for(toks, baseline_ms_per_token, baseline_prompt_ms) / ms if ms else 0.0)
    return out


PHASES = ("draft", "verify", "rule", "cache", "display", "other")  # where a round's milliseconds go


@dataclass(frozen=True)
class PhaseTimes:
    """A round's (or a run's) wall time split by phase, in ms: the drafter, the target's scoring pass, the rule,
    rolling the caches back, building the display event, and whatever else the round spent (the rest)."""

    draft: float = 0.0
    verify: float = 0.0
    rule: float = 0.0
    cache: float = 0.0
    display: float = 0.0
    other: float = 0.0

    @classmethod
    def of(cls, r: Round) -> "PhaseTimes":
        named = r.draft_ms + r.verify_ms + r.rule_ms + r.cache_ms + r.display_ms
        return cls(r.draft_ms, r.verify_ms, r.rule_ms, r.cache_ms, r.display_ms, max(0.0, r.round_ms - named))

    @property
    def total(self) -> float:
        return sum(getattr(self, k) for k in PHASES)

    def __add__(self, other: "PhaseTimes") -> "PhaseTimes":
        return PhaseTimes(*(getattr(self, k) + getattr(other, k) for k in PHASES))


@dataclass
class TimeBreakdown:
    rounds: list[PhaseTimes]
    total: PhaseTimes
    plain_ms: list[float] | None  # per round: what plain decoding would have paid for the same tokens
    reading: str  # one line: the cost ratio, the acceptance, and the break-even acceptance

    def to_dict(self) -> dict:
        return asdict(self)


def time_breakdown(rounds: list[Round], costs: StepCosts | None = None,
                   baseline_ms_per_token: float | None = None, baseline_prompt_ms: float | None = None) -> TimeBreakdown:
    """Where a run's milliseconds went, round by round, beside the plain steps it competes with."""
    per = [PhaseTimes.of(r) for r in rounds]
    total = sum(per, PhaseTimes())
    base = baseline_ms_per_token or (costs.target_ms if costs and costs.target_ms else None)
    prompt = baseline_prompt_ms if baseline_ms_per_token else None
    plain, toks = ([], 0) if base else (None, 0)
    for r in rounds if base else ():
        plain.append(plain_ms_for(toks + len(r.committed_ids), base, prompt) - plain_ms_for(toks, base, prompt))
        toks += len(r.committed_ids)
    return TimeBreakdown(per, total, plain, _reading(rounds, costs, total, plain))


def _reading(rounds: list[Round], costs: StepCosts | None, total: PhaseTimes, plain: list[float] | None) -> str:
    if not rounds:
        return "no rounds yet"
    m = summarize(rounds, costs)
    c = m.c_loop if m.c_loop is not None else m.c_plain
    if c is None or m.mean_gamma <= 0:
        return f"{100 * m.alpha:.0f} % of guesses survive; no draft cost measured (nothing was drafted)"
    need = leviathan_break_even(m.mean_gamma, c)
    head = (f"the draft costs {c:.2f} of a target step per guess and {100 * m.alpha:.0f} % of guesses survive: ")
    if need is None:
        verdict = f"at γ {m.mean_gamma:.1f} no acceptance can break even"
    else:
        side = "above" if m.alpha >= need else "below"
        verdict = f"break-even needs {100 * need:.0f} % at γ {m.mean_gamma:.1f}, so this run is {side} it"
    if plain:
        spent, would = total.total, sum(plain)
        verdict += f" ({spent / 1e3:.2f} s spent vs {would / 1e3:.2f} s of plain steps for the same tokens)"
    return head + verdict
