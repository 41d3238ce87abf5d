"""Exactness of the tree rule (`core.tree.verify_tree`) for every way children are chosen.

1. Closed form, depth-1 trees, V=5: an enumerator written from the rule's definition (not from tree.py) sums over
   every draw of the siblings and gives P(first emitted token) = p to 1e-9 for i.i.d., without-replacement,
   deterministic top-k and mixed siblings, and for greedy (one-hot) targets; verify_tree's own accept probabilities
   and residuals, read with forced uniforms, match the enumerator and assemble the same law.
2. Monte Carlo on a toy "model" (tables p(.|prefix), d(.|prefix) over V=5): trees are drafted from d, verified,
   and decoding continues until 3 tokens are out; the joint law of those 3 tokens is compared with the target's
   exact law by chi-square.
3. The same harness fails on planted bugs: top-k children verified as if sampled, without-replacement children
   verified with the i.i.d. q, and a repair that forgets the refused siblings.
4. Width-1 trees agree with `core.verify.verify` in distribution and, with the same uniforms, decision by decision.
5. Greedy: the walk follows the child holding argmax p, emits argmax p when no child holds it, the bonus at a leaf.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chi2_contingency, chisquare

from specdec.core.sampling import OneHot, dense
from specdec.core.tree import ROOT, TokenTree, verify_tree
from specdec.core.verify import residual_distribution, verify, verify_batch

V = 5


@pytest.fixture(autouse=True)
def _one_thread():
    """Tens of thousands of tiny tensor ops: one thread avoids paying thread hand-offs on every one."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _onehot64(x: int) -> np.ndarray:
    out = np.zeros(V)
    out[x] = 1.0
    return out


def _forgetful_repair(r, q):
    """Planted bug: a refused sibling leaves the residual as it was (r stays p at every node)."""
    return r


# ============================================================================== 1. closed form (depth-1 trees)


def rule_residual(r: np.ndarray, q: np.ndarray) -> np.ndarray:
    """normalize(max(0, r - q)); r itself when nothing is left (a refusal then has probability 0)."""
    res = np.maximum(0.0, r - q)
    mass = res.sum()
    return res / mass if mass > 1e-12 else r


def rule_law(r: np.ndarray, children: list[tuple[int, np.ndarray]], repair=rule_residual) -> np.ndarray:
    """The rule's law of the emitted token at a node whose children (token, q it was drawn from) are all leaves,
    by recursion over the siblings: accept x with a = min(1, r(x)/q(x)), else go on with r <- repair(r, q)."""
    if not children:
        return r
    (x, q), rest = children[0], children[1:]
    a = min(1.0, r[x] / q[x]) if q[x] > 0 else float(r[x] > 0)
    return a * _onehot64(x) + (1.0 - a) * rule_law(repair(r, q), rest, repair)


def sibling_draws(d: np.ndarray, k: int, mode: str) -> list[tuple[float, list[int], list[np.ndarray]]]:
    """Every way a drafter in `mode` can choose up to k children from d: (probability, tokens, q of each token
    given its earlier siblings). Without replacement stops early when d has no mass left."""
    if mode == "iid":
        out = []
        for toks in itertools.product(range(V), repeat=k):
            prob = float(np.prod([d[t] for t in toks]))
            if prob > 0:
                out.append((prob, list(toks), [d] * k))
        return out
    if mode == "topk":
        toks = [int(t) for t in np.argsort(-d, kind="stable")[:k]]
        return [(1.0, toks, [_onehot64(t) for t in toks])]
    if mode == "wor":
        return _without_replacement(d, k, [], [], 1.0)
    if mode == "top1+wor":  # a deterministic first child (e.g. the greedy continuation), then sampled alternatives
        top = int(np.argmax(d))
        rest = d.copy()
        rest[top] = 0.0
        return _without_replacement(rest, k - 1, [top], [_onehot64(top)], 1.0)
    raise ValueError(mode)


