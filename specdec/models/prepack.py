"""Prepacked linear layers for CPU passes: the same numbers as `nn.Linear`, read faster.

A decode step or a verify pass multiplies a few rows of activations by every weight matrix once, so it is bound by
reading weights. oneDNN's matmul with the weight reordered once into its blocked layout
(`torch.ops.mkldnn._reorder_linear_weight`, then `_linear_pointwise`: what inductor's CPU weight prepacking calls)
reads bf16 weights at about twice the rate of `F.linear` for a few rows (docs/performance.md has the figures).

Prepacking never changes a number. Whether the packed kernel adds a product in the same order as `F.linear` is a
property of the CPU and the pass width, so every (shape, width) is checked with a probe that shows any difference
in summation order (`kernels_agree`); a width that differs runs on `F.linear`. `check_widths` settles every width a
narrow pass can have when a pair loads and keeps the verdicts on disk per CPU, torch build and dtype
(`specdec.models.disk_cache`), so no visitor's run pays a check. A pass over PREPACK_ROWS rows (a prompt's prefill)
runs as narrow pieces of PREPACK_ROWS rows and the rest, each on the kernel its width's verdict allows: every row's
numbers are F.linear's on its piece, and no pass of this engine reads a plain weight that has a usable packed copy.
`drop_plain_pages` then hands those weights' pages back to the checkpoint file they are mapped from, so the packed
copies do not hold the target's weights twice in RAM; the pages fault back in wherever a plain weight is read.

`prepack(model)` swaps every bias-free `nn.Linear` of a CPU model in bfloat16 for a `PrepackedLinear` that keeps the
original weight (shared, not copied: the output head may be tied to the input embeddings) beside its packed copy; where
`check_widths` (which packs the layers) finds the packed kernel usable at too few of the common widths, it frees the
copy instead. The swap is made when a pair loads (`models.pair`,
on a CPU in bfloat16; SPECDEC_PREPACK=0 turns it off). `plain_kernels()` runs the block inside it on `F.linear` again: the
benchmarks run transformers' own loops in it, so that "transformers" there means transformers as it ships.
"""

from __future__ import annotations

import copy
import os
import platform
from pathlib import Path
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from specdec.models import disk_cache

PREPACK_DTYPES = (torch.bfloat16,)  # fp32 measured no faster packed; fp16 is not packed for the CPU here
PREPACK_ROWS = 64  # the widest pass the packed kernel runs whole (each width checked); wider ones run in pieces
PREPACK_MIN_ROWS = 256  # select_rows packs a row subset of at least this many rows (fewer: plain weight rows)
# The pass widths most runs are made of: a plain or a draft step (1 row) and a chain's verify (gamma + 1 <= 16). A
# shape whose packed kernel gives F.linear's bits at fewer than half of them frees its packed copies (check_widths):
# they would hold the layer's weights a second time for the few widths left.
HOT_WIDTHS = range(1, 17)
PREPACK_HINT = 1  # the batch size the weight is reordered for (a hint to oneDNN; every row count works)
_PLAIN = ContextVar("specdec_plain_kernels", default=False)
_PROBED: dict[tuple[int, int, int, bool], bool] = {}  # (N, K, rows, bias) -> the kernels add in the same order
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


