"""The static-cache engines (specdec.core.static_cache): the same text as the eager engine, caches that hold the
committed text, the target's law under sampling, and a planted rollback bug that the checks catch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specdec.core.errors import InvalidInputError, UnsupportedModelError
from specdec.core.settings import DecodeSettings
from specdec.core.static_cache import (BUCKETS, MIN_SLOTS, SLACK, StaticCachedLM, bucket_for, open_lm, resolve_engine,
                                       slots_for)
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from tests.test_drafters import SAMPLED, _ngram_prompt, joint_chi_square
from tests.test_engine import check_caches_hold_committed

PROMPT = "def fibonacci(n):"
ENGINES = ("static", pytest.param("compiled", marks=pytest.mark.compile))


def on(pair, engine: str):
    return dataclasses.replace(pair, engine=engine)


def text_of(pair, prompt=PROMPT, **kw) -> list[int]:
    dec = SpeculativeDecoder(pair, prompt, DecodeSettings(**kw))
    for _ in dec:
        pass
    return dec.generated_ids


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("drafter,gamma", [("model", 1), ("model", 4), ("ngram", 6), ("auto", 3)])
def test_greedy_text_equals_the_eager_engine(no_eos, engine, drafter, gamma):
    kw = dict(drafter=drafter, gamma=gamma, max_new_tokens=40)
    assert text_of(on(no_eos, engine), **kw) == text_of(no_eos, **kw)


@pytest.mark.parametrize("engine", ENGINES)
def test_plain_decoding_equals_the_eager_engine(no_eos, engine):
    s = DecodeSettings(max_new_tokens=30)
    assert plain_decode(on(no_eos, engine), PROMPT, s).ids == plain_decode(no_eos, PROMPT, s).ids
    assert plain_decode(on(no_eos, engine), PROMPT, s, model="draft").ids == \
        plain_decode(no_eos, PROMPT, s, model="draft").ids


@pytest.mark.parametrize("engine", ENGINES)
def test_caches_hold_the_committed_text_after_rejections(no_eos, engine):
    dec = SpeculativeDecoder(on(no_eos, engine), PROMPT,
                             DecodeSettings(gamma=6, max_new_tokens=60, sampling=SAMPLED, seed=2))
    assert isinstance(dec.target, StaticCachedLM) and isinstance(dec.drafter.lm, StaticCachedLM)
    for _ in range(8):
        dec.step()
    assert sum(r.rejected_at is not None for r in dec.rounds) >= 2
    check_caches_hold_committed(no_eos, dec, tol=1e-4)
    if engine == "compiled":  # after the first pass, every short pass went through a compiled bucket
        assert dec.target.passes["bucketed"] >= 8 and dec.drafter.lm.passes["bucketed"] > 8


@pytest.mark.stat
@pytest.mark.compile
def test_first_three_tokens_follow_the_target_on_the_compiled_engine(no_eos, one_thread):
    pair = on(no_eos, "compiled")
    prompt = _ngram_prompt(pair)
    test = joint_chi_square(pair, prompt, DecodeSettings(gamma=2, sampling=SAMPLED), 300)
    assert test.p_value > 1e-3, test


class ForgetfulCrop(StaticCachedLM):
    """A planted bug: rolling back trims the token list but leaves the cache's length where it was, so the next
    pass writes past the rejected guesses' slots and attends to them."""

    def crop(self, n: int) -> None:
        del self.ids[n:]


def test_a_cache_that_does_not_roll_back_is_caught(no_eos, monkeypatch):
    import specdec.core.static_cache as sc

    monkeypatch.setattr(sc, "StaticCachedLM", ForgetfulCrop)
    s = DecodeSettings(gamma=4, max_new_tokens=40)
    assert text_of(on(no_eos, "static"), gamma=4, max_new_tokens=40) != text_of(no_eos, gamma=4, max_new_tokens=40)
    dec = SpeculativeDecoder(on(no_eos, "static"), PROMPT, s)
    for _ in range(4):
        dec.step()
    with pytest.raises(AssertionError):
        check_caches_hold_committed(no_eos, dec, tol=1e-4)


@pytest.mark.compile
def test_padding_slots_are_given_back(no_eos):
    lm = open_lm(no_eos.target, no_eos.vocab_size, engine="compiled", max_len=64)
    lm.feed([5, 6, 7])  # eager: the first pass allocates the cache
    lm.feed([8, 9, 10])  # padded to a bucket of 4, then one slot given back
    assert bucket_for(3) == 4 and lm.passes == {"eager": 1, "bucketed": 1}
    assert int(lm.cache.get_seq_length()) == len(lm) == 6
    fresh = no_eos.target(input_ids=torch.tensor([[5, 6, 7, 8, 9, 10, 11]])).logits[0, -1]
    assert torch.allclose(lm.feed([11])[-1], fresh[: no_eos.vocab_size], atol=1e-4)


