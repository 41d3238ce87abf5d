"""What a mask costs a verify pass: the target scoring n fed tokens after a context of L, three ways, interleaved.

- causal: the chain's fast path (no mask: sdpa's is_causal);
- causal mask: the same pattern as an explicit additive mask (visibility_mask, n x (L + n) in the model dtype);
- tree: a token tree's pattern (each node sees its ancestors), also an explicit mask;
and the attention alone (torch sdpa on the pass's q/k/v shapes) with is_causal against the explicit mask.

    python scripts/masked_pass.py                     # the default pair as the app loads it, n = 9 and 33
    python scripts/masked_pass.py --pair tiny --n 9   # the random-weight pair (seconds)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def tree_visible(n: int, branches: int = 3) -> torch.Tensor:
    """[n, n] bool: `branches` chains hanging off the first node, each node seeing its ancestors and itself."""
    parent = [-1] + [0 if i <= branches else i - branches for i in range(1, n)]
    vis = torch.zeros(n, n, dtype=torch.bool)
    for i in range(n):
        j = i
        while j >= 0:
            vis[i, j] = True
            j = parent[j]
    return vis


def time_passes(lm, context: list[int], n: int, repeats: int, vocab: int) -> dict[str, float]:
    """Median ms of one pass of n tokens after `context`, per way, the ways taking turns."""
    ids = torch.tensor([[(7 * i + 3) % min(vocab - 2, 1000) + 2 for i in range(n)]])
    ways = {"causal": None, "causal_mask": torch.ones(n, n, dtype=torch.bool).tril(), "tree": tree_visible(n)}
    times: dict[str, list[float]] = {k: [] for k in ways}
    for rep in range(repeats + 1):
        for name, visible in ways.items():
            t = time.perf_counter()
            lm.score(ids, visible=visible)
            dt = (time.perf_counter() - t) * 1000
            lm.crop(len(context))
            if rep:  # the first turn warms every way up
                times[name].append(dt)
    return {k: statistics.median(v) for k, v in times.items()}


def time_sdpa(heads: int, dim: int, n: int, context: int, dtype, repeats: int) -> dict[str, float]:
    """Attention alone on a pass's shapes, no mask against an additive mask; keys and values carry the query's heads,
    as transformers hands them to sdpa after repeating the grouped KV heads."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, n, dim, generator=g).to(dtype)
    k = torch.randn(1, heads, context + n, dim, generator=g).to(dtype)
    v = torch.randn(1, heads, context + n, dim, generator=g).to(dtype)
    keep = torch.ones(n, context + n, dtype=torch.bool).tril(context)
    mask = torch.zeros(n, context + n, dtype=dtype).masked_fill_(~keep, torch.finfo(dtype).min)[None, None]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    # is_causal aligns the top-left corner: for n queries after a context, sdpa needs the mask (transformers
    # passes is_causal only when q and k have the same length), so the fair no-mask case is the mask-free call
    calls = {"no_mask": lambda: sdpa(q, k, v), "additive_mask": lambda: sdpa(q, k, v, attn_mask=mask)}
    out: dict[str, list[float]] = {k: [] for k in calls}
    for rep in range(repeats + 1):
        for name, f in calls.items():
            t = time.perf_counter()
            for _ in range(10):
                f()
            if rep:
                out[name].append((time.perf_counter() - t) * 100)  # ms per call
    return {k: statistics.median(v) for k, v in out.items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="pair preset (default: the app's default pair)")
    ap.add_argument("--n", default="9,33", help="comma list of fed tokens per pass")
    ap.add_argument("--context", type=int, default=150, help="cached tokens before the pass")
    ap.add_argument("--repeats", type=int, default=9, help="timed turns per way (medians reported)")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "masked-pass.json"))
    args = ap.parse_args(argv)

    from specdec.core.static_cache import open_lm
    from specdec.models.pair import cpu_name, load_pair
    from ui.loader import default_pair_name

    name = args.pair or default_pair_name()
    pair = load_pair(name)
    cfg = pair.target.config
    lm = open_lm(pair.target, pair.vocab_size)
    context = [(13 * i + 5) % min(pair.vocab_size - 2, 1000) + 2 for i in range(args.context)]
    lm.feed(context)
    rows = []
    for n in (int(x) for x in args.n.split(",")):
        passes = time_passes(lm, context, n, args.repeats, pair.vocab_size)
        attn = time_sdpa(cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads, n, args.context,
                         pair.dtype, args.repeats)
        rows.append({"n": n, "context": args.context, "pass_ms": passes, "sdpa_ms": attn,
                     "tree_over_causal": passes["tree"] / passes["causal"],
                     "mask_over_causal": passes["causal_mask"] / passes["causal"]})
        print(f"n={n:3d} L={args.context}: causal {passes['causal']:7.1f} ms  causal mask {passes['causal_mask']:7.1f}"
              f"  tree {passes['tree']:7.1f}  (tree/causal {rows[-1]['tree_over_causal']:.3f});  sdpa per layer: "
              f"no mask {attn['no_mask']:.3f} ms, additive mask {attn['additive_mask']:.3f} ms")
    doc = {"pair": name, "dtype": str(pair.dtype), "cpu": cpu_name(),
           "torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
