"""The shared pair cache stays bounded: the startup pair plus the most recent others, and nothing in use is lost.

Distinct tiny pairs ("tiny:target:<seed>") stand in for custom pairs; weakrefs to their models prove an evicted
pair is really freed once its last user lets go.
"""

from __future__ import annotations

import gc
import weakref
import sys

import pytest
import torch

from specdec.models import pair as models
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from specdec.core.errors import ModelLoadError
from specdec.models.pair import PairCache, load_pair, pair_lease
from specdec.core.settings import DecodeSettings
from tests.conftest import decode_choices

GREEDY = DecodeSettings(gamma=3, max_new_tokens=12)


@pytest.fixture
def cache(monkeypatch):
    """A private cache holding at most one unpinned pair, so the suite's shared pairs are untouched."""
    fresh = PairCache(max_pairs=1)
    monkeypatch.setattr(models, "PAIR_CACHE", fresh)
    monkeypatch.setenv("SPECDEC_PAIR", "tiny")
    yield fresh
    fresh.clear()


def tiny(seed: int):
    return load_pair(target=f"tiny:target:{seed}", draft=f"tiny:draft:{seed}", dtype="float32", device="cpu")


def dead(ref: weakref.ref) -> bool:
    gc.collect()
    return ref() is None


def test_tiny_seeds_give_distinct_pairs(cache):
    a, b = tiny(1), tiny(2)
    assert not torch.equal(a.target.lm_head.weight, b.target.lm_head.weight)
    assert tiny(2) is b  # memoized
    with pytest.raises(ModelLoadError, match="same seed"):
        load_pair(target="tiny:target:1", draft="tiny:draft:2", device="cpu", shared=False)
    with pytest.raises(ModelLoadError, match="tiny:target:<seed>"):
        load_pair(target="tiny:target:x", draft="tiny:draft", device="cpu", shared=False)


def test_startup_pair_stays_and_old_custom_pairs_are_freed(cache):
    startup = load_pair("tiny", dtype="float32", device="cpu")
    first = tiny(1)
    ref = weakref.ref(first.target)
    assert tiny(2) is not None  # over the limit of one: pair 1 (least recently used) leaves
    assert first not in cache and len(cache) == 2
    del first
    assert dead(ref), "an evicted pair nobody uses must be freed"
    assert load_pair("tiny", dtype="float32", device="cpu") is startup
    tiny(3)
    assert startup in cache, "the startup pair is never evicted"


def test_recently_used_pair_is_kept(cache):
    cache.max_pairs = 2
    tiny(0)  # pinned (the first pair of the process)
    a, b = tiny(1), tiny(2)
    assert tiny(1) is a  # a is now the most recent use
    tiny(3)
    assert a in cache and b not in cache


def test_leased_pair_is_not_evicted_and_keeps_decoding(cache):
    tiny(0)  # pinned (the first pair of the process)
    pair = tiny(1)
    ref = weakref.ref(pair.target)
    expected = plain_decode(pair, "hello", GREEDY).ids
    with pair_lease(pair):
        dec = SpeculativeDecoder(pair, "hello", GREEDY)
        dec.step()
        tiny(2)
        three = tiny(3)
        assert pair in cache and len(cache) == 3, "a leased pair stays cached even beyond the limit"
        for _ in dec:
            pass
    assert dec.generated_ids == expected
    assert pair not in cache and three in cache, "trimmed as soon as its last lease ends"
    del pair, dec
    assert dead(ref)


def test_leased_pair_is_handed_out_again_not_loaded_twice(cache):
    tiny(0)
    pair = tiny(1)
    with pair_lease(pair):
        two = tiny(2)
        assert tiny(1) is pair
    # pair 1 was the last one asked for, so pair 2 is the one to leave once the lease ends
    assert pair in cache and two not in cache


def test_unleased_pair_in_use_keeps_working_but_is_not_handed_out_again(cache):
    tiny(0)
    pair = tiny(1)
    expected = plain_decode(pair, "abc", GREEDY).ids
    dec = SpeculativeDecoder(pair, "abc", GREEDY)
    dec.step()
    ref = weakref.ref(pair.target)
    del pair
    tiny(2)
    assert not dead(ref), "the decoder still holds the evicted pair"
    for _ in dec:
        pass
    assert dec.generated_ids == expected
    again = tiny(1)
    assert again.target is not ref(), "an evicted pair is not re-handed by the cache"
    del dec
    assert dead(ref)


