"""What one tree round looked like, as plain JSON-ready dataclasses (built by `specdec.loop.tree_display`).

A `TreeRoundEvent` holds every node of the round's token tree with the numbers the rule read at it: p(x), the
target's probability of the node's token after its parent; q(x), what the draft gave it (a one-hot q means the node
was chosen deterministically); and, for a node the rule tried, the residual r(x) at that moment, the keep chance
min(1, r(x) / q(x)) and the uniform u that decided it (kept iff u < keep chance). A node is accepted, rejected, or
untried (its parent was never reached, or an earlier sibling was accepted). The walk ends with one emitted token:
a repair drawn from the residual after every child of the last accepted node was refused, or a bonus drawn from p
at a node without children.

Events ride on a `Round` (`Round.tree`), so traces write them and replays redraw them without a model.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

# A node's fate in the walk (the CSS classes of the tree view use the same words):
TREE_ACCEPTED = "accepted"
TREE_REJECTED = "rejected"
TREE_UNTRIED = "untried"
TREE_FATES = (TREE_ACCEPTED, TREE_REJECTED, TREE_UNTRIED)
# How the children's q rows were chosen: one-hot (deterministic picks, e.g. top-k) or a drawn distribution.
Q_ONE_HOT = "one-hot"
Q_DRAWN = "drawn"
Q_KINDS = (Q_ONE_HOT, Q_DRAWN)
REPAIR = "repair"
BONUS = "bonus"


@dataclass
class TreeNodeView:
    node: int  # number in topological order (a parent before its children)
    token_id: int
    piece: str  # the token decoded on its own
    parent: int  # -1 for a child of the root (the last committed token)
    depth: int  # 1 for a child of the root
    p: float  # the target's probability of the token after its parent
    q: float  # the probability the node's draw distribution gave it (1 when chosen deterministically)
    fate: str  # TREE_ACCEPTED, TREE_REJECTED or TREE_UNTRIED
    r: float | None = None  # the residual's probability of the token when it was tried (None: untried)
    accept_prob: float | None = None  # min(1, r / q) when tried
    uniform: float | None = None  # the u that decided it when tried

    @property
    def tried(self) -> bool:
        return self.fate != TREE_UNTRIED


@dataclass
class TreeRoundEvent:
    mode: str  # how children were chosen ("top-k", "sampled", "distinct", ...)
    widths: list[int]  # children per node at each depth, as asked
    q_kind: str  # Q_ONE_HOT or Q_DRAWN
    nodes: list[TreeNodeView]
    path: list[int]  # the accepted nodes from the root down
    steps: list[int]  # the tried nodes in the order the rule tried them
    emitted_id: int  # the repair or bonus token that ends the path
    emitted_piece: str
    emitted_kind: str  # REPAIR or BONUS
    emitted_p: float  # p of the emitted token after the last accepted node
    emitted_r: float  # the probability the emitted token was drawn with (the residual's, or p's for a bonus)
    n_committed: int = 0  # tokens of path + emitted that reached the text (EOS or the budget may cut it short)

    @property
    def one_hot(self) -> bool:
        return self.q_kind == Q_ONE_HOT

    @property
    def bonus(self) -> bool:
        return self.emitted_kind == BONUS

    @property
    def end_node(self) -> int:
        """The node the emitted token follows (-1: the root)."""
        return self.path[-1] if self.path else -1

    @property
    def depth(self) -> int:
        return max((n.depth for n in self.nodes), default=0)

    def children(self, node: int) -> list[TreeNodeView]:
        return [n for n in self.nodes if n.parent == node]

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TreeRoundEvent:
        known = {f.name for f in fields(cls)}
        data = {k: v for k, v in d.items() if k in known}
        node_keys = {f.name for f in fields(TreeNodeView)}
        data["nodes"] = [TreeNodeView(**{k: v for k, v in n.items() if k in node_keys}) for n in d["nodes"]]
        data["widths"] = list(d.get("widths") or [])
        return cls(**data)


__all__ = ["BONUS", "Q_DRAWN", "Q_KINDS", "Q_ONE_HOT", "REPAIR", "TREE_ACCEPTED", "TREE_FATES", "TREE_REJECTED",
           "TREE_UNTRIED", "TreeNodeView", "TreeRoundEvent"]
