"""Prepacked CPU linear layers (specdec.models.prepack): bit-identical to nn.Linear on every narrow pass width and
to nn.Linear on narrow pieces for wide ones, actually used (a planted wrong packing shows through), off inside
plain_kernels(), their plain weights' pages handed back to the checkpoint file with the numbers unchanged,
kept out of float32 and non-CPU pairs, safe to deep-copy and to quantize, and the speculative loop on a prepacked
bf16 pair gives exactly the ids of the same pair unpacked."""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import pytest
import torch
from torch import nn

from specdec.core.kvcache import CachedLM
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings
from specdec.models.pair import load_pair
from specdec.models.prepack import (PREPACK_MIN_ROWS, PREPACK_ROWS, PrepackedLinear, cancelling_probe, kernels_agree,
                                    packed_linear, plain_kernels, prepack, prepack_supported, prepacked)
from specdec.models.quant import Int8Linear, quantize
from specdec.models.tiny import tiny_models, tiny_tokenizer
from tests.conftest import decode_choices

BF16 = torch.bfloat16
pytestmark = pytest.mark.skipif(not prepack_supported(BF16, "cpu"), reason="no oneDNN bf16 kernels on this CPU")


def _tiny_bf16(seed: int = 0):
    target, draft = tiny_models(len(tiny_tokenizer()), seed)
    return target.to(BF16).eval(), draft.to(BF16).eval()


@pytest.mark.parametrize("rows", [1, 2, 3, 5, 17, 33, PREPACK_ROWS])
@pytest.mark.parametrize("shape", [(1536, 1536), (8960, 1536), (1536, 8960)])
def test_layer_is_bit_identical_to_linear_on_the_embedded_targets_shapes(rows, shape):
    """The embedded target's bias-free projections (attention output, MLP up and down), on a cancelling probe of
    another seed than the layer's own check uses (any difference in summation order shows in most outputs) and on
    a random input: nn.Linear's bits, whichever kernel this CPU's check picked for the width."""
    n, k = shape
    weight, probe = cancelling_probe(n, k, rows, seed=1000 + rows)
    linear = nn.Linear(k, n, bias=False).to(BF16)
    linear.weight.data.copy_(weight)
    layer = PrepackedLinear.from_linear(linear)
    assert layer.weight is linear.weight  # shared, not copied
    x = torch.randn(1, rows, k, generator=torch.Generator().manual_seed(rows)).to(BF16)
    for inp in (probe.unsqueeze(0), x):
        assert torch.equal(layer(inp), linear(inp))


def test_the_cancelling_probe_shows_a_change_of_summation_order_that_random_inputs_hide():
    """Adding the same products in another order (columns reversed): most outputs of the probe change, while a
    random input of the same shape changes in few or none -- why the per-width check uses the probe."""
    weight, probe = cancelling_probe(256, 1536, 4, seed=7)
    flip = torch.arange(1535, -1, -1)
    changed = (nn.functional.linear(probe, weight) != nn.functional.linear(probe[:, flip], weight[:, flip]))
    x = torch.randn(4, 1536, generator=torch.Generator().manual_seed(7)).to(BF16)
    w = torch.randn(256, 1536, generator=torch.Generator().manual_seed(8)).to(BF16)
    changed_random = nn.functional.linear(x, w) != nn.functional.linear(x[:, flip], w[:, flip])
    assert changed.float().mean() > 0.3 > 10 * changed_random.float().mean()
    assert torch.equal(nn.functional.linear(probe, weight), nn.functional.linear(probe, weight.clone()))
    assert kernels_agree(256, 1536, 4, bias=False) == torch.equal(
        packed_linear(probe, PrepackedLinear(weight).packed, None), nn.functional.linear(probe, weight))


def test_narrow_passes_use_the_packed_weight_and_plain_kernels_do_not():
    """Plant a packing of another weight: narrow passes and the pieces of a wide pass show it, plain_kernels()
    does not."""
    linear = nn.Linear(64, 80, bias=False).to(BF16)
    layer = PrepackedLinear.from_linear(linear)
    narrow = torch.randn(3, 64).to(BF16)
    assert layer.same_bits(3), "a 64 -> 80 layer's 3-row packed pass should match F.linear"
    layer.packed = PrepackedLinear(torch.zeros(80, 64, dtype=BF16)).packed  # after the width's one check
    assert layer(narrow).abs().sum() == 0  # the packed kernel ran
    with plain_kernels():
        assert torch.equal(layer(narrow), linear(narrow))
    assert torch.equal(layer(narrow), torch.zeros(3, 80, dtype=BF16))  # back on once the block ends
    wide = torch.randn(PREPACK_ROWS + 1, 64).to(BF16)
    cuts = torch.tensor([0] + layer.piece_widths(len(wide))).cumsum(0).tolist()
    planted = [torch.zeros(b - a, 80, dtype=BF16) if layer.same_bits(b - a) else linear(wide[a:b])
               for a, b in zip(cuts, cuts[1:])]  # a width whose bits differ runs on F.linear
    assert torch.equal(layer(wide), torch.cat(planted)) and layer(wide).abs().sum() < linear(wide).abs().sum()
    with plain_kernels():
        assert torch.equal(layer(wide), linear(wide))


