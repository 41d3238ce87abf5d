"""One prepared run of the engine on a GPU: exactness on CUDA, then the costs that decide the speedup there.

    python scripts/gpu_check.py                      # on the device machine: CUDA, fp32 + bf16, <= 8 minutes
    python scripts/gpu_check.py --device cpu --short # the same code path in CI (< 1 minute), so it cannot rot

No real weights travel to the device machine (64 MiB upload), so:
  * exactness runs on the tiny random-weight pair, in fp32 and bf16: greedy equality of speculative vs plain
    decoding, a chi-square of the first emitted token of many independent rounds against the target's exact
    distribution, and a cache rollback check (crop then refeed == one fresh pass);
  * token trees: greedy equality of top-k and dynamic tree rounds with plain greedy (tiny pair), and the cost of a
    masked tree pass against a causal pass of as many tokens, and of a draft depth grown on the cache;
  * timings run on random-weight models built from the real Qwen2.5-Coder 1.5B (target) and 0.5B (draft) configs
    (weights do not change the cost of a forward pass): a target pass over k = 1..16 new tokens after a
    128-token prefix, a draft pass (reduced and full vocabulary head), c, plain per-token costs, and the loop's
    overhead per round by category (specdec.bench.overhead);
  * engines (specdec.core.static_cache): the eager loop against the static cache with compiled passes (CUDA
    graphs on CUDA), on the same random-weight models: target and draft pass ms, c, compile seconds, tok/s of plain,
    draft-model and prompt-lookup runs, host syncs per round (torch.cuda.set_sync_debug_mode), and greedy equality
    of every compiled run with the eager one.
Every timed region is bracketed by torch.cuda.synchronize. Writes one JSON ($OUT/gpu-check.json when $OUT is set)
and prints a summary; exits 1 when an exactness check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

# The real configs (from the converted embedded pair; the upstream hub configs have the same shapes).
QWEN_COMMON = {
    "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "vocab_size": 151936,
    "max_position_embeddings": 32768, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "attention_dropout": 0.0,
    "use_sliding_window": False, "sliding_window": None, "max_window_layers": 28, "bos_token_id": 151643,
    "eos_token_id": 151645, "pad_token_id": 151643, "initializer_range": 0.02, "tie_word_embeddings": False,
}
TARGET_1_5B = {**QWEN_COMMON, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
               "num_attention_heads": 12, "num_key_value_heads": 2}
DRAFT_0_5B = {**QWEN_COMMON, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
              "num_attention_heads": 14, "num_key_value_heads": 2}
# --short shrinks every size so CI on two cores runs the same code path in seconds.
SHORT_SHAPES = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 2048, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 0}

PROMPTS = ("def fibonacci(n):", "The history of the printing press begins", "Explain a hash map in one line.")
CHI_PROMPT = "x = "


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def timed_ms(fn, dev: torch.device, reps: int) -> list[float]:
    out = []
    for _ in range(reps):
        sync(dev)
        t0 = time.perf_counter()
        fn()
        sync(dev)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def med(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else 0.0


# ------------------------------------------------------------------------------------------------ exactness


def check_greedy(pair, cfg) -> dict:
    from specdec.loop.decoder import SpeculativeDecoder
    from specdec.loop.plain import plain_decode
    from specdec.core.settings import DecodeSettings

    rows = []
    for prompt in PROMPTS[: cfg.prompts]:
        for gamma in cfg.gammas:
            s = DecodeSettings(gamma=gamma, max_new_tokens=cfg.greedy_tokens)
            plain = plain_decode(pair, prompt, s).ids
            dec = SpeculativeDecoder(pair, prompt, s)
            for _ in dec:
                pass
            spec = dec.generated_ids
            first_diff = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
            if first_diff is None and len(plain) != len(spec):
                first_diff = min(len(plain), len(spec))
            rows.append({"prompt": prompt, "gamma": gamma, "equal": first_diff is None, "first_diff": first_diff,
                         "tokens": len(spec), "rejections": sum(r.rejected_at is not None for r in dec.rounds)})
    return {"runs": rows, "equal": sum(r["equal"] for r in rows), "of": len(rows)}


@torch.inference_mode()
def check_first_token(pair, cfg) -> dict:
    """First emitted token of n independent rounds (gamma=2, T=1) vs the target's exact next-token distribution."""
    from specdec.loop.decoder import SpeculativeDecoder
    from specdec.core.settings import encode_prompt
    from specdec.core.kvcache import CachedLM
    from specdec.learn.lab import chi_square
    from specdec.core.sampling import SamplingConfig, warp
    from specdec.core.settings import DecodeSettings

    sampling = SamplingConfig(temperature=1.0)
    ids = encode_prompt(pair.tokenizer, CHI_PROMPT)
    p0 = warp(CachedLM(pair.target, pair.vocab_size).logits_after(ids)[-1], sampling).double().cpu()
    counts = torch.zeros(pair.vocab_size, dtype=torch.float64)
    rejected = 0
    t0 = time.perf_counter()
    for seed in range(cfg.chi_rounds):
        s = DecodeSettings(gamma=2, max_new_tokens=3, sampling=sampling, seed=1000 + seed)
        rnd = SpeculativeDecoder(pair, CHI_PROMPT, s).step()
        counts[rnd.committed_ids[0]] += 1
        rejected += rnd.rejected_at == 0
    test = chi_square(counts.numpy(), p0.numpy())
    outside = int(counts[p0 <= 0].sum())
    return {"rounds": cfg.chi_rounds, "first_guess_rejected": rejected, "p_value": test.p_value,
            "statistic": test.statistic, "dof": test.dof, "outside_support": outside,
            "seconds": time.perf_counter() - t0}


