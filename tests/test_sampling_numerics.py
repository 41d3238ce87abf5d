"""Sampling at the numerical edges: a tiny temperature is greedy, not NaN, in warp and in both decoders; `sampling.argmax`
on bf16/fp16 agrees with torch.argmax on rows holding NaN (NaN is the maximum, first index)."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from specdec.core.sampling import SamplingConfig, argmax, warp
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode


GREEDY = DecodeSettings(max_new_tokens=12)


# -------------------------------------------------------------------------------------------------- a tiny temperature


# A tiny temperature once overflowed logits / T to inf: p and q were NaN and both decoders emitted the last id.
@pytest.mark.parametrize("temperature", [1e-39, 5e-324])
@pytest.mark.parametrize("top_k, top_p", [(0, 1.0), (5, 1.0), (0, 0.5)])
def test_tiny_temperature_is_greedy_not_nan(temperature, top_k, top_p):
    logits = torch.randn(4, 50) * 10
    probs = warp(logits, SamplingConfig(temperature, top_k, top_p))
    assert not probs.isnan().any()
    assert torch.equal(probs, warp(logits, SamplingConfig()))  # one-hot on the argmax, as greedy


def test_tiny_temperature_decodes_like_greedy_in_both_decoders(tiny_pair):
    tiny = replace(GREEDY, sampling=SamplingConfig(1e-39))
    greedy = plain_decode(tiny_pair, "hello", GREEDY).ids
    assert plain_decode(tiny_pair, "hello", tiny).ids == greedy
    dec = SpeculativeDecoder(tiny_pair, "hello", tiny)
    list(dec)
    assert dec.generated_ids == greedy


# ----------------------------------------------------------------------------------------- argmax with NaN (bf16/fp16)


# Raw NaN patterns: positive and negative sign, quiet and signalling-style payloads, the lowest and highest ones.
NAN_BITS = {torch.bfloat16: [0x7FC0, 0x7F81, 0x7FFF, 0xFFC0, 0xFF81, 0xFFFF],
            torch.float16: [0x7E00, 0x7C01, 0x7FFF, 0xFE00, 0xFC01, 0xFFFF]}


def _signed16(u: int) -> int:
    return u - 0x10000 if u >= 0x8000 else u


def _plant_nan(row: torch.Tensor, col: int, pattern: int) -> None:
    row.view(torch.int16)[col] = _signed16(pattern)


def _any_nan(dtype, g: torch.Generator) -> int:
    return NAN_BITS[dtype][int(torch.randint(len(NAN_BITS[dtype]), (1,), generator=g))]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_argmax_treats_nan_as_the_maximum_like_torch(dtype):
    g = torch.Generator().manual_seed(11)
    rows, width = 600, 64
    x = (torch.randn(rows, width, generator=g) * 4).to(dtype)
    kinds = []
    for r in range(rows):
        kind = r % 10
        kinds.append(kind)
        cols = torch.randperm(width, generator=g).tolist()
        if kind == 0:  # one NaN, any sign
            _plant_nan(x[r], cols[0], _any_nan(dtype, g))
        elif kind == 1:  # several NaNs of different signs/payloads: the first one wins
            for c in cols[:4]:
                _plant_nan(x[r], c, _any_nan(dtype, g))
        elif kind == 2:  # NaN next to +inf (NaN still wins) and -inf
            x[r, cols[0]], x[r, cols[1]] = float("inf"), float("-inf")
            _plant_nan(x[r], cols[2], _any_nan(dtype, g))
        elif kind == 3:  # NaN in an all-negative row
            x[r] = -x[r].abs() - 1
            _plant_nan(x[r], cols[0], _any_nan(dtype, g))
        elif kind == 4:  # negative NaN only (torch's own bf16 NaN), larger positive values about
            _plant_nan(x[r], cols[0], 0xFFFF)
            _plant_nan(x[r], cols[1], 0xFFC0)
        elif kind == 5:  # ties of the top value, no NaN
            x[r, cols[:3]] = 8.0
        elif kind == 6:  # +inf ties, no NaN
            x[r, cols[:2]] = float("inf")
        elif kind == 7:  # -0 and +0 only: equal values, the first wins
            x[r] = 0.0
            x[r, cols[:5]] = -0.0
        elif kind == 8:  # all -inf
            x[r] = float("-inf")
        # kind 9: a plain random row
    want = x.argmax(-1)
    got = argmax(x)
    bad = [(r, kinds[r], int(got[r]), int(want[r])) for r in range(rows) if got[r] != want[r]]
    assert not bad, f"{len(bad)} rows disagree with torch.argmax (row, kind, ours, torch): {bad[:8]}"
    for r in range(0, rows, 7):  # one row at a time (a 1-D input) gives the same answers
        assert int(argmax(x[r])) == int(want[r]), (r, kinds[r])


def test_argmax_float32_rows_with_nan_agree_with_torch():
    x = torch.randn(4, 50)
    x[0, 7] = float("nan")
    x[1, [3, 9]] = float("nan")
    x[2, 5], x[2, 6] = float("inf"), float("nan")
    x[3, 1] = -float("nan")
    for t in (x, x.double()):
        assert torch.equal(argmax(t), t.argmax(-1))
