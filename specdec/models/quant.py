"""Weight-only quantization of a draft model (int8, int4 or int4-all), for CPU decoding with bf16 or fp16 activations.

`quantize(model, mode)` swaps every `nn.Linear` of the decoder layers (attention q/k/v/o, MLP gate/up/down) and
the output projection (lm_head) for a packed layer:

- "int8" (`Int8Linear`): int8 weights with one symmetric scale per output row, multiplied by
  `torch.ops.aten._weight_int8pack_mm` (x [M, K], weight int8 [N, K], scales [N] in x's dtype);
- "int4": the MLP projections (`MLP_NAMES`: gate/up/down, three quarters of a Qwen2.5 layer's weights) as
  `Int4Linear`, 4-bit weights with a scale and an offset per group of INT4_GROUP weights of a row (w ~ q * scale +
  min, q in 0..15, each group's range chosen by `quantize_groups`' search), multiplied by
  `torch.ops.aten._weight_int4pack_mm_for_cpu` (weight packed by `_convert_weight_to_int4pack_for_cpu`, two values
  per byte, N padded to a multiple of 16); the attention projections and the head stay int8, because 4-bit
  attention and head weights cost the draft agreement with the target where 4-bit MLPs do not;
- "int4-all": every decoder layer and the head as `Int4Linear`: the cheapest draft step, at some acceptance on
  prose, so an option rather than a preset.

Why it pays: a one-token draft step is bound by reading weights, and the packed kernels read a half (int8) or a
quarter (int4) of the bf16 bytes. They are made for a few rows, so every packed layer keeps its dequantized weight
as well (`dense`, in the activation dtype) and multiplies wide passes (a prefill, a tree's nodes) by it. Where the
two cross is a property of the CPU, not of the code: on a 2-core AMX Xeon the dense bf16 matmul beats the packed
int4 kernel from ~8 rows, elsewhere only past 16. `settle_dense_rows` times both per layer shape when a pair loads
(once per CPU and torch build: the crossovers are kept on disk like the kernel verdicts) and sets each layer's
`dense_rows`.
float32 activations are refused (`InvalidInputError`: there the dense float32 matmul is the faster kernel), as is
any device other than the CPU. The measured costs and acceptances per kind are in docs/performance.md.

The input embeddings stay as they are (a row lookup reads one row per token). When lm_head was tied to them, the
packed head is a separate copy and the tie is dropped. The original float layers are freed; each packed layer's
`dense` copy means a quantized draft holds its weights twice (packed and dequantized).

Speculative decoding stays exact with a quantized draft: q is the quantized model's own distribution (whichever
kernel computed a pass), the one the drafter samples from and reports to the rule. `select_rows` gives the draft's
reduced vocabulary head (`core.kvcache.ReducedHead`) its rows of the packed head, so the reduced head is a packed
matmul too.
"""

from __future__ import annotations

import gc
import os
import threading
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import nn

from specdec.core.errors import InvalidInputError
from specdec.models import disk_cache

QUANT_MODES = ("int8", "int4", "int4-all")  # what draft_quant may name ("" or "none": no quantization)
PACKED_ACTIVATIONS = (torch.bfloat16, torch.float16)  # the activation dtypes the packed kernels are used with
QMAX = 127  # int8: symmetric range -127..127 (-128 unused, so the scale maps max |w| to exactly 127)
INT4_GROUP = 32  # int4: weights per (scale, offset) pair along a row
INT4_ROWS = 16  # the int4 packing needs a multiple of 16 output rows (padded with zeros)
INT4_BLOCK = 64  # ... and packs them in blocks of 64: the first 64 * b rows of a packed weight are packed alone
DENSE_ROWS = 16  # until measured (`settle_dense_rows`): passes over more rows multiply by the dequantized weight
CROSSOVER_ROWS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # pass widths at which the two kernels are timed against each other
# The MLP projections' attribute names (Llama/Qwen/Mistral gate/up/down, OPT/Phi fc1/fc2, Mixtral-style w1..w3): the
# layers "int4" packs in 4 bits; every other linear layer and the head get int8.
MLP_NAMES = ("gate_proj", "up_proj", "down_proj", "fc1", "fc2", "w1", "w2", "w3")


