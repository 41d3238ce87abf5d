"""Tree rounds end to end on the tiny pair: a draft-model tree, one target pass over every node, `verify_tree`,
both caches kept to the accepted path. Greedy equals plain greedy for every mode and shape; at T > 0 the first
three tokens follow the target's exact joint law, and a tree whose q lies about how its children were chosen is
caught."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.core.errors import InvalidInputError
from specdec.core.sampling import SamplingConfig, dense
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.drafters import tree as tree_mod
from specdec.drafters.tree import TREE_MODES, check_widths
from specdec.learn.lab import chi_square
from specdec.loop.plain import plain_decode
from specdec.loop.tree import TreeDecoder
from tests.test_drafters import SAMPLED, _ngram_prompt, exact_joint

SHAPES = [(3, 2, 1), (1, 1, 1, 1), (4,), (2, 2)]
N_SAMPLES = 400


@pytest.mark.parametrize("mode", TREE_MODES)
@pytest.mark.parametrize("widths", SHAPES)
def test_greedy_tree_decoding_equals_plain_greedy(tiny_pair, one_thread, mode, widths):
    s = DecodeSettings(max_new_tokens=24)
    for prompt in ("def add(a, b):", "hello world"):
        plain = plain_decode(tiny_pair, prompt, s).ids
        dec = TreeDecoder(tiny_pair, prompt, s, widths, mode)
        list(dec)
        assert dec.generated_ids == plain, (mode, widths, prompt)
        assert all(r.tree.size >= 1 for r in dec.rounds)


def test_a_wide_tree_keeps_more_per_pass_than_its_chain(tiny_pair, one_thread):
    """The point of a tree: on the same greedy text, top-k children at depth 1 need fewer target passes."""
    s = DecodeSettings(max_new_tokens=30)
    passes = {}
    for widths in ((1, 1, 1), (3, 2, 1)):
        dec = TreeDecoder(tiny_pair, "def add(a, b):", s, widths, "top-k")
        list(dec)
        passes[widths] = len(dec.rounds)
    assert passes[(3, 2, 1)] < passes[(1, 1, 1)], passes


def tree_joint_chi_square(pair, prompt: str, widths, mode: str, n_samples: int, draft_vocab: int | None = None):
    law = exact_joint(pair, encode_prompt(pair.tokenizer, prompt), SAMPLED)
    cells = {seq: i for i, seq in enumerate(law)}
    counts = np.zeros(len(cells) + 1)
    for seed in range(n_samples):
        s = DecodeSettings(max_new_tokens=3, sampling=SAMPLED, seed=seed, draft_vocab=draft_vocab)
        dec = TreeDecoder(pair, prompt, s, widths, mode)
        list(dec)
        counts[cells.get(tuple(dec.generated_ids), len(cells))] += 1
    return chi_square(counts, list(law.values()) + [0.0])


@pytest.mark.stat
@pytest.mark.parametrize("mode,widths", [("top-k", (2, 1)), ("sampled", (2, 2)), ("distinct", (2, 1)),
                                         ("dynamic", (3, 2, 2))])
def test_first_three_tokens_of_tree_rounds_follow_the_target(no_eos, one_thread, mode, widths):
    test = tree_joint_chi_square(no_eos, _ngram_prompt(no_eos), widths, mode, N_SAMPLES)
    assert test.p_value > 1e-3, (mode, widths, test)


@pytest.mark.stat
@pytest.mark.parametrize("mode", ["top-k", "sampled"])
def test_a_reduced_draft_head_keeps_tree_rounds_exact(no_eos, one_thread, mode):
    """The draft scores ids below 40 plus EOS and the text's own ids: its children and their q come from that
    subset only, and the emitted tokens still follow the target."""
    prompt = _ngram_prompt(no_eos)
    dec = TreeDecoder(no_eos, prompt, DecodeSettings(max_new_tokens=8, sampling=SAMPLED, draft_vocab=40), (2, 2), mode)
    list(dec)
    assert dec.draft.head_cut == 40
    kept = set(range(40)) | set(dec.draft.head.extra_ids)
    assert all(int(t) in kept for r in dec.rounds for t in r.tree.tokens.tolist())
    test = tree_joint_chi_square(no_eos, prompt, (2, 2), mode, N_SAMPLES, draft_vocab=40)
    assert test.p_value > 1e-3, (mode, test)


@pytest.mark.stat
def test_the_chi_square_catches_top_k_children_verified_as_if_sampled(no_eos, one_thread, monkeypatch):
    """Planted bug: deterministic top-k children carry the draft's sampled q instead of a one-hot q."""
    real = tree_mod.choose_children

    def lying(logits, width, mode, cfg, gen):
        xs, rows = real(logits, width, mode, cfg, gen)
        d = dense(tree_mod.distribution(logits[None], cfg))
        return xs, [d] * len(xs)

    monkeypatch.setattr(tree_mod, "choose_children", lying)
    test = tree_joint_chi_square(no_eos, _ngram_prompt(no_eos), (2, 1), "top-k", N_SAMPLES)
    assert test.p_value < 1e-3, test