def _without_replacement(rem, k, toks, qs, prob):
    if k == 0 or rem.sum() <= 0:
        return [(prob, toks, qs)]
    q = rem / rem.sum()
    out = []
    for t in np.flatnonzero(q > 0):
        left = rem.copy()
        left[t] = 0.0
        out += _without_replacement(left, k - 1, toks + [int(t)], qs + [q], prob * float(q[t]))
    return out


def _dist(gen, scale=1.5, keep=V):
    logits = torch.randn(V, generator=gen) * scale
    if keep < V:
        logits[torch.argsort(logits)[: V - keep]] = -torch.inf
    return torch.softmax(logits, -1)


def _closed_form_cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """(p, d) float32 pairs: what verify_tree gets; the enumerator reads the same numbers in float64."""
    g = torch.Generator().manual_seed(11)
    same = _dist(g)
    cases = {
        "random": (_dist(g), _dist(g)),
        "draft-overconfident": (_dist(g, 1.0), _dist(g, 3.0)),
        "sparse-target": (_dist(g, 1.5, keep=3), _dist(g)),
        "draft-misses-a-token": (_dist(g), _dist(g)),
        "identical": (same, same.clone()),
        "disjoint": (torch.tensor([0.5, 0.3, 0.2, 0.0, 0.0]), torch.tensor([0.0, 0.0, 0.2, 0.5, 0.3])),
    }
    p, d = cases["draft-misses-a-token"]  # the draft never proposes the target's favourite token
    d[int(p.argmax())] = 0.0
    d /= d.sum()
    return cases


CF_CASES = _closed_form_cases()
CF_MODES = ["iid", "wor", "topk", "top1+wor"]


def _f64(t: torch.Tensor) -> np.ndarray:
    a = t.double().numpy()
    return a / a.sum()


def _targets(p32: torch.Tensor) -> dict[str, np.ndarray]:
    p = _f64(p32)
    return {"sampled": p, "greedy": _onehot64(int(np.argmax(p)))}


@pytest.mark.parametrize("mode", CF_MODES)
@pytest.mark.parametrize("case", list(CF_CASES))
def test_closed_form_first_token_is_p(case, mode):
    """The rule itself (enumerated, independent of tree.py) gives P(first token) = p exactly, k = 1, 2, 3 siblings."""
    p32, d32 = CF_CASES[case]
    d = _f64(d32)
    for k, (name, p) in itertools.product([1, 2, 3], _targets(p32).items()):
        law = np.zeros(V)
        draws = sibling_draws(d, k, mode)
        assert abs(sum(prob for prob, _, _ in draws) - 1.0) < 1e-12
        for prob, toks, qs in draws:
            law += prob * rule_law(p, list(zip(toks, qs)))
        assert np.abs(law - p).max() < 1e-9, (case, mode, k, name, law, p)


def _tree_inputs(toks, qs, target: str, p32: torch.Tensor, q_as: str):
    """A depth-1 TokenTree and its p rows as verify_tree gets them (p rows after the leaves are arbitrary)."""
    tokens = torch.tensor(toks)
    if q_as == "ids":  # deterministic children as the drafters report them
        q = OneHot(tokens, V)
    else:
        q = torch.from_numpy(np.stack(qs).astype(np.float32))
    g = torch.Generator().manual_seed(len(toks))
    leaves = torch.stack([_dist(g) for _ in toks])
    if target == "greedy-ids":
        p = OneHot(torch.tensor([int(p32.argmax())] + leaves.argmax(-1).tolist()), V)
    elif target == "greedy-dense":
        p = torch.cat([torch.nn.functional.one_hot(p32.argmax(), V).float()[None], leaves])
    else:
        p = torch.cat([p32[None], leaves])
    return TokenTree(tokens, [ROOT] * len(toks), q), p


