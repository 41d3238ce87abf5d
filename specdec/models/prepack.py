"""Prepacked linear layers for CPU passes: the same numbers as `nn.Linear`, read at about twice the speed.

A decode step or a verify pass multiplies a few rows of activations by every weight matrix once, so it is bound by
reading weights. On this project's 2-core CPU (AMD EPYC, AVX-512 with bf16) torch's bf16 `F.linear` read a
[8960, 1536] weight at ~10-12 GB/s for 1-5 rows, while the same matmul through oneDNN with the weight reordered
once into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`: what inductor's
CPU weight prepacking calls) read it at ~21-27 GB/s -- and, for bias-free layers, gave the same bits as `F.linear`
at every width tried (1 to 64 rows on the embedded target's shapes; `tests/test_prepack.py` checks layers, whole
models and the real pair). Over more rows the matmul is compute-bound and packing gains nothing, so passes wider
than PREPACK_ROWS (a prompt's prefill) keep `F.linear`. On the embedded target (interleaved, median of 7, after a
300-token prompt) a one-token step took 261 ms on F.linear and 234 ms prepacked (1.12x), a 5-token verify pass
287 and 173 ms (1.66x), a 17-token pass 386 and 282 ms (1.37x), logits bit-identical each time.

`prepack(model)` swaps every bias-free `nn.Linear` of a CPU model in bfloat16 for a `PrepackedLinear` that keeps the
original weight (shared, not copied: the output head may be tied to the input embeddings) beside its packed copy, so a
prepacked model holds its linear weights twice. The swap is made when a pair loads (`models.pair`, on a CPU in
bfloat16; SPECDEC_PREPACK=0 turns it off).

`plain_kernels()` runs the block inside it on `F.linear` again: the benchmarks run transformers' own loops in it, so
that "transformers" there means transformers as it ships, not transformers on this engine's kernels.
"""

from __future__ import annotations

import copy
import os
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

PREPACK_DTYPES = (torch.bfloat16,)  # fp32 measured no faster packed; fp16 is not packed for the CPU here
PREPACK_ROWS = 64  # passes over more rows than this use F.linear (compute-bound: packing measured no gain)
PREPACK_MIN_ROWS = 256  # select_rows packs a row subset of at least this many rows (fewer: plain weight rows)
PREPACK_HINT = 1  # the batch size the weight is reordered for (a hint to oneDNN; every row count works)
_PLAIN = ContextVar("specdec_plain_kernels", default=False)
_SAME_BITS: dict[tuple[int, int, int, bool], bool] = {}  # (N, K, rows, bias) -> packed gave F.linear's bits


def prepack_supported(dtype: torch.dtype, device) -> bool:
    """Whether `prepack` would pack a model in this dtype on this device."""
    if torch.device(device).type != "cpu" or dtype not in PREPACK_DTYPES:
        return False
    if os.environ.get("SPECDEC_PREPACK", "1").strip().lower() in ("0", "false", "no", "off"):
        return False
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


@contextmanager
def plain_kernels():
    """Inside this block every PrepackedLinear multiplies by its original weight with F.linear."""
    token = _PLAIN.set(True)
    try:
        yield
    finally:
        _PLAIN.reset(token)


def _pack(weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().contiguous(), PREPACK_HINT)


