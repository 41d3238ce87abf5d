"""Tree drafts from a draft model: each node's children are chosen from the draft's distribution after it, one
draft forward pass per depth for the whole frontier (`CachedLM.logits_for_tree`, a tree attention mask).

How children are chosen decides the q each child carries (see `core.tree`), so every mode is verified exactly:
- "top-k": the `width` likeliest ids of the draft's unwarped distribution, deterministically: q is one-hot on each
  child (EAGLE-style static trees; the likeliest guesses, whatever the temperature);
- "sampled": `width` i.i.d. draws from the warped draft distribution d: q = d for every child (SpecInfer);
- "distinct": draws without replacement from d: q is d with the earlier siblings removed and renormalized
  (Sequoia's SpecTree); a node has fewer children when d has fewer ids;
- "dynamic": a tree shaped by the draft's confidence (EAGLE-2, `draft_dynamic_tree`): at depth i the widths[i]
  frontier nodes with the highest path probability get widths[i] top-k children each, and the round keeps the
  candidates with the highest path probability, as many as `TreeBudget` finds worth their width on this machine.
  Every choice is a deterministic function of the draft's logits, so q is one-hot on every node.
A chain is widths (1, 1, ...).

Copy drafters (ngram, predicted) build trees of their own with `propose_tree(committed, depth, budget, cfg, gen)`
(the `TreeDrafter` protocol): every distinct continuation they find becomes a branch (`branch_tree`), each child
chosen deterministically, so q is one-hot on every node. For them a widths shape only bounds the tree
(`copy_tree_bounds`: its length is the depth, its node count the budget); where the branches split follows the
text.
"""

from __future__ import annotations

import math
from typing import Protocol

import torch

from specdec.core.errors import InvalidInputError, whole_number
from specdec.core.kvcache import CachedLM
from specdec.core.settings import MAX_TREE_NODES, TREE_MODES
from specdec.core.sampling import OneHot, SamplingConfig, cat_rows, dense, distribution, sample
from specdec.core.stop import cut_at_stop
from specdec.core.tree import ROOT, TokenTree
from specdec.drafters.gain import TIME_DECAY, WidthCost, round_ms



def check_widths(widths, mode: str) -> list[int]:
    """The tree shape as a list of children per node at each depth; a clear message for a bad one."""
    if mode not in TREE_MODES:
        raise InvalidInputError(f"tree mode must be one of {', '.join(TREE_MODES)}, got {mode!r}")
    widths = [whole_number(w, "a tree width", 1, 8) for w in widths]
    if not widths:
        raise InvalidInputError("a tree needs at least one depth, e.g. widths 3,2,1")
    if mode == "dynamic":
        return widths  # candidates are cut to at most MAX_TREE_NODES by path probability, never refused
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


