"""Tree drafts from a draft model: each node's children are chosen from the draft's distribution after it, one
draft forward pass per depth for the whole frontier (`CachedLM.logits_for_tree`, a tree attention mask).

How children are chosen decides the q each child carries (see `core.tree`), so every mode is verified exactly:
- "top-k": the `width` likeliest ids of the draft's unwarped distribution, deterministically: q is one-hot on each
  child (EAGLE-style static trees; the likeliest guesses, whatever the temperature);
- "sampled": `width` i.i.d. draws from the warped draft distribution d: q = d for every child (SpecInfer);
- "distinct": draws without replacement from d: q is d with the earlier siblings removed and renormalized
  (Sequoia's SpecTree); a node has fewer children when d has fewer ids.
A chain is widths (1, 1, ...).

Copy drafters (ngram, predicted) build trees of their own with `propose_tree(committed, depth, budget, cfg, gen)`
(the `TreeDrafter` protocol): every distinct continuation they find becomes a branch (`branch_tree`), each child
chosen deterministically, so q is one-hot on every node. For them a widths shape only bounds the tree
(`copy_tree_bounds`: its length is the depth, its node count the budget); where the branches split follows the
text.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specdec.core.errors import InvalidInputError, whole_number
from specdec.core.kvcache import CachedLM
from specdec.core.settings import MAX_TREE_NODES
from specdec.core.sampling import OneHot, SamplingConfig, cat_rows, dense, distribution, sample
from specdec.core.stop import cut_at_stop
from specdec.core.tree import ROOT, TokenTree

TREE_MODES = ("top-k", "sampled", "distinct")


def check_widths(widths, mode: str) -> list[int]:
    """The tree shape as a list of children per node at each depth; a clear message for a bad one."""
    if mode not in TREE_MODES:
        raise InvalidInputError(f"tree mode must be one of {', '.join(TREE_MODES)}, got {mode!r}")
    widths = [whole_number(w, "a tree width", 1, 8) for w in widths]
    if not widths:
        raise InvalidInputError("a tree needs at least one depth, e.g. widths 3,2,1")
    nodes, level = 0, 1
    for w in widths:
        level *= w
        nodes += level
    if nodes > MAX_TREE_NODES:
        raise InvalidInputError(f"the tree {','.join(map(str, widths))} has {nodes} nodes; the limit is {MAX_TREE_NODES}")
    return widths


def choose_children(logits: torch.Tensor, width: int, mode: str, cfg: SamplingConfig,
                    gen: torch.Generator | None) -> tuple[list[int], list]:
    """(child tokens, the q row each was drawn from) for one node whose draft logits are `logits` [V]."""
    vocab = logits.shape[-1]
    if mode == "top-k":
        ids = torch.topk(logits.float(), min(width, vocab)).indices
        ids = ids[logits[ids] > float("-inf")]
        return ids.tolist(), [OneHot(ids[j : j + 1], vocab) for j in range(len(ids))]
    d = distribution(logits[None], cfg)  # [1, V]: what the draft samples from, warped as p will be
    if mode == "sampled":
        xs = [int(sample(d, gen)[0]) for _ in range(width)]
        return xs, [d] * width
    xs, rows, left = [], [], d
    for _ in range(width):  # "distinct": without replacement
        if isinstance(left, OneHot) and xs:
            break  # a one-hot d has a single id
        x = int(sample(left, gen)[0])
        xs.append(x)
        rows.append(left)
        rest = dense(left).clone()
        rest[0, x] = 0.0
        mass = float(rest.sum())
        if mass <= 0.0:
            break
        left = rest / mass
    return xs, rows


def draft_tree(lm: CachedLM, committed: list[int], widths: list[int], mode: str, cfg: SamplingConfig,
               gen: torch.Generator | None) -> TokenTree:
    """Grow a tree depth by depth: each pass scores every node so far (row 0 after the committed text), and the
    frontier's nodes get their children."""
    tokens: list[int] = []
    parents: list[int] = []
    qs: list = []
    frontier = [ROOT]
    for width in widths:
        if tokens:
            tree = TokenTree(torch.tensor(tokens, device=lm.device), parents, _rows(qs))
            logits = lm.logits_for_tree(committed, tree)
        else:
            logits = lm.logits_after(committed)[-1:]
        grown = []
        for node in frontier:
            xs, rows = choose_children(logits[node + 1], width, mode, cfg, gen)
            for x, q in zip(xs, rows):
                grown.append(len(tokens))
                tokens.append(x)
                parents.append(node)
                qs.append(q)
        frontier = grown
    return TokenTree(torch.tensor(tokens, dtype=torch.long, device=lm.device), parents, _rows(qs))


def _rows(qs: list):
    """q rows [1, V] each, stacked to [n, V] (one-hot rows stay ids)."""
    return cat_rows(qs)


# ------------------------------------------------------------------------------------------------ copy trees

COPY_TREE_DRAFTERS = ("ngram", "predicted", "suffix")  # drafters with propose_tree; "model" trees come from draft_tree


class TreeDrafter(Protocol):
    def propose_tree(self, committed: list[int], depth: int, budget: int, cfg: SamplingConfig,
                     gen: torch.Generator | None) -> TokenTree:
        """A tree of at most `budget` nodes and `depth` levels that would follow `committed` (may be empty)."""


def check_tree_drafter(name: str) -> None:
    """Refuse a drafter that cannot grow a token tree (the draft model and the copying drafters can)."""
    if name != "model" and name not in COPY_TREE_DRAFTERS:
        raise InvalidInputError(f"tree rounds draft with the draft model or a copying drafter "
                                f"({', '.join(COPY_TREE_DRAFTERS)}); the {name} drafter has no trees")


def copy_tree_bounds(widths: list[int]) -> tuple[int, int]:
    """(depth, node budget) a widths shape allows a copy tree: its length and its node count (at most
    MAX_TREE_NODES), e.g. 4,1,1,1 -> depth 4, 16 nodes: room for four branches of four tokens."""
    nodes, level = 0, 1
    for w in widths:
        level *= w
        nodes += level
    return len(widths), min(nodes, MAX_TREE_NODES)


def branch_tree(branches, budget: int, vocab_size: int, device, stop_ids=()) -> TokenTree:
    """The trie of `branches` (token lists, best first) as a TokenTree with a one-hot q on every node.

    A branch that starts like an earlier one shares its nodes and splits where it differs, so siblings are
    distinct tokens, tried in the order their branches came. Each branch ends after the first of `stop_ids`
    (nothing after an end of text could be committed). Nodes are added until `budget` is spent: the last branch
    that fits only partly keeps its first tokens, and later ones are left out.
    """
    tokens: list[int] = []
    parents: list[int] = []
    child: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for branch in branches:
        node = ROOT
        for t in cut_at_stop([int(t) for t in branch], stop_ids)[0]:
            nxt = child.get((node, t))
            if nxt is None:
                if len(tokens) >= budget:
                    break
                nxt = child[(node, t)] = len(tokens)
                tokens.append(t)
                parents.append(node)
            node = nxt
        if len(tokens) >= budget:
            break
    ids = torch.tensor(tokens, dtype=torch.long, device=device)
    return TokenTree(ids, parents, OneHot(ids, vocab_size))