@pytest.mark.stat
def test_the_chi_square_catches_a_dynamic_tree_verified_against_the_wrong_q(no_eos, one_thread, monkeypatch):
    """Planted bug: the confidence-shaped tree's deterministic nodes carry a q that puts only half its mass on
    the node's token (as if each had been drawn), instead of one-hot."""
    import specdec.loop.tree as loop_tree

    real = loop_tree.draft_dynamic_tree

    def lying(*args, **kwargs):
        tree, probs, passes = real(*args, **kwargs)
        q = torch.full((tree.size, no_eos.vocab_size), 0.5 / (no_eos.vocab_size - 1))
        q[torch.arange(tree.size), tree.tokens] = 0.5
        return tree_mod.TokenTree(tree.tokens, tree.parents, q), probs, passes

    monkeypatch.setattr(loop_tree, "draft_dynamic_tree", lying)
    test = tree_joint_chi_square(no_eos, _ngram_prompt(no_eos), (3, 2, 2), "dynamic", N_SAMPLES)
    assert test.p_value < 1e-3, test


def test_a_dynamic_tree_keeps_its_likeliest_candidates_as_a_tree(tiny_pair):
    """Nodes come parents first, siblings by confidence; a node's path probability never exceeds its parent's; the
    budget callable sees the candidates' path probabilities best first and its answer is the node count."""
    from specdec.core.kvcache import CachedLM

    lm = CachedLM(tiny_pair.draft, tiny_pair.vocab_size)
    committed = encode_prompt(tiny_pair.tokenizer, "def add(a, b):")
    seen = []

    class Budget:
        def keep(self, probs):
            seen.append(list(probs))
            return 7

        def deeper(self, gain):
            return True

    tree, probs, passes = tree_mod.draft_dynamic_tree(lm, committed, [3, 3, 2], SamplingConfig(), Budget())
    assert tree.size == 7 == len(probs) and len(seen) == 1 and passes == 3
    assert seen[0] == sorted(seen[0], reverse=True) and len(seen[0]) == 3 + 3 * 3 + 2 * 2  # candidates per depth
    for i, parent in enumerate(tree.parents):
        assert parent < i and (parent == -1 or probs[i] <= probs[parent] + 1e-12)
    for node in [-1] + list(range(tree.size)):
        kids = tree.children(node)
        assert [probs[k] for k in kids] == sorted((probs[k] for k in kids), reverse=True)
    assert sorted(probs, reverse=True) == seen[0][:7]
    assert tree.q.ids.tolist() == tree.tokens.tolist()  # one-hot q: every node was chosen deterministically


def test_the_tree_budget_grows_with_cheap_width():
    from types import SimpleNamespace

    probs = [0.9, 0.8, 0.6, 0.5, 0.4, 0.3, 0.2, 0.15, 0.1, 0.05] + [0.02] * 30
    picks = {}
    for per_node in (0.3, 8.0):  # ms one more node costs on a ~200 ms round
        budget = tree_mod.TreeBudget()
        for i in range(40):
            n = 1 + (i * 7) % 40
            budget.observe(SimpleNamespace(index=i + 1, round_ms=200 + per_node * n, draft_ms=0, verify_ms=0,
                                           committed_ids=[1, 2]), n, 0)
        picks[per_node] = budget.keep(probs)
    assert picks[0.3] > picks[8.0] >= 1, picks


def test_a_dynamic_tree_drafts_a_depth_only_while_it_pays():
    """deeper(gain): one more draft pass is worth it when the tokens it may add, at this run's ms per token, cost
    more than the pass; before any measured round every depth is drafted."""
    from types import SimpleNamespace

    budget = tree_mod.TreeBudget()
    assert budget.deeper(0.01)
    for i in range(5):  # rounds of 300 ms for 3 tokens (100 ms a token), 4 draft passes of 40 ms
        budget.observe(SimpleNamespace(index=i + 1, round_ms=300.0, draft_ms=160.0, verify_ms=0.0,
                                       committed_ids=[1, 2, 3]), 10, 4)
    assert budget.deeper(0.5) and not budget.deeper(0.3)


