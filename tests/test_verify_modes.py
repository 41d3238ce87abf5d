"""The three verification modes (core.verify): pq, strict and block.

Exactness is checked three ways: the law of the first three emitted tokens of a whole decoding process, computed
exactly by enumerating every draft and every verdict the rule can reach (through its `uniforms=` seam) on a small
context-dependent language, against the target's own law; greedy equality with plain greedy; and a Monte Carlo
chi-square of the decoder's first three tokens on the tiny model. Each check fails on a planted bug. Block
verification's expected number of kept guesses is checked against its formula, sum_i E_q[w_i], and against pq's
on the same drafts.
"""

from __future__ import annotations

import itertools
import json
import math
import zlib

import numpy as np
import pytest
import torch

from specdec.core import verify as verify_mod
from specdec.core.errors import InvalidInputError
from specdec.core.sampling import OneHot
from specdec.core.settings import VERIFY_MODES, DecodeSettings
from specdec.core.verify import block_tests, residual_distribution, verify, verify_batch
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from tests.test_drafters import SAMPLED, _ngram_prompt, joint_chi_square

V = 3  # the enumerated language's vocabulary
LENGTH = 3  # tokens whose joint law is compared


def _dist(ctx: tuple, salt: str, zero: bool = False) -> torch.Tensor:
    """A distribution over V ids that depends on the context: p (salt "p", with a zero every other step) or q."""
    g = torch.Generator().manual_seed(zlib.crc32(repr((ctx, salt)).encode()))
    d = torch.softmax(1.5 * torch.randn(V, generator=g, dtype=torch.float64), 0)
    if zero and len(ctx) % 2 == 0:
        d[int(torch.randint(V, (1,), generator=g))] = 0.0
        d = d / d.sum()
    return d


def _p(ctx):
    return _dist(ctx, "p", zero=True)


def _q(ctx):
    return _dist(ctx, "q")


def target_law(ctx: tuple = (), n: int = LENGTH) -> dict[tuple, float]:
    if n == 0:
        return {(): 1.0}
    out: dict[tuple, float] = {}
    p = _p(ctx)
    for x in range(V):
        for rest, pr in target_law(ctx + (x,), n - 1).items():
            out[(x,) + rest] = out.get((x,) + rest, 0.0) + float(p[x]) * pr
    return out


def _round(ctx: tuple, xs: tuple):
    qs, ps, c = [], [], ctx
    for x in xs:
        qs.append(_q(c))
        ps.append(_p(c))
        c = c + (x,)
    ps.append(_p(c))
    return torch.tensor(xs), torch.stack(qs).float(), torch.stack(ps).float()


def kept_law(mode: str, tests: torch.Tensor) -> list[float]:
    """P(n = k) for k = 0..g from the per-position tests (the verdict's accept_probs) and independent uniforms."""
    a, g = tests.double(), tests.shape[0]
    if mode == "block":  # n = the largest i whose test passes
        return [float((a[k - 1] if k else 1.0) * torch.prod(1 - a[k:])) for k in range(g + 1)]
    return [float(torch.prod(a[:k]) * (1 - a[k] if k < g else 1.0)) for k in range(g + 1)]


def forcing_uniforms(mode: str, k: int, g: int) -> torch.Tensor:
    """Uniforms that make the rule keep exactly k guesses (where that has probability > 0)."""
    u = torch.ones(g)
    if mode == "block":
        if k:
            u[k - 1] = 0.0
    else:
        u[:k] = 0.0
    return u


def speculative_law(mode: str, g: int, ctx: tuple = (), n: int = LENGTH, run=verify,
                    memo: dict | None = None) -> dict[tuple, float]:
    """The exact law of the first n tokens of speculative decoding with g guesses per round: every draft weighted
    by q, every kept count by its probability, every emitted token by the distribution the rule drew it from.

    The law of what follows depends only on the context and the tokens still to come, so each (ctx, n) is worked
    out once per call (`memo`; a fresh one per top-level call, so a planted bug never reads another run's law)."""
    if n <= 0:
        return {(): 1.0}
    memo = {} if memo is None else memo
    if (ctx, n) in memo:
        return memo[(ctx, n)]
    out: dict[tuple, float] = {}
    for xs in itertools.product(range(V), repeat=g):
        tokens, q, p = _round(ctx, xs)
        q_x = math.prod(float(q[i, x]) for i, x in enumerate(xs))
        if q_x == 0:
            continue
        tests = run(tokens, q, p, uniforms=torch.zeros(g), mode=mode).accept_probs
        for k, p_k in enumerate(kept_law(mode, tests)):
            if p_k <= 0:
                continue
            verdict = run(tokens, q, p, uniforms=forcing_uniforms(mode, k, g), mode=mode)
            assert verdict.n_accepted == k
            for y, p_y in enumerate(verdict.final_dist.double().tolist()):
                if p_y <= 0:
                    continue
                emitted = xs[:k] + (y,)
                for rest, pr in speculative_law(mode, g, ctx + emitted, n - len(emitted), run, memo).items():
                    seq = (emitted + rest)[:n]
                    out[seq] = out.get(seq, 0.0) + q_x * p_k * p_y * pr
    memo[(ctx, n)] = out
    return out