def resolve_quant(mode: str | None) -> str:
    """'' (none) or a name from QUANT_MODES; InvalidInputError for anything else."""
    mode = (mode or "").strip().lower()
    if mode in ("", "none"):
        return ""
    if mode not in QUANT_MODES:
        raise InvalidInputError(f"unknown draft quantization {mode[:20]!r}; choose none or {', '.join(QUANT_MODES)}")
    return mode


def check_quant_support(dtype: torch.dtype, device: torch.device | str, mode: str = "int8") -> None:
    """InvalidInputError unless a packed (int8 or int4) draft can run with these activations on this device."""
    device = torch.device(device)
    if device.type != "cpu":
        raise InvalidInputError(
            f"the {mode} draft runs on the CPU only (its kernels, aten._weight_int8pack_mm and "
            f"_weight_int4pack_mm_for_cpu, are used for CPU decoding); got device {device.type}: leave the draft "
            "unquantized there"
        )
    if dtype not in PACKED_ACTIVATIONS:
        name = str(dtype).replace("torch.", "")
        raise InvalidInputError(
            f"the {mode} draft needs bfloat16 or float16 activations, got {name}: with float32 activations the "
            "packed kernels are slower than the dense float32 matmul; use --dtype bfloat16"
        )


def quantize_rows(weight: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 weight [N, K], scales [N] in `dtype`): per-output-row symmetric quantization, w ~ q * scale.

    The scale is rounded to `dtype` before the weights are divided by it, so q * scale (in float) is the matrix
    the kernel multiplies by."""
    w = weight.detach().float()
    scales = (w.abs().amax(dim=1) / QMAX).to(dtype)
    divisor = scales.float().clamp_min(torch.finfo(torch.float32).tiny)[:, None]
    q = torch.round(w / divisor).clamp_(-QMAX, QMAX).to(torch.int8)
    return q.contiguous(), scales.contiguous()


INT4_CLIPS = (0.95, 0.9, 0.85, 0.8, 0.75)  # factors quantize_groups scales a group's ends by, besides 1.0


def check_int4_width(k: int) -> None:
    """InvalidInputError unless a layer of input width k splits into groups of INT4_GROUP."""
    if k % INT4_GROUP:
        raise InvalidInputError(f"the int4 draft needs layer widths divisible by {INT4_GROUP}, got {k}")


def _group_fit(g: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, dtype: torch.dtype):
    """(squared error per group, q, scales, mins) of 16 levels from lo to hi for groups g [N, G, group]."""
    scales, mins = ((hi - lo) / 15).to(dtype), lo.to(dtype)
    s, m = scales.float()[..., None], mins.float()[..., None]
    q = torch.round((g - m) / s.clamp_min(torch.finfo(torch.float32).tiny)).clamp_(0, 15)
    return (q * s + m - g).square_().sum(-1), q, scales, mins


def quantize_groups(weight: torch.Tensor, dtype: torch.dtype, group: int = INT4_GROUP):
    """(q int32 [N, K] in 0..15, scales [N, K / group], mins [N, K / group], both in `dtype`): asymmetric 4-bit
    quantization per group of `group` weights along each row, w ~ q * scale + min.

    Each group's range is its [min, max] or that range with one end or both scaled toward zero by a factor from
    INT4_CLIPS, whichever gives the smallest squared error (clipping a rare outlier buys finer steps for the rest:
    with it the draft's teacher-forced agreement with the target on prose went from 0.677 to 0.688, the bf16
    draft's). Scale and min are rounded to `dtype` before q is computed from them, so q * scale + min is the matrix
    dequantize_groups returns."""
    w = weight.detach().float()
    n, k = w.shape
    g = w.reshape(n, k // group, group)
    lo, hi = g.amin(-1), g.amax(-1)
    best = _group_fit(g, lo, hi, dtype)
    for r in INT4_CLIPS:
        for lo_r, hi_r in ((r, r), (1.0, r), (r, 1.0)):
            err, q, scales, mins = _group_fit(g, lo * lo_r, hi * hi_r, dtype)
            better = err < best[0]
            best = (torch.where(better, err, best[0]), torch.where(better[..., None], q, best[1]),
                    torch.where(better, scales, best[2]), torch.where(better, mins, best[3]))
    _, q, scales, mins = best
    return q.to(torch.int32).reshape(n, k), scales, mins


def dequantize_rows(q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32,
                    rows: int = 1024) -> torch.Tensor:
    """The weight [N, K] that int8 q * scale stands for, computed in float32 and rounded to `dtype`, `rows` rows at
    a time (the same bits as one pass: small temporaries)."""
    out = torch.empty(q.shape, dtype=dtype, device=q.device)
    for i in range(0, q.shape[0], rows):
        out[i : i + rows] = q[i : i + rows].float() * scales[i : i + rows].float()[:, None]
    return out


def dequantize_groups(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor,
                      dtype: torch.dtype = torch.float32, rows: int = 256) -> torch.Tensor:
    """The weight [N, K] that q * scale + min stands for (quantize_groups' inverse up to rounding), computed in
    float32 and rounded to `dtype`; `rows` rows at a time, so the float32 temporaries stay small (the same bits
    as one pass over the whole matrix: every element is its own product and sum)."""
    n, k = q.shape
    out = torch.empty(n, k, dtype=dtype, device=q.device)
    for i in range(0, n, rows):
        g = q[i : i + rows].float().reshape(-1, scales.shape[1], k // scales.shape[1])
        out[i : i + rows] = (g * scales[i : i + rows].float()[..., None]
                             + mins[i : i + rows].float()[..., None]).reshape(-1, k)
    return out


class PackedLinear(nn.Module):
    """What the int8 and int4 layers share: a bias, the dequantized weight `dense` [N, K] for wide passes, and
    forward's choice between the packed kernel (at most DENSE_ROWS rows) and the dense matmul (more)."""

    def __init__(self, dense: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = dense.shape
        self.register_buffer("dense", dense.contiguous())
        self.register_buffer("bias", None if bias is None else bias.detach().to(dense.dtype))
        self.dense_rows = DENSE_ROWS  # passes over more rows take the dense matmul (settle_dense_rows measures it)

    @property
    def dtype(self) -> torch.dtype:
        return self.dense.dtype

    def packed(self, flat: torch.Tensor) -> torch.Tensor:  # [M, K] -> [M, N] by the packed kernel
        raise NotImplementedError

    def _like(self, other: "PackedLinear") -> "PackedLinear":
        """`other` (rows of this layer) taking this layer's measured crossover."""
        other.dense_rows = self.dense_rows
        return other

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.dtype:
            raise InvalidInputError(f"{type(self).__name__} takes {self.dtype} inputs, got {x.dtype}")
        flat = x.reshape(-1, self.in_features)
        if flat.shape[0] > self.dense_rows:
            y = nn.functional.linear(flat, self.dense)
        else:
            y = self.packed(flat.contiguous())
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [N, K] this layer stands for (here: `dense`, rounded to the activation dtype)."""
        return self.dense.float()

    STORED: tuple[str, ...] = ()  # the tensors a built layer is stored as (the disk cache's mapped entries)

    def stored(self) -> dict[str, torch.Tensor]:
        """The built layer's tensors (STORED): from_stored makes the same layer from them, bias aside."""
        return {part: getattr(self, part) for part in self.STORED}

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.mode}, {self.dtype}"


class Int8Linear(PackedLinear):
    """A linear layer with int8 weights and per-output-row scales: y = x @ (q * scale).T + bias."""

    mode = "int8"

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None,
                 dense: torch.Tensor | None = None):
        if qweight.dtype != torch.int8 or qweight.dim() != 2 or scales.shape != qweight.shape[:1]:
            raise ValueError("Int8Linear needs an int8 weight [N, K] and scales [N]")
        if dense is None:
            dense = dequantize_rows(qweight, scales, scales.dtype)
        super().__init__(dense, bias)
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None) -> "Int8Linear":
        """Quantize a float weight [N, K] (activations in `dtype`, default the weight's own)."""
        return cls.from_codes(cls.codes(weight, dtype or weight.dtype), bias)

    @staticmethod
    def codes(weight: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """What the layer is rebuilt from (`from_codes`): quantize_rows' q and scales."""
        q, scales = quantize_rows(weight, dtype)
        return {"q": q, "scales": scales}

    @classmethod
    def from_codes(cls, codes: dict[str, torch.Tensor], bias: torch.Tensor | None = None) -> "Int8Linear":
        return cls(codes["q"], codes["scales"], bias)

    STORED = ("qweight", "scales", "dense")

    @classmethod
    def from_stored(cls, parts: dict[str, torch.Tensor], bias: torch.Tensor | None = None) -> "Int8Linear":
        return cls(parts["qweight"], parts["scales"], bias, dense=parts["dense"])

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: torch.dtype | None = None) -> "Int8Linear":
        return cls.from_weight(linear.weight, linear.bias, dtype)

    def packed(self, flat: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [N, K] the int8 kernel multiplies by, q * scale."""
        return dequantize_rows(self.qweight, self.scales)

    def select_rows(self, rows: slice | torch.Tensor) -> "Int8Linear":
        """The same layer restricted to some output rows: a slice shares the storage, an index tensor copies."""
        if isinstance(rows, slice):
            pick = lambda t: t[rows]  # noqa: E731
        else:
            pick = lambda t: t.index_select(0, rows.to(t.device))  # noqa: E731
        bias = None if self.bias is None else pick(self.bias)
        return self._like(Int8Linear(pick(self.qweight).contiguous(), pick(self.scales).contiguous(), bias,
                                     pick(self.dense).contiguous()))


_SCRATCH = threading.local()


def _as_int32(q: torch.Tensor) -> torch.Tensor:
    """q as int32 (what the int4 packing kernel reads) in a buffer this thread reuses from layer to layer. A fresh
    int32 copy per layer is memory the process never touched before, and first-touch page faults are what a load
    pays most for on some virtual machines (a 0.5B draft's int4 layers: ~1.2 GB of them); the buffer is only read
    while its layer is built (dequantize_groups and pack_int4 both return new tensors)."""
    buf = getattr(_SCRATCH, "int32", None)
    if buf is None or buf.numel() < q.numel() or buf.device != q.device:
        buf = _SCRATCH.int32 = torch.empty(q.numel(), dtype=torch.int32, device=q.device)
    return buf[: q.numel()].view(q.shape).copy_(q)


def pack_int4(q: torch.Tensor, scales: torch.Tensor, mins: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed weight, scales_zeros) for `_weight_int4pack_mm_for_cpu` from quantize_groups' q, scales and mins:
    rows padded with zeros (scale 0, min 0) to a multiple of INT4_ROWS, the scales in the kernel's layout
    [K / group, N, 2] of (scale, zero) with w = (q - 8) * scale + zero."""
    n, k = q.shape
    pad = -n % INT4_ROWS
    if pad:
        q = torch.cat([q, q.new_zeros(pad, k)])
        scales, mins = (torch.cat([t, t.new_zeros(pad, t.shape[1])]) for t in (scales, mins))
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to(torch.int32), 1)
    zeros = mins.float() + scales.float() * 8
    return packed, torch.stack([scales.float(), zeros], -1).transpose(0, 1).to(scales.dtype).contiguous()


class Int4Linear(PackedLinear):
    """A linear layer with 4-bit weights, a scale and an offset per INT4_GROUP weights of a row:
    y = x @ (q * scale + min).T + bias."""

    mode = "int4"

    def __init__(self, dense: torch.Tensor, bias: torch.Tensor | None, qweight: torch.Tensor,
                 scales_zeros: torch.Tensor):
        """dense [N, K]: the dequantized weight; qweight and scales_zeros: pack_int4's (rows possibly padded)."""
        super().__init__(dense, bias)
        self.group = self.in_features // scales_zeros.shape[0]
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales_zeros", scales_zeros)

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None) -> "Int4Linear":
        """Quantize a float weight [N, K] (K a multiple of INT4_GROUP; activations in `dtype`)."""
        check_int4_width(weight.shape[1])
        return cls.from_codes(cls.codes(weight, dtype or weight.dtype), bias)

    @staticmethod
    def codes(weight: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """What the layer is rebuilt from (`from_codes`): quantize_groups' q (as uint8), scales and mins."""
        q, scales, mins = quantize_groups(weight, dtype)
        return {"q": q.to(torch.uint8), "scales": scales, "mins": mins}

    @classmethod
    def from_codes(cls, codes: dict[str, torch.Tensor], bias: torch.Tensor | None = None) -> "Int4Linear":
        q, scales, mins = _as_int32(codes["q"]), codes["scales"], codes["mins"]
        return cls(dequantize_groups(q, scales, mins, scales.dtype), bias, *pack_int4(q, scales, mins))

    STORED = ("dense", "qweight", "scales_zeros")

    @classmethod
    def from_stored(cls, parts: dict[str, torch.Tensor], bias: torch.Tensor | None = None) -> "Int4Linear":
        return cls(parts["dense"], bias, parts["qweight"], parts["scales_zeros"])

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: torch.dtype | None = None) -> "Int4Linear":
        return cls.from_weight(linear.weight, linear.bias, dtype)

    def packed(self, flat: torch.Tensor) -> torch.Tensor:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.qweight, self.group, self.scales_zeros)
        return y[:, : self.out_features] if y.shape[1] != self.out_features else y

    def select_rows(self, rows: slice | torch.Tensor) -> "Int4Linear | torch.Tensor":
        """The same layer restricted to some output rows. A slice from row 0 to a multiple of INT4_BLOCK shares the
        packed storage; anything else (a reduced head's few extra ids) is the dense rows, a plain weight tensor."""
        if isinstance(rows, slice) and rows.start in (None, 0) and rows.step in (None, 1) and rows.stop \
                and rows.stop % INT4_BLOCK == 0 and rows.stop <= self.out_features:
            bias = None if self.bias is None else self.bias[rows]
            return self._like(Int4Linear(self.dense[rows], bias, self.qweight[rows],
                                         self.scales_zeros[:, rows].contiguous()))
        pick = (lambda t: t[rows]) if isinstance(rows, slice) else (lambda t: t.index_select(0, rows.to(t.device)))
        if self.bias is not None:
            raise ValueError("Int4Linear.select_rows: only a head without bias gives dense rows")
        return pick(self.dense).contiguous()