def test_children_carry_the_q_they_were_drawn_from(tiny_pair):
    logits = torch.randn(tiny_pair.vocab_size)
    cfg = SamplingConfig(temperature=1.0)
    gen = torch.Generator().manual_seed(0)
    xs, rows = tree_mod.choose_children(logits, 3, "top-k", cfg, gen)
    assert xs == torch.topk(logits, 3).indices.tolist() and [int(r.ids[0]) for r in rows] == xs
    xs, rows = tree_mod.choose_children(logits, 3, "distinct", cfg, gen)
    assert len(set(xs)) == 3
    for j, (x, q) in enumerate(zip(xs, rows)):
        assert all(float(q[0, earlier]) == 0.0 for earlier in xs[:j]) and float(q.sum()) == pytest.approx(1.0)
    xs, rows = tree_mod.choose_children(logits, 3, "sampled", cfg, gen)
    assert all(torch.equal(r, rows[0]) for r in rows)


def test_bad_tree_shapes_are_refused():
    with pytest.raises(InvalidInputError, match="tree mode"):
        check_widths([2], "beam")
    with pytest.raises(InvalidInputError, match="whole number from 1 to 8"):
        check_widths([2, 0], "top-k")
    with pytest.raises(InvalidInputError, match="at least one depth"):
        check_widths([], "top-k")
    with pytest.raises(InvalidInputError, match="limit is 64"):
        check_widths([8, 8], "top-k")


def test_cli_generates_with_a_tree_and_refuses_a_bad_shape(capsys):
    from specdec.cli import main

    assert main(["generate", "--pair", "tiny", "--dtype", "float32", "--prompt", "def add(a, b):",
                 "--max-new-tokens", "12", "--tree", "3,2,1", "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["tokens"] == 12 and out["tree"] == [3, 2, 1] and out["tokens_per_pass"] >= 1
    assert out["text"] == plain_decode(_tiny(), "def add(a, b):", DecodeSettings(max_new_tokens=12)).text
    assert main(["generate", "--pair", "tiny", "--prompt", "x", "--tree", "3,x"]) == 2
    assert "comma-separated widths" in capsys.readouterr().err


def _tiny():
    from specdec.models.pair import load_pair

    return load_pair("tiny", dtype="float32", device="cpu")


@pytest.mark.slow
def test_greedy_trees_equal_plain_greedy_on_the_real_pair(real_pair_fp32, real_greedy):
    """fp32 on a CPU: the embedded pair's tree rounds write plain greedy's text, token for token."""
    s = DecodeSettings(max_new_tokens=16)
    for prompt, widths, mode in (("def fibonacci(n):", (3, 2, 1), "top-k"),
                                 ("The history of the printing press begins", (2, 2), "top-k"),
                                 ("The history of the printing press begins", (4, 4, 4, 4), "dynamic")):
        plain = real_greedy(prompt, s.max_new_tokens)
        dec = TreeDecoder(real_pair_fp32, prompt, s, widths, mode)
        list(dec)
        assert dec.generated_ids == plain, (prompt, widths)


@pytest.mark.parametrize("mode,widths", [("top-k", (3, 2, 1)), ("sampled", (2, 2))])
def test_after_every_tree_round_both_caches_equal_a_fresh_forward(tiny_pair, one_thread, mode, widths):
    """The cache test: after each round the target's and the draft's caches give the logits a fresh forward over the
    committed text gives (fp32 noise), at T > 0 so paths of every length occur."""
    from tests.test_tree_scoring import fresh

    s = DecodeSettings(max_new_tokens=30, sampling=SamplingConfig(temperature=1.0), seed=3)
    dec = TreeDecoder(tiny_pair, "def add(a, b):", s, widths, mode)
    v = tiny_pair.vocab_size
    for _ in dec:
        for lm, model in ((dec.target, tiny_pair.target), (dec.draft, tiny_pair.draft)):
            got = lm.logits_after(dec.ids)[-1]
            want = fresh(model, dec.ids, v)
            assert float((got.float() - want.float()).abs().max()) < 1e-4
    assert len(dec.rounds) >= 3
