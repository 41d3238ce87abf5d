"""Gather or re-feed: what keeping a tree's accepted path in the cache costs, measured side by side in one run.

    python scripts/tree_keep_bench.py                         # tiny pair target + a random Qwen2.5-0.5B-shaped model
    python scripts/tree_keep_bench.py --models tiny --repeats 30 --threads 1

After CachedLM.logits_for_tree scores a tree, keep_path leaves the accepted path of k nodes in the cache one of
two ways: "gather" moves the accepted nodes' key/value slots into place (index_select on every layer), "refeed"
crops back to the committed text, so the NEXT tree pass feeds the k accepted tokens again (a tail of k + 1
tokens instead of 1). What a round pays is keep + next pass, so both are timed:

1. keep: the same scored tree (a snapshot of its cache, restored before every call) is kept both ways, for
   paths of 1..4 nodes on trees of 8 and 16 nodes. The paths avoid the nodes already in place (node j at depth
   j + 1), which both strategies keep for free.
2. next pass: logits_for_tree of a next tree of the same size after a committed tail of 1 (gather) and of
   k + 1 tokens (refeed), all tail lengths in every repeat in rotating order; "extra" is the median over
   repeats of the paired difference pass(k + 1) - pass(1) (paired within a repeat, so that a shared, noisy CPU
   cancels out better than in separate medians).

The ratio printed is refeed / gather of (keep + next pass), from the medians and the paired extra. --clock cpu
times with the process's CPU time instead of the wall clock: on a CPU shared with other jobs, waiting for a core
then does not count (use it with --threads 1, where CPU time is the work done). Random weights only: nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch

from specdec.core.kvcache import CachedLM
from specdec.core.tree import ROOT as TREE_ROOT
from specdec.core.tree import TokenTree

R = TREE_ROOT
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = time.perf_counter
# Two tree shapes (parents in topological order) and, for each, the timed paths of 1..4 accepted nodes: each goes
# through a later sibling, so none of its slots is in place already.
TREES = {
    8: ([R, R, R, 0, 1, 4, 3, 5], [[1], [1, 4], [1, 4, 5], [1, 4, 5, 7]]),
    16: ([R, R, R, R, 0, 0, 1, 1, 2, 4, 4, 6, 7, 9, 11, 12], [[1], [1, 6], [1, 6, 11], [1, 6, 11, 14]]),
}


def build_model(name: str, dtype: torch.dtype):
    """(model, vocab size, description) for a size name; random weights, built in memory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    if name == "tiny":
        from specdec.models.pair import load_pair

        pair = load_pair("tiny", dtype="float32", device="cpu", shared=False)
        return pair.target.to(dtype), pair.vocab_size, "tiny pair target: Qwen2, hidden 64, 2 layers, vocab 101"
    if name == "qwen0.5b":  # Qwen2.5-0.5B's shape
        cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                          num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                          tie_word_embeddings=True, rope_theta=1000000.0)
        desc = "random Qwen2 (Qwen2.5-0.5B shape): hidden 896, 24 layers, 14 heads / 2 KV heads, vocab 151936"
    elif name == "qwen-mid":
        cfg = Qwen2Config(vocab_size=32000, hidden_size=512, intermediate_size=2048, num_hidden_layers=12,
                          num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True)
        desc = "random Qwen2: hidden 512, 12 layers, 8 heads / 2 KV heads, vocab 32000"
    else:
        raise SystemExit(f"unknown model size {name!r}; choose tiny, qwen-mid, qwen0.5b")
    torch.manual_seed(0)
    return Qwen2ForCausalLM(cfg).to(dtype).eval(), cfg.vocab_size, desc


def make_tree(parents: list[int], vocab: int, gen: torch.Generator) -> TokenTree:
    tokens = torch.randint(4, min(vocab, 5000), (len(parents),), generator=gen)
    return TokenTree(tokens, list(parents), torch.empty(len(parents), 0))


def snapshot(lm: CachedLM):
    return ([(layer.keys.clone(), layer.values.clone()) for layer in lm.cache.layers], list(lm.ids), lm._tree)


def restore(lm: CachedLM, snap) -> None:
    layers, ids, tree = snap
    for layer, (k, v) in zip(lm.cache.layers, layers):
        layer.keys, layer.values = k.clone(), v.clone()
    lm.ids, lm._tree = list(ids), tree


