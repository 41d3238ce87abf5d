"""Building a tree round's display events: pure functions of what one tree round produced (no models, no state).

`tree_round_event` turns the tree, the target's p rows and the verdict into a `TreeRoundEvent`: every node with
p(x), q(x), and for the tried ones the residual r(x) at the moment they were tried and the u that decided them.
`verify_tree` records each tried child's keep chance and u but not the residual it was computed from, so the
residual is recomputed here by replaying the same updates (`verify.residual_distribution`) along the walk.

`tree_chain_round` makes the `Round` that the chain views, statistics and traces read: the accepted path as the
guesses (plus, before a repair, the last refused child at the end of the path, as the rejected guess), with the
`TreeRoundEvent` attached as `Round.tree`.

`TreeRun` presents a TreeDecoder with the decoder shape the playground's session drives (`step()` returns a Round,
`rounds`, `record()`).
"""

from __future__ import annotations

import torch

from specdec.core.events import DraftNote, Round
from specdec.core.metrics import StepCosts
from specdec.core.record import RunRecord
from specdec.core.sampling import OneHot, Probs, prob_at
from specdec.core.stop import StopReason
from specdec.core.tree import ROOT, TokenTree, TreeVerdict
from specdec.core.tree_events import (
    BONUS,
    Q_DRAWN,
    Q_ONE_HOT,
    REPAIR,
    TREE_ACCEPTED,
    TREE_REJECTED,
    TREE_UNTRIED,
    TreeNodeView,
    TreeRoundEvent,
)
from specdec.core.verify import Verdict, residual_distribution
from specdec.loop.display import round_event


def _row(probs: Probs, i: int) -> Probs:
    return probs[i : i + 1]


def _at(probs: Probs, token: int) -> float:
    """probs [1, V] at one token id."""
    device = probs.ids.device if isinstance(probs, OneHot) else probs.device
    return float(prob_at(probs, torch.tensor([token], device=device))[0])


def replay_residuals(tree: TokenTree, p: Probs, verdict: TreeVerdict) -> dict[int, float]:
    """r(x) at every tried child, walking the verdict's path with the rule's own residual update: at each expanded
    node r starts as p there, and each refused child x with draw distribution q_x turns it into
    normalize(max(0, r - q_x))."""
    tried = {s.node: s for s in verdict.steps}
    out: dict[int, float] = {}
    for node in [ROOT, *verdict.path]:
        r = _row(p, node + 1)
        for child in tree.children(node):
            step = tried.get(child)
            if step is None:
                break
            out[child] = _at(r, int(tree.tokens[child]))
            if step.accepted:
                break
            r = residual_distribution(r, _row(tree.q, child))
    return out


def tree_round_event(tree: TokenTree, p: Probs, verdict: TreeVerdict, tokenizer, mode: str = "",
                     widths: list[int] | None = None, n_committed: int | None = None) -> TreeRoundEvent:
    """The round's tree with what the rule read at every node (see the module docstring).

    p: [n + 1, V], row 0 after the committed text and row i + 1 after node i, as `verify_tree` read it.
    """
    ids = [int(t) for t in tree.tokens.tolist()]
    pieces = tokenizer.batch_decode([[i] for i in ids]) if ids else []
    depths = tree.depths
    residuals = replay_residuals(tree, p, verdict)
    steps = {s.node: s for s in verdict.steps}
    path = set(verdict.path)
    nodes = []
    for i, (tok, parent) in enumerate(zip(ids, tree.parents)):
        step = steps.get(i)
        fate = TREE_UNTRIED if step is None else TREE_ACCEPTED if i in path else TREE_REJECTED
        nodes.append(TreeNodeView(
            node=i, token_id=tok, piece=pieces[i], parent=parent, depth=depths[i],
            p=_at(_row(p, parent + 1), tok), q=_at(_row(tree.q, i), tok), fate=fate,
            r=residuals.get(i) if step is not None else None,
            accept_prob=step.accept_prob if step is not None else None,
            uniform=step.uniform if step is not None else None))
    emitted = verdict.tokens[-1]
    end = verdict.path[-1] if verdict.path else ROOT
    final = verdict.final_dist[None] if verdict.final_dist is not None else _row(p, end + 1)
    return TreeRoundEvent(
        mode=mode,
        widths=list(widths or []),
        q_kind=Q_ONE_HOT if isinstance(tree.q, OneHot) else Q_DRAWN,
        nodes=nodes,
        path=list(verdict.path),
        steps=[s.node for s in verdict.steps],
        emitted_id=emitted,
        emitted_piece=tokenizer.decode([emitted]),
        emitted_kind=BONUS if verdict.bonus else REPAIR,
        emitted_p=_at(_row(p, end + 1), emitted),
        emitted_r=_at(final, emitted),
        n_committed=len(verdict.tokens) if n_committed is None else n_committed,
    )