def law_from_verify_tree(p32, d, k, mode, target, q_as="dense", claim_q=None, repair=residual_distribution):
    """P(first token) assembled from verify_tree's own numbers: for every sibling draw, all uniforms = 1 refuse
    every child and report each accept probability and the residual; then
    P(x) = sum_draws prob * [sum_j prod_{i<j}(1 - a_i) a_j 1{x = x_j} + prod_i (1 - a_i) residual(x)].
    Also checks that u = 0 accepts child j exactly when a_j > 0. `claim_q` replaces the q rows the tree states."""
    law = np.zeros(V)
    for prob, toks, qs in sibling_draws(d, k, mode):
        stated = qs if claim_q is None else [claim_q] * len(qs)
        tree, p = _tree_inputs(toks, stated, target, p32, q_as)
        refuse = verify_tree(tree, p, torch.Generator().manual_seed(0), uniforms=[1.0] * len(toks), repair=repair)
        assert refuse.path == [] and [s.node for s in refuse.steps] == list(range(len(toks)))
        assert not any(s.accepted for s in refuse.steps) and refuse.residual is not None
        a = [s.accept_prob for s in refuse.steps]
        for j, a_j in enumerate(a):
            keep = verify_tree(tree, p, torch.Generator().manual_seed(0), uniforms=[1.0] * j + [0.0] * (k - j),
                               repair=repair)
            if a_j > 0:
                assert keep.path == [j] and keep.tokens[0] == toks[j] and keep.bonus and len(keep.steps) == j + 1
            else:  # u = 0 is not below an accept probability of 0
                assert keep.path == [] or keep.path[0] > j
        left = 1.0
        for x, a_j in zip(toks, a):
            law += prob * left * a_j * _onehot64(x)
            left *= 1.0 - a_j
        law += prob * left * dense(refuse.residual).double().numpy()
    return law


FORCED = [(m, "dense") for m in CF_MODES] + [("topk", "ids")]


@pytest.mark.parametrize("mode,q_as", FORCED)
@pytest.mark.parametrize("case", list(CF_CASES))
def test_forced_uniforms_read_the_enumerators_accept_probs(case, mode, q_as):
    """verify_tree's accept probabilities and residual, read with forced uniforms, are the enumerator's; the law
    they assemble is p (float32 arithmetic: 1e-5). Greedy targets come as OneHot ids and as dense one-hot rows."""
    p32, d32 = CF_CASES[case]
    d = _f64(d32)
    for k, target in itertools.product([1, 2, 3], ["sampled", "greedy-ids", "greedy-dense"]):
        p = _targets(p32)["sampled" if target == "sampled" else "greedy"]
        for prob, toks, qs in sibling_draws(d, k, mode):
            tree, prow = _tree_inputs(toks, qs, target, p32, q_as)
            v = verify_tree(tree, prow, uniforms=[1.0] * len(toks))
            # A residual reached with probability ~0 (q took all of r: p = d, all but rounding) is rounding noise,
            # in float32 and float64 alike, and weighs nothing in the law: compare what is reached with weight.
            r, reach = p, 1.0
            for x, q, step in zip(toks, qs, v.steps):
                a = min(1.0, r[x] / q[x]) if q[x] > 0 else float(r[x] > 0)
                if reach > 1e-4:
                    assert abs(step.accept_prob - a) < 1e-5, (toks, v.steps, x, a)
                r, reach = rule_residual(r, q), reach * (1.0 - a)
            if reach > 1e-4:
                assert np.allclose(dense(v.residual).double().numpy(), r, atol=1e-5), (toks, v.residual, r)
        law = law_from_verify_tree(p32, d, k, mode, target, q_as)
        assert np.abs(law - p).max() < 1e-5, (case, mode, k, target, law, p)


PLANTED_CF = {
    # top-k children stated as drawn from d
    "topk-stated-as-sampled": {"mode": "topk", "claim": "d"},
    # without-replacement siblings stated with the i.i.d. q
    "without-replacement-stated-as-iid": {"mode": "wor", "claim": "d"},
    # the repair forgets the refused siblings
    "repair-forgets-siblings": {"mode": "iid", "repair": "forget"},
}


