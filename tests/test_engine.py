"""The decoding loop on the tiny random-weight pair: determinism, greedy equality, caches, stopping, bad input."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from specdec.core.errors import InvalidInputError, ModelLoadError, UnsupportedModelError, VocabularyMismatchError
from specdec.core.kvcache import CachedLM
from specdec.models.pair import load_pair
from specdec.models.tiny import tiny_models, tiny_tokenizer
from specdec.core.sampling import SamplingConfig, dense, draw, warp

PROMPT = "def fibonacci(n):"
SAMPLED = SamplingConfig(temperature=0.9, top_k=40, top_p=0.95)


def run(pair, prompt=PROMPT, **kw):
    dec = SpeculativeDecoder(pair, prompt, DecodeSettings(**kw))
    rounds = list(dec)
    return dec, rounds


def test_same_seed_same_output(tiny_pair):
    a, _ = run(tiny_pair, gamma=4, max_new_tokens=40, sampling=SAMPLED, seed=3)
    b, _ = run(tiny_pair, gamma=4, max_new_tokens=40, sampling=SAMPLED, seed=3)
    c, _ = run(tiny_pair, gamma=4, max_new_tokens=40, sampling=SAMPLED, seed=4)
    assert a.generated_ids == b.generated_ids
    assert a.generated_ids != c.generated_ids


@pytest.mark.parametrize("gamma,draft_vocab", [(1, 0), (4, 0), (8, 0), (4, 60)])
def test_greedy_equals_plain_generate(tiny_pair, gamma, draft_vocab):
    dec, rounds = run(tiny_pair, gamma=gamma, max_new_tokens=30, draft_vocab=draft_vocab)
    ids = torch.tensor([dec.prompt_ids])
    ref = tiny_pair.target.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=30,
                                    eos_token_id=None, pad_token_id=0)[0, ids.shape[1]:].tolist()
    assert dec.generated_ids == ref
    assert plain_decode(tiny_pair, PROMPT, DecodeSettings(max_new_tokens=30)).ids == ref
    assert any(r.rejected_at is not None for r in rounds)  # the pair disagrees sometimes: not a trivial pass


def test_round_events_are_consistent(no_eos):
    dec, rounds = run(no_eos, gamma=5, max_new_tokens=50, sampling=SAMPLED, seed=1)
    assert sum(len(r.committed_ids) for r in rounds) == len(dec.generated_ids) == 50
    assert [r.index for r in rounds] == list(range(len(rounds)))
    for r in rounds:
        assert len(r.draft_ids) == r.gamma == len(r.q_top) == len(r.accept_probs) == len(r.uniforms)
        assert len(r.p_top) == r.gamma + 1
        for i in range(r.n_accepted):
            assert r.uniforms[i] < r.accept_probs[i]
            assert r.accept_probs[i] == pytest.approx(min(1.0, r.p_draft[i] / r.q_draft[i]), rel=1e-5)
        if r.rejected_at is not None:
            assert r.uniforms[r.rejected_at] >= r.accept_probs[r.rejected_at]
            assert not r.is_bonus and r.residual_top
        else:
            assert r.is_bonus and r.residual_top is None
        full = r.draft_ids[: r.n_accepted] + [r.emitted_id]
        assert r.committed_ids == full[: len(r.committed_ids)]
    json.dumps([r.to_dict() for r in rounds])  # JSON-ready
    assert rounds[-1].totals.generated == 50 and rounds[-1].stop_reason == "max_new_tokens"
    assert rounds[-1].totals.target_passes == len(rounds)


def test_step_runs_exactly_one_round(tiny_pair):
    dec = SpeculativeDecoder(tiny_pair, PROMPT, DecodeSettings(gamma=3, max_new_tokens=20, sampling=SAMPLED))
    r0 = dec.step()
    assert len(dec.rounds) == 1 and dec.generated_ids == r0.committed_ids
    dec.step()
    assert len(dec.rounds) == 2


def _fresh_logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0, -1].float()


def check_caches_hold_committed(pair, dec, tol):
    """Both caches hold the committed text minus its last token; continuing equals a fresh full forward."""
    ids = dec.ids
    assert dec.target.ids == ids[:-1]
    assert dec.target.cache.get_seq_length() == len(ids) - 1
    d = dec.drafter.lm
    assert d.ids == ids[: len(d.ids)] and len(d.ids) >= len(ids) - 2  # after a bonus the draft lacks one guess
    assert d.cache.get_seq_length() == len(d.ids)
    for lm, model in ((dec.target, pair.target), (d, pair.draft)):
        cont = lm.logits_after(ids)[-1].float()
        fresh = _fresh_logits(model, ids)[: pair.vocab_size]
        kept = torch.isfinite(cont)  # a reduced draft head scores only its kept ids (the rest are -inf)
        assert kept.all() or lm is d
        assert kept.sum() >= min(pair.vocab_size, lm.head_cut or pair.vocab_size)
        assert (cont[kept] - fresh[kept]).abs().max().item() < tol


def test_caches_after_rejections(no_eos):
    dec = SpeculativeDecoder(no_eos, PROMPT, DecodeSettings(gamma=6, max_new_tokens=60, sampling=SAMPLED, seed=2))
    for _ in range(8):
        dec.step()
    assert sum(r.rejected_at is not None for r in dec.rounds) >= 2
    check_caches_hold_committed(no_eos, dec, tol=1e-4)


def test_stops_at_eos(tiny_pair):
    dec, _ = run(tiny_pair, gamma=4, max_new_tokens=30)
    stop_tok = dec.generated_ids[6]
    pair = dataclasses.replace(tiny_pair, eos_token_ids=(stop_tok,))
    dec2, rounds = run(pair, gamma=4, max_new_tokens=30)
    assert dec2.generated_ids == dec.generated_ids[: dec.generated_ids.index(stop_tok) + 1]
    assert rounds[-1].stop_reason == "eos" and dec2.done


def test_reduced_draft_vocabulary_only_proposes_kept_ids(tiny_pair):
    dec, rounds = run(tiny_pair, gamma=4, max_new_tokens=40, sampling=SAMPLED, draft_vocab=30)
    for r in rounds:
        # kept: ids below the cut, EOS, and every token already in the text when the round started
        seen = set(dec.prompt_ids) | set(dec.generated_ids[: r.position]) | set(tiny_pair.eos_token_ids)
        assert all(t < 30 or t in seen for t in r.draft_ids)
        assert all(t.id < 30 or t.id in seen for row in r.q_top for t in row)  # q has no mass elsewhere
    assert any(r.draft_ids for r in rounds)


def test_reduced_head_matches_the_full_head_on_kept_ids(tiny_pair):
    ids = tiny_pair.tokenizer("hello world", add_special_tokens=False)["input_ids"]
    full = CachedLM(tiny_pair.draft, tiny_pair.vocab_size).logits_after(ids)[-1]
    lm = CachedLM(tiny_pair.draft, tiny_pair.vocab_size, head_vocab=30, always_keep=(77,))
    lm.keep_in_head([95, 95, 3])
    part = lm.logits_after(ids)[-1]
    kept = sorted(set(range(30)) | {77, 95})
    assert torch.allclose(part[kept], full[kept], atol=1e-5)
    others = [i for i in range(tiny_pair.vocab_size) if i not in kept]
    assert torch.isinf(part[others]).all() and (part[others] < 0).all()


@pytest.mark.parametrize("cfg", [SamplingConfig(), SamplingConfig(temperature=0.9), SamplingConfig(0.7, 5, 0.9),
                                 SamplingConfig(1.2, 0, 0.8)])
def test_drawing_over_the_head_columns_equals_drawing_over_the_full_row(tiny_pair, cfg):
    """A reduced head's drafter draws over the scored columns only; the tokens (same seed) and q equal a draw
    over the full -inf-padded row, because the columns are kept in vocabulary order."""
    ids = tiny_pair.tokenizer("hello world", add_special_tokens=False)["input_ids"]
    lm = CachedLM(tiny_pair.draft, tiny_pair.vocab_size, head_vocab=30, always_keep=(77,))
    lm.keep_in_head([95, 3, 40])  # added out of order: the columns must still come out sorted
    assert lm.columns.tolist() == sorted(lm.columns.tolist()) and lm.columns.tolist()[-3:] == [40, 77, 95]
    compact = lm.logits_after(ids, all_columns=False)
    full = torch.full((compact.shape[0], tiny_pair.vocab_size), float("-inf"))
    full[:, lm.columns] = compact
    for seed in range(20):
        a_tok, a_q = draw(compact.expand(8, -1), cfg, torch.Generator().manual_seed(seed), lm.columns, lm.vocab_size)
        b_tok, b_q = draw(full.expand(8, -1), cfg, torch.Generator().manual_seed(seed))
        assert torch.equal(a_tok, b_tok)
        assert torch.allclose(dense(a_q), dense(b_q), atol=1e-6)


@pytest.mark.stat
@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_end_to_end_first_token_follows_target(tiny_pair, draft_vocab):
    """The whole loop, not just verify: first emitted tokens over many seeds follow the target's warped p,
    also when the draft may only propose a subset of the vocabulary (the residual must supply the rest)."""
    cfg = SamplingConfig(temperature=1.5, top_k=12)
    prompt = "ab"
    ids = tiny_pair.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    p = warp(_fresh_logits(tiny_pair.target, ids)[: tiny_pair.vocab_size], cfg).double().numpy()
    n = 1500
    counts = np.zeros_like(p)
    for seed in range(n):
        dec = SpeculativeDecoder(tiny_pair, prompt, DecodeSettings(gamma=2, max_new_tokens=1, sampling=cfg, seed=seed,
                                                                   draft_vocab=draft_vocab))
        counts[dec.step().committed_ids[0]] += 1
    support = p > 0
    assert counts[~support].sum() == 0
    assert chisquare(counts[support], n * p[support] / p[support].sum()).pvalue > 1e-3


# ----------------------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "prompt,kw,match",
    [
        ("", {}, "empty"),
        ("   \n", {}, "empty"),
        ("hi", {"gamma": 0}, "gamma"),
        ("hi", {"gamma": 33}, "gamma"),
        ("hi", {"max_new_tokens": 0}, "max_new_tokens"),
        ("hi", {"max_new_tokens": -5}, "max_new_tokens"),
        ("hi", {"seed": -1}, "seed"),
        ("hi", {"sampling": SamplingConfig(temperature=-1)}, "temperature"),
        ("hi", {"sampling": SamplingConfig(temperature=float("nan"))}, "temperature"),
        ("hi", {"sampling": SamplingConfig(temperature=1, top_p=0)}, "top_p"),
        ("hi", {"sampling": SamplingConfig(temperature=1, top_k=-2)}, "top_k"),
    ],
)
def test_bad_settings_are_refused(tiny_pair, prompt, kw, match):
    with pytest.raises(InvalidInputError, match=match):
        SpeculativeDecoder(tiny_pair, prompt, DecodeSettings(**kw))


def test_unknown_models_are_refused():
    with pytest.raises(ModelLoadError, match="unknown model pair"):
        load_pair("no-such-pair")
    with pytest.raises(ModelLoadError, match="not found"):
        load_pair(target="/nonexistent/folder/model", draft="tiny:draft")


def _save(model, tok, path):
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_mismatched_vocabularies_are_refused(tmp_path):
    tok = tiny_tokenizer()
    target, _ = tiny_models(len(tok))
    other_tok = tiny_tokenizer()
    other_tok.add_tokens(["<extra-token>"])
    other, _ = tiny_models(len(other_tok), seed=1)
    t = _save(target, tok, tmp_path / "t")
    d = _save(other, other_tok, tmp_path / "d")
    with pytest.raises(VocabularyMismatchError, match="different vocabularies"):
        load_pair(target=t, draft=d, device="cpu", shared=False)


def test_local_folders_load_as_a_pair(tmp_path):
    tok = tiny_tokenizer()
    target, draft = tiny_models(len(tok))
    pair = load_pair(target=_save(target, tok, tmp_path / "t"), draft=_save(draft, tok, tmp_path / "d"),
                     device="cpu", dtype="float32", shared=False)
    dec, _ = run(pair, gamma=3, max_new_tokens=8)
    assert len(dec.generated_ids) == 8


def test_non_causal_model_is_refused(tmp_path):
    from transformers import BertConfig, T5Config

    BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=16).save_pretrained(tmp_path / "bert")
    T5Config(vocab_size=50, d_model=16, d_ff=16, num_layers=1, num_heads=2).save_pretrained(tmp_path / "t5")
    for name in ("bert", "t5"):
        with pytest.raises(UnsupportedModelError, match="not a causal language model"):
            load_pair(target=str(tmp_path / name), draft="tiny:draft", shared=False)


def test_remote_code_model_is_refused(tmp_path):
    folder = tmp_path / "remote"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(
        {"model_type": "llama", "auto_map": {"AutoModelForCausalLM": "modeling_evil.EvilLM"}, "vocab_size": 10}))
    with pytest.raises(UnsupportedModelError, match="trust_remote_code"):
        load_pair(target=str(folder), draft="tiny:draft", shared=False)


def test_chat_prompt_uses_template(tiny_pair):
    dec = SpeculativeDecoder(tiny_pair, "hi", DecodeSettings(chat=True, max_new_tokens=4))
    assert tiny_pair.tokenizer.decode(dec.prompt_ids).startswith("<|im_start|>user\nhi<|im_end|>")
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert len(SpeculativeDecoder(tiny_pair, msgs, DecodeSettings(max_new_tokens=4)).prompt_ids) > len(dec.prompt_ids)
    with pytest.raises(InvalidInputError):
        SpeculativeDecoder(tiny_pair, [{"role": "user"}], DecodeSettings())


def test_draft_head_is_reduced_only_for_large_vocabularies_with_plain_heads(tiny_pair):
    from types import SimpleNamespace

    from specdec.drafters.head import AUTO_DRAFT_VOCAB, resolve_draft_vocab

    def pair(vocab, model_type, device="cpu"):
        return SimpleNamespace(vocab_size=vocab, draft=SimpleNamespace(config=SimpleNamespace(model_type=model_type)),
                               device=torch.device(device))

    assert resolve_draft_vocab(tiny_pair, None) == 0  # 101 tokens: nothing to save
    assert resolve_draft_vocab(pair(151936, "qwen2"), None) == AUTO_DRAFT_VOCAB
    assert resolve_draft_vocab(pair(151936, "gemma2"), None) == 0  # soft-capped logits: no sliced head
    assert resolve_draft_vocab(pair(100000, "llama"), None) == 0
    assert resolve_draft_vocab(pair(151936, "qwen2"), 0) == 0 and resolve_draft_vocab(tiny_pair, 40) == 40
    assert resolve_draft_vocab(pair(151936, "qwen2", "cuda"), None) == 0  # measured slower on a GPU
    assert resolve_draft_vocab(pair(151936, "qwen2", "cuda"), 65536) == 65536  # asked for explicitly


def test_plain_greedy_prefixes_do_not_depend_on_the_length_asked(tiny_pair):
    """What conftest.real_greedy relies on to serve every real-pair test from one decode per prompt."""
    from specdec.loop.plain import plain_decode

    long = plain_decode(tiny_pair, "Hello world", DecodeSettings(max_new_tokens=24)).ids
    for n in (1, 7, 16):
        assert plain_decode(tiny_pair, "Hello world", DecodeSettings(max_new_tokens=n)).ids == long[:n]
