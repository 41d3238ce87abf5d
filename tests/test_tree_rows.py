"""Token trees as ragged batch rows (loop.tree_batch): each row its own tree and accepted path in one batched target
pass. Greedy equality with plain greedy per row (every tree mode, copied trees), caches that hold each row's text,
and each row's first three tokens following its target, with planted bugs (nodes that see their siblings, a row
verified against another row's p, top-k children verified as if sampled) that the same test rejects."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specdec.core.errors import InvalidInputError
from specdec.core.sampling import SamplingConfig, dense
from specdec.core.settings import DecodeSettings
from specdec.drafters import tree as tree_mod
from specdec.learn.lab import chi_square
from specdec.loop import tree_batch
from specdec.loop.plain import plain_decode
from specdec.loop.tree_batch import TreeBatchDecoder, tree_batch_decode, tree_block
from tests.test_ragged import CHI_CFG, CHI_PROMPTS, PROMPTS, _exact_first_three

CASES = [("top-k", (3, 2, 1), "model"), ("sampled", (2, 2), "model"), ("distinct", (2, 1), "model"),
         ("dynamic", (3, 2, 2), "model"), ("top-k", (2, 2, 2), "ngram")]


@pytest.mark.parametrize("mode,widths,drafter", CASES)
def test_greedy_tree_rows_equal_plain_greedy(tiny_pair, one_thread, mode, widths, drafter):
    s = DecodeSettings(max_new_tokens=20, drafter=drafter)
    res = tree_batch_decode(tiny_pair, PROMPTS, s, widths, mode)
    assert res.ids == [plain_decode(tiny_pair, p, s).ids for p in PROMPTS], (mode, widths, drafter)
    if drafter == "model":  # the tiny pair's draft agrees with its target often; its text rarely repeats a prompt
        assert len(res.rounds) < 20  # trees kept more than one token per pass somewhere


def test_tree_block_lays_out_tails_and_nodes():
    tree = tree_mod.TokenTree(torch.tensor([7, 8, 9]), [-1, -1, 0], tree_mod.OneHot(torch.tensor([7, 8, 9]), 20))
    ids, pos, vis, real, starts = tree_block([[1, 2], [3], []], [tree, tree, None], [5, 0, 4], pad=0)
    assert ids.tolist() == [[1, 2, 7, 8, 9], [0, 3, 7, 8, 9], [0, 0, 0, 0, 0]] and starts == [0, 1, 5]
    assert pos[0].tolist() == [5, 6, 7, 7, 8] and pos[1, 1:].tolist() == [0, 1, 1, 2]
    assert real.tolist() == [[True] * 5, [False] + [True] * 4, [False] * 5]
    # node 2 (a child of node 0) sees the tail, node 0 and itself; never its parent's sibling
    assert vis[0, 4].tolist() == [True, True, True, False, True] and not vis[0, 3, 2]


def test_caches_hold_each_rows_text(no_eos):
    s = DecodeSettings(max_new_tokens=40, sampling=SamplingConfig(temperature=1.0), seed=2)
    for compact_at in (1.0, 0.0):
        dec = TreeBatchDecoder(no_eos, PROMPTS, s, (2, 2), "sampled", compact_at=compact_at)
        for _ in range(5):
            dec.step()
        assert len({len(o) for o in dec.out}) > 1
        assert dec.target.holes > 0 or dec.target.compactions > 0
        assert dec.batched_draft and (dec.draft.holes > 0 or dec.draft.compactions > 0)
        for lm, model in ((dec.target, no_eos.target), (dec.draft, no_eos.draft)):
            ids, valid = dec._catch_up(lm)
            cont = lm.score(ids, pad=~valid, n_logits=1)[:, -1]
            for b in range(len(PROMPTS)):
                with torch.inference_mode():
                    fresh = model(input_ids=torch.tensor([dec.text(b)])).logits[0, -1, : no_eos.vocab_size]
                seen = cont[b] > float("-inf")  # the draft's reduced head scores fewer ids
                assert (cont[b][seen] - fresh[seen]).abs().max().item() < 1e-4


@pytest.mark.parametrize("widths", [(3, 2, 1), (2, 2, 2, 2)])
def test_trees_drafted_for_all_rows_at_once_are_the_per_row_trees(tiny_pair, one_thread, widths):
    """One batched draft pass per depth grows the same top-k trees as a batch-1 draft per row: every round keeps
    the same counts, and the text is plain greedy's."""
    s = DecodeSettings(max_new_tokens=24)
    runs = {}
    for batched in (True, False):
        dec = TreeBatchDecoder(tiny_pair, PROMPTS, s, widths, "top-k", batched_draft=batched)
        runs[batched] = (dec.run(), dec)
    (fast, dec), (slow, _) = runs[True], runs[False]
    assert dec.batched_draft and dec.rows == []
    assert [r.n_accepted for r in fast.rounds] == [r.n_accepted for r in slow.rounds]
    assert fast.ids == slow.ids == [plain_decode(tiny_pair, p, s).ids for p in PROMPTS]


