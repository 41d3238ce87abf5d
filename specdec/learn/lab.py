"""Math and sampling behind the Learn tab: the 100-point picture, the exactness lab and the real-model check.

Nothing here re-implements the acceptance rule. Every sampled round goes through `specdec.core.verify.verify_batch`,
looked up on the module at call time (so a test that monkeypatches a broken verifier or residual into
`specdec.core.verify` sees the lab fail), and wrong repairs are plugged in through its `repair=` argument.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from specdec.core import verify as verify_mod
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.loop.decoder import SpeculativeDecoder
from specdec.drafters.head import resolve_draft_vocab
from specdec.drafters import DraftModelDrafter
from specdec.core.errors import InvalidInputError, whole_number
from specdec.core.record import RunRecord
from specdec.core.kvcache import CachedLM
from specdec.core.speedup import leviathan_speedup
from specdec.core.sampling import SamplingConfig, warp

MIN_TOKENS, MAX_TOKENS = 3, 6
MAX_LAB_ROUNDS = 100_000
LEVEL = 1e-3  # the significance level of every exactness verdict (lab, bug zoo, the Learn tab)
DEFAULT_TOKENS = ("cat", "dog", "owl")
DEFAULT_P = (50.0, 30.0, 20.0)
DEFAULT_Q = (60.0, 10.0, 30.0)
# verify_batch materializes a few [rows, V] tensors; this bounds each call to ~16 MB per tensor.
MAX_CELLS_PER_CALL = 1 << 22


class LabInputError(InvalidInputError):
    """Numbers the learner typed that cannot form a distribution; the message is shown as is."""


# ------------------------------------------------------------------------------------------ distributions


def parse_distribution(values: Sequence, name: str) -> tuple[np.ndarray, str | None]:
    """Turn typed numbers (points or probabilities) into a distribution; (probs, note if it was rescaled).

    Empty, non-numeric, NaN, infinite or negative entries and an all-zero row are refused with a message
    that says which entry is wrong, since the learner fixes them by hand.
    """
    if values is None or len(values) == 0:
        raise LabInputError(f"{name} is empty: enter one number per token")
    out = []
    for i, v in enumerate(values, 1):
        if v is None or (isinstance(v, str) and not v.strip()):
            raise LabInputError(f"{name}: entry {i} is empty; enter a number (0 is allowed)")
        try:
            x = float(v)
        except (TypeError, ValueError):
            raise LabInputError(f"{name}: entry {i} ({v!r}) is not a number") from None
        if math.isnan(x) or math.isinf(x):
            raise LabInputError(f"{name}: entry {i} is {x}; enter a finite number")
        if x < 0:
            raise LabInputError(f"{name}: entry {i} is negative ({x:g}); chances cannot be below 0")
        out.append(x)
    arr = np.asarray(out, dtype=np.float64)
    total = arr.sum()
    if total <= 0:
        raise LabInputError(f"{name} adds up to 0; give at least one token some points")
    note = None
    if abs(total - 100.0) > 1e-6 and abs(total - 1.0) > 1e-9:
        note = f"{name} added up to {total:g}, not 100; it was rescaled to 100 points"
    return arr / total, note


def parse_tokens(names: Sequence) -> list[str]:
    """Token labels for the editor: blanks become tok1, tok2, ...; duplicates are refused (bars would merge)."""
    labels = [(str(n).strip() if n is not None else "") or f"tok{i}" for i, n in enumerate(names, 1)]
    seen = set()
    for lab in labels:
        if lab in seen:
            raise LabInputError(f"the token '{lab}' appears twice; give each token a different name")
        seen.add(lab)
    return labels


@dataclass
class HundredPoints:
    """One position of the rule in points out of 100 (all arrays are probabilities; multiply by 100 to show)."""

    tokens: list[str]
    p: np.ndarray
    q: np.ndarray
    kept: np.ndarray  # min(p, q): mass the check keeps from the draft's guesses
    residual: np.ndarray  # max(0, p - q): mass the repair must add; sums to the gap
    final: np.ndarray  # kept + residual, which equals p
    alpha: float  # sum of kept = chance the guess is accepted
    notes: list[str] = field(default_factory=list)

    @property
    def gap(self) -> float:
        return 1.0 - self.alpha

    @property
    def repair_dist(self) -> np.ndarray:
        """normalize(max(0, p - q)): what a repair draws from, given that it happens."""
        return self.residual / self.gap if self.gap > 1e-12 else self.p.copy()


def hundred_points(p, q, tokens: Sequence[str] | None = None) -> HundredPoints:
    """Kept, gap, repair and final parts for target p and draft q (points or probabilities, any scale)."""
    pn, note_p = parse_distribution(p, "Target p")
    qn, note_q = parse_distribution(q, "Draft q")
    if len(pn) != len(qn):
        raise LabInputError(f"p has {len(pn)} entries but q has {len(qn)}; give both the same tokens")
    toks = parse_tokens(tokens if tokens is not None else [f"tok{i}" for i in range(1, len(pn) + 1)])
    if len(toks) != len(pn):
        raise LabInputError(f"{len(toks)} token names for {len(pn)} probabilities")
    kept = np.minimum(pn, qn)
    residual = np.maximum(0.0, pn - qn)
    notes = [n for n in (note_p, note_q) if n]
    return HundredPoints(toks, pn, qn, kept, residual, kept + residual, float(kept.sum()), notes)


# ------------------------------------------------------------------------------------------- wrong repairs


def repair_fresh_from_p(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Wrong: after a rejection, draw a fresh token from the target. Tokens the draft already covered get extra."""
    return p