def layer_kind(mode: str, attr: str) -> type[PackedLinear]:
    """The packed layer a decoder linear layer named `attr` (or "lm_head", the output projection) becomes under
    `mode`: int4 everywhere for "int4-all", int4 MLPs beside int8 attention and head for "int4", else int8."""
    if mode == "int4-all" or (mode == "int4" and attr in MLP_NAMES):
        return Int4Linear
    return Int8Linear


def _decoder_linears(model: nn.Module) -> list[tuple[nn.Module, str, nn.Linear]]:
    """(parent, attribute, layer) for every nn.Linear inside the decoder layers."""
    base = getattr(model, "base_model", model)
    layers = getattr(base, "layers", None) or getattr(base, "h", None)
    if layers is None:
        raise InvalidInputError(f"cannot find the decoder layers of a {type(model).__name__} to quantize")
    found = []
    for layer in layers:
        for parent in layer.modules():
            for attr, child in list(parent.named_children()):
                if isinstance(child, nn.Linear):  # prepacked ones too (models.prepack keeps the weight)
                    found.append((parent, attr, child))
    return found


@torch.no_grad()
def quantize(model: nn.Module, mode: str = "int8", dtype: torch.dtype | None = None, cache: bool = True) -> nn.Module:
    """Swap the decoder layers' linear layers and the output projection for packed layers, in place (`layer_kind`:
    int8 everywhere, or int4 MLPs beside int8 attention and head); returns model.

    dtype: the activation dtype (bfloat16 or float16); None keeps the model's own. A model in another float dtype
    is cast to it first (its norms and embeddings then run in it too). cache: read the codes from, and write them
    to, the disk cache (`specdec.models.disk_cache`), keyed by a digest of the source weights, the mode and the
    dtype: the codes are a pure function of those, and the range search costs tens of seconds per start. The
    layers built from them (dequantized, packed) are stored too, per CPU and torch build, and mapped back from the
    file on the next start. Raises InvalidInputError for an unknown
    mode, float32 activations or a device other than the CPU, before changing anything.
    """
    mode = resolve_quant(mode)
    if not mode:
        raise InvalidInputError("quantize needs a mode: " + ", ".join(QUANT_MODES))
    if getattr(model, "_specdec_quant", ""):
        raise InvalidInputError(f"this model is already quantized ({model._specdec_quant})")
    first = next(model.parameters())
    dtype = dtype or first.dtype
    check_quant_support(dtype, first.device, mode)
    linears = [(parent, attr, linear, layer_kind(mode, attr)) for parent, attr, linear in _decoder_linears(model)]
    head = model.get_output_embeddings()
    head_kind = layer_kind(mode, "lm_head")
    swaps = [(linear, kind) for *_, linear, kind in linears]
    if isinstance(head, nn.Linear):
        swaps.append((head, head_kind))
    for linear, kind in swaps:  # refuse a width the int4 grouping cannot split before anything changes
        if kind is Int4Linear:
            check_int4_width(linear.in_features)
    if first.dtype != dtype:
        model.to(dtype)
    named = {id(m): name for name, m in model.named_modules()}
    layers = [(named[id(linear)], kind, linear) for linear, kind in swaps]
    identity = _codes_identity(mode, dtype, layers) if cache and disk_cache.enabled() else None
    built = _cached_layers(identity, dtype, layers) if identity else None
    if built is None:
        built = _build_layers(identity, dtype, layers)
        if identity:
            disk_cache.write_mapped(_built_path(identity, dtype), _built_identity(identity, dtype),
                                    {f"{name}/{part}": t for name, layer in built.items()
                                     for part, t in layer.stored().items()})
    for parent, attr, linear, kind in linears:
        setattr(parent, attr, built[named[id(linear)]])
    if isinstance(head, nn.Linear):
        model.set_output_embeddings(built[named[id(head)]])
        if getattr(model.config, "tie_word_embeddings", False):
            model.config.tie_word_embeddings = False  # the packed head is its own copy now; nothing may re-tie it
    model._specdec_quant = mode
    gc.collect()  # the replaced float layers hold no other references: free them now
    return model


