"""The weight-only int8 and int4 drafts (specdec.models.quant): the layers against their dequantized weights (packed
kernel for a few rows, dense matmul for more), the refusals, q read from the quantized model, greedy equality with
plain target decoding, and the joint law of the first 3 tokens by chi-square (failing on a planted q from another
draft)."""

from __future__ import annotations

import copy

import pytest
import torch

from specdec.core.errors import InvalidInputError
from specdec.core.kvcache import CachedLM
from specdec.core.sampling import SamplingConfig, dense, distribution
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.drafters import Draft, DraftModelDrafter
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from specdec.models.pair import load_pair, quantized_draft_pair
from specdec.models.quant import (DENSE_ROWS, INT4_BLOCK, MLP_NAMES, QUANT_MODES, Int4Linear, Int8Linear,
                                  PackedLinear, check_quant_support, quant_of, quantize, quantize_int8, resolve_quant)

from .test_drafters import N_SAMPLES, SAMPLED, _ngram_prompt, joint_chi_square

BF16 = torch.bfloat16


@pytest.fixture(scope="module", params=QUANT_MODES)
def quant_pair(tiny_pair, request):
    """The tiny pair's float32 target beside an int8 or int4 copy of its draft (bfloat16 activations)."""
    return quantized_draft_pair(tiny_pair, request.param, BF16)


@pytest.fixture(scope="module", params=QUANT_MODES)
def quant_no_eos(no_eos, request):
    return quantized_draft_pair(no_eos, request.param, BF16)


# ------------------------------------------------------------------------------------------------- the layer


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_int8_linear_matches_its_dequantized_weight(dtype):
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(96, 64, generator=gen).to(dtype)
    b = torch.randn(96, generator=gen).to(dtype)
    layer = Int8Linear.from_weight(w, b)
    # Each weight is within half a step of its row's scale, and the scale maps the row's largest |w| to 127.
    step = layer.scales.float()[:, None]
    assert (layer.dequantized() - w.float()).abs().le(step * 0.5 + 1e-6).all()
    assert layer.qweight.abs().amax(1).ge(126).all()
    x = torch.randn(2, 5, 64, generator=gen).to(dtype)
    ref = x.float() @ layer.dequantized().T + b.float()
    y = layer(x)
    assert y.shape == (2, 5, 96) and y.dtype == dtype
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
    # Row subsets (the reduced head's) give the same numbers as the whole layer's columns.
    idx = torch.tensor([3, 50, 95])
    torch.testing.assert_close(layer.select_rows(slice(0, 40))(x), y[..., :40])
    torch.testing.assert_close(layer.select_rows(idx)(x), y[..., idx])