@torch.inference_mode()
def check_rollback(pair, dtype: torch.dtype) -> dict:
    """Feed, crop back, refeed other tokens: the logits must equal one fresh pass over the final sequence."""
    from specdec.core.kvcache import CachedLM

    gen = torch.Generator().manual_seed(0)
    base = torch.randint(4, pair.vocab_size, (24,), generator=gen).tolist()
    wrong = torch.randint(4, pair.vocab_size, (5,), generator=gen).tolist()
    right = torch.randint(4, pair.vocab_size, (5,), generator=gen).tolist()
    out = {}
    for role, model, head in (("target", pair.target, 0), ("draft", pair.draft, 0),
                              ("draft_reduced_head", pair.draft, pair.vocab_size // 2)):
        lm = CachedLM(model, pair.vocab_size, head)
        lm.feed(base)
        lm.feed(wrong)
        lm.crop(len(base) + 2)  # keep two of the wrong tokens, roll back three
        kept = base + wrong[:2]
        got = lm.feed(right, len(right)).float()
        fresh = CachedLM(model, pair.vocab_size, head).feed(kept + right, len(right)).float()
        finite = torch.isfinite(fresh)
        diff = float((got[finite] - fresh[finite]).abs().max()) if finite.any() else 0.0
        scale = float(fresh[finite].abs().max()) if finite.any() else 1.0
        same_argmax = bool((got.argmax(-1) == fresh.argmax(-1)).all())
        same_mask = bool((torch.isfinite(got) == finite).all())
        tol = 1e-4 if dtype == torch.float32 else 3e-2  # relative to the largest logit
        out[role] = {"max_abs_diff": diff, "relative": diff / max(scale, 1e-9), "same_argmax": same_argmax,
                     "ok": same_mask and same_argmax and diff <= tol * max(scale, 1.0)}
    return out


def exactness(dev: torch.device, dtype_name: str, cfg) -> dict:
    from dataclasses import replace

    from specdec.models.pair import load_pair

    pair = load_pair("tiny", dtype=dtype_name, device=str(dev), shared=False)
    # The tiny draft is the target plus a little noise (few rejections). For the distribution test the draft is an
    # unrelated random model instead, so most first guesses are rejected and the repair path carries the test.
    other = load_pair(target="tiny:target:1", draft="tiny:draft:1", dtype=dtype_name, device=str(dev), shared=False)
    unrelated = replace(pair, draft=other.draft, draft_id=other.draft_id)
    t0 = time.perf_counter()
    res = {"greedy": check_greedy(pair, cfg), "tree_greedy": check_tree_greedy(pair, cfg),
           "first_token": check_first_token(unrelated, cfg), "rollback": check_rollback(pair, pair.dtype)}
    res["seconds"] = time.perf_counter() - t0
    g, c, t = res["greedy"], res["first_token"], res["tree_greedy"]
    # bf16 is not bit-exact between a 1-token and a k-token pass (different kernels/reductions): greedy equality
    # is required in fp32 only; in bf16 it is reported.
    res["ok"] = bool(
        ((g["equal"] == g["of"] and t["equal"] == t["of"]) or dtype_name != "float32")
        and c["p_value"] >= cfg.p_min and c["outside_support"] == 0
        and all(r["ok"] for r in res["rollback"].values())
    )
    return res


# -------------------------------------------------------------------------------------------------- timings


def random_pair(dev: torch.device, dtype: torch.dtype, short: bool):
    """Random-weight target and draft with the real configs (shrunk with --short), sharing a padded tokenizer."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from specdec.models.pair import ModelPair, eos_ids
    from specdec.models.tiny import tiny_tokenizer

    specs = [{**spec, **(SHORT_SHAPES if short else {})} for spec in (TARGET_1_5B, DRAFT_0_5B)]
    vocab = specs[0]["vocab_size"]
    tok = tiny_tokenizer(vocab)
    models = []
    for i, spec in enumerate(specs):
        torch.manual_seed(i)
        with torch.device(dev):
            models.append(AutoModelForCausalLM.from_config(Qwen2Config(**spec), dtype=dtype).eval())
    target, draft = models
    return ModelPair(target, draft, tok, dev, dtype, "qwen2.5-coder-1.5b/0.5b configs, random weights",
                     "random:" + ("short-" if short else "") + "1.5b", "random:" + ("short-" if short else "") + "0.5b",
                     vocab, eos_ids(tok))


def random_ids(pair, cfg, n_new: int) -> tuple[list[int], list[int]]:
    """A random prefix of cfg.prefix ids and n_new more to feed after it (seeded: every engine reads the same)."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(200, pair.vocab_size, (cfg.prefix,), generator=gen).tolist()
    return prefix, torch.randint(200, pair.vocab_size, (n_new,), generator=gen).tolist()


def draft_head(pair) -> int:
    """The drafter's default head (65 536 ids for Qwen's 151 936); half the vocabulary for the small --short one."""
    from specdec.drafters.head import AUTO_DRAFT_VOCAB

    return AUTO_DRAFT_VOCAB if pair.vocab_size >= 2 * AUTO_DRAFT_VOCAB else pair.vocab_size // 2


def feed_costs(lm, prefix: list[int], new: list[int], ks, cfg, warmup: int) -> tuple[dict, dict]:
    """After feeding `prefix` once: per k, the median ms of feeding k new ids and cropping back (cfg.reps timed
    passes), and the seconds the `warmup` untimed ones before them took (compilation, graph capture)."""
    lm.feed(prefix)
    ms, warm_s = {}, {}
    for k in ks:
        def one(k=k):
            lm.feed(new[:k], k)
            lm.crop(len(prefix))
        t0 = time.perf_counter()
        for _ in range(warmup):
            one()
        warm_s[k] = time.perf_counter() - t0
        ms[k] = med(timed_ms(one, lm.device, cfg.reps))
    return ms, warm_s


@torch.inference_mode()
def pass_costs(pair, cfg) -> dict:
    """Median ms of one cached forward pass over k new tokens after a prefix, as CachedLM.feed runs it."""
    from specdec.core.kvcache import CachedLM

    prefix, new = random_ids(pair, cfg, max(cfg.ks))

    def costs(lm, ks):
        return feed_costs(lm, prefix, new, ks, cfg, cfg.warmup)[0]

    target = costs(CachedLM(pair.target, pair.vocab_size), cfg.ks)
    draft_full = costs(CachedLM(pair.draft, pair.vocab_size), [1])[1]
    head = draft_head(pair)
    draft_reduced = costs(CachedLM(pair.draft, pair.vocab_size, head, pair.eos_token_ids), [1])[1]
    t1 = target[1]
    return {
        "prefix_tokens": cfg.prefix,
        "target_ms_by_k": target,
        "draft_ms_full_head": draft_full,
        "draft_ms_reduced_head": draft_reduced,
        "draft_head_ids": head,
        "c_pass": draft_reduced / t1 if t1 else None,  # one draft step over one target step (reduced draft head)
        # what a round pays at gamma: gamma draft steps and one target pass over gamma + 1 tokens
        "round_model_ms_by_gamma": {g: g * draft_reduced + target[g + 1] for g in cfg.ks if g + 1 in target},
    }


def tree_costs(pair, cfg) -> dict:
    """Token trees on this device: the target scoring n tree nodes in one masked pass against a causal pass of n
    tokens (same prefix), and the draft growing a tree one depth at a time (`CachedLM.grow_tree`: a pass as wide
    as the depth's new nodes), median ms."""
    from specdec.core.kvcache import CachedLM
    from specdec.core.sampling import OneHot
    from specdec.core.tree import TokenTree

    prefix, new = random_ids(pair, cfg, max(cfg.tree_nodes))
    out = {"target_tree_ms": {}, "target_causal_ms": {}, "draft_grow_ms_by_width": {}}
    lm = CachedLM(pair.target, pair.vocab_size)
    lm.logits_after(prefix)
    for n in cfg.tree_nodes:
        ids = torch.tensor(new[:n], device=lm.device)
        tree = TokenTree(ids, [-1] + [max(-1, i - 3) for i in range(1, n)], OneHot(ids, pair.vocab_size))

        def scored_tree():
            lm.logits_for_tree(prefix, tree)
            lm.sync(prefix)

        def causal():
            lm.logits_after(prefix, new[:n], n_logits=n)
            lm.sync(prefix)

        for fn in (scored_tree, causal):  # untimed first passes (allocation, kernel choice)
            fn()
        out["target_tree_ms"][n] = med(timed_ms(scored_tree, lm.device, cfg.reps))
        out["target_causal_ms"][n] = med(timed_ms(causal, lm.device, cfg.reps))
    draft = CachedLM(pair.draft, pair.vocab_size)
    for w in cfg.tree_widths:
        def grow():
            draft.tree_root(prefix)
            draft.grow_tree(new[:w], [-1] * w)
            draft.sync(prefix)

        grow()
        out["draft_grow_ms_by_width"][w] = med(timed_ms(grow, draft.device, cfg.reps))
    return out


def check_tree_greedy(pair, cfg) -> dict:
    """Greedy equality of tree rounds (fixed top-k and dynamic trees) with plain greedy decoding."""
    from specdec.core.settings import DecodeSettings
    from specdec.loop.plain import plain_decode
    from specdec.loop.tree import TreeDecoder

    rows = []
    for prompt in PROMPTS[: cfg.prompts]:
        for widths, mode in (((3, 2, 1), "top-k"), ((4, 4, 4, 4), "dynamic")):
            s = DecodeSettings(max_new_tokens=cfg.greedy_tokens)
            plain = plain_decode(pair, prompt, s).ids
            dec = TreeDecoder(pair, prompt, s, widths, mode)
            list(dec)
            rows.append({"prompt": prompt, "mode": mode, "widths": list(widths),
                         "equal": dec.generated_ids == plain, "rounds": len(dec.rounds)})
    return {"runs": rows, "equal": sum(r["equal"] for r in rows), "of": len(rows)}


@torch.inference_mode()
def host_sync_probe(pair, cfg) -> dict:
    """Rounds as the engine runs them vs the same rounds with torch.cuda.synchronize() before every host read.

    On the first H200 run, rounds timed with the profiler (which synchronizes at every boundary) were 3-4x
    faster than untimed ones (tiny pair 21 vs 83 ms/round): this measures whether waiting for queued GPU work
    inside a device-to-host read (.tolist(), int(t)) is what costs, alternating the two so drift hits both.
    """
    from specdec.loop.decoder import SpeculativeDecoder
    from specdec.core.settings import DecodeSettings

    dev = pair.device
    settings = DecodeSettings(gamma=4, max_new_tokens=cfg.overhead_tokens)

    def round_ms() -> float:
        rounds = list(SpeculativeDecoder(pair, PROMPTS[0], settings))[1:]
        return sum(r.round_ms for r in rounds) / max(1, len(rounds))

    names = ("tolist", "item", "__int__", "__float__", "__bool__", "__index__")
    saved = {n: getattr(torch.Tensor, n) for n in names}

    def synced(fn):
        def read(self, *args, **kwargs):
            if self.is_cuda:
                torch.cuda.synchronize(self.device)
            return fn(self, *args, **kwargs)
        return read

    own = {n: torch.Tensor.__dict__.get(n) for n in names}  # most are inherited from the C base class

    def restore():
        for n in names:
            if own[n] is None:
                if n in torch.Tensor.__dict__:
                    delattr(torch.Tensor, n)
            else:
                setattr(torch.Tensor, n, own[n])

    round_ms()  # warm-up
    plain, with_sync = [], []
    try:
        for _ in range(cfg.probe_repeats):
            plain.append(round_ms())
            for n, fn in saved.items():
                setattr(torch.Tensor, n, synced(fn))
            with_sync.append(round_ms())
            restore()
    finally:
        restore()
    x = torch.randn(2048, 2048, device=dev)

    def host_read(explicit: bool) -> float:
        def one():
            y = x @ x
            t0 = time.perf_counter()
            if explicit:
                sync(dev)
            float(y[0, 0])
            return (time.perf_counter() - t0) * 1e3
        return med([one() for _ in range(cfg.reps)])

    return {"round_ms": plain, "round_ms_sync_before_reads": with_sync,
            "host_read_after_matmul_ms": host_read(False), "sync_then_host_read_ms": host_read(True)}


@torch.inference_mode()
def engine_pass_ms(pair, engine: str, cfg) -> dict:
    """Median ms of a target pass over 1 and gamma + 1 new tokens and of a draft pass over 1 (reduced head), after a
    prefix, on one engine; the first passes of each shape (compilation, graph capture) are timed apart."""
    from specdec.core.static_cache import open_lm

    prefix, new = random_ids(pair, cfg, 8)
    out = {}
    t0 = time.perf_counter()
    for name, lm, ks in (("target", open_lm(pair.target, pair.vocab_size, engine=engine, max_len=cfg.prefix + 64),
                          (1, 5)),
                         ("draft", open_lm(pair.draft, pair.vocab_size, draft_head(pair), pair.eos_token_ids,
                                           engine=engine, max_len=cfg.prefix + 64), (1,))):
        ms, warm_s = feed_costs(lm, prefix, new, ks, cfg, cfg.warmup + 2)
        for k in ks:
            out[f"{name}_warmup_s_k{k}"] = warm_s[k]
            out[f"{name}_ms_k{k}"] = ms[k]
    out["c_pass"] = out["draft_ms_k1"] / out["target_ms_k1"] if out["target_ms_k1"] else None
    out["seconds"] = time.perf_counter() - t0
    return out


def count_syncs(fn, dev: torch.device) -> tuple[object, int | None]:
    """fn()'s result and how many host syncs CUDA reported during it (None on a CPU)."""
    if dev.type != "cuda":
        return fn(), None
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            res = fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    return res, sum("synchroniz" in str(w.message).lower() for w in caught)


@torch.inference_mode()
def engine_runs(pair, engine: str, cfg) -> dict:
    """Plain, draft-model and prompt-lookup runs on one engine: tok/s (median of repeats, after a warm-up run),
    the generated ids (to compare engines), and host syncs per round of one extra draft-model run."""
    import dataclasses

    from specdec.core.settings import DecodeSettings
    from specdec.loop.decoder import SpeculativeDecoder
    from specdec.loop.plain import plain_decode

    p = dataclasses.replace(pair, engine=engine)
    s = DecodeSettings(gamma=4, max_new_tokens=cfg.overhead_tokens)
    prompt = PROMPTS[0]

    def spec(drafter):
        dec = SpeculativeDecoder(p, prompt, dataclasses.replace(s, drafter=drafter), top_k=0)
        for _ in dec:
            pass
        return dec

    out = {}
    for name, run in (("plain", lambda: plain_decode(p, prompt, s)), ("model", lambda: spec("model")),
                      ("ngram", lambda: spec("ngram"))):
        run()  # warm-up: compilation and graph capture
        times, res = [], None
        for _ in range(cfg.probe_repeats):
            sync(pair.device)
            t0 = time.perf_counter()
            res = run()
            sync(pair.device)
            times.append(time.perf_counter() - t0)
        ids = res.ids if name == "plain" else res.generated_ids
        out[name] = {"tok_s": len(ids) / med(times), "tokens": len(ids), "ids": ids}
        if name != "plain":
            out[name]["tokens_per_round"] = len(ids) / max(1, len(res.rounds))
    dec, syncs = count_syncs(lambda: spec("model"), pair.device)
    out["host_syncs_per_round"] = None if syncs is None else syncs / max(1, len(dec.rounds))
    return out


def engines(dev: torch.device, cfg) -> dict:
    """Eager against compiled on the random real-shape pair: pass costs, runs, and equal greedy ids."""
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    pair = random_pair(dev, dtype, cfg.short)
    res = {"dtype": str(dtype).replace("torch.", "")}
    for engine in ("eager", "compiled"):
        t0 = time.perf_counter()
        res[engine] = {"passes": engine_pass_ms(pair, engine, cfg), "runs": engine_runs(pair, engine, cfg)}
        res[engine]["seconds"] = time.perf_counter() - t0
    res["greedy_equal"] = {n: res["eager"]["runs"][n]["ids"] == res["compiled"]["runs"][n]["ids"]
                           for n in ("plain", "model", "ngram")}
    res["ok"] = all(res["greedy_equal"].values())
    for engine in ("eager", "compiled"):
        for run in res[engine]["runs"].values():
            if isinstance(run, dict):
                run.pop("ids", None)
    return res


def timings(dev: torch.device, cfg) -> dict:
    from specdec.loop.plain import measure_step_costs
    from specdec.bench.overhead import PROMPTS as OVERHEAD_PROMPTS
    from specdec.bench.overhead import measure_overhead
    from specdec.models.pair import load_pair

    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    t0 = time.perf_counter()
    pair = random_pair(dev, dtype, cfg.short)
    built = time.perf_counter() - t0
    res = {"dtype": str(dtype).replace("torch.", ""), "build_seconds": built, "passes": pass_costs(pair, cfg),
           "trees": tree_costs(pair, cfg)}
    steps = measure_step_costs(pair, n_tokens=cfg.step_tokens)
    res["plain_step_ms"] = {"target": steps.target_ms, "draft": steps.draft_ms,
                            "c_plain": steps.draft_ms / steps.target_ms if steps.target_ms else None}
    prompts = OVERHEAD_PROMPTS[: cfg.prompts]
    res["overhead_random_qwen"] = measure_overhead(pair, prompts, gamma=4, max_new_tokens=cfg.overhead_tokens)
    del pair
    tiny = load_pair("tiny", dtype=str(dtype).replace("torch.", ""), device=str(dev), shared=False)
    res["overhead_tiny"] = measure_overhead(tiny, prompts, gamma=4, max_new_tokens=cfg.overhead_tokens)
    res["host_sync_probe_tiny"] = host_sync_probe(tiny, cfg)
    res["seconds"] = time.perf_counter() - t0
    return res


# ---------------------------------------------------------------------------------------------------- main


class Config:
    def __init__(self, short: bool):
        self.short = short
        self.prompts = 1 if short else 3
        self.gammas = (1, 4) if short else (1, 3, 5)
        self.greedy_tokens = 12 if short else 40
        self.chi_rounds = 100 if short else 3000
        self.p_min = 1e-3  # a correct sampler fails this once in a thousand runs
        self.ks = list(range(1, 6)) if short else list(range(1, 17))
        self.prefix = 16 if short else 128
        self.reps = 3 if short else 20
        self.warmup = 1 if short else 3
        self.step_tokens = 4 if short else 16
        self.overhead_tokens = 10 if short else 48
        self.probe_repeats = 1 if short else 3
        self.tree_nodes = (9, 17) if short else (9, 17, 33, 64)
        self.tree_widths = (1, 4) if short else (1, 4, 8, 16)


def environment(dev: torch.device) -> dict:
    import transformers

    env = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
           "device": str(dev), "torch_threads": torch.get_num_threads()}
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda,
                   capability=f"{props.major}.{props.minor}")
    return env