def _probe_weight(n: int, k: int, seed: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight [n, k], the column pairs [2, PROBE_PAIRS]) of a cancelling probe; see cancelling_probe."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(min(n, PROBE_BASE_ROWS), k, generator=gen)
    cols = torch.randperm(k, generator=gen)[: 2 * min(PROBE_PAIRS, k // 2)].view(2, -1)
    sign = torch.randint(0, 2, (base.shape[0], 1), generator=gen).float() * 2 - 1
    base[:, cols[0]], base[:, cols[1]] = PROBE_SCALE * sign, -PROBE_SCALE * sign
    return base.to(dtype).repeat(-(-n // base.shape[0]), 1)[:n].contiguous(), cols


def _probe_input(cols: torch.Tensor, k: int, rows: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """An input [rows, k] equal in each column pair of `cols`, so the probe's paired products cancel exactly."""
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed))
    x[:, cols[1]] = x[:, cols[0]]
    return x.to(dtype)


def cancelling_probe(n: int, k: int, rows: int, seed: int = 0, dtype: torch.dtype = torch.bfloat16):
    """A weight [n, k] and an input [rows, k] whose products cancel in pairs of columns: column pair (i, j) holds
    +-2^20 in the weight and equal values in the input, so each output's exact sum is unchanged, while a running
    sum carries ~2^20 from one column of a pair to the other and rounds every product added meanwhile to ~1/8.
    bf16 products are exact in fp32, so a kernel's output depends only on the order it adds them; two kernels
    that add in different orders then differ in most outputs, two that add in the same order agree in all (random
    inputs show such a difference in only a tiny share of outputs). The weight tiles PROBE_BASE_ROWS random rows:
    cheap to build for a 151,936-row head."""
    weight, cols = _probe_weight(n, k, seed, dtype)
    return weight, _probe_input(cols, k, rows, seed + 1, dtype)


def kernels_agree(n: int, k: int, rows: int, bias: bool, dtype: torch.dtype = torch.bfloat16) -> bool:
    """Whether the packed kernel and F.linear add a [rows, k] x [k, n] product in the same order (same bits),
    tried on a `cancelling_probe` with a random bias when the layer has one."""
    return widths_agree(n, k, [rows], bias, dtype)[rows]


def widths_agree(n: int, k: int, widths, bias: bool, dtype: torch.dtype = torch.bfloat16) -> dict[int, bool]:
    """kernels_agree for several pass widths of one shape, building and packing the probe's weight once."""
    weight, cols = _probe_weight(n, k, 0, dtype)
    packed = _pack(weight)
    b = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(dtype) if bias else None
    out = {}
    for rows in widths:
        x = _probe_input(cols, k, rows, rows, dtype)
        out[rows] = bool(torch.equal(packed_linear(x, packed, b), nn.functional.linear(x, weight, b)))
    return out


# ---------------------------------------------------------------------------- verdicts kept between processes


def kernel_identity(dtype: torch.dtype) -> dict:
    """What a kernel verdict is a function of: the CPU (model name and flags), the torch build (its oneDNN
    among it), the dtype and the probe."""
    cpu = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "flags", "vendor_id", "cpu family", "model", "stepping") and key not in cpu:
                cpu[key] = " ".join(sorted(value.split())) if key == "flags" else value.strip()
    except OSError:
        cpu["machine"] = platform.processor() or platform.machine()
    build = [line.strip() for line in torch.__config__.show().splitlines() if "onednn" in line.lower()]
    return {"cpu": cpu, "torch": torch.__version__, "onednn": build, "dtype": str(dtype),
            "probe": [PROBE_SCALE, PROBE_PAIRS, PROBE_BASE_ROWS, 1]}


def _verdicts_path(identity: dict) -> Path:
    return disk_cache.store_dir("kernels") / f"{disk_cache.digest(identity)[:32]}.json"


def _key(n: int, k: int, rows: int, bias: bool) -> str:
    return f"{n}x{k}x{rows}{'b' if bias else ''}"


def check_widths(model: nn.Module, widths=None, say=None) -> dict[str, int]:
    """Settle, before any run, which pass widths of every PrepackedLinear shape in `model` may use the packed
    kernel: verdicts read from the disk cache (this CPU, this torch build, this dtype) or probed now and written
    there; then each layer's own packing checked once. After this, no pass of at most PREPACK_ROWS rows runs a
    check. A shape whose kernels agree at fewer than half of the HOT_WIDTHS (those with a verdict) would use its
    packed copies on few passes: those layers drop them and run on F.linear (on a Xeon with AMX the embedded
    target's MLP down projection agrees at 12-23 rows only: 0.77 GB freed). Returns counts: verdicts read, probed,
    layers checked, and layers whose packed copy was freed."""
    widths = list(widths or range(1, PREPACK_ROWS + 1))
    layers = [m for m in model.modules() if isinstance(m, PrepackedLinear)]
    counts = {"read": 0, "probed": 0, "layers": 0, "freed": 0}
    by_dtype: dict[torch.dtype, list[PrepackedLinear]] = {}
    for m in layers:
        by_dtype.setdefault(m.weight.dtype, []).append(m)
    for dtype, group in by_dtype.items():
        identity = kernel_identity(dtype)
        path = _verdicts_path(identity)
        stored = disk_cache.read_json(path, identity) or {}
        known = {key: v for key, v in stored.items() if isinstance(v, bool)}
        shapes = sorted({(m.out_features, m.in_features, m.bias is not None) for m in group})
        fresh = 0
        for n, k, bias in shapes:
            todo = [w for w in widths if _key(n, k, w, bias) not in known]
            counts["read"] += len(widths) - len(todo)
            if todo:
                if say:
                    say(f"checking the packed kernels on this CPU: [{n}, {k}] at {len(todo)} pass widths (once)")
                for w, same in widths_agree(n, k, todo, bias, dtype).items():
                    known[_key(n, k, w, bias)] = same
                fresh += len(todo)
            for w in widths:
                _PROBED[(n, k, w, bias)] = known[_key(n, k, w, bias)]
        counts["probed"] += fresh
        if fresh:
            disk_cache.write_json(path, identity, known)
        rare = {(n, k, bias) for n, k, bias in shapes if not serves_hot_widths(known, n, k, bias)}
        for m in group:
            if (m.out_features, m.in_features, m.bias is not None) in rare:
                m.free_packing()
                counts["freed"] += 1
            m.packing_ok()
            counts["layers"] += 1
    if counts["freed"] and say:
        say(f"{counts['freed']} layers run on F.linear: their packed kernel differs at most common pass widths")
    return counts


def serves_hot_widths(known: dict[str, bool], n: int, k: int, bias: bool) -> bool:
    """Whether the packed kernel of shape [n, k] agrees with F.linear at half or more of the HOT_WIDTHS that have a
    verdict in `known` (none known: True, nothing speaks against it)."""
    seen = [known[key] for w in HOT_WIDTHS if (key := _key(n, k, w, bias)) in known]
    return 2 * sum(seen) >= len(seen)


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
        self._packing_ok: bool | None = None  # packing_ok's verdict, once made
        self._agreeing: list[int] | None = None  # piece_widths' widths, widest first, once known

    @classmethod
    def from_linear(cls, linear: nn.Linear, pack: bool = True) -> "PrepackedLinear":
        return cls(linear.weight, linear.bias, pack)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(self.in_features, 1)
        if (torch.compiler.is_compiling()  # a compiled graph traces F.linear (inductor packs weights itself)
                or x.dtype != self.weight.dtype or x.device.type != "cpu" or _PLAIN.get()):
            return nn.functional.linear(x, self.weight, self.bias)
        if rows > PREPACK_ROWS:
            if self.packing_freed:
                return nn.functional.linear(x, self.weight, self.bias)
            return self._in_pieces(x, rows)
        return self._narrow(x, rows)

    def _narrow(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        if not self.same_bits(rows):  # packs on the first narrow pass (packing_ok) unless freed for good
            return nn.functional.linear(x, self.weight, self.bias)
        return packed_linear(x.contiguous(), self.packed, self.bias)

    def _in_pieces(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        """A wide pass (a prompt's prefill) as narrow passes, each as wide as the rows left allow among the widths
        whose packed bits are F.linear's (`piece_widths`): every row's numbers are F.linear's on its piece, and a
        wide pass reads no plain weight that a packed copy serves (`drop_plain_pages`)."""
        flat = x.reshape(rows, self.in_features)
        out, start = [], 0
        for width in self.piece_widths(rows):
            out.append(self._narrow(flat[start:start + width], width))
            start += width
        return torch.cat(out).view(*x.shape[:-1], self.out_features)

    def piece_widths(self, rows: int) -> list[int]:
        """How a pass of `rows` rows is cut: greedily the widest width of at most PREPACK_ROWS rows whose packed
        kernel agrees with F.linear (PREPACK_ROWS itself where it does), the rest the same way; where no width that
        fits agrees, the rest in one piece of PREPACK_ROWS (on F.linear)."""
        if self._agreeing is None:
            self._agreeing = [w for w in range(PREPACK_ROWS, 0, -1) if self.same_bits(w)]
        out = []
        while rows > 0:
            width = next((w for w in self._agreeing if w <= rows), min(rows, PREPACK_ROWS))
            out.append(width)
            rows -= width
        return out

    def same_bits(self, rows: int) -> bool:
        """Whether passes of `rows` rows through the packed weight give F.linear's bits. oneDNN and F.linear may
        sum in different orders for some widths on some CPUs (on a Xeon with AMX: 33 and 64 rows on every shape of
        the embedded target, 1, 2, 3 and 5 rows on its MLP down projection). Two checks, each made once: the
        kernels at this (shape, width), on a probe that exposes any difference in summation order (`check_widths`
        settles every width at load and keeps the verdicts on disk; a width it has not seen is probed here), and
        this layer's own packing (`packing_ok`). A width that fails runs on F.linear: prepacking never changes a
        number."""
        key = (self.out_features, self.in_features, rows, self.bias is not None)
        same = _PROBED.get(key)
        if same is None:
            same = _PROBED[key] = kernels_agree(*key, dtype=self.weight.dtype)
        return same and self.packing_ok()

    def packing_ok(self) -> bool:
        """Whether this layer's packed copy is its weight's (a stale or wrong packing): once, on a random input of
        the first width whose kernels agree."""
        if self._packing_ok is None:
            if self.packed is None:
                self.packed = _pack(self.weight)
            rows = next((r for (n, k, r, b), same in sorted(_PROBED.items())
                         if same and (n, k, b) == (self.out_features, self.in_features, self.bias is not None)), None)
            if rows is None:
                return False  # no width of this shape agrees (or none checked yet): nothing to use the packing for
            gen = torch.Generator().manual_seed(rows)
            x = torch.randn(rows, self.in_features, generator=gen).to(self.weight.dtype)
            self._packing_ok = bool(torch.equal(packed_linear(x, self.packed, self.bias),
                                                nn.functional.linear(x, self.weight, self.bias)))
        return self._packing_ok

    def free_packing(self) -> None:
        """Drop the packed copy for good: every pass then runs on F.linear (check_widths, for a rarely agreeing
        shape)."""
        self.packed = None
        self._packing_ok = False

    @property
    def packing_freed(self) -> bool:
        return self.packed is None and self._packing_ok is False

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
                # Packed by check_widths (which a pair load runs next), and only where the verdicts keep the packing.
                setattr(parent, attr, PrepackedLinear.from_linear(child, pack=False))
                swapped += 1
    return swapped


def prepacked(model: nn.Module) -> int:
    """How many of the model's layers are PrepackedLinear now (0: none; a quantized copy has none left)."""
    return sum(isinstance(m, PrepackedLinear) for m in model.modules())


def drop_plain_pages(model: nn.Module) -> int:
    """Hand back the resident pages of the plain weights that no pass of this engine reads any more: those of the
    PrepackedLinear layers whose packed copy is in use, not tied to another module (an embedding table is read by
    lookups) and mapped from the checkpoint file (`specdec.models.pages`). Narrow passes read the packed copy, wide
    ones run in narrow pieces (`PrepackedLinear._in_pieces`), so these pages come back only where the plain weight
    is read: inside plain_kernels(), in a compiled graph, at a width whose packed bits differ, or to copy the model.
    Returns the bytes advised (the embedded target: its attention output and MLP weights, ~2.3 GiB)."""
    from specdec.models.pages import drop_resident

    shared = {id(p) for m in model.modules() if not isinstance(m, PrepackedLinear) for p in m.parameters(False)}
    weights = [m.weight for m in model.modules()
               if isinstance(m, PrepackedLinear) and m.packed is not None and m._packing_ok
               and id(m.weight) not in shared]
    return drop_resident(weights)