@pytest.mark.parametrize("bug", list(PLANTED_CF))
def test_closed_form_catches_the_planted_bugs(bug):
    """Both the enumerator and verify_tree's assembled law move off p by a lot under each planted bug (so the 1e-9
    and 1e-5 checks above can fail)."""
    spec = PLANTED_CF[bug]
    worst_enum = worst_tree = 0.0
    for p32, d32 in CF_CASES.values():
        p, d = _f64(p32), _f64(d32)
        for k in (2, 3):
            repair64 = (lambda r, q: r) if spec.get("repair") else rule_residual
            law = np.zeros(V)
            for prob, toks, qs in sibling_draws(d, k, spec["mode"]):
                stated = [d] * len(qs) if spec.get("claim") else qs
                law += prob * rule_law(p, list(zip(toks, stated)), repair64)
            worst_enum = max(worst_enum, float(np.abs(law - p).max()))
            law_t = law_from_verify_tree(p32, d, k, spec["mode"], "sampled", claim_q=d if spec.get("claim") else None,
                                         repair=_forgetful_repair if spec.get("repair") else residual_distribution)
            assert np.allclose(law_t, law, atol=1e-5)  # verify_tree does what the (buggy) rule says
            worst_tree = max(worst_tree, float(np.abs(law_t - p).max()))
    assert worst_enum > 0.05 and worst_tree > 0.05, (bug, worst_enum, worst_tree)


# ================================================================== 2-3. Monte Carlo on a toy model, planted bugs

MAX_PREFIX = 6  # tokens: 2 emitted before a last round + a depth-3 tree + one spare
N_MC = 12_000  # draws for the correct rule (0.4-1 ms each on a shared 2-core machine, depending on its load)
N_BUG = 8_000  # draws for a planted bug: the weakest one (3x1 without replacement stated as iid) gives p ~ 1e-9 at 5000
SEED = 0


class Toy:
    """A fixed random table of next-token distributions over V tokens for every prefix up to MAX_PREFIX tokens:
    p for the target, d for the draft. Prefix (t1, ..., tn) has code sum over bijective base-V digits t_i + 1, so
    the code after token t is code * V + t + 1 and the empty prefix is 0. The target's logits are N(0, 1) * 2
    (a sharpening temperature of 0.5); the draft's are the target's * 1.5 plus N(0, 1) * 2.5 noise: an
    over-confident, often wrong draft, so children are accepted, refused and repaired in a mix (at the root, all
    children are refused in 2-45% of rounds depending on the mode, and the whole depth is accepted in 15-70%)."""

    def __init__(self, seed: int, t_scale: float = 2.0, d_sharp: float = 1.5, noise: float = 2.5):
        g = torch.Generator().manual_seed(seed)
        n = (V ** (MAX_PREFIX + 1) - 1) // (V - 1)
        tl = torch.randn(n, V, generator=g) * t_scale
        dl = tl * d_sharp + torch.randn(n, V, generator=g) * noise
        self.p32 = torch.softmax(tl, -1).numpy()
        d32 = torch.softmax(dl, -1).numpy()
        self.p64 = self.p32.astype(np.float64) / self.p32.sum(1, keepdims=True, dtype=np.float64)
        self.d64 = d32.astype(np.float64) / d32.sum(1, keepdims=True, dtype=np.float64)

    def law3(self) -> np.ndarray:
        """The target's exact law of its first 3 tokens, flattened over V^3 (index (t1 * V + t2) * V + t3)."""
        out = np.zeros((V, V, V))
        for a in range(V):
            for b in range(V):
                out[a, b] = self.p64[0, a] * self.p64[a + 1, b] * self.p64[(a + 1) * V + b + 1]
        return out.ravel()


def _pick(weights: list[float], u: float) -> int:
    """Inverse CDF over unnormalized weights (pure Python: V = 5, and numpy's per-call cost would dominate)."""
    x, last = u * sum(weights), 0
    for t, w in enumerate(weights):
        if w > 0:
            last = t
            if x < w:
                return t
            x -= w
    return last