QUANT_FORMAT = 1  # bump when codes() changes what it computes: cached codes of the old rule are then ignored
STORED_FORMAT = 1  # bump when a layer's STORED parts or from_stored change: stored layers of the old kind are ignored


def _build_layers(identity: dict | None, dtype: torch.dtype, layers) -> dict[str, "PackedLinear"]:
    """Every layer built from its codes: read from the disk cache (identity given) or computed (and written)."""
    codes = _cached_codes(identity, layers) if identity else None
    if codes is None:
        codes = {name: kind.codes(linear.weight, dtype) for name, kind, linear in layers}
        if identity:
            disk_cache.write_tensors(_codes_path(identity), identity, {f"{name}/{part}": t for name, parts in
                                                                       codes.items() for part, t in parts.items()})
    # Rebuilding a layer (dequantize, int4 packing) is torch work outside the GIL: a thread per core.
    with ThreadPoolExecutor(max_workers=max(1, min(len(layers), os.cpu_count() or 1, 8))) as pool:
        return dict(zip([name for name, *_ in layers],
                        pool.map(lambda layer: layer[1].from_codes(codes[layer[0]], layer[2].bias), layers)))


def _built_identity(identity: dict, dtype: torch.dtype) -> dict:
    """What built layers are a function of: their codes' identity, and the packing kernels of this CPU and torch
    build (the int4 layout `_convert_weight_to_int4pack_for_cpu` writes is the torch build's own)."""
    from specdec.models.prepack import kernel_identity

    return {"codes": identity, "kernels": kernel_identity(dtype), "stored": STORED_FORMAT}


