"""Where one plain decoding step's time goes: the target scoring one token after a context, split into matmuls and
everything else, against the time its weights take to read from memory (the floor a bandwidth-bound step cannot
beat).

Every module of the body is timed by hooks (exclusive time: a module's own time minus its children's), sdpa and the
cache write by wrapping them, and the head by wrapping the scorer's projection, so the parts add up to the step:
    matmul      the linear layers of the body (q/k/v/o, gate/up/down)
    head        the output projection onto the vocabulary (outside the body)
    attention   sdpa itself
    cache write the key/value cache update
    attn glue   the attention module's own work besides those: rotary applied, reshapes, head repeats
    norm        RMSNorm modules
    rotary      the rotary embedding's cos/sin (once a step)
    mlp glue    the activation and the gate * up product
    layer glue  residual adds in the decoder layers
    body glue   the body's own work: position ids, mask choice, embedding lookup
    scorer      the rest of the step: the scorer's Python around the body (positions, cache bookkeeping)
Hooks cost a little time themselves: the unhooked step's median is reported beside the hooked one.

    python scripts/step_profile.py                 # the default pair's target as the app loads it
    python scripts/step_profile.py --pair tiny     # the random-weight pair (seconds)
    python scripts/step_profile.py --model draft   # one draft step instead, on the head the drafter uses
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PARTS = ("matmul", "head", "attention", "cache write", "attn glue", "norm", "rotary", "mlp glue", "layer glue",
         "body glue", "scorer")


def part_of(module: nn.Module) -> str | None:
    """The part a module's own time is booked to (None: booked to its parent's part)."""
    name = type(module).__name__
    if isinstance(module, nn.Linear) or "Linear" in name:
        return "matmul"
    if "Norm" in name:
        return "norm"
    if "Rotary" in name:
        return "rotary"
    if "Attention" in name:
        return "attn glue"
    if "MLP" in name or isinstance(module, (nn.SiLU, nn.GELU)) or "Activation" in name:
        return "mlp glue"
    if "DecoderLayer" in name or "Block" in name:
        return "layer glue"
    if isinstance(module, nn.Embedding):
        return "body glue"
    return None


class PartTimer:
    """Exclusive wall time per part: enter/leave nest; a span's time minus its children's goes to its part."""

    def __init__(self) -> None:
        self.totals = {p: 0.0 for p in PARTS}
        self.stack: list[list] = []  # [part, start, children's time]

    def enter(self, part: str) -> None:
        self.stack.append([part, time.perf_counter(), 0.0])

    def leave(self) -> None:
        part, start, children = self.stack.pop()
        spent = time.perf_counter() - start
        self.totals[part] += spent - children
        if self.stack:
            self.stack[-1][2] += spent

    @contextlib.contextmanager
    def span(self, part: str):
        self.enter(part)
        try:
            yield
        finally:
            self.leave()

    def wrap(self, fn, part: str):
        def timed(*args, **kwargs):
            with self.span(part):
                return fn(*args, **kwargs)
        return timed


@contextlib.contextmanager
def hooked(lm, timer: PartTimer):
    """Time every part of lm's passes while inside: module hooks on the body, sdpa and the cache update wrapped,
    the scorer's head projection wrapped."""
    import transformers.cache_utils as cache_utils

    body = lm.model.base_model
    handles = []
    for module in [*body.modules(), lm.out_head]:
        part = "body glue" if module is body else "head" if module is lm.out_head else part_of(module)
        if part is None:
            continue
        handles.append(module.register_forward_pre_hook(lambda m, a, p=part: timer.enter(p)))
        handles.append(module.register_forward_hook(lambda m, a, o: timer.leave()))
    sdpa = nn.functional.scaled_dot_product_attention
    layer_update = cache_utils.DynamicLayer.update
    project = lm.head.project
    nn.functional.scaled_dot_product_attention = timer.wrap(sdpa, "attention")
    cache_utils.DynamicLayer.update = timer.wrap(layer_update, "cache write")
    lm.head.project = timer.wrap(project, "head")
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        nn.functional.scaled_dot_product_attention = sdpa
        cache_utils.DynamicLayer.update = layer_update
        lm.head.project = project


def step_ms(lm, context_len: int, token: int, timer: PartTimer | None = None) -> float:
    """One plain step (feed one token, the next token's logits), the cache cropped back after; wall ms."""
    t = time.perf_counter()
    if timer is None:
        lm.feed([token])
    else:
        with timer.span("scorer"):
            lm.feed([token])
    dt = (time.perf_counter() - t) * 1e3
    lm.crop(context_len)
    return dt


