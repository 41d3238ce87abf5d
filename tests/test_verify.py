"""Exactness of the acceptance rule: closed form, Monte Carlo with warps, and power against broken verifiers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.core.sampling import OneHot, SamplingConfig, dense, sample, warp
from specdec.core.verify import residual_distribution, verify, verify_batch

V = 8


def _rand_dist(gen, v=V):
    return torch.softmax(torch.randn(v, generator=gen) * 2, -1)


def _cases():
    g = torch.Generator().manual_seed(7)
    onehot = lambda i: torch.nn.functional.one_hot(torch.tensor(i), V).float()  # noqa: E731
    p_disj = torch.tensor([0.5, 0.3, 0.2, 0, 0, 0, 0, 0.0])
    q_disj = torch.tensor([0, 0, 0, 0.1, 0.4, 0.5, 0, 0.0])
    same = _rand_dist(g)
    return {
        "random": (_rand_dist(g), _rand_dist(g)),
        "random-sparse": (warp(torch.randn(V, generator=g), SamplingConfig(1.0, top_k=4)), _rand_dist(g)),
        "one-hot-agree": (onehot(3), onehot(3)),
        "one-hot-disagree": (onehot(3), onehot(5)),
        "identical": (same, same.clone()),
        "disjoint": (p_disj, q_disj),
    }


def exact_first_token_dist(p0: torch.Tensor, q0: torch.Tensor, gamma: int, gen) -> torch.Tensor:
    """P(first emitted token = x), assembled from verify's own outputs with the uniform forced.

    For each possible draft token d: verify with u=0 tells whether d can be kept and with which accept prob a_d;
    verify with u=1 forces a rejection at position 0 and reports the distribution the repair is drawn from.
    P(x) = sum_d q(d) [a_d 1{x=d} + (1 - a_d) repair_d(x)].
    """
    rest_q = torch.stack([_rand_dist(gen) for _ in range(gamma - 1)]) if gamma > 1 else torch.zeros(0, V)
    rest_p = torch.stack([_rand_dist(gen) for _ in range(gamma)])
    q = torch.cat([q0[None], rest_q])
    p = torch.cat([p0[None], rest_p])
    out = torch.zeros(V, dtype=torch.float64)
    for d in range(V):
        if q0[d] == 0:
            continue
        tokens = torch.tensor([d] + [0] * (gamma - 1))
        q_d = q.clone()
        q_d[1:, 0] = torch.clamp(q_d[1:, 0], min=1e-3)  # later positions never matter for the first token
        keep = verify(tokens, q_d, p, uniforms=torch.zeros(gamma))
        a_d = float(keep.accept_probs[0])
        if a_d > 0:
            assert keep.tokens[0] == d
        reject = verify(tokens, q_d, p, uniforms=torch.ones(gamma))
        assert reject.rejected_at == 0
        out += float(q0[d]) * (a_d * torch.nn.functional.one_hot(torch.tensor(d), V).double()
                               + (1 - a_d) * reject.residual.double())
    return out


@pytest.mark.parametrize("gamma", [1, 3, 5])
@pytest.mark.parametrize("case", list(_cases()))
def test_first_token_distribution_is_exactly_p(case, gamma):
    p0, q0 = _cases()[case]
    dist = exact_first_token_dist(p0, q0, gamma, torch.Generator().manual_seed(gamma))
    assert torch.allclose(dist, p0.double(), atol=1e-6), (dist, p0)


def test_greedy_is_the_one_hot_case():
    logits_p = torch.tensor([[0.1, 2.0, 0.3], [1.0, 0.0, 0.5], [0.0, 0.0, 3.0]])
    logits_q = torch.tensor([[0.1, 2.5, 0.3], [0.0, 0.9, 0.5]])
    cfg = SamplingConfig(temperature=0)
    p, q = warp(logits_p, cfg), warp(logits_q, cfg)
    tokens = q.argmax(-1)  # draft guesses 1, 1; target wants 1, 0
    v = verify(tokens, q, p, torch.Generator().manual_seed(0))
    assert v.tokens == [1, 0] and v.n_accepted == 1 and v.rejected_at == 1
    v = verify(torch.tensor([1, 0]), warp(torch.tensor([[0, 1.0, 0], [1.0, 0, 0]]), cfg), p)
    assert v.tokens == [1, 0, 2] and v.rejected_at is None


def test_residual_handles_equal_distributions():
    p = torch.tensor([0.25, 0.75])
    assert torch.equal(residual_distribution(p, p.clone()), p)


# ------------------------------------------------------------------------------------------------ Monte Carlo

WARPS = {
    "t1": SamplingConfig(temperature=1.0),
    "t0.7-k5": SamplingConfig(temperature=0.7, top_k=5),
    "t1.3-p0.8": SamplingConfig(temperature=1.3, top_p=0.8),
    "t0.9-k6-p0.9": SamplingConfig(temperature=0.9, top_k=6, top_p=0.9),
}
N = 100_000
GAMMA = 3


def _bigram(seed):
    """Target and draft bigram logit tables: row = previous token. The draft is a noisy copy of the target."""
    g = torch.Generator().manual_seed(seed)
    tgt = torch.randn(V, V, generator=g) * 1.5
    drf = tgt + torch.randn(V, V, generator=g) * 1.0
    return tgt, drf


def run_rounds(cfg, seed=0, q_for_verify="warped", repair=residual_distribution):
    """N independent rounds from context token 0 on a bigram pair; returns (first, second, n_acc, P table)."""
    tgt_logits, drf_logits = _bigram(seed)
    P, Q = warp(tgt_logits, cfg), warp(drf_logits, cfg)
    Q_claimed = Q if q_for_verify == "warped" else torch.softmax(drf_logits, -1)  # the #47932 bug: pre-warp q
    gen = torch.Generator().manual_seed(seed + 1)
    prev = torch.zeros(N, dtype=torch.long)
    ctx, drafts, qrows = [prev], [], []
    for _ in range(GAMMA):
        q = Q[prev]
        prev = sample(q, gen)  # the draft samples from the warped q
        drafts.append(prev)
        qrows.append(Q_claimed[ctx[-1]])
        ctx.append(prev)
    tokens = torch.stack(drafts, 1)
    prows = torch.stack([P[c] for c in ctx], 1)  # p after the context and after each draft token
    bv = verify_batch(tokens, torch.stack(qrows, 1), prows, gen, repair=repair)
    first = torch.where(bv.n_accepted >= 1, tokens[:, 0], bv.next_token)
    second = torch.where(bv.n_accepted >= 2, tokens[:, 1], bv.next_token)
    return first, second, bv.n_accepted, P


def _pvalue(observed: np.ndarray, expected: np.ndarray, groups: int = 1) -> float:
    """Chi-square p-value; mass in a cell the target gives probability 0 is an immediate failure."""
    zero = expected == 0
    if observed[zero].sum() > 0:
        return 0.0
    exp = expected[~zero] * observed.sum() / expected[~zero].sum()  # float32 rows sum to 1 only to ~1e-7
    return float(chisquare(observed[~zero], exp, ddof=groups - 1).pvalue)


def first_token_pvalue(first, P):
    obs = np.bincount(first.numpy(), minlength=V).astype(float)
    return _pvalue(obs, N * P[0].double().numpy())


def second_token_pvalue(first, second, n_acc, P):
    """Given the first token was an accepted draft x, the next emitted token must follow p(. | x)."""
    mask = n_acc >= 1
    x, y = first[mask].numpy(), second[mask].numpy()
    obs = np.zeros((V, V))
    np.add.at(obs, (x, y), 1)
    p64 = P.double().numpy()
    exp = obs.sum(1, keepdims=True) * p64 / p64.sum(1, keepdims=True)
    used = obs.sum(1) > 0
    return _pvalue(obs[used].ravel(), exp[used].ravel(), groups=int(used.sum()))


@pytest.mark.stat
@pytest.mark.parametrize("warp_name", list(WARPS))
def test_monte_carlo_matches_target(warp_name):
    first, second, n_acc, P = run_rounds(WARPS[warp_name])
    assert (n_acc >= 1).sum() > N // 10  # enough accepted rounds for the conditional test to mean something
    assert first_token_pvalue(first, P) > 1e-3
    assert second_token_pvalue(first, second, n_acc, P) > 1e-3


@pytest.mark.stat
@pytest.mark.parametrize("warp_name", ["t0.7-k5", "t1.3-p0.8", "t0.9-k6-p0.9"])
def test_monte_carlo_catches_q_taken_before_warp(warp_name):
    first, second, n_acc, P = run_rounds(WARPS[warp_name], q_for_verify="raw")
    assert min(first_token_pvalue(first, P), second_token_pvalue(first, second, n_acc, P)) < 1e-3


@pytest.mark.stat
@pytest.mark.parametrize("warp_name", list(WARPS))
def test_monte_carlo_catches_repair_from_p(warp_name):
    first, second, n_acc, P = run_rounds(WARPS[warp_name], repair=lambda p, q: p)
    assert first_token_pvalue(first, P) < 1e-3


@pytest.mark.stat
def test_sample_draws_exactly_from_probs():
    """The inverse-CDF sampler every draft, repair and bonus token goes through: chi-square, zeros never drawn."""
    p = torch.tensor([0.0, 0.5, 0.0, 0.25, 0.125, 0.0, 0.125, 0.0])
    draws = sample(p.expand(N, V), torch.Generator().manual_seed(11))
    counts = np.bincount(draws.numpy(), minlength=V).astype(float)
    assert _pvalue(counts, N * p.double().numpy()) > 1e-3
    skewed = sample(torch.tensor([1.0, 0, 0, 0]).expand(1000, 4), torch.Generator().manual_seed(0))
    assert (skewed == 0).all()


# ------------------------------------------------------------------------------ the fast paths keep the same answers


def test_argmax_matches_torch_first_index_on_ties_and_bfloat16():
    from specdec.core.sampling import argmax

    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 151936, generator=g)
    x[2, [7, 900, 151935]] = 50.0  # a three-way tie: the first index wins, as in torch.argmax
    x[3] = -x[3].abs() - 1.0  # no positive value: the int16 reading of the bits does not apply
    x[4, :100] = float("-inf")
    for t in (x, x.bfloat16(), x.half(), x[0], x[3].bfloat16(), x[2].bfloat16(), x.double()):
        assert torch.equal(argmax(t), t.argmax(-1)), t.dtype


def test_sample_of_one_hot_rows_is_their_index_and_keeps_the_random_stream():
    """The CPU shortcut for one-hot rows returns what inversion would, and draws the same uniforms."""
    rows = torch.zeros(3, 151936)
    rows[0, 5], rows[1, 151935], rows[2, 0] = 1.0, 1.0, 1.0
    g1, g2 = torch.Generator().manual_seed(1), torch.Generator().manual_seed(1)
    assert sample(rows, g1).tolist() == [5, 151935, 0]
    torch.rand(3, 1, generator=g2, dtype=torch.float64)  # the uniforms inversion would have used
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))
    # one-hot but for a tiny mass elsewhere: not a shortcut, the tiny token stays reachable in principle
    almost = torch.zeros(1, 8)
    almost[0, 0], almost[0, 3] = 1e-30, 1.0
    assert sample(almost, torch.Generator().manual_seed(0)).tolist() == [3]


def test_draw_returns_the_distribution_it_drew_from():
    from specdec.core.sampling import draw

    g = torch.Generator().manual_seed(5)
    logits = torch.randn(4, 300, generator=g)
    tokens, q = draw(logits, SamplingConfig(), torch.Generator().manual_seed(0))
    assert isinstance(q, OneHot) and torch.equal(tokens, logits.argmax(-1))
    assert torch.equal(dense(q), warp(logits, SamplingConfig()))
    cfg = SamplingConfig(temperature=0.8, top_k=20)
    tokens, q = draw(logits, cfg, torch.Generator().manual_seed(0))
    assert torch.equal(q, warp(logits, cfg)) and (q.gather(-1, tokens[:, None]) > 0).all()
    assert torch.equal(tokens, sample(warp(logits, cfg), torch.Generator().manual_seed(0)))
    # greedy draws consume the generator as sampling does, so later draws of a seeded run line up
    a, b = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    draw(logits, SamplingConfig(), a)
    sample(warp(logits, cfg), b)
    assert torch.equal(torch.rand(2, generator=a), torch.rand(2, generator=b))


@pytest.mark.parametrize("vocab", [50, 1000, 151936])
def test_top_rows_gives_torch_topk_values(vocab):
    from specdec.loop.display import top_rows

    g = torch.Generator().manual_seed(vocab)
    x = torch.softmax(torch.randn(6, vocab, generator=g) * 3, -1)
    x[1] = 0.0
    x[1, vocab - 1] = 1.0  # one-hot, the hot id in the tail past the last whole block
    vals, ids = top_rows(x, 8)
    ref_vals, _ = torch.topk(x, 8)
    assert torch.equal(vals, ref_vals) and torch.equal(x.gather(-1, ids), vals)
    assert ids[1, 0] == vocab - 1


def _one_hot_or_not(ids_or_probs, as_ids: bool, vocab: int):
    return OneHot(ids_or_probs, vocab) if as_ids else OneHot(ids_or_probs, vocab).dense()


@pytest.mark.parametrize("q_ids,p_ids", [(True, False), (True, True), (False, True)])
@pytest.mark.parametrize("g", [0, 1, 3])
def test_one_hot_rows_as_ids_give_the_dense_rule_exactly(q_ids, p_ids, g):
    """OneHot rows (greedy warps, copied proposals) take shortcuts in the rule; every answer -- kept prefix, emitted
    token, acceptance probabilities, the repair distribution and the random stream -- equals the dense rule's."""
    V, B = 40, 64
    gen = torch.Generator().manual_seed(g)
    draft = torch.randint(V, (B, g), generator=gen)
    target_ids = torch.where(torch.rand(B, g + 1, generator=gen) < 0.6,
                             torch.cat([draft, torch.zeros(B, 1, dtype=torch.long)], 1), torch.randint(V, (B, g + 1), generator=gen))
    if q_ids:
        q_sparse, q_dense = OneHot(draft, V), OneHot(draft, V).dense()
    else:  # a sampled q (with the draft token in its support) against a one-hot p
        q_dense = torch.softmax(torch.randn(B, g, V, generator=gen), -1)
        q_sparse = q_dense
    if p_ids:
        p_sparse, p_dense = OneHot(target_ids, V), OneHot(target_ids, V).dense()
    else:
        p_dense = torch.softmax(torch.randn(B, g + 1, V, generator=gen) + 6 * OneHot(target_ids, V).dense(), -1)
        p_sparse = p_dense
    a = verify_batch(draft, q_sparse, p_sparse, torch.Generator().manual_seed(7))
    b = verify_batch(draft, q_dense, p_dense, torch.Generator().manual_seed(7))
    assert torch.equal(a.n_accepted, b.n_accepted) and torch.equal(a.next_token, b.next_token)
    assert torch.equal(a.accept_probs, b.accept_probs) and torch.equal(a.uniforms, b.uniforms)
    assert torch.allclose(dense(a.final_dist), b.final_dist, atol=1e-7)
    if p_ids:  # the repair of a one-hot p is p itself, kept as ids
        assert isinstance(a.final_dist, OneHot)
    if g:  # a case the test must reach: some rounds rejected, some not
        assert 0 < int((a.n_accepted < g).sum()) < B and int((a.n_accepted > 0).sum()) > 0


def test_one_hot_q_repairs_from_p_without_the_guess():
    """A copied guess x (q one-hot on x) that is rejected is repaired from p with x removed, renormalized."""
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]])
    q = OneHot(torch.tensor([[0]]), 4)
    v = verify(torch.tensor([0]), q[0], p, uniforms=torch.tensor([0.99]))
    assert v.rejected_at == 0 and v.tokens[0] in (1, 2)
    assert torch.allclose(dense(v.residual), torch.tensor([0.0, 0.6, 0.4, 0.0]))


@pytest.mark.parametrize("cfg", [SamplingConfig(0.7), SamplingConfig(1e-39), SamplingConfig(0.9, 5, 0.8)])
def test_warp_leaves_the_callers_logits_untouched(cfg):
    """The warp works in place on its own float32 copy, never on the logits it was given (also when they are float32)."""
    x = torch.randn(3, 50, generator=torch.Generator().manual_seed(0))
    kept = x.clone()
    probs = warp(x, cfg)
    assert torch.equal(x, kept) and torch.allclose(probs.sum(-1), torch.ones(3))