def draft_tree_rows(lm: CachedLM, tails: torch.Tensor, real: torch.Tensor, depths: list[int], widths: list[int],
                    mode: str, cfg: SamplingConfig, gen: torch.Generator | None):
    """`draft_tree` for B rows of one batched draft cache at once: one draft pass per depth for every row's frontier.

    tails [B, w] / real [B, w]: per row, the committed tokens its cache lacks, right-aligned behind padding (a row
    with nothing real drafts no tree); depths[b]: how many of `widths` row b grows. The first pass feeds the tails
    and gives each row's root its children; each later pass feeds the nodes of the last depth, row b's node at depth
    d sitting at position (row b's text length - 1 + d) and seeing its row's text, its ancestors' slots and itself,
    never a sibling, a cousin or another row (`CachedLM.score`'s sees: the ancestors fed by earlier passes). The
    last depth's nodes are never fed: nothing reads their logits. Children are chosen per node exactly as
    `draft_tree` does (`choose_children`: q is what each child was drawn from, a row's draws in node order).

    Returns (trees: TokenTree | None per row, columns: per row the cache column of each fed node, None for nodes
    never fed). The node slots stay in the cache: the caller keeps the committed path's and drops the rest.
    """
    b_rows = tails.shape[0]
    logits = lm.score(tails, pad=~real, n_logits=1)[:, -1:]  # [B, 1, V]: after each row's committed text
    lengths = lm.counts(b_rows)  # text slots per row, the last committed token included
    first = lm.width  # the column the first node pass writes
    grow = [bool(real[b].any()) and depths[b] > 0 for b in range(b_rows)]
    tokens: list[list[int]] = [[] for _ in range(b_rows)]
    parents: list[list[int]] = [[] for _ in range(b_rows)]
    qs: list[list] = [[] for _ in range(b_rows)]
    level: list[list[int]] = [[] for _ in range(b_rows)]  # node depth (1 = a child of the root)
    columns: list[list[int | None]] = [[] for _ in range(b_rows)]
    frontier: list[list[int]] = [[ROOT] for _ in range(b_rows)]  # the nodes whose logits are in `logits`, in order
    for d, width in enumerate(widths):
        grown: list[list[int]] = [[] for _ in range(b_rows)]
        for b in range(b_rows):
            if not grow[b] or d >= depths[b]:
                continue
            for j, node in enumerate(frontier[b]):
                xs, rows = choose_children(logits[b, j], width, mode, cfg, gen)
                for x, q in zip(xs, rows):
                    grown[b].append(len(tokens[b]))
                    tokens[b].append(int(x))
                    parents[b].append(node)
                    qs[b].append(q)
                    level[b].append(d + 1)
                    columns[b].append(None)
        frontier = grown
        if d + 1 >= len(widths) or not any(grown[b] and d + 1 < depths[b] for b in range(b_rows)):
            break
        # Feed this depth's nodes of the rows that grow deeper; a node sees its ancestors' columns.
        k = max(len(g) if d + 1 < depths[b] else 0 for b, g in enumerate(grown))
        start = lm.width
        ids = torch.zeros(b_rows, k, dtype=torch.long)
        positions = torch.zeros(b_rows, k, dtype=torch.long)
        fed = torch.zeros(b_rows, k, dtype=torch.bool)
        sees = torch.zeros(b_rows, k, start, dtype=torch.bool)
        sees[:, :, :first] = True  # the row's text (the scorer ANDs its own valid slots: holes and padding stay hidden)
        for b, nodes in enumerate(grown):
            if d + 1 >= depths[b]:
                frontier[b] = []
                continue
            for j, node in enumerate(nodes):
                ids[b, j], positions[b, j], fed[b, j] = tokens[b][node], lengths[b] - 1 + level[b][node], True
                columns[b][node] = start + j
                par = parents[b][node]
                while par != ROOT:
                    sees[b, j, columns[b][par]] = True
                    par = parents[b][par]
        dev = lm.device
        eye = torch.eye(k, dtype=torch.bool, device=dev).expand(b_rows, k, k)
        logits = lm.score(ids.to(dev), positions.to(dev), eye, pad=~fed.to(dev), sees=sees.to(dev))
    trees = [TokenTree(torch.tensor(tokens[b], dtype=torch.long, device=lm.device), parents[b], _rows(qs[b]))
             if tokens[b] else None for b in range(b_rows)]
    return trees, columns