def weight_bytes(lm) -> dict[str, int]:
    """Bytes one plain step reads: every linear weight of the body (its packed copy where it runs on one) and the
    head's rows the scorer projects onto."""
    body = 0
    for m in lm.model.base_model.modules():
        w = getattr(m, "weight", None)
        if part_of(m) == "matmul" and isinstance(w, torch.Tensor) and w.dim() == 2:
            body += w.numel() * w.element_size()
        for name in ("qweight", "codes", "scales"):  # quantized layers keep codes beside (or instead of) a weight
            t = getattr(m, name, None)
            if isinstance(t, torch.Tensor) and not isinstance(w, torch.Tensor):
                body += t.numel() * t.element_size()
    head = lm.head.weight if lm.head.cut else lm.out_head.weight
    if isinstance(head, nn.Module):  # a quantized head (or its rows): what its packed kernel reads
        head = [t for n in ("qweight", "scales", "scales_zeros") if isinstance(t := getattr(head, n, None), torch.Tensor)]
    else:
        head = [head]
    return {"body": body, "head": sum(t.numel() * t.element_size() for t in head)}


def read_gb_s(gib: float = 1.0, repeats: int = 5) -> float:
    """Memory read bandwidth: the best of `repeats` sums over a `gib` GiB float32 tensor, GB/s."""
    x = torch.ones(int(gib * 2**30) // 4)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best / 1e9


def profile(lm, context: list[int], repeats: int) -> dict:
    """Median unhooked step, then the hooked steps' median and mean, and their mean ms per part (and its sum)."""
    lm.feed(context)
    n = len(lm)
    token = context[-1]
    for _ in range(3):
        step_ms(lm, n, token)
    plain = statistics.median(step_ms(lm, n, token) for _ in range(repeats))
    timer = PartTimer()
    with hooked(lm, timer):
        step_ms(lm, n, token, PartTimer())  # hooks warm
        timer.totals = dict.fromkeys(PARTS, 0.0)
        hooked_steps = [step_ms(lm, n, token, timer) for _ in range(repeats)]
    parts = {p: 1e3 * v / repeats for p, v in timer.totals.items()}
    # parts are means over the hooked steps, so they sum to those steps' mean (one stalled step moves both alike);
    # the median is the figure to read
    return {"step_ms": plain, "hooked_step_ms": statistics.median(hooked_steps),
            "hooked_mean_ms": statistics.fmean(hooked_steps),
            "parts_ms": parts, "parts_sum_ms": sum(parts.values())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="pair preset (default: the app's default pair)")
    ap.add_argument("--model", choices=["target", "draft"], default="target",
                    help="whose step: the target's (plain decoding) or the draft model's (one guess, on the reduced "
                         "head the model drafter uses where it does)")
    ap.add_argument("--context", type=int, default=150, help="cached tokens before the step")
    ap.add_argument("--repeats", type=int, default=15, help="timed steps (medians and means over them)")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "step-profile.json"))
    args = ap.parse_args(argv)

    from specdec.core.static_cache import open_lm
    from specdec.models.pair import cpu_name, load_pair
    from ui.loader import default_pair_name

    name = args.pair or default_pair_name()
    pair = load_pair(name)
    if args.model == "draft":
        from specdec.drafters.head import resolve_draft_vocab

        lm = open_lm(pair.draft, pair.vocab_size, resolve_draft_vocab(pair, None))
    else:
        lm = open_lm(pair.target, pair.vocab_size)
    context = [(13 * i + 5) % min(pair.vocab_size - 2, 1000) + 2 for i in range(args.context)]
    with torch.inference_mode():
        doc = profile(lm, context, args.repeats)
        weights = weight_bytes(lm)
    gb_s = read_gb_s()
    total = weights["body"] + weights["head"]
    doc.update(pair=name, model=args.model, dtype=str(pair.dtype), cpu=cpu_name(), torch=torch.__version__,
               threads=torch.get_num_threads(), context=args.context, weight_bytes=weights, read_gb_s=gb_s,
               floor_ms=1e3 * total / (gb_s * 1e9))
    matmul = doc["parts_ms"]["matmul"] + doc["parts_ms"]["head"]
    doc["matmul_gb_s"] = total / (matmul * 1e6) if matmul else None
    print(f"{name} ({args.model}) on {doc['cpu']}, {doc['threads']} threads, context {args.context}")
    print(f"step {doc['step_ms']:.1f} ms (hooked {doc['hooked_step_ms']:.1f}; parts sum {doc['parts_sum_ms']:.1f})")
    for p, ms in doc["parts_ms"].items():
        print(f"  {p:12s} {ms:7.2f} ms  {100 * ms / doc['parts_sum_ms']:5.1f} %")
    print(f"weights read per step {total / 1e9:.2f} GB; memory read {gb_s:.1f} GB/s -> floor {doc['floor_ms']:.1f} ms;"
          f" matmuls ran at {doc['matmul_gb_s'] or 0:.1f} GB/s")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