def choose_children(d: np.ndarray, w: int, mode: str, uniforms, state_as_iid: bool):
    """w children of a node whose draft distribution is d: [(token, q the tree states for it)]. The stated q is
    the one the token was drawn from given its earlier siblings, unless `state_as_iid` (the planted bugs: d)."""
    if mode == "topk":
        return [(int(t), d if state_as_iid else _onehot64(int(t))) for t in np.argsort(-d, kind="stable")[:w]]
    rem = d.tolist()
    if mode == "iid":
        return [(_pick(rem, next(uniforms)), d) for _ in range(w)]
    out = []
    if mode == "top1+wor":
        t = int(np.argmax(d))
        out.append((t, d if state_as_iid else _onehot64(t)))
        rem[t] = 0.0
    elif mode != "wor":
        raise ValueError(mode)
    while len(out) < w and sum(rem) > 0:
        t = _pick(rem, next(uniforms))
        out.append((t, d if state_as_iid else np.array(rem) / sum(rem)))
        rem[t] = 0.0
    return out


def _uniform_stream(rng: np.random.Generator):
    while True:
        yield from rng.random(4096).tolist()


def draft_tree(toy: Toy, code: int, widths, mode: str, uniforms, state_as_iid=False):
    """A tree drafted from d after the prefix `code`, level by level (breadth first: parents before children, each
    node's siblings in the order chosen), and the target's p rows for it: row 0 at the prefix, row i+1 after node i."""
    tokens, parents, qrows, codes = [], [], [], [code]
    frontier = [(ROOT, code)]
    for w in widths:
        nxt = []
        for node, c in frontier:
            for t, q in choose_children(toy.d64[c], w, mode, uniforms, state_as_iid):
                nxt.append((len(tokens), c * V + t + 1))
                tokens.append(t)
                parents.append(node)
                qrows.append(q)
                codes.append(c * V + t + 1)
        frontier = nxt
    tok = torch.tensor(tokens)
    q = OneHot(tok, V) if mode == "topk" and not state_as_iid else torch.from_numpy(np.stack(qrows).astype(np.float32))
    return TokenTree(tok, parents, q), torch.from_numpy(toy.p32[codes])


def decode_three(toy: Toy, widths, mode: str, n: int, seed: int, state_as_iid=False, repair=residual_distribution):
    """n independent decodes of 3 tokens from the empty prefix, one drafted tree per round. Returns the counts of
    the V^3 joint outcomes and the histogram of the first round's accepted path length."""
    uniforms, gen = _uniform_stream(np.random.default_rng(seed)), torch.Generator().manual_seed(seed + 1)
    counts, first_path = np.zeros(V ** 3), np.zeros(len(widths) + 1)
    for _ in range(n):
        out, code = [], 0
        while len(out) < 3:
            tree, p = draft_tree(toy, code, widths, mode, uniforms, state_as_iid)
            v = verify_tree(tree, p, gen, repair=repair)
            if not out:
                first_path[v.n_accepted] += 1
            for t in v.tokens:
                out.append(t)
                code = code * V + t + 1
        counts[(out[0] * V + out[1]) * V + out[2]] += 1
    return counts, first_path / n


def pvalue(counts: np.ndarray, law: np.ndarray) -> float:
    """Chi-square goodness of fit; cells expected to hold fewer than 5 draws are pooled into one."""
    exp = law * counts.sum() / law.sum()
    if counts[exp == 0].sum() > 0:
        return 0.0
    small = exp < 5
    obs, e = np.append(counts[~small], counts[small].sum()), np.append(exp[~small], exp[small].sum())
    keep = e > 0
    return float(chisquare(obs[keep], e[keep] * obs[keep].sum() / e[keep].sum()).pvalue)


MC_CASES = [(m, w) for m in ("iid", "wor", "topk") for w in ((2, 2), (3, 1), (2, 2, 2))] + [
    ("top1+wor", (3, 1)), ("top1+wor", (2, 2))]


