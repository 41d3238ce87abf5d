"""The speculative sampling rules. Pure tensor math, no models, no I/O.

Glossary (shapes for a batch of B rounds of g guesses over a vocabulary of V ids):
- x_i, draft_tokens [B, g]: the guesses, left to right.
- q_i, draft_probs [B, g, V]: the warped distribution guess i was drawn from (OneHot when it was chosen
  deterministically: greedy drafts, copied text).
- p_i, target_probs [B, g+1, V]: the target's distribution, warped the same way, after the committed text and
  after each guess; row g gives the bonus.
- n, n_accepted [B]: how many leading guesses are kept; exactly one more token (repair or bonus) follows them.
- u, uniforms [B, g]: the draws that decided; the `uniforms=` seam replays given ones (u = 0 forces a keep where
  the keep probability is > 0, u = 1 forces a rejection).

Three modes, each exact -- the emitted text is distributed as the target's own sampling:
- "pq" (Leviathan et al. 2022; Chen et al. 2023): keep x_i with probability min(1, p_i(x_i) / q_i(x_i)), left to
  right; at the first rejection emit a token from normalize(max(0, p_i - q_i)); if all g pass, a bonus from p_g.
  Since min(p, q) + (1 - sum min(p, q)) * normalize(max(0, p - q)) = p, every emitted token follows p.
- "strict" (the default of vLLM's strict sampler, TensorRT-LLM without rejection sampling, llama.cpp): the target
  draws its own token y_i ~ p_i at each position and a guess survives only if x_i = y_i; at the first mismatch
  y_i is emitted. Drawing y ~ p and comparing is, in law, keeping x with probability p(x) and otherwise drawing
  from p with x removed -- the "pq" rule with q replaced by a one-hot q on the guess -- and that is how it runs
  here, so its u reads as the other modes' do. A guess x ~ q survives with probability sum_x q(x) p(x) rather than
  pq's sum_x min(p(x), q(x)); with a one-hot q (greedy drafts, copied text) the two keep a guess equally often.
- "block" (Sun et al. 2024, "Block verification accelerates speculative decoding", arXiv 2403.10444): the
  guesses are judged jointly. With w_0 = 1 and w_i = min(1, w_{i-1} p_{i-1}(x_i) / q_{i-1}(x_i)) (the weight of
  the prefix x_1..x_i), s_i = sum_x max(0, w_i p_i(x) - q_i(x)), and h_i = s_i / (s_i + 1 - w_i) for i < g,
  h_g = w_g, keep n = the largest i with u_i < h_i (0 if none), then emit a token from
  normalize(max(0, w_n p_n - q_n)) -- or from p_g when n = g. Proof sketch: by induction from the last position,
  the probability that the block keeps a prefix that continues x_1..x_i, together with the residual mass left at
  i, adds up to w_i times the target's probability of x_1..x_i over the draft's; w_0 = 1 then says the emitted
  sequence follows p. The weight w_i can recover after a poor guess (a later guess that the target likes more
  than the draft raises it), so a guess that pq would have rejected can still be kept; the paper proves the
  expected number kept is at least pq's for every draft and target, and the most any valid verifier of the block
  can keep.

`verify_batch` is the only implementation of the rules in the project; `verify` is its single-round view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specdec.core.sampling import OneHot, Probs, dense, prob_at, sample, take_rows, zero_rows

VERIFY_MODES = ("pq", "strict", "block")  # how the target checks the guesses (the module docstring)


@dataclass
class Verdict:
    tokens: list[int]  # emitted this round: the accepted prefix plus exactly one repaired or bonus token
    n_accepted: int
    rejected_at: int | None  # index of the first rejected draft token, None when all were kept
    accept_probs: torch.Tensor  # [gamma] each position's test: min(1, p/q) (pq), p(x) (strict), h_i (block)
    uniforms: torch.Tensor  # [gamma] the u drawn at each position; its test passes iff u_i < accept_probs_i
    residual: Probs | None  # [V] normalize(max(0, p - q)) at the rejected position, None for a bonus
    final_dist: Probs  # [V] the distribution the last emitted token was drawn from (residual or p)

    @property
    def bonus(self) -> bool:
        return self.rejected_at is None


@dataclass
class BatchVerdict:
    n_accepted: torch.Tensor  # [B]
    next_token: torch.Tensor  # [B] the repaired or bonus token
    accept_probs: torch.Tensor  # [B, gamma] each position's test (see Verdict.accept_probs)
    uniforms: torch.Tensor  # [B, gamma]
    final_dist: Probs  # [B, V]
    weights: torch.Tensor | None = None  # [B, gamma + 1] block mode's w_0..w_g, None in the other modes


def accept_ratio(p_x: torch.Tensor, q_x: torch.Tensor) -> torch.Tensor:
    """min(1, p(x)/q(x)) elementwise: the probability the rule keeps a guess x. q(x) = 0 cannot happen for a token
    the draft sampled; it is read as "p decides alone" rather than a division by 0."""
    tiny = torch.finfo(q_x.dtype).tiny if q_x.is_floating_point() else 1e-38
    return torch.where(q_x > 0, (p_x / q_x.clamp_min(tiny)).clamp(max=1.0), (p_x > 0).to(p_x.dtype))


def acceptance_probs(draft_tokens: torch.Tensor, draft_probs: Probs, target_probs: Probs) -> torch.Tensor:
    """min(1, p(x)/q(x)) for each draft token; shapes [..., g], [..., g, V], [..., >=g, V] -> [..., g]."""
    return accept_ratio(prob_at(target_probs, draft_tokens), prob_at(draft_probs, draft_tokens))


def residual_distribution(p: Probs, q: Probs) -> Probs:
    """normalize(max(0, p - q)) over the last dim.

    When p == q (up to rounding) the residual has no mass; a rejection then has probability ~0, and falling back
    to p keeps the output distribution p. One-hot rows take shortcuts that are the same arithmetic: for a one-hot
    p, max(0, p - q) is zero off p's token, so normalized it is p; for a one-hot q on x, it is p with x removed.
    """
    if isinstance(p, OneHot):
        return p
    if isinstance(q, OneHot):
        r = p.clone()
        rows = (q.ids >= 0).nonzero().flatten()
        r.reshape(-1, r.shape[-1]).index_put_((rows, q.ids.reshape(-1)[rows]), torch.zeros((), dtype=r.dtype))
    else:
        r = (p - q).clamp_min_(0.0)
    mass = r.sum(-1, keepdim=True)
    return torch.where(mass > 1e-12, r.div_(mass.clamp_min(1e-38)), p)


def residual_mass(w: torch.Tensor, target_probs: Probs, draft_probs: Probs, g: int) -> torch.Tensor:
    """s_i = sum_x max(0, w_i p_i(x) - q_i(x)) in float64 for rows i = 1..g-1; w [B, g-1], p and q [B, >=g, V].

    A one-hot q_i (a copied or greedy guess y, or an all-zero row) has one entry to subtract from: every other x
    adds w_i p_i(x) >= 0 whole, so s_i = w_i (sum_x p_i(x) - p_i(y)) + max(0, w_i p_i(y) - q_i(y)) -- the same sum
    with its terms grouped, read from row sums and one gather instead of [B, g, V] float64 temporaries (a 33-guess
    copy round would build ~200 MB of them). A dense q has no such shortcut."""
    rows = slice(1, g)
    if not isinstance(draft_probs, OneHot):
        p, q = dense(target_probs)[:, rows].double(), dense(draft_probs)[:, rows].double()
        return (w[..., None] * p - q).clamp_min(0.0).sum(-1)
    y = draft_probs.ids[:, rows]
    q_y = (y >= 0).double()
    if isinstance(target_probs, OneHot):
        p_rows = target_probs.ids[:, rows]
        total, p_y = (p_rows >= 0).double(), ((p_rows == y) & (y >= 0)).double()
    else:
        p = target_probs[:, rows]
        total = p.sum(-1, dtype=torch.float64)
        p_y = p.gather(-1, y.clamp_min(0).unsqueeze(-1)).squeeze(-1).double() * q_y
    return w * (total - p_y) + (w * p_y - q_y).clamp_min(0.0)


def block_tests(draft_tokens: torch.Tensor, draft_probs: Probs, target_probs: Probs) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's weights w [B, g+1] (w_0 = 1) and tests h [B, g] (see the module docstring)."""
    b, g = draft_tokens.shape
    p_x, q_x = prob_at(target_probs, draft_tokens).double(), prob_at(draft_probs, draft_tokens).double()
    ratio = torch.where(q_x > 0, p_x / q_x.clamp_min(1e-300), (p_x > 0).double() * float("inf"))
    w = [torch.ones(b, dtype=torch.float64, device=draft_tokens.device)]
    for i in range(g):
        w.append(torch.clamp(w[-1] * ratio[:, i], max=1.0))
    w = torch.stack(w, 1)  # [B, g+1]
    s = residual_mass(w[:, 1:g], target_probs, draft_probs, g)  # [B, g-1]: s_1..s_{g-1}
    denom = s + 1.0 - w[:, 1:g]
    h_inner = torch.where(denom > 1e-15, s / denom.clamp_min(1e-300), torch.ones_like(s))  # w_i = 1: keep going
    h = torch.cat([h_inner, w[:, g:]], 1) if g else w[:, :0]
    return w, h