def law_gap(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


@pytest.mark.parametrize("g", [1, 2, 3])
@pytest.mark.parametrize("mode", VERIFY_MODES)
def test_every_mode_emits_exactly_the_targets_law(mode, g):
    assert law_gap(speculative_law(mode, g), target_law()) < 1e-6


def test_the_exact_law_catches_a_strict_rule_that_redraws_from_p():
    """Planted bug: at a mismatch, strict emits a fresh draw from p (which can be the refused guess again)."""

    def redraw(tokens, q, p, uniforms=None, mode="pq"):
        bv = verify_batch(tokens[None], q[None], p[None], uniforms=uniforms[None], mode=mode,
                          repair=lambda p_row, q_row: p_row)
        return _single(bv, tokens)

    assert law_gap(speculative_law("strict", 2, run=redraw), target_law()) > 1e-2


def test_the_exact_law_catches_block_tests_without_the_residual_mass(monkeypatch):
    """Planted bug: each position's test taken as its prefix weight w_i alone, forgetting s_i."""
    real = verify_mod.block_tests

    def weights_only(tokens, q, p):
        w, _ = real(tokens, q, p)
        return w, w[:, 1:]

    monkeypatch.setattr(verify_mod, "block_tests", weights_only)
    assert law_gap(speculative_law("block", 2), target_law()) > 1e-2


def _single(bv, tokens):
    n = int(bv.n_accepted[0])
    g = tokens.shape[0]
    return verify_mod.Verdict(tokens[:n].tolist() + [int(bv.next_token[0])], n, n if n < g else None,
                              bv.accept_probs[0], bv.uniforms[0], bv.final_dist[0] if n < g else None,
                              bv.final_dist[0])


def _expected_kept(mode: str, g: int) -> tuple[float, float]:
    """(E[kept], sum_i E_q[w_i]) over every draft of the first round, exactly."""
    e_kept = e_weights = 0.0
    for xs in itertools.product(range(V), repeat=g):
        tokens, q, p = _round((), xs)
        q_x = math.prod(float(q[i, x]) for i, x in enumerate(xs))
        tests = verify(tokens, q, p, uniforms=torch.zeros(g), mode=mode).accept_probs
        e_kept += q_x * sum(k * pk for k, pk in enumerate(kept_law(mode, tests)))
        w, _ = block_tests(tokens[None], q[None], p[None])
        e_weights += q_x * float(w[0, 1:].sum())
    return e_kept, e_weights


@pytest.mark.parametrize("g", [1, 2, 3, 4])
def test_block_keeps_its_formula_and_at_least_as_many_as_pq(g):
    block, formula = _expected_kept("block", g)
    pq, _ = _expected_kept("pq", g)
    assert block == pytest.approx(formula, abs=1e-6)
    assert block >= pq - 1e-9
    if g >= 2:
        assert block > pq + 1e-3  # strictly more on this language once a block has two guesses


def test_block_keeps_more_than_pq_on_the_same_drafts_with_confidence():
    """Many random rounds (random p, q, drafts drawn from q): the paired difference of kept counts has a 99 %
    confidence interval above 0, and each mode's mean matches its exact expectation."""
    gen = torch.Generator().manual_seed(7)
    b, g, vocab = 4000, 4, 6
    q = torch.softmax(1.2 * torch.randn(b, g, vocab, generator=gen), -1)
    p = torch.softmax(1.2 * torch.randn(b, g + 1, vocab, generator=gen), -1)
    tokens = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(b, g)
    kept, expected = {}, {}
    for mode in ("pq", "block"):
        bv = verify_batch(tokens, q, p, torch.Generator().manual_seed(1), mode=mode)
        kept[mode] = bv.n_accepted.double()
        if mode == "block":
            expected[mode] = block_tests(tokens, q, p)[0][:, 1:].sum(-1)
        else:
            expected[mode] = bv.accept_probs.double().cumprod(-1).sum(-1)
    diff = kept["block"] - kept["pq"]
    half = 2.576 * float(diff.std()) / math.sqrt(b)
    assert float(diff.mean()) - half > 0, (float(diff.mean()), half)
    for mode in kept:  # the mean kept count is the expectation of the formula over these drafts
        gap = float(kept[mode].mean() - expected[mode].mean())
        assert abs(gap) < 4 * float(kept[mode].std()) / math.sqrt(b), (mode, gap)


def test_strict_keeps_a_guess_with_the_targets_probability_of_it():
    gen = torch.Generator().manual_seed(3)
    q = torch.softmax(torch.randn(1, 5, generator=gen), -1)
    p = torch.softmax(torch.randn(2, 5, generator=gen), -1)
    for x in range(5):
        tokens = torch.tensor([x])
        strict = verify(tokens, q, p, uniforms=torch.zeros(1), mode="strict").accept_probs[0]
        pq = verify(tokens, q, p, uniforms=torch.zeros(1), mode="pq").accept_probs[0]
        assert float(strict) == pytest.approx(float(p[0, x]))
        assert float(pq) == pytest.approx(min(1.0, float(p[0, x] / q[0, x])))
        one_hot = verify(tokens, OneHot(tokens, 5), p, uniforms=torch.zeros(1), mode="pq").accept_probs[0]
        assert float(one_hot) == pytest.approx(float(strict))  # with a one-hot q the two rules agree


def test_strict_repairs_from_the_target_without_the_refused_guess():
    p = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.3, 0.5]])
    q = torch.tensor([[0.1, 0.1, 0.8]])
    v = verify(torch.tensor([0]), q, p, uniforms=torch.ones(1), mode="strict")
    assert v.rejected_at == 0
    assert torch.allclose(v.residual, torch.tensor([0.0, 0.6, 0.4]))
    assert torch.allclose(v.residual, residual_distribution(p[:1], OneHot(torch.tensor([0]), 3))[0])