@pytest.mark.stat
@pytest.mark.parametrize("mode,widths", MC_CASES, ids=[f"{m}-{'x'.join(map(str, w))}" for m, w in MC_CASES])
def test_tree_rounds_follow_the_target(mode, widths):
    toy = Toy(SEED)
    counts, first_path = decode_three(toy, widths, mode, N_MC, SEED + 100)
    # the draws exercise every outcome of a round: all root children refused, each depth accepted, the bonus
    assert (first_path > 0.01).all(), first_path
    pv = pvalue(counts, toy.law3())
    print(f"{mode} {widths}: p-value {pv:.3g}, first round's accepted depth {first_path.round(3)}")
    assert pv > 1e-3, (mode, widths, pv, first_path)


PLANTED_MC = {
    # deterministic top-k children verified as if sampled from d (q_x = d instead of one-hot)
    "topk-verified-as-sampled-2x2": {"mode": "topk", "widths": (2, 2), "state_as_iid": True},
    "topk-verified-as-sampled-3x1": {"mode": "topk", "widths": (3, 1), "state_as_iid": True},
    # without-replacement siblings verified with the i.i.d. q (earlier siblings not removed from q)
    "without-replacement-verified-as-iid-3x1": {"mode": "wor", "widths": (3, 1), "state_as_iid": True},
    "without-replacement-verified-as-iid-2x2": {"mode": "wor", "widths": (2, 2), "state_as_iid": True},
    # the repair forgets the refused siblings: r stays p
    "repair-forgets-siblings-iid-2x2": {"mode": "iid", "widths": (2, 2), "repair": _forgetful_repair},
    "repair-forgets-siblings-wor-3x1": {"mode": "wor", "widths": (3, 1), "repair": _forgetful_repair},
}


@pytest.mark.stat
@pytest.mark.parametrize("bug", list(PLANTED_MC))
def test_planted_bug_breaks_the_joint_law(bug):
    spec = dict(PLANTED_MC[bug])
    toy = Toy(SEED)
    counts, _ = decode_three(toy, spec.pop("widths"), spec.pop("mode"), N_BUG, SEED + 100, **spec)
    pv = pvalue(counts, toy.law3())
    print(f"{bug}: p-value {pv:.3g}")
    assert pv < 1e-3, (bug, pv)


# ===================================================================================== 4. width 1 = the chain


def draft_chain(toy: Toy, code: int, gamma: int, rng, one_hot: bool):
    """gamma guesses from d (or d's argmax, deterministic, with one-hot q), and the target's gamma + 1 rows."""
    toks, qrows, codes = [], [], [code]
    for _ in range(gamma):
        d = toy.d64[codes[-1]]
        t = int(np.argmax(d)) if one_hot else _pick(d.tolist(), rng.random())
        toks.append(t)
        qrows.append(d)
        codes.append(codes[-1] * V + t + 1)
    tok = torch.tensor(toks)
    q = OneHot(tok, V) if one_hot else torch.from_numpy(np.stack(qrows).astype(np.float32))
    return tok, q, torch.from_numpy(toy.p32[codes])


def decode_three_chain(toy: Toy, gamma: int, n: int, seed: int, use_tree: bool) -> np.ndarray:
    rng, gen = np.random.default_rng(seed), torch.Generator().manual_seed(seed + 1)
    counts = np.zeros(V ** 3)
    for _ in range(n):
        out, code = [], 0
        while len(out) < 3:
            tok, q, p = draft_chain(toy, code, gamma, rng, one_hot=False)
            emitted = verify_tree(TokenTree.chain(tok, q), p, gen).tokens if use_tree else verify(tok, q, p, gen).tokens
            for t in emitted:
                out.append(t)
                code = code * V + t + 1
        counts[(out[0] * V + out[1]) * V + out[2]] += 1
    return counts