def kept_count(passed: torch.Tensor, mode: str) -> torch.Tensor:
    """How many guesses are kept [B] from which tests passed [B, g]: the leading run of passes ("pq", "strict"),
    or the last position whose test passed ("block": the longest prefix the block accepts), 0 if none."""
    if mode != "block":
        return passed.long().cumprod(-1).sum(-1)
    g = passed.shape[-1]
    return (passed.long() * torch.arange(1, g + 1, device=passed.device)).amax(-1) if g else passed.long().sum(-1)


def mode_tests(draft_tokens: torch.Tensor, draft_probs: Probs, target_probs: Probs, mode: str
               ) -> tuple[Probs, torch.Tensor | None, torch.Tensor]:
    """What a rule reads: (the q it judges against, block's weights or None, each guess's test [B, g]). Strict
    judges against a one-hot q on each guess: the target's own draw decides (module docstring)."""
    if mode == "strict":
        draft_probs = OneHot(draft_tokens, target_probs.shape[-1])
    if mode == "block":
        weights, tests = block_tests(draft_tokens, draft_probs, target_probs)
        return draft_probs, weights, tests.float()
    return draft_probs, None, acceptance_probs(draft_tokens, draft_probs, target_probs)


def verify_batch(
    draft_tokens: torch.Tensor,
    draft_probs: Probs,
    target_probs: Probs,
    generator: torch.Generator | None = None,
    repair: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = residual_distribution,
    uniforms: torch.Tensor | None = None,
    mode: str = "pq",
) -> BatchVerdict:
    """Run one of the rules on B independent rounds at once: shapes [B, g], [B, g, V], [B, g+1, V] (or OneHot
    [B, g], [B, g+1]).

    `repair` exists so teaching tools and tests can swap in a *wrong* repair and watch exactness fail; the
    engine always uses the residual. `uniforms` ([B, g]) replays given draws instead of fresh ones, e.g. to
    re-run a recorded round or to force an accept (u = 0) or a reject (u = 1).
    """
    if mode not in VERIFY_MODES:
        raise ValueError(f"verification mode must be one of {', '.join(VERIFY_MODES)}, got {mode!r}")
    b, g = draft_tokens.shape
    draft_probs, weights, a = mode_tests(draft_tokens, draft_probs, target_probs, mode)
    u = torch.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype) if uniforms is None else uniforms.to(a)
    n_acc = kept_count(u < a, mode)
    p_next = take_rows(target_probs, n_acc)
    # A zero q row after the last draft makes the bonus a special case of the repair: residual(p, 0) = p.
    if g:
        q_next = zero_rows(take_rows(draft_probs, n_acc.clamp_max(g - 1)), n_acc == g)
    else:
        q_next = OneHot(torch.full((b,), -1, device=draft_tokens.device), p_next.shape[-1])
    if repair is not residual_distribution or mode == "block":  # teaching repairs and block's weights read dense rows
        p_next, q_next = dense(p_next), dense(q_next)
    if mode == "block":  # block's residual normalize(max(0, w_n p_n - q_n)); w_g = 1 is not needed: q_g = 0
        w_n = weights.gather(1, n_acc[:, None]).to(p_next.dtype)
        p_next = torch.where(n_acc[:, None] == g, p_next, p_next * w_n)
        final = repair(p_next, q_next)
        final = final / final.sum(-1, keepdim=True).clamp_min(1e-38)
    else:
        final = repair(p_next, q_next)
    return BatchVerdict(n_acc, sample(final, generator), a, u, final, weights)


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: Probs,
    target_probs: Probs,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
    mode: str = "pq",
) -> Verdict:
    """One round: draft_tokens [g], draft_probs [g, V] (q, post-warp), target_probs [g+1, V] (p, same warp);
    either may be OneHot. `mode` is one of VERIFY_MODES."""
    g = draft_tokens.shape[0]
    if draft_probs.shape[0] != g or target_probs.shape[0] != g + 1 or draft_probs.shape[-1] != target_probs.shape[-1]:
        raise ValueError(
            f"verify expects draft_probs [g, V] and target_probs [g+1, V] for g={g} draft tokens, got "
            f"{tuple(draft_probs.shape)} and {tuple(target_probs.shape)}"
        )
    u = None if uniforms is None else uniforms[None]
    bv = verify_batch(draft_tokens[None], draft_probs[None], target_probs[None], generator, uniforms=u, mode=mode)
    n = int(bv.n_accepted[0])
    return Verdict(
        tokens=draft_tokens[:n].tolist() + [int(bv.next_token[0])],
        n_accepted=n,
        rejected_at=n if n < g else None,
        accept_probs=bv.accept_probs[0],
        uniforms=bv.uniforms[0],
        residual=bv.final_dist[0] if n < g else None,
        final_dist=bv.final_dist[0],
    )


