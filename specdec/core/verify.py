"""The speculative sampling rule (Leviathan et al. 2022; Chen et al. 2023). Pure tensor math, no models, no I/O.

For each draft token x_i, left to right, keep it with probability min(1, p_i(x_i) / q_i(x_i)). At the first
rejection, emit a token drawn from normalize(max(0, p_i - q_i)); if all gamma pass, emit a bonus token from p_gamma.
Since min(p, q) + (1 - sum min(p, q)) * normalize(max(0, p - q)) = p, every emitted token is distributed exactly as
the target would have sampled it.

`verify_batch` is the only implementation of the rule in the project; `verify` is its single-round view.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from specdec.core.sampling import OneHot, Probs, dense, prob_at, sample, take_rows, zero_rows


@dataclass
class Verdict:
    tokens: list[int]  # emitted this round: the accepted prefix plus exactly one repaired or bonus token
    n_accepted: int
    rejected_at: int | None  # index of the first rejected draft token, None when all were kept
    accept_probs: torch.Tensor  # [gamma] min(1, p/q) at each drafted token
    uniforms: torch.Tensor  # [gamma] the u drawn at each position; position i is kept iff u_i < accept_probs_i
    residual: Probs | None  # [V] normalize(max(0, p - q)) at the rejected position, None for a bonus
    final_dist: Probs  # [V] the distribution the last emitted token was drawn from (residual or p)

    @property
    def bonus(self) -> bool:
        return self.rejected_at is None


@dataclass
class BatchVerdict:
    n_accepted: torch.Tensor  # [B]
    next_token: torch.Tensor  # [B] the repaired or bonus token
    accept_probs: torch.Tensor  # [B, gamma]
    uniforms: torch.Tensor  # [B, gamma]
    final_dist: Probs  # [B, V]


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


def verify_batch(
    draft_tokens: torch.Tensor,
    draft_probs: Probs,
    target_probs: Probs,
    generator: torch.Generator | None = None,
    repair: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = residual_distribution,
    uniforms: torch.Tensor | None = None,
) -> BatchVerdict:
    """Run the rule on B independent rounds at once: shapes [B, g], [B, g, V], [B, g+1, V] (or OneHot [B, g],
    [B, g+1]).

    `repair` exists so teaching tools and tests can swap in a *wrong* repair and watch exactness fail; the
    engine always uses the residual. `uniforms` ([B, g]) replays given draws instead of fresh ones, e.g. to
    re-run a recorded round or to force an accept (u = 0) or a reject (u = 1).
    """
    b, g = draft_tokens.shape
    a = acceptance_probs(draft_tokens, draft_probs, target_probs)
    u = torch.rand(a.shape, generator=generator, device=a.device, dtype=a.dtype) if uniforms is None else uniforms.to(a)
    kept = u < a
    n_acc = kept.long().cumprod(-1).sum(-1)  # length of the leading run of kept tokens
    p_next = take_rows(target_probs, n_acc)
    # A zero q row after the last draft makes the bonus a special case of the repair: residual(p, 0) = p.
    if g:
        q_next = zero_rows(take_rows(draft_probs, n_acc.clamp_max(g - 1)), n_acc == g)
    else:
        q_next = OneHot(torch.full((b,), -1, device=draft_tokens.device), p_next.shape[-1])
    if repair is not residual_distribution:  # teaching repairs read dense rows
        p_next, q_next = dense(p_next), dense(q_next)
    final = repair(p_next, q_next)
    return BatchVerdict(n_acc, sample(final, generator), a, u, final)


def verify(
    draft_tokens: torch.Tensor,
    draft_probs: Probs,
    target_probs: Probs,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> Verdict:
    """One round: draft_tokens [g], draft_probs [g, V] (q, post-warp), target_probs [g+1, V] (p, same warp);
    either may be OneHot."""
    g = draft_tokens.shape[0]
    if draft_probs.shape[0] != g or target_probs.shape[0] != g + 1 or draft_probs.shape[-1] != target_probs.shape[-1]:
        raise ValueError(
            f"verify expects draft_probs [g, V] and target_probs [g+1, V] for g={g} draft tokens, got "
            f"{tuple(draft_probs.shape)} and {tuple(target_probs.shape)}"
        )
    u = None if uniforms is None else uniforms[None]
    bv = verify_batch(draft_tokens[None], draft_probs[None], target_probs[None], generator, uniforms=u)
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