@pytest.mark.stat
def test_chain_tree_and_verify_have_the_same_law():
    """A width-1 tree through verify_tree and the same chain through verify: each matches the target's joint law
    of 3 tokens, and the two histograms are one law (chi-square test of homogeneity)."""
    toy = Toy(SEED)
    law = toy.law3()
    n = N_MC // 2
    by_tree = decode_three_chain(toy, 3, n, SEED + 200, use_tree=True)
    by_chain = decode_three_chain(toy, 3, n, SEED + 300, use_tree=False)
    cells = (by_tree + by_chain) >= 10
    table = np.stack([np.append(by_tree[cells], by_tree[~cells].sum()), np.append(by_chain[cells], by_chain[~cells].sum())])
    pv = (pvalue(by_tree, law), pvalue(by_chain, law), float(chi2_contingency(table[:, table.sum(0) > 0]).pvalue))
    print(f"p-values: tree vs target {pv[0]:.3g}, verify vs target {pv[1]:.3g}, tree vs verify {pv[2]:.3g}")
    assert min(pv) > 1e-3, pv


@pytest.mark.parametrize("one_hot", [False, True], ids=["sampled", "one-hot"])
def test_chain_tree_and_verify_decide_alike_with_the_same_uniforms(one_hot):
    """Same uniforms and the same generator: the same accept probabilities, accepted prefix, repair distribution,
    and emitted tokens, round by round."""
    toy, rng = Toy(SEED + 1), np.random.default_rng(5)
    outcomes = set()
    for i in range(400):
        gamma = 1 + i % 4
        code = int(rng.integers(0, V + 1))  # the empty prefix or a 1-token one
        tok, q, p = draft_chain(toy, code, gamma, rng, one_hot)
        u = rng.random(gamma).astype(np.float32)
        ref = verify(tok, q, p, torch.Generator().manual_seed(i), uniforms=torch.from_numpy(u))
        got = verify_tree(TokenTree.chain(tok, q), p, torch.Generator().manual_seed(i), uniforms=u.tolist())
        assert got.tokens == ref.tokens and got.n_accepted == ref.n_accepted and got.bonus == ref.bonus
        assert got.path == list(range(ref.n_accepted))
        tried = min(ref.n_accepted + 1, gamma)
        assert [s.node for s in got.steps] == list(range(tried))
        assert np.allclose([s.accept_prob for s in got.steps], ref.accept_probs[:tried].numpy(), atol=1e-6)
        assert [s.accepted for s in got.steps] == [j < ref.n_accepted for j in range(tried)]
        assert torch.allclose(dense(got.final_dist), dense(ref.final_dist), atol=1e-6)
        outcomes.add(ref.n_accepted)
    assert outcomes == {0, 1, 2, 3, 4} if not one_hot else len(outcomes) > 2


def test_teaching_repairs_get_dense_rows_as_in_the_chain():
    """The `repair=` seam reads dense rows in verify_batch; verify_tree gives a custom repair the same (a repair
    written for tensors, like the lab's 'from-q', must not meet OneHot rows)."""
    def from_q(r, q):  # specdec.learn.lab.repair_from_q, a wrong repair written for dense rows
        return torch.where(q.sum(-1, keepdim=True) > 0, q, r)

    toy, rng = Toy(SEED), np.random.default_rng(1)
    for i in range(50):
        tok, q, p = draft_chain(toy, 0, 2, rng, one_hot=True)
        u = rng.random(2).astype(np.float32)
        ref = verify_batch(tok[None], q[None], p[None], torch.Generator().manual_seed(i), repair=from_q,
                           uniforms=torch.from_numpy(u)[None])
        got = verify_tree(TokenTree.chain(tok, q), p, torch.Generator().manual_seed(i), uniforms=u.tolist(),
                          repair=from_q)
        assert got.n_accepted == int(ref.n_accepted[0]) and got.tokens[-1] == int(ref.next_token[0])


# ========================================================================================== 5. greedy


def _greedy_p(ids, as_ids: bool):
    ids = torch.tensor(ids)
    return OneHot(ids, V) if as_ids else torch.nn.functional.one_hot(ids, V).float()