class PrepackedLinear(nn.Linear):
    """An nn.Linear (same weight and bias parameters) that multiplies passes of at most PREPACK_ROWS rows by a
    oneDNN-packed copy of its weight."""

    def __init__(self, weight: nn.Parameter | torch.Tensor, bias: torch.Tensor | None = None, pack: bool = True):
        """pack=False defers packing to the first narrow pass (a deep copy: it is often quantized before one)."""
        nn.Module.__init__(self)  # not nn.Linear.__init__: it would allocate a fresh weight
        self.out_features, self.in_features = weight.shape
        self.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
        self.bias = bias
        # A plain attribute: an opaque oneDNN tensor, not part of the state dict; None until packed.
        self.packed = _pack(weight) if pack else None

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "PrepackedLinear":
        return cls(linear.weight, linear.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(self.in_features, 1)
        if (torch.compiler.is_compiling()  # a compiled graph traces F.linear (inductor packs weights itself)
                or rows > PREPACK_ROWS or x.dtype != self.weight.dtype or x.device.type != "cpu" or _PLAIN.get()):
            return nn.functional.linear(x, self.weight, self.bias)
        if self.packed is None:
            self.packed = _pack(self.weight)
        if not self.same_bits(rows):
            return nn.functional.linear(x, self.weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.packed, self.bias, "none", [None], "")

    def same_bits(self, rows: int) -> bool:
        """Whether the packed kernel gives F.linear's bits for passes of `rows` rows of this layer's shape. oneDNN
        and F.linear may pick different kernels (accumulation orders) for some widths on some CPUs: on a Xeon with
        AMX, 2-, 33- and 64-row passes of the embedded target's shapes differed in the last bit while 1, 5 and 17
        matched. So each (shape, width) is checked once, on a random input drawn from a private generator, and
        a width whose bits differ runs on F.linear: prepacking never changes a number."""
        key = (self.out_features, self.in_features, rows, self.bias is not None)
        same = _SAME_BITS.get(key)
        if same is None:
            gen = torch.Generator().manual_seed(rows)
            x = torch.randn(rows, self.in_features, generator=gen).to(self.weight.dtype)
            packed = torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [None], "")
            same = _SAME_BITS[key] = bool(torch.equal(packed, nn.functional.linear(x, self.weight, self.bias)))
        return same

    def select_rows(self, rows) -> "PrepackedLinear | torch.Tensor":
        """The output rows `rows` (a slice or an index tensor) as a layer of their own, for a reduced vocabulary
        head (`core.kvcache.ReducedHead`): packed when there are many (the head's first ids), the plain weight
        rows when there are few (the extra ids, re-selected as the text adds some)."""
        weight = self.weight[rows] if isinstance(rows, slice) else self.weight.index_select(0, rows)
        if weight.shape[0] < PREPACK_MIN_ROWS or self.bias is not None:
            return weight.detach()
        return PrepackedLinear(weight.detach().contiguous())

    def __deepcopy__(self, memo):
        """A copy with its own weights, packed on its first narrow pass (a quantized copy of a draft starts from one
        and never packs: quantize replaces the layer); a weight tied to another module stays tied (the memo)."""
        out = PrepackedLinear(copy.deepcopy(self.weight, memo), copy.deepcopy(self.bias, memo), pack=False)
        memo[id(self)] = out
        return out


def prepack(model: nn.Module) -> int:
    """Swap every bias-free nn.Linear of `model` (CPU, a PREPACK_DTYPES weight) for a PrepackedLinear, in place;
    returns how many were swapped. Layers already swapped or quantized (models.quant's packed layers) are left
    alone, and so are layers with a bias: for one row, torch adds the bias in another order than oneDNN's fused
    bias (1-ulp differences in ~2 of 10^4 outputs of a [1536, 1536] projection), while bias-free layers gave the
    same bits at every width from 1 to 64 rows. On Qwen2.5 that leaves out q/k/v, ~7% of a layer's weights."""
    swapped = 0
    for parent in list(model.modules()):
        for attr, child in list(parent.named_children()):
            if (type(child) is nn.Linear and child.bias is None and child.weight.dtype in PREPACK_DTYPES
                    and child.weight.device.type == "cpu"):
                setattr(parent, attr, PrepackedLinear.from_linear(child))
                swapped += 1
    return swapped


def prepacked(model: nn.Module) -> int:
    """How many of the model's layers are PrepackedLinear now (0: none; a quantized copy has none left)."""
    return sum(isinstance(m, PrepackedLinear) for m in model.modules())