def _built_path(identity: dict, dtype: torch.dtype):
    ident = _built_identity(identity, dtype)
    return disk_cache.store_dir("quant") / f"{identity['rule'][1]}-built-{disk_cache.digest(ident)[:32]}.bin"


def _cached_layers(identity: dict, dtype: torch.dtype, layers) -> dict[str, "PackedLinear"] | None:
    """The built layers stored for exactly these codes on this CPU and torch build, mapped from the file (no
    dequantizing or packing, no fresh memory filled), each with the source layer's bias; None when any is missing
    or does not fit its layer."""
    flat = disk_cache.read_mapped(_built_path(identity, dtype), _built_identity(identity, dtype))
    if flat is None:
        return None
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        name, _, part = key.rpartition("/")
        parts.setdefault(name, {})[part] = t
    built = {}
    for name, kind, linear in layers:
        mine = parts.get(name, {})
        if set(mine) != set(kind.STORED) or tuple(mine["dense"].shape) != tuple(linear.weight.shape) \
                or mine["dense"].dtype != dtype:
            return None
        try:
            built[name] = kind.from_stored(mine, linear.bias)
        except (ValueError, RuntimeError, IndexError):
            return None
    return built


def _codes_identity(mode: str, dtype: torch.dtype, layers) -> dict:
    """What the codes are a function of: the rule (mode, group, clips, format), the dtype and every source weight."""
    source = disk_cache.tensor_digest((f"{name}:{kind.__name__}", linear.weight) for name, kind, linear in layers)
    return {"rule": [QUANT_FORMAT, mode, INT4_GROUP, list(INT4_CLIPS), QMAX], "dtype": str(dtype), "source": source}