def test_eviction_listeners_and_nested_leases(cache):
    seen = []
    cache.on_evict(lambda p: seen.append(p.target_id))
    tiny(0)
    pair = tiny(1)
    with pair_lease(pair), pair_lease(pair):
        tiny(2)
        assert pair.leases == 2 and pair in cache
    assert pair.leases == 0
    assert seen == ["tiny:target:1"]


def test_limit_from_environment(cache, monkeypatch):
    cache.max_pairs = None
    monkeypatch.setenv("SPECDEC_MAX_PAIRS", "0")
    tiny(0)  # pinned
    tiny(1)
    assert len(cache) == 1
    monkeypatch.setenv("SPECDEC_MAX_PAIRS", "many")
    with pytest.raises(ModelLoadError, match="SPECDEC_MAX_PAIRS"):
        tiny(2)
    monkeypatch.delenv("SPECDEC_MAX_PAIRS")
    assert cache.limit() == models.DEFAULT_MAX_PAIRS


def test_set_max_pairs_trims_at_once(cache, monkeypatch):
    monkeypatch.setattr(models.PAIR_CACHE, "max_pairs", 3)
    tiny(0)
    tiny(1)
    tiny(2)
    assert len(cache) == 3
    models.set_max_pairs(1)
    assert len(cache) == 2
    with pytest.raises(ModelLoadError):
        models.set_max_pairs(-1)


def test_private_pairs_bypass_the_cache(cache):
    p = load_pair(target="tiny:target:5", draft="tiny:draft:5", device="cpu", shared=False)
    assert p not in cache and len(cache) == 0


def test_the_app_loader_lets_an_evicted_pair_go(cache):
    from ui.loader import LoadJob, PairLoader, PairRequest

    loader = PairLoader(measure=False)
    load_pair("tiny", dtype="float32", device="cpu")  # the startup pair (pinned)
    first = tiny(1)
    ref = weakref.ref(first.target)
    req = PairRequest("tiny", "tiny:target:1", "tiny:draft:1")
    loader._jobs[req] = LoadJob(req, pair=first)  # as a finished background load leaves it
    del first
    tiny(2)  # over the limit: pair 1 leaves the cache, and the loader forgets its job
    assert loader.peek(req) is None
    assert dead(ref), "the loader must not keep an evicted pair alive"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="malloc_trim is glibc's")
def test_freed_heap_pages_go_back_to_the_system():
    import psutil

    from specdec.models.pair import release_freed_memory

    rss = lambda: psutil.Process().memory_info().rss / 2**20  # noqa: E731
    blocks = [bytearray(64 * 1024) for _ in range(4000)]  # 250 MiB in heap-sized blocks, as a load leaves them
    keep = blocks[-1]  # noqa: F841 -- the heap's top stays in use: freeing alone returns nothing
    grown = rss()
    del blocks
    assert release_freed_memory()
    assert rss() < grown - 150


def test_pairs_of_one_target_share_its_loaded_model(cache, tmp_path):
    """Two cached pairs with the same target (ids, dtype, device) hold one copy of it: the second load builds only
    its draft, and both decode as each would alone. A private pair (shared=False) loads its own."""
    from specdec.models.tiny import tiny_models, tiny_tokenizer

    cache.max_pairs = 2
    tok = tiny_tokenizer()
    folders = {}
    for name, seed in (("t", 0), ("d1", 1), ("d2", 2)):
        model, _ = tiny_models(len(tok), seed)
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
        folders[name] = str(tmp_path / name)
    one = load_pair(target=folders["t"], draft=folders["d1"], dtype="bfloat16", device="cpu")
    two = load_pair(target=folders["t"], draft=folders["d2"], dtype="bfloat16", device="cpu")
    assert two.target is one.target and two.tokenizer is one.tokenizer and two.draft is not one.draft
    alone = load_pair(target=folders["t"], draft=folders["d2"], dtype="bfloat16", device="cpu", shared=False)
    assert alone.target is not one.target
    assert decode_choices(two, "the cat sat on the mat", GREEDY) == decode_choices(alone, "the cat sat on the mat",
                                                                                   GREEDY)
