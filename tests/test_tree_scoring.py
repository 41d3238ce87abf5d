"""Scoring a token tree in one target pass (CachedLM.logits_for_tree) and keeping the accepted path (keep_path).

Every check compares with a fresh full forward (no cache, transformers' own causal mask) of the committed text
plus the path to a node: the tree pass must give, for every node, the logits that node would get as a chain.
"""

from __future__ import annotations

import random

import pytest
import torch

from specdec.core.kvcache import CachedLM, tree_attention_mask
from specdec.core.tree import ROOT, TokenTree
from specdec.models.tiny import tiny_models

SHAPES = {
    "width3": [ROOT, ROOT, ROOT],
    "2x2": [ROOT, ROOT, 0, 0, 1, 1],
    "unbalanced": [ROOT, ROOT, ROOT, 0, 0, 1, 3, 3, 6, 2, 8],
}
COMMITTED = [5, 40, 41, 42, 7, 60, 61, 9, 33, 70]


def make_tree(parents: list[int], vocab: int, seed: int = 0) -> TokenTree:
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, vocab, (len(parents),), generator=gen)
    return TokenTree(tokens, list(parents), torch.full((len(parents), vocab), 1.0 / vocab))


def path_tokens(tree: TokenTree, node: int) -> list[int]:
    return [int(tree.tokens[j]) for j in tree.path_to(node)]


@torch.inference_mode()
def fresh(model, ids: list[int], vocab: int) -> torch.Tensor:
    """The logits after `ids` from a full forward with no cache."""
    return model(input_ids=torch.tensor([ids])).logits[0, -1, :vocab]


def fresh_rows(model, committed: list[int], tree: TokenTree, vocab: int) -> torch.Tensor:
    """[n + 1, V]: row 0 after the committed text, row i + 1 after committed + path_to(i)."""
    rows = [fresh(model, committed, vocab)]
    rows += [fresh(model, committed + path_tokens(tree, i), vocab) for i in range(tree.size)]
    return torch.stack(rows)


def max_diff(got: torch.Tensor, want: torch.Tensor, columns: torch.Tensor | None = None) -> float:
    if columns is not None:
        got, want = got[:, columns], want[:, columns]
    return float((got - want).abs().max())


# ---------------------------------------------------------------------------------------------- models


@pytest.fixture(scope="module")
def eager_pair(tiny_pair):
    """The tiny target and draft again, with eager attention (adds the mask to the scores) instead of sdpa."""
    target, draft = tiny_models(tiny_pair.vocab_size, 0)
    for m in (target, draft):
        m.set_attn_implementation("eager")
        m.eval()
    assert target.config._attn_implementation == "eager"
    return target, draft