def test_block_can_keep_a_guess_whose_own_test_failed():
    """The point of judging jointly: a poor first guess followed by a guess the target likes more than the draft
    raises the weight back, and the block keeps both even when the first position's test failed."""
    q = torch.tensor([[0.9, 0.1], [0.1, 0.9]])
    p = torch.tensor([[0.5, 0.5], [0.9, 0.1], [0.5, 0.5]])
    tokens = torch.tensor([0, 0])
    w, h = block_tests(tokens[None], q[None], p[None])
    assert float(w[0, 1]) == pytest.approx(0.5 / 0.9)
    assert float(w[0, 2]) == 1.0 and float(h[0, 1]) == 1.0
    v = verify(tokens, q, p, uniforms=torch.tensor([0.99, 0.5]), mode="block")
    assert v.n_accepted == 2 and v.bonus
    assert verify(tokens, q, p, uniforms=torch.tensor([0.99, 0.5]), mode="pq").n_accepted == 0


def test_an_unknown_mode_is_refused():
    with pytest.raises(ValueError, match="verification mode"):
        verify(torch.tensor([0]), torch.ones(1, 2) / 2, torch.ones(2, 2) / 2, mode="lenient")
    with pytest.raises(InvalidInputError, match="verification must be one of pq, strict, block"):
        DecodeSettings(verify="lenient").validate()


@pytest.mark.parametrize("mode", VERIFY_MODES)
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_decoding_equals_plain_greedy_in_every_mode(tiny_pair, one_thread, mode, drafter):
    s = DecodeSettings(max_new_tokens=20, drafter=drafter, verify=mode)
    for prompt in ("def add(a, b):", "abcabcab"):
        dec = SpeculativeDecoder(tiny_pair, prompt, s, top_k=0)
        list(dec)
        assert dec.generated_ids == plain_decode(tiny_pair, prompt, s).ids, (mode, drafter, prompt)
        assert {r.verify for r in dec.rounds} == {mode}


@pytest.mark.stat
@pytest.mark.parametrize("mode", ["strict", "block"])
def test_first_three_tokens_follow_the_target_in_every_mode(no_eos, one_thread, mode):
    s = DecodeSettings(gamma=2, sampling=SAMPLED, verify=mode)
    test = joint_chi_square(no_eos, _ngram_prompt(no_eos), s, 500)
    assert test.p_value > 1e-3, (mode, test)


@pytest.mark.stat
def test_the_chi_square_catches_block_verification_whose_last_test_always_passes(no_eos, one_thread, monkeypatch):
    """Planted bug: the last position's test read like an interior one with w = 1 (h_g = 1), so every block is
    kept whole and the text follows the draft."""
    real = verify_mod.block_tests

    def last_always_passes(tokens, q, p):
        w, h = real(tokens, q, p)
        return w, torch.cat([h[:, :-1], torch.ones_like(h[:, -1:])], 1)

    monkeypatch.setattr(verify_mod, "block_tests", last_always_passes)
    s = DecodeSettings(gamma=2, sampling=SAMPLED, verify="block")
    test = joint_chi_square(no_eos, _ngram_prompt(no_eos), s, 500)
    assert test.p_value < 1e-3, test