def summary_lines(report: dict) -> list[str]:
    lines = [f"environment: {json.dumps(report['environment'])}"]
    for dt, r in report["exactness"].items():
        g, c, rb = r["greedy"], r["first_token"], r["rollback"]
        lines.append(f"{dt:9s} greedy spec == plain {g['equal']}/{g['of']} | first-token chi-square p = "
                     f"{c['p_value']:.3g} over {c['rounds']} rounds ({c['first_guess_rejected']} first guesses "
                     f"rejected, {c['outside_support']} outside support) | rollback "
                     + ", ".join(f"{k} {'ok' if v['ok'] else 'FAIL'} ({v['max_abs_diff']:.2g})" for k, v in rb.items())
                     + f" -> {'OK' if r['ok'] else 'FAIL'}")
    t = report.get("timings")
    if t:
        p = t["passes"]
        ks = p["target_ms_by_k"]
        lines.append(f"target pass ({t['dtype']}, prefix {p['prefix_tokens']}), ms by k: "
                     + " ".join(f"{k}:{v:.2f}" for k, v in ks.items()))
        lines.append(f"draft pass: {p['draft_ms_reduced_head']:.2f} ms (reduced head), {p['draft_ms_full_head']:.2f} "
                     f"ms (full head); c_pass = {p['c_pass']:.3f}; plain decode ms/token target "
                     f"{t['plain_step_ms']['target']:.2f}, draft {t['plain_step_ms']['draft']:.2f} "
                     f"(c_plain {t['plain_step_ms']['c_plain']:.3f})")
        for name in ("overhead_random_qwen", "overhead_tiny"):
            o = t[name]
            cats = ", ".join(f"{k} {v:.3f}" for k, v in o["per_category_ms"].items() if v >= 0.005)
            lines.append(f"{name}: round {o['round_ms']:.2f} ms (untimed {o['plain_round_ms']:.2f}), model "
                         f"{o['model_ms']:.2f}, overhead {o['overhead_ms']:.2f}, w/o events "
                         f"{o['engine_overhead_ms']:.2f} ms/round | {cats}")
        if "host_sync_probe_tiny" in t:
            h = t["host_sync_probe_tiny"]
            lines.append("tiny rounds ms, as run: " + " ".join(f"{v:.2f}" for v in h["round_ms"]) + " | with a sync "
                         "before each host read: " + " ".join(f"{v:.2f}" for v in h["round_ms_sync_before_reads"])
                         + f" | host read after a matmul {h['host_read_after_matmul_ms']:.3f} ms, after an explicit "
                         f"sync {h['sync_then_host_read_ms']:.3f} ms")
    e = report.get("engines")
    if e:
        for engine in ("eager", "compiled"):
            ps, rs = e[engine]["passes"], e[engine]["runs"]
            syncs = rs.get("host_syncs_per_round")
            lines.append(f"{engine:8s} ({e['dtype']}): target {ps['target_ms_k1']:.2f} ms (k=1), "
                         f"{ps['target_ms_k5']:.2f} ms (k=5), draft {ps['draft_ms_k1']:.2f} ms, c_pass "
                         f"{ps['c_pass']:.3f}, first passes {ps['target_warmup_s_k1'] + ps['target_warmup_s_k5'] + ps['draft_warmup_s_k1']:.1f} s"
                         f" | tok/s plain {rs['plain']['tok_s']:.1f}, model {rs['model']['tok_s']:.1f}, ngram "
                         f"{rs['ngram']['tok_s']:.1f}" + ("" if syncs is None else f" | host syncs/round {syncs:.1f}"))
        lines.append("compiled greedy ids == eager: " + ", ".join(f"{k} {v}" for k, v in e["greedy_equal"].items()))
    lines.append(f"total {report['seconds']:.0f} s -> {'OK' if report['ok'] else 'FAIL'}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--short", action="store_true", help="small sizes and counts (CI)")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--skip-timings", action="store_true")
    ap.add_argument("--skip-engines", action="store_true", help="leave out eager vs compiled")
    ap.add_argument("--out", default=None, help="JSON path (default: $OUT/gpu-check.json, else ./gpu-check.json)")
    args = ap.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: no CUDA device; use --device cpu", file=sys.stderr)
        return 2
    dev = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    cfg = Config(args.short)
    t0 = time.perf_counter()
    report = {"environment": environment(dev), "short": args.short, "exactness": {}}
    for dt in [d for d in args.dtypes.split(",") if d]:
        print(f"exactness on the tiny pair, {dt} ...", file=sys.stderr, flush=True)
        report["exactness"][dt] = exactness(dev, dt, cfg)
    if not args.skip_timings:
        print("timings on random-weight Qwen2.5-Coder 1.5B/0.5B-shaped models ...", file=sys.stderr, flush=True)
        report["timings"] = timings(dev, cfg)
    if not args.skip_engines:
        print("engines: eager vs compiled static cache ...", file=sys.stderr, flush=True)
        report["engines"] = engines(dev, cfg)
    report["ok"] = all(r["ok"] for r in report["exactness"].values()) and report.get("engines", {}).get("ok", True)
    report["seconds"] = time.perf_counter() - t0
    out = Path(args.out or Path(os.environ.get("OUT", ".")) / "gpu-check.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2, default=str))
    print("\n".join(summary_lines(report)))
    print(f"wrote {out}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