def _codes_path(identity: dict):
    return disk_cache.store_dir("quant") / f"{identity['rule'][1]}-{identity['source'][:32]}.safetensors"


def _cached_codes(identity: dict, layers) -> dict[str, dict[str, torch.Tensor]] | None:
    """The stored codes for exactly these weights and this rule, each layer's present with the right shapes."""
    flat = disk_cache.read_tensors(_codes_path(identity), identity)
    if flat is None:
        return None
    codes: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in flat.items():
        name, _, part = key.rpartition("/")
        codes.setdefault(name, {})[part] = t
    for name, _, linear in layers:
        if name not in codes or tuple(codes[name].get("q", torch.empty(0)).shape) != tuple(linear.weight.shape):
            return None
    return codes


def _time_ms(fn, x: torch.Tensor, reps: int) -> float:
    """Best of `reps` timed calls of fn(x), after one untimed call."""
    from specdec.core.clock import Stopwatch

    fn(x)
    clock = Stopwatch(x.device)
    best = float("inf")
    for _ in range(reps):
        clock.lap()
        fn(x)
        best = min(best, clock.lap())
    return best


def measure_dense_rows(layers: list[PackedLinear], rows=CROSSOVER_ROWS, reps: int = 3) -> int:
    """The widest pass (of `rows`) up to which the packed kernel is at least as fast as the dense matmul on this
    CPU, for layers of one shape. Each timing runs every layer in `layers` once (best of `reps`), so the weights
    stream from memory as in a real pass: one layer timed alone stays in the cache and flatters the dense matmul,
    which reads 2-4x more bytes. Every width up to the first where dense wins counts: 0 when dense wins even one
    row, max(rows) when it never does."""
    first = layers[0]
    dense = lambda x: [nn.functional.linear(x, m.dense) for m in layers]  # noqa: E731
    packed = lambda x: [m.packed(x) for m in layers]  # noqa: E731
    out = 0
    with torch.inference_mode():
        for m in rows:
            x = torch.randn(m, first.in_features, dtype=first.dtype, device=first.dense.device)
            if _time_ms(dense, x, reps) < _time_ms(packed, x, reps):
                break
            out = m
    return out