def test_cli_race_and_trace_carry_the_mode(tiny_pair, capsys, tmp_path):
    from specdec.cli import main
    from specdec.io.trace import load_trace
    from specdec.loop.race import parse_lanes

    trace = tmp_path / "t.json"
    assert main(["generate", "--pair", "tiny", "--dtype", "float32", "--prompt", "hello", "--max-new-tokens", "6",
                 "--verify", "block", "--temperature", "0.8", "--trace", str(trace), "--json"]) == 0
    rounds = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert rounds
    record = load_trace(trace.read_text())
    assert record.settings.verify == "block" and {r.verify for r in record.rounds} == {"block"}
    lanes = parse_lanes("model:4:strict, ngram:block:8, model")
    assert [(x.drafter, x.gamma, x.verify) for x in lanes] == [("model", 4, "strict"), ("ngram", 8, "block"),
                                                              ("model", 4, "pq")]
    assert "strict" in lanes[0].label
    with pytest.raises(InvalidInputError, match="verification mode"):
        parse_lanes("model:lenient")
    bad = json.loads(trace.read_text())
    bad["settings"]["verify"] = "lenient"
    with pytest.raises(Exception, match="settings.verify"):
        load_trace(json.dumps(bad))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["strict", "block"])
def test_greedy_equals_plain_greedy_on_the_real_pair(real_pair_fp32, real_greedy, mode):
    s = DecodeSettings(max_new_tokens=24, verify=mode)
    prompt = "def fibonacci(n):"
    dec = SpeculativeDecoder(real_pair_fp32, prompt, s, top_k=0)
    list(dec)
    assert dec.generated_ids == real_greedy(prompt, s.max_new_tokens)
    assert np.mean([r.n_accepted for r in dec.rounds]) > 0.5  # the draft's guesses were kept, not just repaired


@pytest.mark.parametrize("mode", VERIFY_MODES)
def test_expected_kept_is_the_mean_of_the_kept_law(mode):
    from specdec.core.verify import expected_kept

    tests = torch.tensor([0.9, 0.2, 0.7, 0.5])
    law = kept_law(mode, tests)
    assert sum(law) == pytest.approx(1.0)
    assert expected_kept(tests, mode) == pytest.approx(sum(k * p for k, p in enumerate(law)))


def test_same_draft_verdicts_replay_each_rule_with_the_same_uniforms():
    from specdec.core.verify import same_draft_verdicts

    gen = torch.Generator().manual_seed(11)
    q = torch.softmax(torch.randn(3, 6, generator=gen), -1)
    p = torch.softmax(torch.randn(4, 6, generator=gen), -1)
    tokens, u = torch.tensor([1, 4, 2]), torch.rand(3, generator=gen)
    for v in same_draft_verdicts(tokens, q, p, u):
        direct = verify(tokens, q, p, uniforms=u, mode=v.mode)
        assert v.n_accepted == direct.n_accepted
        assert v.tests == pytest.approx(direct.accept_probs.tolist())


def test_scrape_of_our_own_prometheus_text_reads_back_our_counts(tiny_pair):
    from specdec.io import server_metrics as sm

    dec = SpeculativeDecoder(tiny_pair, "hello world", DecodeSettings(max_new_tokens=16, drafter="ngram"))
    list(dec)
    exported = sm.export(dec.record())
    back = sm.parse_scrape(sm.prometheus_text(exported))
    c = exported["vllm"]
    assert back.num_drafts == c["num_drafts"] and back.num_accepted_tokens == c["num_accepted_tokens"]
    assert back.per_position_rate == pytest.approx(c["per_position_acceptance_rate"])
    pr = exported["per_request"]
    assert sum(pr["acceptance_histogram"].values()) == pr["num_spec_steps"] == c["num_drafts"]
    assert sum(pr["per_step"]["num_accepted_tokens"]) == c["num_accepted_tokens"]
    for bad in ("", "not { prometheus", "# TYPE other counter\nother_total 3\n"):
        with pytest.raises(InvalidInputError):
            sm.parse_scrape(bad)


