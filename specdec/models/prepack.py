"""Prepacked linear layers for CPU passes: the same numbers as `nn.Linear`, read at about twice the speed.

A decode step or a verify pass multiplies a few rows of activations by every weight matrix once, so it is bound by
reading weights. On this project's 2-core CPU (AMD EPYC, AVX-512 with bf16) torch's bf16 `F.linear` read a
[8960, 1536] weight at ~10-12 GB/s for 1-5 rows, while the same matmul through oneDNN with the weight reordered
once into its blocked layout (`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`: what inductor's
CPU weight prepacking calls) read it at ~21-27 GB/s -- and, for bias-free layers, gave the same bits as `F.linear`
at every width tried (1 to 64 rows on the embedded target's shapes). That is a property of the CPU, not a promise:
on a Xeon with AMX some widths add in another order, so each (shape, width) is checked once with a probe that shows
any difference in order (`kernels_agree`), and a width that differs runs on `F.linear` (`tests/test_prepack.py`
checks layers, whole models and the real pair). Over more rows the matmul is compute-bound and packing gains
nothing, so passes wider than PREPACK_ROWS (a prompt's prefill) keep `F.linear`. On the embedded target
(interleaved, median of 7, after a 300-token prompt) a one-token step took 261 ms on F.linear and 234 ms prepacked
(1.12x), a 5-token verify pass 287 and 173 ms (1.66x), a 17-token pass 386 and 282 ms (1.37x), logits
bit-identical each time.

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
PROBE_SCALE = 2.0 ** 20  # the cancelling weight entries: a running sum near it rounds to 1/8
PROBE_PAIRS = 8  # cancelling column pairs per probe
PROBE_BASE_ROWS = 256  # distinct random weight rows a probe tiles


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


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x [..., k] times a `_pack`ed weight [n, k] (plus bias): oneDNN's product, the one prepacking runs."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def cancelling_probe(n: int, k: int, rows: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16):
    """A weight [n, k] and an input [rows, k] whose products cancel in pairs of columns: column pair (i, j) holds
    +-2^20 in the weight and equal values in the input, so each output's exact sum is unchanged, while a running
    sum carries ~2^20 from one column of a pair to the other and rounds every product added meanwhile to ~1/8.
    bf16 products are exact in fp32, so a kernel's output depends only on the order it adds them; two kernels
    that add in different orders then differ in most outputs (36-80% measured), two that add in the same order
    agree in all. Random inputs expose the same differences in ~10^-4 of outputs (some widths in 2 of 10 draws).
    The weight tiles PROBE_BASE_ROWS random rows: cheap to build for a 151,936-row head."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(min(n, PROBE_BASE_ROWS), k, generator=gen)
    x = torch.randn(rows, k, generator=gen)
    cols = torch.randperm(k, generator=gen)[: 2 * min(PROBE_PAIRS, k // 2)].view(2, -1)
    x[:, cols[1]] = x[:, cols[0]]
    sign = torch.randint(0, 2, (base.shape[0], 1), generator=gen).float() * 2 - 1
    base[:, cols[0]], base[:, cols[1]] = PROBE_SCALE * sign, -PROBE_SCALE * sign
    weight = base.to(dtype).repeat(-(-n // base.shape[0]), 1)[:n].contiguous()
    return weight, x.to(dtype)


def kernels_agree(n: int, k: int, rows: int, bias: bool, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the packed kernel and F.linear add a [rows, k] x [k, n] product in the same order (same bits),
    tried on a `cancelling_probe` with a random bias when the layer has one."""
    weight, x = cancelling_probe(n, k, rows, seed=rows, dtype=dtype)
    b = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype) if bias else None
    return bool(torch.equal(packed_linear(x, _pack(weight), b), nn.functional.linear(x, weight, b)))


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
        return packed_linear(x.contiguous(), self.packed, self.bias)

    def same_bits(self, rows: int) -> bool:
        """Whether passes of `rows` rows through the packed weight give F.linear's bits. oneDNN and F.linear may
        sum in different orders for some widths on some CPUs (on a Xeon with AMX: 33 and 64 rows on every shape of
        the embedded target, 1, 2, 3 and 5 rows on its MLP down projection). Checked once per (shape, width):
        `kernels_agree` on a probe that exposes any difference in summation order, then this layer's own packing
        on a random input (a stale or wrong packing). A width that fails runs on F.linear: prepacking never
        changes a number."""
        key = (self.out_features, self.in_features, rows, self.bias is not None)
        same = _SAME_BITS.get(key)
        if same is None:
            same = kernels_agree(*key, dtype=self.weight.dtype)
            if same:
                gen = torch.Generator().manual_seed(rows)
                x = torch.randn(rows, self.in_features, generator=gen).to(self.weight.dtype)
                same = bool(torch.equal(packed_linear(x, self.packed, self.bias),
                                        nn.functional.linear(x, self.weight, self.bias)))
            _SAME_BITS[key] = same
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
    bias (1-ulp differences in ~2 of 10^4 outputs of a [1536, 1536] projection). On Qwen2.5 that leaves out q/k/v,
    ~7% of a layer's weights."""
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