@dataclass
class ModeVerdict:
    """What one rule decides on a given draft with given uniforms (the repair token itself is left undrawn)."""

    mode: str
    tests: list[float]  # [g] each position's test probability under this rule
    n_accepted: int
    expected: float = 0.0  # guesses this rule keeps on average from this draft, over fresh uniforms


def expected_kept(tests: torch.Tensor, mode: str) -> float:
    """E[guesses kept | the draft] from its tests [g] with independent uniforms: sum_k prod_{j<=k} a_j for the
    leading-run rules, sum_k k h_k prod_{j>k} (1 - h_j) for block."""
    a = tests.double()
    g = a.shape[0]
    if mode != "block":
        return float(a.cumprod(0).sum())
    later = torch.cat([(1 - a).flip(0).cumprod(0).flip(0)[1:], a.new_ones(1)]) if g else a
    return float(sum((k + 1) * a[k] * later[k] for k in range(g)))


def same_draft_verdicts(draft_tokens: torch.Tensor, draft_probs: Probs, target_probs: Probs,
                        uniforms: torch.Tensor) -> list[ModeVerdict]:
    """Every rule's verdict on one round's draft [g], q [g, V], p [g+1, V] with the same uniforms [g]: what pq,
    strict and block would have kept from the same guesses and the same draws."""
    out = []
    for mode in VERIFY_MODES:
        tests = mode_tests(draft_tokens[None], draft_probs[None], target_probs[None], mode)[2][0]
        n = int(kept_count((uniforms.to(tests) < tests)[None], mode)[0])
        out.append(ModeVerdict(mode, tests.float().tolist(), n, expected_kept(tests, mode)))
    return out