@pytest.mark.parametrize("rows", [1, 5, DENSE_ROWS + 1])
def test_int4_linear_matches_its_dequantized_weight(rows):
    """Few rows go through the int4 kernel, more through the dense dequantized weight: the same layer either way.
    200 output rows are padded to 208 for the packing; a 128-row cut shares the packed storage, a 40-row cut and
    index rows are dense rows."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(200, 64, generator=gen).to(BF16)
    layer = Int4Linear.from_weight(w)
    deq = layer.dequantized()
    # Each group of 32 weights maps onto 16 evenly spaced levels; the range searched for is never worse (squared
    # error per group, up to the bf16 rounding of the dense copy) than the group's own [min, max].
    g = w.float().reshape(200, 2, 32)
    lo, step = g.amin(-1, keepdim=True), (g.amax(-1, keepdim=True) - g.amin(-1, keepdim=True)) / 15
    plain = (torch.round((g - lo) / step) * step + lo - g).square().sum(-1)
    searched = (deq.reshape(200, 2, 32) - g).square().sum(-1)
    assert (searched <= plain * 1.05 + 1e-3).all() and (searched < plain * 0.99).any()
    x = torch.randn(rows, 64, generator=gen).to(BF16)
    ref = x.float() @ deq.T
    y = layer(x)
    assert y.shape == (rows, 200) and y.dtype == BF16
    torch.testing.assert_close(y.float(), ref, rtol=2e-2, atol=2e-2 * float(ref.abs().max()))
    shared = layer.select_rows(slice(0, 2 * INT4_BLOCK))
    assert isinstance(shared, Int4Linear)
    torch.testing.assert_close(shared(x), y[:, : 2 * INT4_BLOCK])
    assert isinstance(layer.select_rows(slice(0, 40)), torch.Tensor)
    idx = torch.tensor([3, 50, 199])
    rows_w = layer.select_rows(idx)
    torch.testing.assert_close(torch.nn.functional.linear(x, rows_w).float(), ref[:, idx], rtol=2e-2,
                               atol=2e-2 * float(ref.abs().max()))


def test_int4_layers_built_one_after_another_on_the_reused_buffer_equal_fresh_builds():
    """Int4Linear.from_codes converts each layer's codes to int32 in a buffer its thread reuses: a small layer built
    after a large one, and a large one after a small one, give the bits of the one-shot formula."""
    from specdec.models.quant import dequantize_groups, pack_int4

    gen = torch.Generator().manual_seed(1)
    codes = [Int4Linear.codes(torch.randn(n, k, generator=gen).to(BF16), BF16) for n, k in [(96, 128), (32, 64),
                                                                                          (160, 96)]]
    for c in codes + codes[::-1]:
        layer = Int4Linear.from_codes(c)
        q = c["q"].to(torch.int32)
        packed, scales_zeros = pack_int4(q, c["scales"], c["mins"])
        assert torch.equal(layer.dense, dequantize_groups(q, c["scales"], c["mins"], c["scales"].dtype))
        assert torch.equal(layer.qweight, packed) and torch.equal(layer.scales_zeros, scales_zeros)


def test_int8_linear_refuses_another_input_dtype():
    layer = Int8Linear.from_weight(torch.randn(8, 16, dtype=BF16))
    with pytest.raises(InvalidInputError, match="bfloat16"):
        layer(torch.randn(1, 16))


def test_quantize_swaps_the_layers_and_the_head(quant_pair, tiny_pair):
    draft = quant_pair.draft
    mode = quant_of(draft)
    assert mode in QUANT_MODES and quant_of(tiny_pair.draft) == ""
    linears = [m for m in draft.modules() if type(m) is torch.nn.Linear]
    assert linears == []  # q/k/v/o, gate/up/down and lm_head are all packed
    n_packed = sum(isinstance(m, PackedLinear) for m in draft.modules())
    assert n_packed == 7 * draft.config.num_hidden_layers + 1
    # int4-all: every layer and the head in 4 bits; int4: the MLPs in 4 bits, attention and head int8; int8: all int8
    assert type(draft.get_output_embeddings()) is (Int4Linear if mode == "int4-all" else Int8Linear)
    for name, m in draft.named_modules():
        if isinstance(m, PackedLinear) and name != "lm_head":
            in_mlp = name.rsplit(".", 1)[-1] in MLP_NAMES
            four = mode == "int4-all" or (mode == "int4" and in_mlp)
            assert type(m) is (Int4Linear if four else Int8Linear), name
    assert draft.get_input_embeddings().weight.dtype == BF16
    assert quant_pair.target is tiny_pair.target  # the target is shared, unchanged
    assert tiny_pair.draft.get_input_embeddings().weight.dtype == torch.float32  # the original draft is untouched
    assert quant_pair.describe()["draft_quant"] == f"{mode}:bfloat16"


def test_unsupported_settings_are_refused_clearly(tiny_pair):
    with pytest.raises(InvalidInputError, match="float32"):
        load_pair("tiny", dtype="float32", device="cpu", draft_quant="int8", shared=False)
    with pytest.raises(InvalidInputError, match="float32"):
        quantize_int8(copy.deepcopy(tiny_pair.draft))
    with pytest.raises(InvalidInputError, match="CPU only"):
        check_quant_support(BF16, "cuda")
    with pytest.raises(InvalidInputError, match="float32"):
        quantize(copy.deepcopy(tiny_pair.draft), "int4")
    with pytest.raises(InvalidInputError, match="unknown draft quantization"):
        resolve_quant("int3")
    with pytest.raises(InvalidInputError, match="divisible by 32"):
        Int4Linear.from_weight(torch.randn(16, 40, dtype=BF16))
    assert resolve_quant("none") == resolve_quant(None) == ""


@pytest.mark.parametrize("mode", QUANT_MODES)
def test_load_pair_with_a_quantized_draft_records_it(mode):
    pair = load_pair("tiny", dtype="auto", device="cpu", draft_quant=mode, shared=False)
    assert pair.dtype == BF16  # "auto" picks what the packed kernels need on the CPU
    assert pair.draft_quant == mode and pair.describe()["draft_quant"] == mode
    assert quant_of(pair.draft) == mode and quant_of(pair.target) == ""


def test_the_default_int8_preset_quantizes_its_draft(monkeypatch):
    import specdec.models.pair as pairs

    monkeypatch.setitem(pairs.PAIRS, "tiny-int8-test", ("tiny:target", "tiny:draft"))
    monkeypatch.setitem(pairs.PAIR_DRAFT_QUANT, "tiny-int8-test", "int8")
    pair = load_pair("tiny-int8-test", device="cpu", shared=False)
    assert pair.draft_quant == "int8" and pair.name == "tiny-int8-test"
    assert pairs.PAIR_DRAFT_QUANT["default-int8"] == "int8" and pairs.PAIR_DRAFT_QUANT["default-int4"] == "int4"
    assert pairs.PAIRS["default-int8"] == pairs.PAIRS["default"] == pairs.PAIRS["default-int4"]


# ------------------------------------------------------------------------------- q is the quantized draft's


@pytest.mark.parametrize("head_vocab", [0, 40])
def test_the_drafter_reports_the_quantized_drafts_own_q(quant_pair, tiny_pair, head_vocab):
    cfg = SamplingConfig(temperature=1.0)
    committed = encode_prompt(quant_pair.tokenizer, "abcab")
    drafter = DraftModelDrafter(quant_pair.draft, quant_pair.vocab_size, head_vocab=head_vocab,
                                always_keep=quant_pair.eos_token_ids)
    d = drafter.propose(committed, 3, cfg, torch.Generator().manual_seed(1))
    guesses = d.tokens.tolist()
    for model, same in ((quant_pair.draft, True), (tiny_pair.draft, False)):
        lm = CachedLM(model, quant_pair.vocab_size, head_vocab, quant_pair.eos_token_ids)
        lm.keep_in_head(committed)
        # The drafter's own feeding: the committed text in one pass, then one guess per pass (bf16 rounding
        # depends on the batch shape, so the same passes are replayed).
        logits = [lm.logits_after(committed)[-1]] + [lm.feed([g])[-1] for g in guesses[:-1]]
        rows = dense(distribution(torch.stack(logits), cfg))
        # (Equal up to float32 softmax rounding: the drafter warps only the reduced head's columns.)
        gap = float((dense(d.probs) - rows).abs().max())
        assert (gap < 1e-6) if same else (gap > 1e-3), (model.dtype, gap)


# ---------------------------------------------------------------------------------------------- greedy


@pytest.mark.parametrize("gamma", [2, 4])
@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_greedy_equals_plain_target_greedy(quant_pair, one_thread, gamma, draft_vocab):
    """float32 target (bit-exact between one-token and many-token passes on a CPU), int8/int4 draft in bf16."""
    for prompt in ("hello world", "abcab", "the cat sat"):
        s = DecodeSettings(gamma=gamma, max_new_tokens=32, draft_vocab=draft_vocab)
        dec = SpeculativeDecoder(quant_pair, prompt, s)
        list(dec)
        assert dec.generated_ids == plain_decode(quant_pair, prompt, s).ids, (prompt, gamma, draft_vocab)
        assert sum(r.gamma for r in dec.rounds) > 0


@pytest.mark.parametrize("mode", QUANT_MODES)
def test_greedy_on_an_all_bf16_tiny_pair(one_thread, mode):
    """The pair as load_pair(draft_quant=mode) builds it: both models in bfloat16."""
    pair = load_pair("tiny", dtype="bfloat16", device="cpu", draft_quant=mode, shared=False)
    for gamma in (2, 4):
        s = DecodeSettings(gamma=gamma, max_new_tokens=32)
        dec = SpeculativeDecoder(pair, "hello world", s)
        list(dec)
        assert dec.generated_ids == plain_decode(pair, "hello world", s).ids, gamma


# ------------------------------------------------------------------------------------------ chi-square


@pytest.mark.stat
@pytest.mark.parametrize("draft_vocab", [0, 40])
def test_first_three_tokens_follow_the_target_with_a_quantized_draft(quant_no_eos, one_thread, draft_vocab):
    prompt = _ngram_prompt(quant_no_eos)
    s = DecodeSettings(drafter="model", gamma=2, sampling=SAMPLED, draft_vocab=draft_vocab)
    test = joint_chi_square(quant_no_eos, prompt, s, N_SAMPLES)
    assert test.p_value > 1e-3, test


def coarse_copy(model: torch.nn.Module, levels: int) -> torch.nn.Module:
    """A float copy of a model whose linear weights are rounded to 2 * levels + 1 values per row."""
    out = copy.deepcopy(model)
    with torch.no_grad():
        for m in out.modules():
            if type(m) is torch.nn.Linear:
                s = m.weight.abs().amax(1, keepdim=True) / levels
                m.weight.copy_(torch.round(m.weight / s) * s)
    return out


class ForeignQ:
    """A planted bug: the guesses are drawn from the quantized draft, but the q reported with them is another model's
    distribution on the same text."""

    def __init__(self, inner: DraftModelDrafter, liar: torch.nn.Module, vocab_size: int):
        self.inner, self.liar = inner, CachedLM(liar, vocab_size)

    def propose(self, committed, gamma, cfg, gen) -> Draft:
        d = self.inner.propose(committed, gamma, cfg, gen)
        guesses = d.tokens.tolist()
        if not guesses:
            return d
        logits = self.liar.logits_after(list(committed), guesses[:-1], n_logits=len(guesses))
        return Draft(d.tokens, distribution(logits, cfg), d.note)

    def feedback(self, committed, n_accepted, n_drafted) -> None:
        self.inner.feedback(committed, n_accepted, n_drafted)


@pytest.mark.stat
def test_the_chi_square_catches_q_reported_from_another_draft(quant_no_eos, no_eos, one_thread):
    """The int8 draft's q and the float draft's differ too little on the tiny pair for 500 draws to tell (q from
    the float draft gave p ~ 0.87); the lie is therefore amplified: q from the float draft with its linear weights
    rounded to 3 values per row (-s, 0, s), which the chi-square rejects (p ~ 4e-25)."""
    prompt = _ngram_prompt(no_eos)
    s = DecodeSettings(drafter="model", gamma=2, sampling=SAMPLED, draft_vocab=0)
    liar = coarse_copy(no_eos.draft, 1)

    def lying(st):
        inner = DraftModelDrafter(quant_no_eos.draft, quant_no_eos.vocab_size, head_vocab=0)
        return ForeignQ(inner, liar, quant_no_eos.vocab_size)

    wrong = joint_chi_square(quant_no_eos, prompt, s, N_SAMPLES, lying)
    assert wrong.p_value < 1e-6, wrong


# ------------------------------------------------------------------------------------------------ real pair


REAL_PROMPT = "def fibonacci(n):"
REAL_TOKENS = 16  # four rounds or more at γ 4


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["int8", "int4"])  # int4-all differs only in which layers are int4: tiny pair above
def test_real_pair_greedy_with_a_quantized_draft_equals_plain_greedy(real_pair_fp32, real_greedy, mode):
    """The project's convention for equality: a float32 target (bit-exact on a CPU); the draft is int8 or int4
    with bfloat16 activations, so its speed is not what is tested here, only that the output is the target's."""
    pair = quantized_draft_pair(real_pair_fp32, mode, BF16)
    s = DecodeSettings(gamma=4, max_new_tokens=REAL_TOKENS)
    dec = SpeculativeDecoder(pair, REAL_PROMPT, s)
    list(dec)
    assert dec.generated_ids == real_greedy(REAL_PROMPT, REAL_TOKENS)  # the target's greedy: the draft plays no part
    assert sum(r.n_accepted for r in dec.rounds) > 0  # the quantized draft still guesses right