@pytest.mark.parametrize("p_as_ids", [True, False], ids=["p-ids", "p-dense"])
@pytest.mark.parametrize("q_kind", ["sampled", "one-hot-ids"])
def test_greedy_follows_the_argmax_child(p_as_ids, q_kind):
    """Nodes 0-2 are the root's children (tokens 1, 3, 0); node 3 (token 4) and node 4 (token 2) are node 1's,
    node 5 (token 2) is node 3's. Whatever the uniforms and the seed:
    - argmax p is 3 at the root -> node 1; at node 1 argmax p is 0, no child holds it -> emit 0 (a repair);
    - at node 1 argmax p is 4 -> node 3; at node 3 argmax p is 1, held by no child -> emit 1;
    - argmax p 4 at node 1 and 2 at node 3 -> node 5, a leaf: emit the bonus, argmax p after node 5.
    - argmax p 2 at the root, held by no child -> emit 2 at once."""
    tokens = torch.tensor([1, 3, 0, 4, 2, 2])
    parents = [ROOT, ROOT, ROOT, 1, 1, 3]
    if q_kind == "sampled":
        g = torch.Generator().manual_seed(3)
        q = torch.stack([_dist(g, 0.5) for _ in tokens])  # full support: every token could have been drawn
    else:
        q = OneHot(tokens, V)
    tree = TokenTree(tokens, parents, q)
    #          root  n0 n1 n2 n3 n4 n5     expected path, tokens, bonus
    scenarios = [([3, 0, 0, 0, 0, 0, 0], [1], [3, 0], False),
                 ([3, 0, 4, 0, 1, 0, 0], [1, 3], [3, 4, 1], False),
                 ([3, 0, 4, 0, 2, 0, 3], [1, 3, 5], [3, 4, 2, 3], True),
                 ([2, 0, 4, 0, 2, 0, 3], [], [2], False)]
    rng = np.random.default_rng(0)
    for ids, path, emitted, bonus in scenarios:
        p = _greedy_p(ids, p_as_ids)
        for seed in range(5):
            uniforms = None if seed % 2 else rng.random(6).tolist()
            v = verify_tree(tree, p, torch.Generator().manual_seed(seed), uniforms=uniforms)
            assert (v.path, v.tokens, v.bonus) == (path, emitted, bonus), (ids, seed, v)
            for s in v.steps:  # accept probability 1 on the argmax child, 0 on the others
                want = float(int(tokens[s.node]) == ids[parents[s.node] + 1])
                assert s.accept_prob == pytest.approx(want) and s.accepted == bool(want)


def test_greedy_random_trees_match_a_greedy_walk():
    """Random trees (duplicate siblings included) and random one-hot targets: verify_tree emits exactly what a
    greedy walk does -- follow the first child holding argmax p, else emit argmax p."""
    rng = np.random.default_rng(7)
    for i in range(300):
        n = int(rng.integers(1, 12))
        parents = [ROOT] + [int(rng.integers(-1, j)) for j in range(1, n)]
        tokens = torch.from_numpy(rng.integers(0, V, n))
        argmaxes = rng.integers(0, V, n + 1).tolist()
        q = torch.softmax(torch.from_numpy(rng.normal(size=(n, V))).float(), -1) if i % 2 else OneHot(tokens, V)
        tree = TokenTree(tokens, parents, q)
        node, want = ROOT, []
        while True:
            hit = [c for c in tree.children(node) if int(tokens[c]) == argmaxes[node + 1]]
            if not hit:
                want.append(argmaxes[node + 1])
                break
            node = hit[0]
            want.append(int(tokens[node]))
        v = verify_tree(tree, _greedy_p(argmaxes, bool(i % 3)), torch.Generator().manual_seed(i))
        assert v.tokens == want, (parents, tokens, argmaxes, v)
        assert v.bonus == (tree.children(node) == [])  # node: where the walk stopped