@pytest.fixture(scope="module")
def tiny_llama(tiny_pair):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=tiny_pair.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2, tie_word_embeddings=True)
    torch.manual_seed(3)
    return LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def tiny_sliding(tiny_pair):
    """A Qwen2 whose second layer has a 6-token sliding window: the tree mask must apply it (a dict of masks)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=tiny_pair.vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, initializer_range=0.2, use_sliding_window=True,
                      sliding_window=6, max_window_layers=1, tie_word_embeddings=True)
    torch.manual_seed(4)
    model = Qwen2ForCausalLM(cfg).eval()
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    return model


MODELS = ["target", "draft", "draft_reduced_head", "target_eager", "draft_eager", "llama", "sliding"]


@pytest.fixture
def model_and_lm(request, tiny_pair, eager_pair, tiny_llama, tiny_sliding):
    """(model for the fresh forward, a CachedLM over it, the scored columns or None) for a MODELS name."""
    v = tiny_pair.vocab_size
    name = request.param
    model = {"target": tiny_pair.target, "draft": tiny_pair.draft, "draft_reduced_head": tiny_pair.draft,
             "target_eager": eager_pair[0], "draft_eager": eager_pair[1], "llama": tiny_llama,
             "sliding": tiny_sliding}[name]
    lm = CachedLM(model, v, head_vocab=50 if name == "draft_reduced_head" else 0, always_keep=(1, 70, 90))
    return model, lm, lm.columns


# ---------------------------------------------------------------------------------------------- tree logits


@pytest.mark.parametrize("model_and_lm", MODELS, indirect=True)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_tree_logits_equal_fresh_forward_of_each_path(model_and_lm, shape, tiny_pair):
    model, lm, columns = model_and_lm
    v = tiny_pair.vocab_size
    tree = make_tree(SHAPES[shape], v, seed=len(shape))
    committed = COMMITTED * 2  # 20 tokens: longer than the sliding model's window
    want = fresh_rows(model, committed, tree, v)
    # Cold cache (the whole committed text is the tail), then a warm one (a cached prefix and a short tail).
    got_cold = lm.logits_for_tree(committed, tree)
    assert got_cold.shape == (tree.size + 1, v)
    assert max_diff(got_cold, want, columns) < 1e-4
    lm.keep_path(committed + [3], [])
    longer = committed + [11, 12]
    want_warm = fresh_rows(model, longer, tree, v)
    got_warm = lm.logits_for_tree(longer, tree)
    assert len(lm.ids) == len(longer) and lm.cache.get_seq_length() == len(longer) + tree.size
    assert max_diff(got_warm, want_warm, columns) < 1e-4
    if columns is not None:  # a reduced head: -inf outside its columns, as logits_after gives
        outside = torch.ones(v, dtype=torch.bool)
        outside[columns] = False
        assert torch.isneginf(got_warm[:, outside]).all()


@pytest.mark.parametrize("model_and_lm", ["target", "draft_reduced_head", "target_eager", "llama"], indirect=True)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_tree_grown_depth_by_depth_scores_each_node_as_a_fresh_forward(model_and_lm, shape, tiny_pair):
    """tree_root then one grow_tree per depth (only that depth's nodes fed, their ancestors already cached):
    every row equals the fresh forward of committed + its path; a node given the wrong ancestors does not; and
    the next sync leaves the cache of the committed text alone."""
    model, lm, columns = model_and_lm
    v = tiny_pair.vocab_size
    tree = make_tree(SHAPES[shape], v, seed=len(shape))
    want = fresh_rows(model, COMMITTED, tree, v)
    assert max_diff(lm.tree_root(COMMITTED), want[:1], columns) < 1e-4
    depths, number = tree.depths, {}
    for d in range(1, max(depths) + 1):
        nodes = [i for i in range(tree.size) if depths[i] == d]
        got = lm.grow_tree([int(tree.tokens[i]) for i in nodes],
                           [number[tree.parents[i]] if tree.parents[i] >= 0 else -1 for i in nodes])
        for i in nodes:
            number[i] = len(number)
        assert max_diff(got, want[[i + 1 for i in nodes]], columns) < 1e-4, (shape, d)
    deep = max(range(tree.size), key=lambda i: depths[i])
    if depths[deep] > 1:  # the deepest node fed again as a child of the root: other ancestors, other logits
        lm.tree_root(COMMITTED)
        wrong = lm.grow_tree([int(tree.tokens[deep])], [-1])
        assert max_diff(wrong, want[deep + 1 : deep + 2], columns) > 1e-3
    lm.sync(COMMITTED + [3])
    assert lm.ids == COMMITTED and lm.cache.get_seq_length() == len(COMMITTED)
    assert max_diff(lm.logits_after(COMMITTED + [3]), fresh(model, COMMITTED + [3], v)[None], columns) < 1e-4


@pytest.mark.parametrize("model_and_lm", ["target", "draft", "target_eager"], indirect=True)
@pytest.mark.parametrize("shape", list(SHAPES))
def test_broken_mask_is_caught(model_and_lm, shape, tiny_pair):
    """The check above can fail: a causal mask over the flattened nodes (siblings and cousins see each other)
    gives other logits than the fresh forwards, while the tree's own mask, on the same lm, agrees with them."""
    model, lm, _ = model_and_lm
    v = tiny_pair.vocab_size
    tree = make_tree(SHAPES[shape], v, seed=len(shape))
    want = fresh_rows(model, COMMITTED, tree, v)
    causal = torch.ones(tree.size, tree.size, dtype=torch.bool).tril()
    assert not torch.equal(causal, tree.ancestors_mask())
    broken = lm.logits_for_tree(COMMITTED, tree, visible=causal)
    assert max_diff(broken, want) > 1e-2
    # Nodes that see exactly their ancestors under the causal mask too (node 0 and its first-child line) agree.
    same_rows = [0] + [i + 1 for i in range(tree.size) if torch.equal(causal[i], tree.ancestors_mask()[i])]
    assert max_diff(broken[same_rows], want[same_rows]) < 1e-4
    assert max_diff(lm.logits_for_tree(COMMITTED, tree), want) < 1e-4


def test_additive_mask_in_model_dtype(tiny_pair):
    """The mask is float in the model's dtype, 0 where visible and the dtype's min where hidden (a bool mask would
    be added as 0/1 by eager attention and hide nothing)."""
    tree = make_tree(SHAPES["2x2"], tiny_pair.vocab_size)
    positions = torch.tensor([3, 4] + [4 + d for d in tree.depths])
    for dtype in (torch.float32, torch.bfloat16):
        mask = tree_attention_mask(3, 2, tree.ancestors_mask(), positions, None, dtype, "cpu")
        assert mask.dtype == dtype and mask.shape == (1, 1, 2 + 6, 3 + 2 + 6)
        visible = mask[0, 0] == 0
        assert set(mask.unique().tolist()) == {0.0, torch.finfo(dtype).min}
        assert visible[0].tolist() == [True] * 4 + [False] * 7  # the tail is causal
        assert visible[2].tolist() == [True] * 5 + [True] + [False] * 5  # node 0: the committed text and itself
        assert visible[2 + 4].tolist() == [True] * 5 + [False, True, False, False, True, False]  # node 4: 1 and 4


# ---------------------------------------------------------------------------------------------- chains


@pytest.mark.parametrize("gamma", [1, 4])
def test_chain_equals_logits_after(tiny_pair, gamma):
    """A chain scored as a tree gives logits_after's numbers (cold cache, then a warm cache with a tail of 2)."""
    v = tiny_pair.vocab_size
    for model in (tiny_pair.target, tiny_pair.draft):
        as_tree, as_chain = CachedLM(model, v), CachedLM(model, v)
        committed = list(COMMITTED)
        for rnd in range(3):
            tokens = torch.randint(4, v, (gamma,), generator=torch.Generator().manual_seed(rnd))
            chain = TokenTree.chain(tokens, torch.full((gamma, v), 1.0 / v))
            got = as_tree.logits_for_tree(committed, chain)
            want = as_chain.logits_after(committed, tokens.tolist(), gamma + 1)
            assert got.shape == want.shape == (gamma + 1, v)
            assert max_diff(got, want) < 1e-5
            accepted = rnd % (gamma + 1)
            committed = committed + tokens[:accepted].tolist() + [int(v - 1 - rnd)]
            as_tree.keep_path(committed, list(range(accepted)))


# ---------------------------------------------------------------------------------------------- keep_path


def random_tree(rng: random.Random, vocab: int) -> TokenTree:
    n = rng.randint(3, 12)
    parents = [ROOT] + [rng.choice([ROOT] + list(range(i))) for i in range(1, n)]
    tokens = torch.tensor([rng.randrange(4, vocab) for _ in range(n)])
    return TokenTree(tokens, parents, torch.full((n, vocab), 1.0 / vocab))


@pytest.mark.parametrize("how", ["gather", "refeed"])
@pytest.mark.parametrize("model_name", ["target", "draft"])
def test_keep_path_leaves_the_cache_of_a_fresh_forward(tiny_pair, how, model_name):
    """Rounds in a row: score a random tree, accept a random path (sometimes none, sometimes cut short as a stop
    rule would), keep it; the cache then gives a fresh forward's logits, checked on alternate rounds by
    logits_after and by the next round's tree pass itself."""
    v = tiny_pair.vocab_size
    model = getattr(tiny_pair, model_name)
    lm = CachedLM(model, v)
    rng = random.Random(7)
    committed = list(COMMITTED)
    tree = random_tree(rng, v)
    for rnd in range(12):
        got = lm.logits_for_tree(committed, tree)
        if rnd % 2:  # the tree pass right after a keep: its rows (row 0 too) need the kept cache to be right
            assert max_diff(got, fresh_rows(model, committed, tree, v)) < 1e-4
        node = rng.choice([ROOT] + list(range(tree.size)))
        path, accepted = tree.path_to(node), path_tokens(tree, node)
        if path and rng.random() < 0.25:  # a stop rule ended the text inside the accepted path
            cut = rng.randrange(len(path))
            after = committed + accepted[: cut + 1]
        else:
            after = committed + accepted + [rng.randrange(4, v)]
        lm.keep_path(after, path, how)
        assert lm.ids == after[: len(lm.ids)] and len(lm.ids) <= len(after) - 1
        assert lm.cache.get_seq_length() == len(lm.ids)
        if how == "gather":
            assert lm.ids == after[:-1]  # every accepted node that stays cached was moved into place
        committed = after
        tree = random_tree(rng, v)
        if rnd % 2 == 0:
            assert max_diff(lm.logits_after(committed), fresh(model, committed, v)[None]) < 1e-4


def test_keep_path_default_and_checks(tiny_pair):
    v = tiny_pair.vocab_size
    lm = CachedLM(tiny_pair.target, v)
    assert CachedLM.KEEP_PATH in ("gather", "refeed")
    tree = make_tree(SHAPES["2x2"], v)
    with pytest.raises(RuntimeError):
        lm.keep_path(COMMITTED + [3], [])  # nothing scored yet
    lm.logits_for_tree(COMMITTED, tree)
    with pytest.raises(ValueError):
        lm.keep_path(COMMITTED + [3], [2])  # node 2 is not a child of the root
    with pytest.raises(ValueError):
        lm.keep_path(COMMITTED + [3], [0], how="copy")
    lm.keep_path(COMMITTED + path_tokens(tree, 4) + [3], [1, 4])  # the default strategy
    assert lm.ids == COMMITTED + path_tokens(tree, 4)
    assert lm.cache.get_seq_length() == len(lm.ids)


def test_other_calls_drop_unkept_tree_slots(tiny_pair):
    """A scored tree that no keep_path follows leaves no slots behind: sync, feed and logits_after drop them."""
    v = tiny_pair.vocab_size
    model = tiny_pair.target
    lm = CachedLM(model, v)
    tree = make_tree(SHAPES["unbalanced"], v)
    lm.logits_for_tree(COMMITTED, tree)
    assert lm.cache.get_seq_length() == len(COMMITTED) + tree.size
    nxt = COMMITTED + [int(tree.tokens[0]), 3]  # agrees with node 0: its slot must still not be reused by sync
    assert max_diff(lm.logits_after(nxt), fresh(model, nxt, v)[None]) < 1e-4
    assert lm.cache.get_seq_length() == len(lm.ids) == len(nxt)
    lm.logits_for_tree(nxt, tree)
    lm.sync(nxt)
    assert lm.cache.get_seq_length() == len(lm.ids)
    lm.logits_for_tree(nxt, tree)
    lm.crop(3)
    assert lm.cache.get_seq_length() == len(lm.ids) == 3