def test_engine_names_and_limits_are_checked(no_eos, monkeypatch):
    monkeypatch.setenv("SPECDEC_COMPILE", "1")
    assert resolve_engine() == "compiled"
    monkeypatch.setenv("SPECDEC_COMPILE", "")
    assert resolve_engine() == "eager"
    with pytest.raises(InvalidInputError, match="unknown engine"):
        resolve_engine("fast")
    lm = open_lm(no_eos.target, no_eos.vocab_size, engine="static", max_len=8)
    assert lm.slots == MIN_SLOTS and lm.max_len == MIN_SLOTS - SLACK  # rounded up, so graphs are shared
    assert slots_for(MIN_SLOTS) == 2 * MIN_SLOTS and slots_for(MIN_SLOTS + 1 - SLACK) == 2 * MIN_SLOTS
    with pytest.raises(InvalidInputError, match=f"static cache holds {lm.max_len} tokens"):
        lm.feed(list(range(3, 3 + MIN_SLOTS)))
    with pytest.raises(UnsupportedModelError, match="eager engine"):
        lm.score(torch.tensor([[1, 2], [3, 4]]))  # one row: batches run on the eager engine
    assert BUCKETS[0] == 1 and list(BUCKETS) == sorted(BUCKETS)


@pytest.mark.compile
def test_the_cli_takes_the_compiled_engine(no_eos, capsys):
    from specdec.cli import main

    assert main(["generate", "--pair", "tiny", "--dtype", "float32", "--device", "cpu", "--prompt", PROMPT,
                 "--max-new-tokens", "12", "--compile", "--json"]) == 0
    out = capsys.readouterr().out
    assert '"engine": "compiled"' in out


@pytest.mark.compile
def test_precompiled_buckets_leave_nothing_to_compile_mid_run(no_eos):
    from torch._dynamo.utils import counters

    from specdec.core.static_cache import precompile

    for model in (no_eos.target, no_eos.draft):
        precompile(model, no_eos.vocab_size)
    before = dict(counters["stats"])
    text_of(on(no_eos, "compiled"), gamma=4, max_new_tokens=30)  # γ shrinks near the budget: passes of 1..6
    text_of(on(no_eos, "compiled"), prompt="x", drafter="auto", gamma=3, max_new_tokens=20)
    assert dict(counters["stats"]).get("unique_graphs") == before.get("unique_graphs")


@pytest.mark.parametrize("bucketed", [False, True])
@pytest.mark.parametrize("how", ["gather", "refeed"])
def test_trees_on_the_static_cache_give_a_fresh_forwards_logits(no_eos, bucketed, how):
    """Token trees on the static cache (the mask spans every slot, the stale ones hidden; bucketed: the node count
    padded to a bucket, the padding seeing only itself): every node's row equals a fresh forward of its path, and
    after keep_path the cache holds exactly the committed text, round after round."""
    import random

    from tests.test_tree_scoring import fresh, fresh_rows, max_diff, path_tokens, random_tree

    v, model = no_eos.vocab_size, no_eos.target
    lm = StaticCachedLM(model, v, max_len=64)
    lm.bucketed = bucketed
    rng = random.Random(3)
    committed = [5, 40, 41, 42, 7, 60]
    for _ in range(6):
        tree = random_tree(rng, v)
        got = lm.logits_for_tree(committed, tree)
        assert max_diff(got, fresh_rows(model, committed, tree, v)) < 1e-4
        node = rng.choice([-1] + list(range(tree.size)))
        after = committed + path_tokens(tree, node) + [rng.randrange(4, v)]
        lm.keep_path(after, tree.path_to(node), how)
        assert int(lm.cache.get_seq_length()) == lm.width == len(lm.ids) and lm.ids == after[: len(lm.ids)]
        committed = after
        assert max_diff(lm.logits_after(committed), fresh(model, committed, v)[None]) < 1e-4
    if bucketed:
        assert lm.passes["bucketed"] > 0


TREE_CASES = [("top-k", (3, 2, 1), "model"), ("dynamic", (3, 2, 2), "model"), ("top-k", (2, 2, 2), "ngram")]


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("mode,widths,drafter", TREE_CASES)
def test_tree_decoding_on_the_static_engines_equals_plain_greedy(no_eos, one_thread, engine, mode, widths, drafter):
    """TreeDecoder opens both caches on the pair's engine: draft-model trees (fixed and dynamic, the dynamic one
    grown depth by depth) and copied trees give plain greedy's text, and on the compiled engine the tree passes
    after the first went through buckets (the node count padded, the padding seeing only itself)."""
    from specdec.loop.tree import TreeDecoder

    pair = on(no_eos, engine)
    for prompt in (PROMPT, _ngram_prompt(no_eos)):
        s = DecodeSettings(max_new_tokens=24, drafter=drafter)
        plain = plain_decode(no_eos, prompt, s).ids
        dec = TreeDecoder(pair, prompt, s, widths, mode)
        list(dec)
        assert isinstance(dec.target, StaticCachedLM) and dec.generated_ids == plain, (engine, mode, prompt)
        if engine == "compiled":
            assert dec.target.passes["bucketed"] >= len(dec.rounds) - 1
            if drafter == "model":
                assert dec.draft.passes["bucketed"] > 0


@pytest.mark.stat
def test_first_three_tokens_of_tree_rounds_follow_the_target_on_the_static_engine(no_eos, one_thread):
    """Sampled children (their own q) and a dynamic tree (one-hot q per node) on the static cache follow the
    target's joint law of the first three tokens."""
    from tests.test_tree_decoding import tree_joint_chi_square

    pair = on(no_eos, "static")
    for mode, widths in (("sampled", (2, 2)), ("dynamic", (3, 2, 2))):
        test = tree_joint_chi_square(pair, _ngram_prompt(pair), widths, mode, 400)
        assert test.p_value > 1e-3, (mode, test)
