"""Copy length by expected gain: how many of a copy's tokens to verify this round, from what this run has measured.

A copying drafter (ngram, suffix) finds a candidate of up to gamma tokens; verifying g of them costs one target
pass g positions wider, and yields the kept prefix plus one repaired or bonus token. With a_i the chance that guess
i is kept once every guess before it was, a round of g guesses yields on average

    E(g) = 1 + sum_{k<g} prod_{i<=k} a_i   tokens, for   T(g) = T_0 + w g   ms,

and `choose` takes the g (at least 1, at most the candidate) with the most tokens per ms, E(g) / T(g) -- the
`expected` gamma policy's reasoning, applied to one-hot proposals, whose draft costs nothing and whose acceptance
depends on the copy (how long the match was, how far into the copy a guess is) rather than on one alpha.

- a_i: kept / tested over this run's copied guesses, per match-length bucket and position bucket (MATCH_BUCKETS,
  POS_BUCKETS), decayed by DECAY a round and started from PRIOR_ALPHA (worth PRIOR_WEIGHT guesses);
- w / T_0 (`width_cost`): the rounds' own wall time regressed on their width (rounds after the first, which also
  ran the prompt), decayed; until the widths seen spread enough it leans on PRIOR_WIDTH (a wider pass costs ~3 %
  of a step per token: ~2-4 ms on ~200 ms for the embedded pair on 2 CPU cores; on AMX CPUs width is nearly free,
  on others ~10 ms a token -- which is why it is measured, not fixed).

The choice follows wall-clock timings, so the same seed can give different lengths; the drafter records each
round's chosen length as the round's `asked`, and a replay copies exactly those (length rule "asked").
"""

from __future__ import annotations

from bisect import bisect_right

from specdec.core.events import KEPT, REJECTED

MATCH_BUCKETS = (1, 2, 3, 4, 8, 16)  # match lengths 1, 2, 3, 4-7, 8-15, 16+
POS_BUCKETS = (0, 1, 2, 3, 4, 8, 16)  # positions in the copy 0, 1, 2, 3, 4-7, 8-15, 16+
PRIOR_ALPHA = (0.45, 0.6, 0.7, 0.8, 0.85, 0.9)  # per match bucket, before this run has shown anything
PRIOR_WEIGHT = 2.0  # guesses' worth of evidence the prior counts for, per cell
PRIOR_WIDTH = 0.03  # w / T_0 until measured
DECAY = 0.95  # per round, for the acceptance counts
TIME_DECAY = 0.9  # per round, for the timing regression
SPREAD_WEIGHT = 32.0  # width variance x rounds at which the measured slope counts as much as the prior


def _bucket(edges: tuple[int, ...], x: int) -> int:
    return max(0, bisect_right(edges, x) - 1)


class CopyGain:
    """Learns a copy's acceptance (by match length and position) and the cost of width; picks each copy's length."""

    def __init__(self):
        self.kept = [[0.0] * len(POS_BUCKETS) for _ in MATCH_BUCKETS]
        self.tested = [[0.0] * len(POS_BUCKETS) for _ in MATCH_BUCKETS]
        self.timing = WidthCost()

    # -- what the run has shown ------------------------------------------------------------------------------
    def alpha(self, match_len: int, pos: int) -> float:
        b, p = _bucket(MATCH_BUCKETS, match_len), _bucket(POS_BUCKETS, pos)
        return (self.kept[b][p] + PRIOR_WEIGHT * PRIOR_ALPHA[b]) / (self.tested[b][p] + PRIOR_WEIGHT)

    def width_cost(self) -> float:
        """w / T_0: the extra ms of one more verified guess over the ms of a round that verifies none."""
        return self.timing.per_token()

    def expected(self, match_len: int, g: int) -> float:
        """E(g): tokens a round of the first g guesses of a copy after a match_len-token match yields on average."""
        out, run = 1.0, 1.0
        for i in range(g):
            run *= self.alpha(match_len, i)
            out += run
        return out

    def choose(self, match_len: int, n: int) -> int:
        """The length in 1..n with the most expected tokens per unit of round time."""
        rho = self.width_cost()
        best, best_rate, tokens, run = 1, -1.0, 1.0, 1.0
        for g in range(1, n + 1):
            run *= self.alpha(match_len, g - 1)
            tokens += run
            rate = tokens / (1 + rho * g)
            if rate > best_rate:
                best, best_rate = g, rate
        return best

    # -- learning --------------------------------------------------------------------------------------------
    def observe(self, rnd) -> None:
        """One finished Round: its copied guesses' fates (by the note's match length) and its time by width."""
        note = rnd.note
        if rnd.gamma and note is not None and note.one_hot and note.match_len:
            for row in self.kept + self.tested:
                for j in range(len(row)):
                    row[j] *= DECAY
            b = _bucket(MATCH_BUCKETS, note.match_len)
            for i, fate in enumerate(rnd.fates):
                if fate not in (KEPT, REJECTED):
                    break  # discarded or cut: never tested within the text
                p = _bucket(POS_BUCKETS, i)
                self.tested[b][p] += 1
                self.kept[b][p] += fate == KEPT
                if fate == REJECTED:
                    break
        self.timing.observe(rnd, rnd.gamma)


def round_ms(rnd) -> float:
    """A finished round's wall time (draft + verify where the whole round was not clocked)."""
    return rnd.round_ms or (rnd.draft_ms + rnd.verify_ms)


class WidthCost:
    """w / T_0 learned from a run's own rounds: their wall time regressed on how many positions they verified
    (decayed by TIME_DECAY a round; leaning on PRIOR_WIDTH until the widths seen spread enough). Copy lengths
    (`CopyGain`) and dynamic tree budgets (`drafters.tree.TreeBudget`) both read it."""

    def __init__(self):
        self._t = [0.0] * 5  # decayed sums: weight, x, y, x^2, x*y (x = width, y = round ms)

    def per_token(self) -> float:
        sw, sx, sy, sxx, sxy = self._t
        if sw <= 0:
            return PRIOR_WIDTH
        mx, my = sx / sw, sy / sw
        var = max(0.0, sxx / sw - mx * mx)
        if var <= 1e-9 or my <= 0:
            return PRIOR_WIDTH
        slope = max(0.0, (sxy / sw - mx * my) / var)
        base = max(my - slope * mx, 0.1 * my)
        weight = sw * var / (sw * var + SPREAD_WEIGHT)
        return min(1.0, weight * slope / base + (1 - weight) * PRIOR_WIDTH)

    def observe(self, rnd, width: int) -> None:
        """One finished Round that verified `width` positions besides the bonus; round one also ran the prompt and
        is left out."""
        ms = round_ms(rnd)
        if rnd.index > 0 and ms > 0:
            x = float(width)
            self._t = [TIME_DECAY * v for v in self._t]
            for j, v in enumerate((1.0, x, ms, x * x, x * ms)):
                self._t[j] += v