def repair_from_q(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Wrong: after a rejection, ask the draft again. The bonus row has q = 0, so it falls back to p there."""
    return torch.where(q.sum(-1, keepdim=True) > 0, q, p)


def _engine_residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    # Resolved per call, not bound at import, so monkeypatching specdec.core.verify.residual_distribution reaches here.
    return verify_mod.residual_distribution(p, q)


REPAIRS: dict[str, Callable | None] = {  # None: the engine's own residual
    "correct": None,
    "fresh-p": repair_fresh_from_p,
    "from-q": repair_from_q,
}


def resolve_repair(key_or_fn: str | Callable | None) -> Callable:
    if key_or_fn is None or callable(key_or_fn):
        return key_or_fn or _engine_residual
    if key_or_fn not in REPAIRS:
        raise LabInputError(f"unknown repair '{key_or_fn}'; choose one of {', '.join(REPAIRS)}")
    return REPAIRS[key_or_fn] or _engine_residual


# --------------------------------------------------------------------------------------------- sampling


def _as_prob_tensor(x) -> torch.Tensor:
    t = torch.as_tensor(np.asarray(x, dtype=np.float64) if not torch.is_tensor(x) else x).to(torch.float32)
    return t / t.sum()


def sample_first_tokens(
    p,
    q,
    n: int,
    generator: torch.Generator | None = None,
    repair: str | Callable | None = None,
    time_budget_s: float | None = None,
) -> torch.Tensor:
    """Token index emitted first by n independent one-guess rounds at one position: LongTensor [n].

    Each round drafts x ~ q and hands (x, q, p) to verify_batch, which keeps x or repairs (see sample_rounds).
    """
    pt, qt = _as_prob_tensor(p), _as_prob_tensor(q)
    if pt.shape != qt.shape or pt.dim() != 1:
        raise LabInputError("p and q must be 1-D over the same tokens")
    return sample_rounds(qt, qt, pt, n, generator, repair, time_budget_s)


def sample_rounds(drawn: torch.Tensor, q: torch.Tensor, p: torch.Tensor, n: int,
                  generator: torch.Generator | None = None, repair: str | Callable | None = None,
                  time_budget_s: float | None = None) -> torch.Tensor:
    """The first emitted token of n one-guess rounds: x ~ drawn, then verify_batch(x, q, p, repair).

    `drawn` is what the draft really samples from and `q` what the rule is told; they are the same distribution
    in a correct implementation, and the bug zoo passes them apart (and unnormalized) to reproduce a mistake.
    The bonus row is filled with p as a placeholder: the first emitted token never depends on it. Rounds run in
    batches sized so the [rows, V] tensors inside verify_batch stay small. With time_budget_s, batching stops once
    the budget is spent, so fewer than n rounds may come back (only matters for vocabulary-wide rows).
    """
    n = whole_number(n, "the number of rounds", 1, MAX_LAB_ROUNDS, LabInputError)
    rep = resolve_repair(repair)
    v = p.shape[0]
    rows = max(1, MAX_CELLS_PER_CALL // (2 * v))
    target_rows = torch.stack([p, p])  # [2, V]: the checked position, then the (unused) bonus position
    out = []
    t0 = time.perf_counter()
    for start in range(0, int(n), rows):
        if out and time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
            break
        b = min(rows, int(n) - start)
        x = torch.multinomial(drawn, b, replacement=True, generator=generator)  # the draft's guesses
        verdict = verify_mod.verify_batch(
            x[:, None], q.expand(b, 1, v), target_rows.expand(b, 2, v), generator, repair=rep
        )
        out.append(torch.where(verdict.n_accepted > 0, x, verdict.next_token))
    return torch.cat(out)


def counts(samples: torch.Tensor, v: int) -> np.ndarray:
    return torch.bincount(samples, minlength=v).numpy().astype(np.float64)


# ----------------------------------------------------------------------------------------- statistics


@dataclass
class ChiSquare:
    statistic: float
    p_value: float  # nan when there were too few samples to test
    dof: int
    n: int
    cells: int  # cells after pooling small ones
    note: str = ""

    @property
    def testable(self) -> bool:
        return not math.isnan(self.p_value)


def chi_square(observed, probs, min_expected: float = 5.0) -> ChiSquare:
    """Goodness of fit of observed counts to probs (scipy.stats.chisquare), with small cells handled.

    A draw on a token of probability 0 is impossible under probs, so the fit fails outright (p-value 0)
    instead of dividing by a zero expectation. Cells expected to hold fewer than min_expected draws are
    pooled into one cell (or into the smallest large cell if the pool is still small), the usual condition
    for the chi-square approximation to hold.
    """
    obs = np.asarray(observed, dtype=np.float64)
    pr = np.asarray(probs, dtype=np.float64)
    pr = pr / pr.sum()
    n = int(round(obs.sum()))
    if n <= 0:
        return ChiSquare(float("nan"), float("nan"), 0, 0, 0, "no samples")
    impossible = obs[pr <= 0].sum()
    if impossible > 0:
        return ChiSquare(
            float("inf"), 0.0, 0, n, len(pr),
            f"{int(impossible)} draw(s) landed on tokens the target gives probability 0",
        )
    if int((pr > 0).sum()) == 1:
        # Greedy-like target: one possible token, and (checked above) every draw landed on it.
        return ChiSquare(0.0, 1.0, 0, n, 1, "the target allows a single token and every draw matched it")
    exp = n * pr
    big = exp >= min_expected
    o_cells, e_cells = list(obs[big]), list(exp[big])
    small = np.flatnonzero(~big & (pr > 0))
    groups = 0
    if len(small):
        # Bins of consecutive small cells (most likely first), each expected to hold >= min_expected draws.
        # The bins depend on probs only, never on the counts, so the test stays valid.
        small = small[np.argsort(-pr[small], kind="stable")]
        o_acc = e_acc = 0.0
        for j in small:
            o_acc += obs[j]
            e_acc += exp[j]
            if e_acc >= min_expected:
                o_cells.append(o_acc)
                e_cells.append(e_acc)
                groups += 1
                o_acc = e_acc = 0.0
        if e_acc > 0:
            if e_cells:  # the leftover bin is too small: fold it into the smallest cell
                k = int(np.argmin(e_cells))
                o_cells[k] += o_acc
                e_cells[k] += e_acc
            else:
                o_cells.append(o_acc)
                e_cells.append(e_acc)
    note = f"{len(small)} rare token(s) pooled into {max(groups, 1)} cell(s)" if len(small) else ""
    if len(e_cells) < 2:
        return ChiSquare(float("nan"), float("nan"), 0, n, len(e_cells), "too few samples for a chi-square test")
    from scipy.stats import chisquare  # here, not at import: scipy.stats costs the app's start ~0.7 s

    stat, pv = chisquare(np.asarray(o_cells), np.asarray(e_cells))
    return ChiSquare(float(stat), float(pv), len(e_cells) - 1, n, len(e_cells), note)


def total_variation(a, b) -> float:
    """TV distance between two distributions (counts are normalized first)."""
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return 0.5 * float(np.abs(a / a.sum() - b / b.sum()).sum())


def format_p_value(pv: float) -> str:
    if math.isnan(pv):
        return "n/a"
    if pv == 0:
        return "0"
    return f"{pv:.4f}" if pv >= 1e-4 else f"{pv:.2e}"


@dataclass
class LabResult:
    tokens: list[str]
    p: np.ndarray
    q: np.ndarray
    counts: np.ndarray
    test: ChiSquare
    tv: float  # TV(empirical, p)
    repair: str
    n: int
    seconds: float

    @property
    def empirical(self) -> np.ndarray:
        return self.counts / self.counts.sum()


def run_lab(hp: HundredPoints, n: int, seed: int = 0, repair: str = "correct") -> LabResult:
    """Sample n rounds with the chosen repair and test the first emitted token against p."""
    gen = torch.Generator().manual_seed(int(seed))
    t0 = time.perf_counter()
    samples = sample_first_tokens(hp.p, hp.q, n, gen, repair)
    c = counts(samples, len(hp.p))
    secs = time.perf_counter() - t0
    return LabResult(hp.tokens, hp.p, hp.q, c, chi_square(c, hp.p), total_variation(c, hp.p), repair, int(n), secs)


# ---------------------------------------------------------------------------------------- real models


@dataclass
class FirstTokenLogits:
    """The raw next-token logits of both models at a prefix, as the engine's own code computes them."""

    prompt_ids: list[int]
    target: torch.Tensor  # [V] float32, cpu
    draft: torch.Tensor  # [V] float32, cpu; -inf outside the draft's reduced head (as the drafter sees it)


@torch.inference_mode()
def first_token_logits(pair, prefix: str, chat: bool = False) -> FirstTokenLogits:
    """Target and draft logits after the prefix through CachedLM and DraftModelDrafter's own cache (the engine's
    code, unchanged), before any warp: the one computation of the first-token rows (`first_token_rows` warps them;
    the bug zoo rebuilds each wrong construction from them)."""
    ids = encode_prompt(pair.tokenizer, prefix, chat)
    target = CachedLM(pair.target, pair.vocab_size).logits_after(ids)[-1]
    drafter = DraftModelDrafter(pair.draft, pair.vocab_size, head_vocab=resolve_draft_vocab(pair, None),
                                always_keep=pair.eos_token_ids)
    drafter.lm.keep_in_head(ids)  # as propose() does before its first step
    draft = drafter.lm.logits_after(ids)[-1]
    return FirstTokenLogits(ids, target.float().cpu(), draft.float().cpu())


@dataclass
class FirstTokenRows:
    """The warped target row p0 and draft row q0 at a prefix, computed by the engine's own code path."""

    prompt_ids: list[int]
    p0: torch.Tensor  # [V]
    q0: torch.Tensor  # [V]
    sampling: SamplingConfig


def first_token_rows(pair, prefix: str, sampling: SamplingConfig, chat: bool = False,
                     logits: FirstTokenLogits | None = None) -> FirstTokenRows:
    """p0 and q0 as one SpeculativeDecoder round computes them: the engine's warp of the raw rows of
    `first_token_logits` (or of `logits`, already computed at this prefix). The decoder's first round scores the
    prompt together with the guesses, so its numbers match these up to the arithmetic of batching."""
    cfg = sampling.validate()
    logits = logits or first_token_logits(pair, prefix, chat)
    return FirstTokenRows(logits.prompt_ids, warp(logits.target, cfg), warp(logits.draft, cfg), cfg)


@dataclass
class SupportDraws:
    support: torch.Tensor  # LongTensor [S]: vocabulary ids where p0 > 0 or q0 > 0
    counts: np.ndarray  # [S]
    n: int
    seconds: float
    capped_from: int | None = None



def sample_on_support(rows: FirstTokenRows, n: int, seed: int, repair=None,
                      time_budget_s: float = 8.0) -> SupportDraws:
    """N vectorized verify_batch rounds on the exact rows, restricted to tokens where p0 or q0 is positive.

    Dropping tokens with p = q = 0 changes nothing: the draft never proposes them, min and max(0, p - q) are
    0 there, and a zero-probability entry is never sampled. It turns a 151 936-wide row into a few dozen
    under top-k. Without top-k/top-p the support is the whole vocabulary and the time budget may cut N short.
    """
    support = torch.nonzero((rows.p0 > 0) | (rows.q0 > 0)).squeeze(-1)
    gen = torch.Generator().manual_seed(int(seed))
    t0 = time.perf_counter()
    s = sample_first_tokens(rows.p0[support], rows.q0[support], n, gen, repair, time_budget_s)
    secs = time.perf_counter() - t0
    m = int(s.shape[0])
    return SupportDraws(support, counts(s, len(support)), m, secs, n if m < n else None)


def engine_first_tokens(pair, prefix: str, sampling: SamplingConfig, k: int, gamma: int = 1, seed0: int = 1,
                        on_step: Callable[[int, int], None] | None = None) -> list[int]:
    """First emitted token of k real SpeculativeDecoder rounds from the prefix, one fresh decoder per seed."""
    out = []
    for i in range(k):
        settings = DecodeSettings(gamma=gamma, max_new_tokens=gamma + 1, sampling=sampling, seed=seed0 + i)
        rnd = SpeculativeDecoder(pair, prefix, settings).step()
        out.append(int(rnd.committed_ids[0]))
        if on_step:
            on_step(i + 1, k)
    return out


@dataclass
class RealCheck:
    """Everything the real-model panel shows; arrays are over `support` (vocabulary ids)."""

    rows: FirstTokenRows
    draws: SupportDraws
    test: ChiSquare  # vectorized draws vs p0
    tv: float
    engine_ids: list[int]
    engine_test: ChiSquare | None  # real decoder rounds vs p0
    engine_outside: int  # real rounds whose first token has p0 = 0 (must be 0)

    @property
    def alpha(self) -> float:
        return float(torch.minimum(self.rows.p0, self.rows.q0).sum())


def check_engine_rounds(rows: FirstTokenRows, engine_ids: list[int]) -> tuple[ChiSquare | None, int]:
    """Chi-square of the real rounds' first tokens against p0 over the full vocabulary (rare tokens pooled)."""
    if not engine_ids:
        return None, 0
    c = np.bincount(np.asarray(engine_ids), minlength=rows.p0.shape[0]).astype(np.float64)
    outside = int(c[(rows.p0 <= 0).numpy()].sum())
    return chi_square(c, rows.p0.double().numpy()), outside


def real_check(rows: FirstTokenRows, draws: SupportDraws, engine_ids: list[int]) -> RealCheck:
    p_s = rows.p0[draws.support].double().numpy()
    test = chi_square(draws.counts, p_s)
    engine_test, outside = check_engine_rounds(rows, engine_ids)
    return RealCheck(rows, draws, test, total_variation(draws.counts, p_s), engine_ids, engine_test, outside)


# --------------------------------------------------------------------------------------------- speedup


def speedup_curve(gamma: int, c: float, alphas: Sequence[float]) -> list[float]:
    return [leviathan_speedup(float(a), gamma, c) for a in alphas]


@dataclass
class RunPoint:
    """One recorded run, reduced to what the speedup chart can place."""

    label: str
    drafter: str
    rounds: int
    alpha: float  # per-token acceptance (the alpha of the Leviathan formula)
    mean_gamma: float
    tokens_per_round: float
    measured_speedup: float | None  # only when the run carries a plain-decoding baseline
    c_loop: float | None  # the cost ratio the loop paid (metrics module docstring)
    c_plain: float | None = None  # draft / target plain per-token cost, when the pair's costs were measured


def run_points(records: Sequence[RunRecord]) -> list[RunPoint]:
    """A point per run that drafted anything."""
    points = []
    for rec in records:
        m = rec.metrics
        if not m.drafted:
            continue
        points.append(RunPoint(rec.display_label, rec.settings.drafter, m.rounds, m.alpha, m.mean_gamma,
                               m.tokens_per_round, m.speedup, m.c_loop, m.c_plain))
    return points