@pytest.mark.slow
@torch.inference_mode()
def test_real_bf16_pair_greedy_with_the_app_default_int4_draft():
    """bfloat16 target: the verify pass and plain decoding round near-ties differently (scripts/greedy_bf16.py), so
    the runs must agree token for token up to the first place where the target itself is at a near-tie, if any."""
    pair = load_pair("default-int4", dtype="bfloat16", device="cpu", shared=False)
    assert pair.draft_quant == "int4" and quant_of(pair.draft) == "int4"
    s = DecodeSettings(gamma=4, max_new_tokens=REAL_TOKENS)
    dec = SpeculativeDecoder(pair, REAL_PROMPT, s)
    list(dec)
    spec, plain = dec.generated_ids, plain_decode(pair, REAL_PROMPT, s).ids
    assert sum(r.n_accepted for r in dec.rounds) > 0
    at = next((i for i, (a, b) in enumerate(zip(spec, plain)) if a != b), None)
    if at is None:
        assert spec == plain
        return
    ids = encode_prompt(pair.tokenizer, REAL_PROMPT) + plain[:at]
    logits = pair.target(input_ids=torch.tensor([ids])).logits[0, -1].float()
    gap = abs(float(logits[plain[at]] - logits[spec[at]]))
    assert gap < 0.5, (at, gap)  # a bf16 near-tie (one bf16 step at |logit| ~ 16-32 is 0.125)