@pytest.mark.parametrize("rows", [PREPACK_ROWS + 1, 2 * PREPACK_ROWS, 2 * PREPACK_ROWS + 37])
@pytest.mark.parametrize("shape", [(1536, 1536), (8960, 1536)])
def test_a_wide_pass_is_its_narrow_pieces(rows, shape):
    """A pass over more than PREPACK_ROWS rows gives, row for row, F.linear's bits on pieces of PREPACK_ROWS rows
    and the rest (on a cancelling probe: any change of summation order shows), in a batch of any shape."""
    n, k = shape
    weight, probe = cancelling_probe(n, k, rows, seed=2000 + rows)
    layer = PrepackedLinear(weight)
    widths = layer.piece_widths(rows)
    assert sum(widths) == rows and max(widths) <= PREPACK_ROWS and widths == sorted(widths, reverse=True)
    assert widths[0] == PREPACK_ROWS or not layer.same_bits(PREPACK_ROWS)
    cuts = torch.tensor([0] + widths).cumsum(0).tolist()
    pieces = torch.cat([nn.functional.linear(probe[a:b], weight) for a, b in zip(cuts, cuts[1:])])
    assert torch.equal(layer(probe), pieces)
    assert torch.equal(layer(probe.view(1, rows, k)), pieces.view(1, rows, n))


@torch.inference_mode()
def test_whole_model_logits_are_bit_identical_with_a_cache():
    target, _ = _tiny_bf16()
    ref = copy.deepcopy(target)
    assert prepack(target) > 0 and prepacked(target) and not prepacked(ref)
    assert target.get_output_embeddings().weight is target.get_input_embeddings().weight or \
        not target.config.tie_word_embeddings
    vocab = target.config.vocab_size
    a, b = CachedLM(target, vocab), CachedLM(ref, vocab)
    prompt = [i % vocab for i in range(5, 45)]

    def close(x, y):
        assert torch.equal(x, y)

    close(a.feed(prompt), b.feed(prompt))
    for width in (1, 5, 17):
        ids = [(7 * width + i) % vocab for i in range(width)]
        close(a.feed(ids, n_logits=width), b.feed(ids, n_logits=width))


def test_a_width_whose_packed_bits_differ_runs_on_linear():
    """The once-per-(shape, width) check: a packing that gives other bits (here: planted before the first pass of
    a shape no other test uses) is caught, and that width runs on F.linear."""
    linear = nn.Linear(64, 88, bias=False).to(BF16)
    layer = PrepackedLinear.from_linear(linear)
    layer.packed = PrepackedLinear(torch.zeros(88, 64, dtype=BF16)).packed
    narrow = torch.randn(4, 64).to(BF16)
    assert not layer.same_bits(4)
    assert torch.equal(layer(narrow), linear(narrow))


def test_prepack_skips_float32_biased_and_packed_layers(monkeypatch):
    target, _ = tiny_models(len(tiny_tokenizer()), 0)
    assert prepack(target.eval()) == 0  # float32: left alone
    assert not prepack_supported(torch.float32, "cpu") and not prepack_supported(BF16, "cuda")
    biased = nn.Sequential(nn.Linear(8, 8).to(BF16), nn.Linear(8, 8, bias=False).to(BF16))
    assert prepack(biased) == 1 and type(biased[0]) is nn.Linear and isinstance(biased[1], PrepackedLinear)
    monkeypatch.setenv("SPECDEC_PREPACK", "0")
    assert not prepack_supported(BF16, "cpu")
    monkeypatch.delenv("SPECDEC_PREPACK")
    _, draft = _tiny_bf16()
    quantize(draft, "int8")
    assert prepack(draft) == 0  # every linear layer is quantized already


@torch.inference_mode()
def test_deepcopy_keeps_ties_and_a_prepacked_model_quantizes():
    target, draft = _tiny_bf16()
    prepack(draft)
    twin = copy.deepcopy(draft)
    head = twin.get_output_embeddings()
    assert isinstance(head, PrepackedLinear) and head.weight is not draft.get_output_embeddings().weight
    assert head.packed is None  # packed on its first narrow pass, not by the copy
    if twin.config.tie_word_embeddings:
        assert head.weight is twin.get_input_embeddings().weight
    ids = torch.tensor([list(range(3, 12))])
    assert torch.equal(twin(input_ids=ids).logits, draft(input_ids=ids).logits)
    quantize(twin, "int8")
    assert isinstance(twin.get_output_embeddings(), Int8Linear)
    assert not any(isinstance(m, PrepackedLinear) for m in twin.modules())