def test_time_breakdown_adds_up_and_reads_the_break_even(tiny_pair):
    from specdec.core.metrics import PHASES, StepCosts, time_breakdown
    from specdec.core.speedup import leviathan_break_even, leviathan_speedup

    dec = SpeculativeDecoder(tiny_pair, "hello world", DecodeSettings(max_new_tokens=16))
    list(dec)
    b = time_breakdown(dec.rounds, StepCosts(5.0, 1.0))
    for r, t in zip(dec.rounds, b.rounds):
        assert t.total == pytest.approx(max(r.round_ms, t.total - t.other))
        assert all(getattr(t, k) >= 0 for k in PHASES)
    assert b.plain_ms == [5.0 * len(r.committed_ids) for r in dec.rounds]
    assert "break-even needs" in b.reading or "no acceptance can break even" in b.reading
    a = leviathan_break_even(4, 0.3)
    assert leviathan_speedup(a, 4, 0.3) == pytest.approx(1.0, abs=1e-9)
    assert leviathan_break_even(2, 1.2) is None


def test_trees_take_strict_and_refuse_block(tiny_pair, one_thread):
    """Strict on a tree judges every child as deterministic (one-hot q); greedy output still equals plain greedy;
    block, a rule for one chain, is refused with a message."""
    from specdec.loop.tree import TreeDecoder

    s = DecodeSettings(max_new_tokens=16, verify="strict")
    dec = TreeDecoder(tiny_pair, "def add(a, b):", s, (2, 1), "sampled")
    list(dec)
    assert dec.generated_ids == plain_decode(tiny_pair, "def add(a, b):", s).ids
    assert all(isinstance(r.tree.q, OneHot) for r in dec.rounds)
    with pytest.raises(InvalidInputError, match="block verification"):
        TreeDecoder(tiny_pair, "hello", DecodeSettings(verify="block"), (2, 1))


@pytest.mark.stat
def test_strict_tree_rounds_follow_the_target(no_eos, one_thread):
    from specdec.loop.tree import TreeDecoder
    from tests.test_drafters import exact_joint
    from specdec.core.settings import encode_prompt
    from specdec.learn.lab import chi_square

    prompt = _ngram_prompt(no_eos)
    law = exact_joint(no_eos, encode_prompt(no_eos.tokenizer, prompt), SAMPLED)
    cells = {seq: i for i, seq in enumerate(law)}
    counts = np.zeros(len(cells) + 1)
    for seed in range(300):
        dec = TreeDecoder(no_eos, prompt, DecodeSettings(max_new_tokens=3, sampling=SAMPLED, seed=seed,
                                                         verify="strict"), (2, 1), "sampled")
        list(dec)
        counts[cells.get(tuple(dec.generated_ids), len(cells))] += 1
    assert chi_square(counts, list(law.values()) + [0.0]).p_value > 1e-3


@pytest.mark.parametrize("p_kind", ["dense", "onehot"])
def test_block_residual_mass_of_a_one_hot_q_is_the_dense_sum(p_kind):
    """residual_mass reads a one-hot q (copied or greedy guesses, an all-zero row among them) from row sums and one
    gather; it must give the dense formula's s_i, sum_x max(0, w_i p_i(x) - q_i(x)), for dense and one-hot p,
    including a row where the guess is p's own token and one where q has no token."""
    from specdec.core.verify import residual_mass

    g, vocab = 6, 50
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(vocab, (2, g), generator=gen)
    ids[0, 3] = -1  # an all-zero q row
    q = OneHot(ids, vocab)
    if p_kind == "dense":
        p = torch.softmax(torch.randn(2, g + 1, vocab, generator=gen), -1)
        p[1, 2] = 0.0
        p[1, 2, ids[1, 2]] = 1.0  # a row whose mass sits on the guess
    else:
        pid = torch.randint(vocab, (2, g + 1), generator=gen)
        pid[:, 2] = ids[:, 2]  # the target's token is the guess
        p = OneHot(pid, vocab)
    w = torch.rand(2, g - 1, generator=gen, dtype=torch.float64)
    w[0, 0] = 1.0
    pd, qd = verify_mod.dense(p)[:, 1:g].double(), q.dense()[:, 1:g].double()
    expected = (w[..., None] * pd - qd).clamp_min(0.0).sum(-1)
    assert torch.allclose(residual_mass(w, p, q, g), expected, rtol=0, atol=1e-12)
    # and block_tests gives the same tests as with the dense q (the one-hot shortcut changes no verdict)
    _, h_onehot = block_tests(ids.clamp_min(0), OneHot(ids.clamp_min(0), vocab), p)
    _, h_dense = block_tests(ids.clamp_min(0), OneHot(ids.clamp_min(0), vocab).dense(), p)
    assert torch.allclose(h_onehot, h_dense, rtol=0, atol=1e-12)