def settle_dense_rows(model: nn.Module, say=None) -> dict[str, int]:
    """Set every packed layer's `dense_rows` from measured crossovers, one per (kind, shape, dtype): read from the
    disk cache for this CPU and torch build (`prepack.kernel_identity`) or timed now and written there. Returns
    counts: crossovers read and measured. Timings are a measurement, not a verdict: a busy machine may pick a
    slower kernel, never a different result (each kernel computes the draft's own q)."""
    from specdec.models.prepack import kernel_identity

    layers = [m for m in model.modules() if isinstance(m, PackedLinear)]
    counts = {"read": 0, "measured": 0}
    if not layers:
        return counts
    identity = {**kernel_identity(layers[0].dtype), "crossover": [list(CROSSOVER_ROWS), "all layers"]}
    path = disk_cache.store_dir("kernels") / f"crossover-{disk_cache.digest(identity)[:32]}.json"
    known = {k: v for k, v in (disk_cache.read_json(path, identity) or {}).items() if isinstance(v, int)}
    groups: dict[str, list[PackedLinear]] = {}
    for m in layers:
        groups.setdefault(f"{type(m).__name__}:{m.out_features}x{m.in_features}", []).append(m)
    fresh = False
    for key, group in groups.items():
        if key in known:
            counts["read"] += 1
        else:
            if say:
                say(f"timing the draft's packed kernels against dense on this CPU: {key} (once)")
            known[key] = measure_dense_rows(group)
            counts["measured"] += 1
            fresh = True
        for m in group:
            m.dense_rows = known[key]
    if fresh:
        disk_cache.write_json(path, identity, known)
    return counts


def quantize_int8(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """quantize(model, "int8", dtype)."""
    return quantize(model, "int8", dtype)


def quant_of(model: nn.Module) -> str:
    """The quantization `quantize` applied to this model ('' for none)."""
    return getattr(model, "_specdec_quant", "")