# ---------------------------------------------------------------------------------------------- the bench


def test_quant_draft_bench_refuses_float32_and_runs_on_the_tiny_pair(tmp_path, capsys, one_thread):
    import json

    from specdec.cli import main as cli_main

    base = ["bench", "--quant-draft", "--pair", "tiny", "--device", "cpu", "--kinds", "code", "--repeats", "1",
            "--max-new-tokens", "4"]
    assert cli_main(base + ["--dtype", "float32", "--out", str(tmp_path / "x.json")]) == 2
    assert "bfloat16 or float16 activations" in capsys.readouterr().err
    out = tmp_path / "quant-draft.json"
    assert cli_main(base + ["--dtype", "bfloat16", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["int8_models"]["draft_quant"] == "int8" and doc["models"]["draft_quant"] == ""
    rows = {r["contender"]: r for r in doc["groups"]["all"]}
    assert set(rows) == {"bf16", "int8", "int8-32k", "int4", "int4-all"}
    for r in rows.values():
        for key in ("alpha", "c_loop", "c_steady", "draft_ms_per_guess_steady", "c_plain", "tokens_per_pass", "tok_s",
                    "speedup", "same_as_plain"):
            assert key in r


def test_loop_parts_split_round_one_from_the_steady_state():
    """Round one carries both prefills: the steady columns leave each run's first round out, the overall ones don't."""
    from specdec.bench.harness import Sample
    from specdec.bench.harness import loop_parts
    from specdec.core.events import Round

    def rnd(index: int, gamma: int, draft_ms: float, verify_ms: float) -> Round:
        return Round(index=index, position=0, gamma=gamma, draft_ids=[5] * gamma, draft_pieces=["x"] * gamma,
                     q_draft=[1.0] * gamma, p_draft=[1.0] * gamma, accept_probs=[1.0] * gamma, uniforms=[0.0] * gamma,
                     n_accepted=gamma, rejected_at=None, emitted_id=6, emitted_piece="y", is_bonus=True, emitted_p=1.0,
                     q_top=[[] for _ in range(gamma)], p_top=[[] for _ in range(gamma + 1)], residual_top=None,
                     committed_ids=[5] * (gamma + 1), committed_pieces=["x"] * (gamma + 1), draft_ms=draft_ms,
                     verify_ms=verify_ms)

    first = [rnd(0, 4, 400, 900), rnd(1, 4, 40, 100), rnd(2, 2, 20, 100)]
    runs = [Sample("int4", "code", "greedy", "p", 15, 1.0, first),
            Sample("int4", "code", "greedy", "q", 5, 1.0, [rnd(0, 4, 200, 500)])]
    parts = loop_parts(runs)
    assert parts["draft_ms_per_guess"] == pytest.approx(660 / 14)
    assert parts["verify_ms_per_round"] == pytest.approx(1600 / 4)
    assert parts["draft_ms_per_guess_steady"] == pytest.approx(10.0)
    assert parts["verify_ms_per_round_steady"] == pytest.approx(100.0)
    assert parts["c_steady"] == pytest.approx(0.1)
    assert loop_parts(runs[1:])["c_steady"] is None and loop_parts(runs[1:])["draft_ms_per_guess_steady"] is None


def test_the_app_opens_on_the_int4_draft_on_a_cpu_with_fast_bf16_only(monkeypatch):
    from specdec.models import pair as pair_mod
    from ui.loader import default_pair_name

    monkeypatch.delenv("SPECDEC_DEVICE", raising=False)
    monkeypatch.delenv("SPECDEC_DTYPE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(pair_mod, "cpu_has_fast_bf16", lambda: True)
    assert default_pair_name() == "default-int4"
    monkeypatch.setenv("SPECDEC_DTYPE", "float32")  # the packed kernels need bf16 activations
    assert default_pair_name() == "default"
    monkeypatch.delenv("SPECDEC_DTYPE")
    # Without native bf16 matmuls (an AVX2-only CPU) a bf16 pass costs more with every row: the float32 pair.
    monkeypatch.setattr(pair_mod, "cpu_has_fast_bf16", lambda: False)
    assert default_pair_name() == "default"
    monkeypatch.setattr(pair_mod, "cpu_has_fast_bf16", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_pair_name() == "default"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dequantizing_a_few_rows_at_a_time_gives_the_one_pass_bits(dtype):
    from specdec.models.quant import dequantize_groups, dequantize_rows

    gen = torch.Generator().manual_seed(0)
    q4 = torch.randint(0, 16, (700, 96), generator=gen, dtype=torch.int32)
    scales, mins = torch.randn(700, 3, generator=gen).to(dtype), torch.randn(700, 3, generator=gen).to(dtype)
    whole = (q4.float().reshape(700, 3, 32) * scales.float()[..., None] + mins.float()[..., None]).reshape(700, 96)
    assert torch.equal(dequantize_groups(q4, scales, mins, dtype, rows=64), whole.to(dtype))
    q8 = torch.randint(-127, 128, (700, 96), generator=gen, dtype=torch.int8)
    assert torch.equal(dequantize_rows(q8, scales[:, 0], dtype, rows=64), (q8.float() * scales[:, :1].float()).to(dtype))