def test_bad_settings_are_refused(tiny_pair):
    with pytest.raises(InvalidInputError, match="block"):
        TreeBatchDecoder(tiny_pair, PROMPTS[:2], DecodeSettings(verify="block"))
    with pytest.raises(InvalidInputError, match="draft model or"):
        TreeBatchDecoder(tiny_pair, PROMPTS[:2], DecodeSettings(drafter="auto"))
    with pytest.raises(InvalidInputError, match="nodes"):
        TreeBatchDecoder(tiny_pair, PROMPTS[:2], DecodeSettings(), (8, 8, 8))
    with pytest.raises(InvalidInputError, match="all rows at once"):
        TreeBatchDecoder(tiny_pair, PROMPTS[:2], DecodeSettings(), (2, 2), "dynamic", batched_draft=True)


# ------------------------------------------------------------------------------------------ chi-square


def _chi_pvalues(pair, runs=80, copies=2, widths=(2, 2), mode="sampled"):
    """Per prompt, the chi-square p-values of its first three tokens over many runs of tree rows."""
    counts = np.zeros((3, len(CHI_PROMPTS), pair.vocab_size))
    batch = [p for p in CHI_PROMPTS for _ in range(copies)]
    for seed in range(runs):
        res = tree_batch_decode(pair, batch, DecodeSettings(max_new_tokens=3, sampling=CHI_CFG, seed=seed),
                                widths, mode)
        for row, out in enumerate(res.ids):
            for j in range(3):
                counts[j, row // copies, out[j]] += 1
    return [[chi_square(counts[j, i], exact[j]).p_value for j in range(3)]
            for i, exact in enumerate(_exact_first_three(pair, p, CHI_CFG) for p in CHI_PROMPTS)]


@pytest.mark.stat
@pytest.mark.parametrize("mode,widths", [("sampled", (2, 2)), ("top-k", (2, 1)), ("dynamic", (3, 2))])
def test_chi_square_per_row_first_three_tokens(no_eos, one_thread, mode, widths):
    for prompt, pvs in zip(CHI_PROMPTS, _chi_pvalues(no_eos, widths=widths, mode=mode)):
        assert min(pvs) > 1e-3, (mode, prompt, pvs)


@pytest.mark.stat
def test_chi_square_catches_nodes_that_see_their_siblings(no_eos, one_thread, monkeypatch):
    """Planted bug: every node sees every earlier node of its row's tree (a causal block, not its ancestors)."""
    real = tree_batch.tail_and_nodes
    monkeypatch.setattr(tree_batch, "tail_and_nodes",
                        lambda nt, visible: real(nt, torch.ones_like(visible).tril()))
    later = [min(pvs[1:]) for pvs in _chi_pvalues(no_eos, runs=50, widths=(3, 2))]
    assert min(later) < 1e-6, later


@pytest.mark.stat
def test_chi_square_catches_a_row_verified_against_another_rows_p(no_eos, one_thread, monkeypatch):
    """Planted bug: each row's tree is walked on the p rows of the row before it in the batch."""
    step = tree_batch.TreeBatchDecoder.step

    def crossed(self):
        score = type(self.target).score.__get__(self.target)
        self.target.score = lambda *a, **kw: score(*a, **kw).roll(1, dims=0)
        return step(self)

    monkeypatch.setattr(tree_batch.TreeBatchDecoder, "step", crossed)
    firsts = [pvs[0] for pvs in _chi_pvalues(no_eos, runs=40, copies=1)]
    assert min(firsts) < 1e-6, firsts


@pytest.mark.stat
def test_chi_square_catches_top_k_children_verified_as_if_sampled(no_eos, one_thread, monkeypatch):
    """Planted bug: deterministic top-k children carry the draft's sampled q instead of a one-hot q."""
    real = tree_mod.choose_children

    def lying(logits, width, mode, cfg, gen):
        xs, rows = real(logits, width, mode, cfg, gen)
        return xs, [dense(tree_mod.distribution(logits[None], cfg))] * len(xs)

    monkeypatch.setattr(tree_mod, "choose_children", lying)
    pvs = [min(p) for p in _chi_pvalues(no_eos, runs=60, widths=(2, 1), mode="top-k")]
    assert min(pvs) < 1e-6, pvs


@pytest.mark.slow
def test_real_pair_tree_rows_greedy_equal_batch1(real_pair_fp32, real_greedy):
    """The embedded pair in fp32: tree rows (a top-k tree and a dynamic one) give each prompt its plain greedy text."""
    prompts = ["def fibonacci(n):", "The history of the printing press begins",
               "import numpy as np\n\ndef moving_average(x, k):"]
    s = DecodeSettings(max_new_tokens=12)
    refs = [real_greedy(p, s.max_new_tokens) for p in prompts]
    for mode, widths in (("top-k", (3, 2, 1)), ("dynamic", (4, 4, 4))):
        assert tree_batch_decode(real_pair_fp32, prompts, s, widths, mode).ids == refs, mode