def test_row_subsets_for_a_reduced_head():
    """select_rows: a large block of rows is a packed layer of its own, a few rows are plain weight rows; both give
    the whole layer's columns."""
    linear = nn.Linear(96, 400, bias=False).to(BF16)
    layer = PrepackedLinear.from_linear(linear)
    x = torch.randn(3, 96).to(BF16)
    block, few = layer.select_rows(slice(0, PREPACK_MIN_ROWS)), layer.select_rows(torch.tensor([5, 300, 399]))
    assert isinstance(block, PrepackedLinear) and isinstance(few, torch.Tensor)
    torch.testing.assert_close(block(x), linear(x)[:, :PREPACK_MIN_ROWS], rtol=0, atol=1e-2)
    torch.testing.assert_close(nn.functional.linear(x, few), linear(x)[:, [5, 300, 399]], rtol=0, atol=1e-2)


def test_speculative_ids_equal_the_unpacked_pair(tiny_pair):
    """The loop on a prepacked bf16 pair makes exactly the choices it makes on the same pair unpacked (greedy and
    sampled with one seed): the kernels give the same numbers, so nothing downstream can tell them apart."""
    target, draft = _tiny_bf16(seed=0)
    plain = dataclasses.replace(tiny_pair, target=target, draft=draft, dtype=BF16)
    packed_t, packed_d = copy.deepcopy(target), copy.deepcopy(draft)
    prepack(packed_t), prepack(packed_d)
    packed = dataclasses.replace(plain, target=packed_t, draft=packed_d)
    assert packed.prepacked and not plain.prepacked
    for s in (DecodeSettings(gamma=4, max_new_tokens=24),
              DecodeSettings(gamma=3, max_new_tokens=24, sampling=SamplingConfig(0.8, 0, 0.95), seed=3),
              DecodeSettings(gamma=5, max_new_tokens=24, drafter="auto")):
        prompt = "the cat sat on the mat and the cat"
        assert decode_choices(plain, prompt, s) == decode_choices(packed, prompt, s)


@pytest.mark.slow
@torch.inference_mode()
def test_the_app_default_pair_is_prepacked_and_bit_identical():
    """The embedded pair in bf16 (the app's CPU default, int4 draft): its target is prepacked, and its logits on a
    prompt and on 1-, 5- and 17-token passes after it are the same bits inside plain_kernels() as outside."""
    pair = load_pair("default-int4", dtype="bfloat16", device="cpu")
    assert pair.prepacked and pair.describe()["prepacked"]
    assert isinstance(pair.target.get_output_embeddings(), PrepackedLinear)
    ids = pair.tokenizer("def fibonacci(n):\n    if n < 2:", return_tensors="pt").input_ids[0].tolist()
    runs = []
    for use_plain in (True, False):
        lm = CachedLM(pair.target, pair.vocab_size)
        with plain_kernels() if use_plain else contextlib.nullcontext():
            out = [lm.feed(ids)]
            for width in (1, 5, 17):
                out.append(lm.feed(list(range(100, 100 + width)), n_logits=width))
        runs.append(out)
    assert all(torch.equal(a, b) for a, b in zip(*runs))


@torch.inference_mode()
def test_a_loaded_model_leaves_its_plain_weights_to_the_file_and_keeps_its_numbers(tmp_path):
    """A bf16 checkpoint loaded as transformers maps it, prepacked and checked as a pair load does: the plain
    weights of its packed layers are handed back to the file (the tied head is not: the embedding reads it), and the
    logits of a wide prefill and of narrow passes after it are the same bits before and after, and inside
    plain_kernels() (which reads the plain weights again) for passes of at most PREPACK_ROWS rows."""
    from transformers import AutoModelForCausalLM

    from specdec.models.prepack import check_widths, drop_plain_pages

    target, _ = _tiny_bf16()
    target.save_pretrained(str(tmp_path))
    model = AutoModelForCausalLM.from_pretrained(str(tmp_path), dtype=BF16).eval()
    prepack(model)
    check_widths(model)
    vocab = model.config.vocab_size
    prompt = [(3 * i) % vocab for i in range(2 * PREPACK_ROWS + 9)]

    def run(prefill):
        lm = CachedLM(model, vocab)
        out = [lm.feed(prefill, n_logits=len(prefill))]
        for width in (1, 5):
            out.append(lm.feed([(11 * width + i) % vocab for i in range(width)], n_logits=width))
        return out

    before, short = run(prompt), run(prompt[:40])
    assert drop_plain_pages(model) > 0
    head = model.get_output_embeddings()
    assert head.weight is model.get_input_embeddings().weight  # tied: left resident
    assert all(torch.equal(a, b) for a, b in zip(before, run(prompt)))
    with plain_kernels():
        assert all(torch.equal(a, b) for a, b in zip(short, run(prompt[:40])))