def path_confidence(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """log of how likely the draft thinks each next token is, [m, V]: its warped distribution (what the target's p
    will be warped to), or, greedy, its plain softmax (a one-hot warp would rank nothing)."""
    if cfg.greedy:
        return torch.log_softmax(logits.float(), -1)
    return dense(distribution(logits, cfg)).float().log()


def draft_dynamic_tree(lm: CachedLM, committed: list[int], widths: list[int], cfg: SamplingConfig,
                       budget: "TreeBudget | None" = None, stop_ids=()) -> tuple[TokenTree, list[float], int]:
    """EAGLE-2's dynamic tree from the draft model: (the tree, each node's path probability, draft passes run).

    Depth 0 takes the root's widths[0] likeliest children. Depth i > 0 expands the widths[i] nodes of the last
    depth with the highest path probability (the product of the draft's probabilities from the root, in
    `path_confidence`), widths[i] top-k children each; one draft pass scores just those nodes (`CachedLM.grow_tree`:
    their ancestors are already in the draft's cache), so a pass is widths[i] wide however big the tree grows. Then every candidate is ranked by path probability and
    the best `budget.keep(sorted path probabilities)` are kept (no budget: all, at most MAX_TREE_NODES); a child
    never ranks above its parent, so the kept nodes form a tree. A depth is drafted only while `budget.deeper(gain)`
    says the tokens it can add (at most the summed path probability of the nodes it would expand) are worth a
    draft pass. End-of-text candidates are never expanded.
    """
    tokens: list[int] = []  # every candidate, parents before children
    parents: list[int] = []
    score: list[float] = []  # log path probability
    fed: dict[int, int] = {}  # candidate -> its node number in the draft's grown tree (the expanded ones)
    frontier = [ROOT]
    stops = set(int(t) for t in stop_ids)
    passes = 0
    for depth, width in enumerate(widths):
        if depth == 0:
            rows = lm.tree_root(committed)
        else:
            order = sorted((c for c in frontier if tokens[c] not in stops), key=lambda c: (-score[c], c))[:width]
            if not order or (budget is not None and not budget.deeper(sum(math.exp(score[c]) for c in order))):
                break
            rows = lm.grow_tree([tokens[c] for c in order],
                                [fed[parents[c]] if parents[c] != ROOT else ROOT for c in order])
            for c in order:
                fed[c] = len(fed)
            frontier = order
        passes += 1
        conf = path_confidence(rows, cfg)
        grown = []
        for node, c in zip(frontier if depth else [ROOT], conf):
            top = torch.topk(c, min(width, c.shape[-1]))
            base = score[node] if node != ROOT else 0.0
            for v, x in zip(top.values.tolist(), top.indices.tolist()):
                if v == float("-inf"):
                    break
                grown.append(len(tokens))
                tokens.append(int(x))
                parents.append(node)
                score.append(base + v)
        frontier = grown
    ranked = sorted(range(len(tokens)), key=lambda c: (-score[c], c))
    probs = [math.exp(score[c]) for c in ranked]
    n = min(len(ranked), MAX_TREE_NODES)
    if budget is not None and ranked:
        n = max(1, min(n, int(budget.keep(probs[:n]))))
    kept = sorted(ranked[:n])  # creation order: parents first, siblings by confidence
    pos = {c: j for j, c in enumerate(kept)}
    ids = torch.tensor([tokens[c] for c in kept], dtype=torch.long, device=lm.device)
    tree = TokenTree(ids, [pos[parents[c]] if parents[c] != ROOT else ROOT for c in kept], OneHot(ids, lm.vocab_size))
    return tree, [math.exp(score[c]) for c in kept], passes


class TreeBudget:
    """What a dynamic tree is worth on this machine, from this run's own rounds.

    keep(probs): how many candidates to verify -- the n with the most expected tokens per unit of round time,
    E(n) / (1 + rho n), where E(n) = 1 + the sum of the n best path probabilities (each node's chance of being
    accepted, as the draft sees it: EAGLE-2's value of a tree) and rho the measured cost of one more verified node
    against a round that verifies none (`gain.WidthCost`: width is nearly free on some CPUs and costs ~10 ms a
    node on others).
    deeper(gain): whether one more draft pass (its measured ms) buys its cost in tokens: at most `gain` more
    accepted tokens, each worth this run's measured ms per committed token. Until a round has been measured,
    every depth is drafted.
    """

    def __init__(self):
        self.timing = WidthCost()
        self._sums = [0.0, 0.0, 0.0, 0.0]  # decayed: draft ms, draft passes, round ms, committed tokens

    def keep(self, probs: list[float]) -> int:
        rho = self.timing.per_token()
        best, best_rate, tokens = 1, -1.0, 1.0
        for n, s in enumerate(probs, 1):
            tokens += s
            rate = tokens / (1 + rho * n)
            if rate > best_rate:
                best, best_rate = n, rate
        return best

    def deeper(self, gain: float) -> bool:
        draft_ms, passes, round_ms, tokens = self._sums
        if passes <= 0 or tokens <= 0:
            return True
        return gain * round_ms / tokens >= draft_ms / passes

    def observe(self, rnd, nodes: int, passes: int) -> None:
        """A finished round (its chain view, `Round`) that verified `nodes` tree nodes after `passes` draft passes."""
        self.timing.observe(rnd, nodes)
        if rnd.index > 0 and passes > 0:  # round one also ran the prompt
            self._sums = [TIME_DECAY * v for v in self._sums]
            for j, v in enumerate((rnd.draft_ms, passes, round_ms(rnd), len(rnd.committed_ids))):
                self._sums[j] += v


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
