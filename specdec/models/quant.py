"""Weight-only int8 quantization of a draft model, for CPU decoding with bf16 (or fp16) activations.

`quantize_int8(model)` swaps every `nn.Linear` of the decoder layers (attention q/k/v/o, MLP gate/up/down) and the
output projection (lm_head) for an `Int8Linear`: int8 weights with one symmetric scale per output row, the bias
kept as it was. The forward pass calls `torch.ops.aten._weight_int8pack_mm` (x [M, K] bf16/fp16, weight int8
[N, K], scales [N] in x's dtype), which reads a quarter of the bytes an fp32 matmul reads and half of a bf16 one:
a draft step is bound by reading its weights, so that is where the time goes. With float32 activations the same
kernel measured slower than the dense fp32 matmul, so float32 is refused (`InvalidInputError`), as is any device
other than the CPU.

The input embeddings stay as they are (a row lookup reads one row per token). When lm_head was tied to them, the
int8 head is a separate copy and the tie is dropped; otherwise the float weights of every swapped layer are freed.

Speculative decoding stays exact with a quantized draft: q is the quantized model's own distribution, the one
the drafter samples from and reports to the rule. `Int8Linear.select_rows` gives the draft's reduced vocabulary
head (`core.kvcache.ReducedHead`) its rows of the int8 head, so the reduced head is also an int8 matmul.
"""

from __future__ import annotations

import gc

import torch
from torch import nn

from specdec.core.errors import InvalidInputError

QUANT_MODES = ("int8",)  # what draft_quant may name ("" or "none": no quantization)
INT8_ACTIVATIONS = (torch.bfloat16, torch.float16)  # the activation dtypes the int8 kernel is used with
QMAX = 127  # symmetric range: -127..127 (-128 unused, so the scale maps max |w| to exactly 127)


def resolve_quant(mode: str | None) -> str:
    """'' (none) or a name from QUANT_MODES; InvalidInputError for anything else."""
    mode = (mode or "").strip().lower()
    if mode in ("", "none"):
        return ""
    if mode not in QUANT_MODES:
        raise InvalidInputError(f"unknown draft quantization {mode[:20]!r}; choose none or {', '.join(QUANT_MODES)}")
    return mode


def check_int8_support(dtype: torch.dtype, device: torch.device | str) -> None:
    """InvalidInputError unless the int8 draft can run with these activations on this device."""
    device = torch.device(device)
    if device.type != "cpu":
        raise InvalidInputError(
            f"the int8 draft runs on the CPU only (its kernel, aten._weight_int8pack_mm, is used for CPU decoding); "
            f"got device {device.type}: leave the draft unquantized there"
        )
    if dtype not in INT8_ACTIVATIONS:
        name = str(dtype).replace("torch.", "")
        raise InvalidInputError(
            f"the int8 draft needs bfloat16 or float16 activations, got {name}: with float32 activations the int8 "
            "kernel is slower than the dense float32 matmul; use --dtype bfloat16"
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


class Int8Linear(nn.Module):
    """A linear layer with int8 weights and per-output-row scales: y = x @ (q * scale).T + bias."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        if qweight.dtype != torch.int8 or qweight.dim() != 2 or scales.shape != qweight.shape[:1]:
            raise ValueError("Int8Linear needs an int8 weight [N, K] and scales [N]")
        self.out_features, self.in_features = qweight.shape
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.register_buffer("bias", None if bias is None else bias.detach().to(scales.dtype))

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None = None,
                    dtype: torch.dtype | None = None) -> "Int8Linear":
        """Quantize a float weight [N, K] (activations in `dtype`, default the weight's own)."""
        dtype = dtype or weight.dtype
        q, scales = quantize_rows(weight, dtype)
        return cls(q, scales, bias)

    @classmethod
    def from_linear(cls, linear: nn.Linear, dtype: torch.dtype | None = None) -> "Int8Linear":
        return cls.from_weight(linear.weight, linear.bias, dtype)

    @property
    def dtype(self) -> torch.dtype:
        return self.scales.dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != self.scales.dtype:
            raise InvalidInputError(f"Int8Linear takes {self.scales.dtype} inputs, got {x.dtype}")
        flat = x.reshape(-1, self.in_features).contiguous()
        y = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scales)
        y = y.reshape(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def select_rows(self, rows: slice | torch.Tensor) -> "Int8Linear":
        """The same layer restricted to some output rows: a slice shares the storage, an index tensor copies."""
        if isinstance(rows, slice):
            pick = lambda t: t[rows]  # noqa: E731
        else:
            pick = lambda t: t.index_select(0, rows.to(t.device))  # noqa: E731
        bias = None if self.bias is None else pick(self.bias)
        return Int8Linear(pick(self.qweight).contiguous(), pick(self.scales).contiguous(), bias)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight [N, K] this layer multiplies by."""
        return self.qweight.float() * self.scales.float()[:, None]

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8, {self.scales.dtype}"


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
                if type(child) is nn.Linear:
                    found.append((parent, attr, child))
    return found


@torch.no_grad()
def quantize_int8(model: nn.Module, dtype: torch.dtype | None = None) -> nn.Module:
    """Swap the decoder layers' linear layers and the output projection for Int8Linear, in place; returns model.

    dtype: the activation dtype (bfloat16 or float16); None keeps the model's own. A model in another float dtype
    is cast to it first (its norms and embeddings then run in it too). Raises InvalidInputError for float32
    activations or a device other than the CPU, before changing anything.
    """
    if getattr(model, "_specdec_quant", ""):
        raise InvalidInputError(f"this model is already quantized ({model._specdec_quant})")
    first = next(model.parameters())
    dtype = dtype or first.dtype
    check_int8_support(dtype, first.device)
    if first.dtype != dtype:
        model.to(dtype)
    for parent, attr, linear in _decoder_linears(model):
        setattr(parent, attr, Int8Linear.from_linear(linear, dtype))
    head = model.get_output_embeddings()
    if isinstance(head, nn.Linear):
        model.set_output_embeddings(Int8Linear.from_linear(head, dtype))
        if getattr(model.config, "tie_word_embeddings", False):
            model.config.tie_word_embeddings = False  # the int8 head is its own copy now; nothing may re-tie it
    model._specdec_quant = "int8"
    gc.collect()  # the replaced float layers hold no other references: free them now
    return model


def quant_of(model: nn.Module) -> str:
    """The quantization quantize_int8 applied to this model ('' for none)."""
    return getattr(model, "_specdec_quant", "")