def time_keeps(lm: CachedLM, prompt: list[int], tree: TokenTree, paths, repeats: int) -> dict:
    """{(k, how): median ms of keep_path} on one scored tree, restored from a snapshot before every keep."""
    lm.crop(len(prompt) - 1)
    lm.logits_for_tree(prompt, tree)
    snap = snapshot(lm)
    out = {}
    for path in paths:
        after = prompt + [int(tree.tokens[j]) for j in path] + [3]
        ms = {"gather": [], "refeed": []}
        for rep in range(repeats + 1):
            for how in ("gather", "refeed") if rep % 2 else ("refeed", "gather"):
                restore(lm, snap)
                t0 = clock()
                lm.keep_path(after, path, how)
                if rep:  # the first round warms up
                    ms[how].append((clock() - t0) * 1e3)
        for how, xs in ms.items():
            out[len(path), how] = statistics.median(xs)
    restore(lm, snap)
    lm.crop(len(prompt) - 1)
    return out


def time_next_passes(lm: CachedLM, prompt: list[int], nxt: TokenTree, tails: list[int], repeats: int) -> dict:
    """{tail: [ms per repeat]} of logits_for_tree(nxt) after a committed tail of `tail` uncached tokens."""
    out = {t: [] for t in tails}
    for rep in range(repeats + 1):
        shift = rep % len(tails)
        for tail in tails[shift:] + tails[:shift]:
            lm.crop(len(prompt) - tail)
            t0 = clock()
            lm.logits_for_tree(prompt, nxt)
            if rep:
                out[tail].append((clock() - t0) * 1e3)
    lm.crop(len(prompt) - 1)
    return out


def bench(name: str, context: int, repeats: int, dtype: torch.dtype, nodes: list[int]) -> dict:
    model, vocab, desc = build_model(name, dtype)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(4, min(vocab, 5000), (context,), generator=gen).tolist()
    lm = CachedLM(model, vocab)
    lm.logits_after(prompt)  # the prompt's pass, once: the cache then holds prompt[:-1] ... and its last token
    lm.crop(context - 1)
    print(f"\n{name}: {desc}; {dtype}; context {context} tokens; {torch.get_num_threads()} threads; {repeats} "
          f"repeats (medians); {clock.__name__} clock", flush=True)
    print(f"{'nodes':>5} {'k':>2} | {'gather keep':>11} {'next(1)':>9} {'total':>9} | {'refeed keep':>11} "
          f"{'next(k+1)':>9} {'extra':>8} {'total':>9} | refeed/gather", flush=True)
    rows = []
    for n in nodes:
        parents, paths = TREES[n]
        tree, nxt = make_tree(parents, vocab, gen), make_tree(parents, vocab, gen)
        keeps = time_keeps(lm, prompt, tree, paths, max(repeats, 20))
        tails = [1] + [len(p) + 1 for p in paths]
        passes = time_next_passes(lm, prompt, nxt, tails, repeats)
        base = statistics.median(passes[1])
        for path in paths:
            k = len(path)
            g_keep, r_keep = keeps[k, "gather"], keeps[k, "refeed"]
            r_next = statistics.median(passes[k + 1])
            extra = statistics.median(b - a for a, b in zip(passes[1], passes[k + 1]))
            g_total, r_total = g_keep + base, r_keep + base + extra
            ratio = r_total / g_total
            print(f"{n:>5} {k:>2} | {g_keep:>9.3f}ms {base:>7.2f}ms {g_total:>7.2f}ms | {r_keep:>9.3f}ms "
                  f"{r_next:>7.2f}ms {extra:>+6.2f}ms {r_total:>7.2f}ms | {ratio:.3f}", flush=True)
            rows.append({"nodes": n, "path_len": k, "gather_keep_ms": g_keep, "refeed_keep_ms": r_keep,
                         "next_tail1_ms": base, "next_tail_k1_ms": r_next, "refeed_extra_ms": extra,
                         "gather_total_ms": g_total, "refeed_total_ms": r_total, "refeed_over_gather": ratio})
    del lm, model
    return {"model": name, "description": desc, "context": context, "repeats": repeats, "dtype": str(dtype),
            "threads": torch.get_num_threads(), "clock": clock.__name__, "rows": rows}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="tiny,qwen0.5b", help="comma list of tiny, qwen-mid, qwen0.5b")
    ap.add_argument("--context", type=int, default=256, help="committed tokens before the tree")
    ap.add_argument("--repeats", type=int, default=9, help="repeats of the next-pass timings (keeps: at least 20)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default); 1 steadies the "
                    "tiny model's sub-millisecond matmuls on a shared CPU")
    ap.add_argument("--clock", default="wall", choices=list(CLOCKS), help="wall: time.perf_counter; cpu: "
                    "time.process_time (this process's CPU time)")
    ap.add_argument("--nodes", default="8,16", help="tree sizes to time, of " + ",".join(map(str, TREES)))
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    global clock
    clock = CLOCKS[args.clock]
    dtype = getattr(torch, args.dtype)
    nodes = [int(n) for n in args.nodes.split(",")]
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}; default keep: {CachedLM.KEEP_PATH}")
    out = [bench(m, args.context, args.repeats, dtype, nodes) for m in args.models.split(",") if m]
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
