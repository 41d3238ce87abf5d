"""Token trees: a draft of several candidate continuations, verified from the root in one walk.

Glossary (on top of `core.events`):
- node: one guessed token. Nodes are numbered 0..n-1 in topological order (a parent before its children);
  `parents[i]` is the parent's number, -1 for a child of the root (the root is the last committed token).
- siblings: the children of one node, in the order they were chosen -- the order the rule tries them.
- `q[i]`: the distribution node i was drawn from GIVEN its earlier siblings. This one field says how children were
  chosen, so one walk verifies every kind of tree exactly:
  * sampled i.i.d. from the parent's draft distribution (SpecInfer): q[i] is that distribution for every sibling;
  * sampled without replacement (Sequoia's SpecTree): q[i] is that distribution with the earlier siblings removed
    and renormalized;
  * chosen deterministically (top-k children, a copied continuation): q[i] is one-hot on the node's token.
  A chain is the tree with one child per node; its rule is then the textbook one.
- `p[0]` / `p[i + 1]`: the target's (warped) distribution after the committed text / after node i.
- r: the residual at the node being expanded. It starts as p there; each refused child x with draw distribution
  q_x turns it into normalize(max(0, r - q_x)) (`verify.residual_distribution`, the chain's repair). A child x is
  accepted with probability min(1, r(x) / q_x(x)) (`verify.accept_ratio`).

The walk: at the root, try its children in order; on an accept move to that child and try its children; when every
child of a node is refused emit a token drawn from the residual (the repair); at a node without children emit the
bonus, drawn from p there (the residual against nothing). The emitted sequence is exactly distributed as the target:
at each node, P(emit x) = P(accepted child x) + P(all refused) r_final(x) = p(x), by induction over the siblings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from specdec.core.sampling import Probs, dense, prob_at, sample
from specdec.core.verify import accept_ratio, residual_distribution

ROOT = -1


@dataclass
class TokenTree:
    """n guessed tokens in topological order, their parents, and the distribution each was drawn from."""

    tokens: torch.Tensor  # LongTensor [n]
    parents: list[int]  # [n], ROOT (-1) for a child of the root; parents[i] < i
    q: Probs  # [n, V]: what node i was drawn from, given its earlier siblings (see the module docstring)

    def __post_init__(self) -> None:
        n = int(self.tokens.shape[0])
        if len(self.parents) != n or any(not ROOT <= p < i for i, p in enumerate(self.parents)):
            raise ValueError("parents must list, for each node, ROOT or an earlier node")

    @property
    def size(self) -> int:
        return len(self.parents)

    def children(self, node: int) -> list[int]:
        """The children of `node` (ROOT for the root), in the order they were chosen."""
        return [i for i, p in enumerate(self.parents) if p == node]

    @property
    def depths(self) -> list[int]:
        """Depth of every node: 1 for a child of the root."""
        out: list[int] = []
        for p in self.parents:
            out.append(1 if p == ROOT else out[p] + 1)
        return out

    def path_to(self, node: int) -> list[int]:
        """The nodes from the root's child down to `node` (empty for ROOT)."""
        path = []
        while node != ROOT:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestors_mask(self) -> torch.Tensor:
        """[n, n] bool: entry (i, j) is True where node j is node i or one of its ancestors -- what node i may see
        of the fed nodes in the target's one pass."""
        n = self.size
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            mask[i, i] = True
            if p != ROOT:
                mask[i] |= mask[p]
        return mask

    @classmethod
    def chain(cls, tokens: torch.Tensor, q: Probs) -> "TokenTree":
        """A chain of guesses as the width-1 tree."""
        return cls(tokens, list(range(-1, int(tokens.shape[0]) - 1)), q)


@dataclass
class TreeStep:
    """The rule's decision at one tried child: what it saw and what it decided (for display and for tests)."""

    node: int
    accept_prob: float  # min(1, r(x) / q(x)) with r the residual when it was tried
    uniform: float
    accepted: bool


@dataclass
class TreeVerdict:
    path: list[int]  # accepted nodes from the root down
    tokens: list[int]  # the accepted path's tokens plus exactly one repaired or bonus token
    steps: list[TreeStep] = field(default_factory=list)  # every tried child, in the order tried
    residual: Probs | None = None  # [V] the distribution the repair was drawn from (None for a bonus)
    final_dist: Probs | None = None  # [V] the distribution the last token was drawn from (residual or p)

    @property
    def bonus(self) -> bool:
        return self.residual is None

    @property
    def n_accepted(self) -> int:
        return len(self.path)


def _row(probs: Probs, i: int) -> Probs:
    return probs[i : i + 1]


def verify_tree(tree: TokenTree, p: Probs, generator: torch.Generator | None = None,
                uniforms: list[float] | None = None,
                repair: Callable[[Probs, Probs], Probs] = residual_distribution) -> TreeVerdict:
    """Walk the tree from the root with the rule module's own pieces (see the module docstring).

    p: [n + 1, V], row 0 after the committed text, row i + 1 after node i. The seams are the chain's: `uniforms`
    replaces the random draws of the accept/reject tests, in the order children are tried (to replay a round or
    force a verdict), and `repair` replaces the residual update (to watch a wrong one break exactness); the repair
    or bonus token is always drawn with `generator`.
    """
    tree_q = tree.q
    if repair is not residual_distribution:  # teaching repairs read dense rows, as verify_batch gives them
        p, tree_q = dense(p), dense(tree_q)
    steps: list[TreeStep] = []
    path: list[int] = []
    node, draws = ROOT, iter(uniforms) if uniforms is not None else None
    while True:
        r = _row(p, node + 1)  # the residual starts as p at the node
        refused = False
        moved = False
        for child in tree.children(node):
            x = tree.tokens[child : child + 1]
            q_x = _row(tree_q, child)
            ratio = float(accept_ratio(prob_at(r, x), prob_at(q_x, x)))
            u = _next_uniform(draws, generator, x.device)
            ok = u < ratio
            steps.append(TreeStep(child, ratio, u, ok))
            if ok:
                path.append(child)
                node, moved = child, True
                break
            r, refused = repair(r, q_x), True
        if moved:
            continue
        y = int(sample(r, generator)[0])
        tokens = [int(t) for t in tree.tokens[path].tolist()] + [y]
        return TreeVerdict(path, tokens, steps, r[0] if refused else None, r[0])


def _next_uniform(draws, generator: torch.Generator | None, device) -> float:
    """The next given uniform (the `uniforms` seam), or a fresh one."""
    if draws is None:
        return float(torch.rand((), generator=generator, device=device))
    try:
        return float(next(draws))
    except StopIteration:
        raise ValueError("verify_tree ran out of given uniforms: give one per child it tries") from None
