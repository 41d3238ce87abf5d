"""Building a round's display event: a pure function of the values one round produced (no models, no state).

`round_event` turns the draft, the target's p rows, the rule's verdict and what was committed into a `Round`;
`top_k` candidates per position ride along for the token views and charts (0 skips them: text and statistics only).
"""

from __future__ import annotations

import torch

from specdec.core.events import DraftNote, Round, TokenProb
from specdec.core.sampling import OneHot, Probs, prob_at
from specdec.core.stop import StopReason
from specdec.core.verify import Verdict, same_draft_verdicts

TOPK_BLOCK = 128  # ids per block in top_rows' first pass


def top_rows(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, ids) of the k largest entries of each row of x [n, V], largest first: torch.topk's answer, faster.

    The k largest values all lie in the k blocks (of TOPK_BLOCK ids) with the largest maxima -- any other block
    has k larger values elsewhere -- so one vectorized max per block and a topk over k blocks' entries replace a
    topk over the whole row, which torch walks in ~0.5 ms per 152k-token row on a CPU. Equal values may come
    out in another order than torch.topk's.
    """
    n, vocab = x.shape
    blocks = vocab // TOPK_BLOCK
    k = min(k, vocab)
    if blocks <= k:
        return torch.topk(x, k, dim=-1)
    block_max = x[:, : blocks * TOPK_BLOCK].reshape(n, blocks, TOPK_BLOCK).amax(-1)
    best = torch.topk(block_max, k, dim=-1).indices  # [n, k]
    ids = (best.unsqueeze(-1) * TOPK_BLOCK + torch.arange(TOPK_BLOCK, device=x.device)).reshape(n, -1)
    tail = torch.arange(blocks * TOPK_BLOCK, vocab, device=x.device).expand(n, -1)  # the ids past the last block
    ids = torch.cat([ids, tail], -1)
    vals, pick = torch.topk(x.gather(-1, ids), k, dim=-1)
    return vals, ids.gather(-1, pick)


def top_candidates(probs: Probs, tokenizer, k: int) -> list[list[TokenProb]]:
    """Top-k (id, piece, prob) per row of probs [n, V], with one top_rows call and one batch decode ([] per row
    for k = 0)."""
    if not k:
        return [[] for _ in range(probs.shape[0])]
    if isinstance(probs, OneHot):  # one token with probability 1 per row (none for an all-zero row)
        ids = [[i] if i >= 0 else [] for i in probs.ids.tolist()]
        ps = [[1.0] * len(row) for row in ids]
    else:
        vals, idx = top_rows(probs.float(), k)
        ids, ps = idx.tolist(), vals.tolist()
    pieces = tokenizer.batch_decode([[i] for row in ids for i in row])
    out, j = [], 0
    for row_ids, row_ps in zip(ids, ps):
        out.append([TokenProb(i, pieces[j + n], p) for n, (i, p) in enumerate(zip(row_ids, row_ps)) if p > 0])
        j += len(row_ids)
    return out


def round_event(index: int, position: int, asked: int, tokens: torch.Tensor, q: Probs, note: DraftNote | None,
                p: Probs, verdict: Verdict, committed: list[int], stop_reason: StopReason | None,
                draft_ms: float, verify_ms: float, tokenizer, top_k: int, verify_mode: str = "pq") -> Round:
    """One round as a Round event. tokens [g] and q [g, V]: the draft; p [g+1, V]: the target's warped rows;
    `committed`: what the round added to the text (the verdict's tokens after the stop rule's cut)."""
    g = int(tokens.shape[0])
    ids = tokens.tolist()
    emitted = verdict.tokens[-1]
    n = verdict.n_accepted
    residual = top_candidates(verdict.residual[None], tokenizer, top_k)[0] if verdict.residual is not None else None
    return Round(
        index=index,
        position=position,
        gamma=g,
        draft_ids=ids,
        draft_pieces=tokenizer.batch_decode([[i] for i in ids]),
        q_draft=prob_at(q, tokens).tolist(),
        p_draft=prob_at(p, tokens).tolist(),
        accept_probs=verdict.accept_probs.tolist(),
        uniforms=verdict.uniforms.tolist(),
        n_accepted=n,
        rejected_at=verdict.rejected_at,
        emitted_id=emitted,
        emitted_piece=tokenizer.decode([emitted]),
        is_bonus=verdict.bonus,
        emitted_p=float(prob_at(p[n : n + 1], torch.tensor([emitted]))),
        q_top=top_candidates(q, tokenizer, top_k) if g else [],
        p_top=top_candidates(p, tokenizer, top_k),
        residual_top=residual,
        committed_ids=list(committed),
        committed_pieces=tokenizer.batch_decode([[i] for i in committed]),
        draft_ms=draft_ms,
        verify_ms=verify_ms,
        stop_reason=stop_reason,
        top_k=top_k,
        note=note,
        asked=asked,
        verify=verify_mode,
        same_draft=same_draft_verdicts(tokens, q, p, verdict.uniforms) if top_k and g else [],
    )
