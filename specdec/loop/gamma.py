"""Gamma policies: how many guesses the next round asks for, as small objects the decoder asks and tells.

Each policy has `gamma` (what the next round asks for) and `observe(round)` (told what a round did). The names are
`settings.GAMMA_POLICIES`; `make_policy` builds the one a run's settings name.

- fixed: gamma every round.
- confidence: gamma every round; the drafter itself ends a draft after a guess it is unsure of.
- heuristic: +2 after a round that kept every guess it drafted, -1 otherwise; a round that drafted nothing
  (a copying drafter without a match) says nothing about acceptance and leaves gamma as it is.
- expected: the gamma with the best predicted speedup for decayed running estimates of alpha and c_loop; for the
  copying drafters that choose their own copy length by expected gain (drafters.GAIN_DRAFTERS, drafters/gain.py)
  it asks for MAX_GAMMA and the drafter cuts each copy.
- `Scheduled`: forced gammas (a trace's), then the wrapped policy.
"""

from __future__ import annotations

from specdec.core.events import Round
from specdec.core.metrics import loop_cost_ratio
from specdec.core.speedup import leviathan_speedup
from specdec.core.settings import MAX_GAMMA, DecodeSettings
from specdec.drafters import GAIN_DRAFTERS


class FixedGamma:
    def __init__(self, gamma: int):
        self.gamma = gamma

    def observe(self, rnd: Round) -> None:
        pass


class HeuristicGamma(FixedGamma):
    def observe(self, rnd: Round) -> None:
        if rnd.gamma == 0:
            return
        self.gamma = min(MAX_GAMMA, self.gamma + 2) if rnd.n_accepted == rnd.gamma else max(1, self.gamma - 1)


class ExpectedGamma(FixedGamma):
    """Decayed per-token acceptance counts and draft/target cost ratio (priors: alpha 0.7, c 0.5, worth a few
    rounds of evidence); each round asks for argmax_g leviathan_speedup(alpha, g, c)."""

    DECAY = 0.8  # recent rounds count most: acceptance shifts with the content being written

    def __init__(self, gamma: int):
        super().__init__(gamma)
        self.kept, self.tested, self.c = 2.8, 4.0, 0.5

    def observe(self, rnd: Round) -> None:
        self.kept = self.DECAY * self.kept + rnd.n_accepted
        self.tested = self.DECAY * self.tested + rnd.n_accepted + (rnd.rejected_at is not None)
        c_round = loop_cost_ratio(rnd.draft_ms, rnd.gamma, rnd.verify_ms, 1)
        if rnd.index > 0 and c_round is not None:  # round one also ran the prompt: its timing says little
            self.c = 0.7 * self.c + 0.3 * c_round
        alpha = min(0.99, max(0.01, self.kept / self.tested))
        self.gamma = max(range(1, MAX_GAMMA + 1), key=lambda g: leviathan_speedup(alpha, g, self.c))


class Scheduled:
    """The gammas of `schedule` round by round (e.g. a trace's, to reproduce a run whose policy followed
    wall-clock timings), then whatever the wrapped policy has come to; the policy observes every round."""

    def __init__(self, schedule: list[int], policy):
        self.schedule = list(schedule)
        self.policy = policy
        self.rounds = 0

    @property
    def gamma(self) -> int:
        return self.schedule[self.rounds] if self.rounds < len(self.schedule) else self.policy.gamma

    def observe(self, rnd: Round) -> None:
        self.rounds += 1
        self.policy.observe(rnd)


POLICIES = {"fixed": FixedGamma, "confidence": FixedGamma, "heuristic": HeuristicGamma, "expected": ExpectedGamma}


def make_policy(settings: DecodeSettings, schedule: list[int] | None = None):
    if settings.gamma_policy == "expected" and settings.drafter in GAIN_DRAFTERS:
        policy = FixedGamma(MAX_GAMMA)  # the drafter picks each copy's length (drafters/gain.py)
    else:
        policy = POLICIES[settings.gamma_policy](settings.gamma)
    return policy if schedule is None else Scheduled(schedule, policy)