def chain_guesses(verdict: TreeVerdict) -> list[int]:
    """The nodes a tree round shows as its chain of guesses: the accepted path, then (before a repair) the last
    child refused at its end -- the refusal the repair was drawn after."""
    return list(verdict.path) + ([verdict.steps[-1].node] if not verdict.bonus and verdict.steps else [])


def tree_chain_round(index: int, position: int, tree: TokenTree, p: Probs, verdict: TreeVerdict,
                     event: TreeRoundEvent, committed: list[int], stop_reason: StopReason | None, draft_ms: float,
                     verify_ms: float, tokenizer, top_k: int, drafter: str = "model") -> Round:
    """The Round a tree round is shown, counted and traced as (see the module docstring), carrying `event`."""
    guesses = chain_guesses(verdict)
    device = tree.tokens.device
    idx = torch.tensor(guesses, dtype=torch.long, device=device)
    rows = torch.tensor([0] + [g + 1 for g in guesses], dtype=torch.long, device=device)
    by_node = {s.node: s for s in verdict.steps}
    n = len(verdict.path)
    chain = Verdict(
        tokens=list(verdict.tokens), n_accepted=n, rejected_at=None if verdict.bonus else n,
        accept_probs=torch.tensor([by_node[g].accept_prob for g in guesses], dtype=torch.float32),
        uniforms=torch.tensor([by_node[g].uniform for g in guesses], dtype=torch.float32),
        residual=verdict.residual, final_dist=verdict.final_dist)
    note = DraftNote(drafter, one_hot=isinstance(tree.q, OneHot))
    rnd = round_event(index, position, None, tree.tokens[idx], tree.q[idx], note, p[rows], chain, committed,
                      stop_reason, draft_ms, verify_ms, tokenizer, top_k)
    rnd.tree = event
    return rnd


class TreeRun:
    """A TreeDecoder in the shape the playground's session drives: `step()` returns the round's chain `Round`
    (its `tree` set), `rounds` lists them, `record()` is the run as a RunRecord."""

    def __init__(self, decoder):
        self.tree = decoder

    @property
    def pair(self):
        return self.tree.pair

    @property
    def settings(self):
        return self.tree.settings

    @property
    def prompt(self):
        return self.tree.prompt

    @property
    def done(self) -> bool:
        return self.tree.done

    @property
    def stop_reason(self):
        return self.tree.stop_reason

    @property
    def rounds(self) -> list[Round]:
        return [r.round for r in self.tree.rounds]

    def step(self) -> Round:
        return self.tree.step().round

    def __iter__(self):
        while not self.done:
            yield self.step()

    def record(self, costs: StepCosts | None = None, label: str = "") -> RunRecord:
        dec = self.tree
        text = dec.pair.tokenizer.decode(dec.generated_ids, skip_special_tokens=True)
        return RunRecord(dec.prompt, list(dec.prompt_ids), dec.settings, dec.pair.info(), self.rounds, text,
                         dec.stop_reason, costs, label=label)
