"""Side-by-side benchmark: transformers generate(), transformers assisted generation, our plain baseline and our
speculative loop, interleaved (A B C D A B C D ...) on the same pair, prompts, gamma and sampling settings.

Ratios measured in one run are what to compare; absolute tok/s on shared machines are noisy.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from .decoder import (DecodeSettings, SpeculativeDecoder, encode_prompt, measure_step_costs, plain_decode,
                      synchronize)
from .events import Round
from .metrics import RunMetrics, summarize
from .prompts import PROMPTS
from .sampling import SamplingConfig

CONTENDERS = ("hf_plain", "hf_assisted", "ours_plain", "ours_spec")
# Our timed loop builds the display candidates as the app's would, so the comparison includes that work (its share
# is measured separately by render_overhead and by `--overhead`).
TIMED_TOP_K = 8


def add_bench_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="one prompt per kind, 20 tokens, 1 repeat (< 3 min on 2 cores)")
    ap.add_argument("--gamma", default="4", help="draft length, or 'auto' to compare adaptive policies")
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--modes", default="greedy,sampled", help="comma list of greedy,sampled (temperature 0.7)")
    ap.add_argument("--kinds", default="code,prose,chat")
    ap.add_argument("--sweep-gamma", default=None, help="e.g. 1..12: measured vs predicted speedup per gamma")
    ap.add_argument("--policy", default="fixed", choices=["fixed", "expected", "heuristic", "confidence"],
                    help="gamma policy of our loop (d) in the side-by-side table; (b) always uses a constant gamma")
    ap.add_argument("--draft-vocab", type=int, default=None,
                    help="our loop's draft head: ids below N plus EOS and the text's own tokens; 0 = full "
                         "vocabulary; default: 65536 for large vocabularies")
    ap.add_argument("--out", default="bench-results/bench.json")
    ap.add_argument("--drafter", choices=["model", "ngram", "early-exit", "cross"], default=None,
                    help="one drafter against transformers' own equivalent, plain generate() and our plain decoding, "
                         "on the input-grounded prompts (specdec/drafter_bench.py)")
    ap.add_argument("--equiv-gamma", type=int, default=None,
                    help="with --drafter: run transformers' equivalent at this gamma instead of --gamma (e.g. its own "
                         "best setting, to compare best against best in one run)")
    ap.add_argument("--overhead", action="store_true", help="per-round time outside the model forward passes, "
                    "by category (JSON to bench-results/overhead.json unless --out)")
    ap.add_argument("--predicted", action="store_true", help="light edits, the original text as the prediction: "
                    "predicted drafter vs plain and ngram (JSON to bench-results/predicted.json unless --out)")
    ap.add_argument("--batch", default=None, help="e.g. 1,2,4,8,16: batched speculative vs plain batched decoding "
                    "per batch size (latency vs throughput; JSON to bench-results/batch.json unless --out)")


@dataclass
class Sample:
    contender: str
    kind: str
    mode: str
    prompt: str
    tokens: int
    seconds: float
    rounds: list[Round] = field(default_factory=list)  # our speculative loop's rounds (empty for other contenders)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def _sampling(mode: str) -> SamplingConfig:
    return SamplingConfig(temperature=0.7) if mode == "sampled" else SamplingConfig()


def _hf_kwargs(s: DecodeSettings) -> dict:
    cfg = s.sampling
    if cfg.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": cfg.temperature, "top_k": cfg.top_k or None, "top_p": cfg.top_p}


def assistant_for(draft: torch.nn.Module, gamma: int) -> torch.nn.Module:
    """The draft as transformers' assisted generation should run it here (constant gamma, no confidence stop).

    transformers reads these knobs from the assistant's generation_config; a shallow copy of the module with its
    own config changes them without touching the shared pair (the weights are the same objects)."""
    view = copy.copy(draft)
    gc = copy.deepcopy(draft.generation_config)
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule, gc.assistant_confidence_threshold = gamma, "constant", 0.0
    view.generation_config = gc
    return view


@torch.inference_mode()
def run_hf(pair, prompt_ids, s: DecodeSettings, assisted: bool, gamma: int) -> tuple[int, float, list]:
    ids = torch.tensor([prompt_ids], device=pair.device)
    kw = _hf_kwargs(s)
    if assisted:
        kw["assistant_model"] = assistant_for(pair.draft, gamma)
    torch.manual_seed(s.seed)
    synchronize(pair.device)
    t0 = time.perf_counter()
    out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.max_new_tokens,
                               min_new_tokens=0, pad_token_id=pair.tokenizer.pad_token_id, **kw)
    synchronize(pair.device)
    return out.shape[1] - ids.shape[1], time.perf_counter() - t0, []


def run_ours_plain(pair, prompt, s):
    t0 = time.perf_counter()
    res = plain_decode(pair, prompt, s)
    return len(res.ids), time.perf_counter() - t0, []


def run_ours_spec(pair, prompt, s):
    t0 = time.perf_counter()
    dec = SpeculativeDecoder(pair, prompt, s, top_k=TIMED_TOP_K)
    for _ in dec:
        pass
    synchronize(pair.device)
    return len(dec.generated_ids), time.perf_counter() - t0, dec.rounds


def _median_tok_s(samples: list[Sample]) -> float:
    """Median over repeats per (prompt, mode), then summed across prompts: total tokens over total time of the
    median runs, so a long prompt counts for its tokens and one noisy repeat does not move the result."""
    by: dict[tuple, list[Sample]] = {}
    for x in samples:
        by.setdefault((x.prompt, x.mode), []).append(x)
    tokens = secs = 0.0
    for runs in by.values():
        mid = sorted(runs, key=lambda x: x.tok_s)[len(runs) // 2]  # a real run; the upper one of an even count
        tokens += mid.tokens
        secs += mid.seconds
    return tokens / secs if secs else 0.0


def spec_metrics(spec: list[Sample], costs=None) -> RunMetrics:
    """Acceptance, c_loop and the predicted speedup of our loop's timed runs, pooled (specdec.metrics conventions)."""
    return summarize([r for x in spec for r in x.rounds], costs)


def _jobs(prompts: dict, modes: list[str]) -> list[tuple[str, str, str]]:
    """(kind, mode, prompt) for every prompt in every sampling mode, in benchmark order."""
    return [(k, m, p) for m in modes for k in prompts for p in prompts[k]]


def summarize_group(samples: list[Sample], costs) -> dict:
    """Side-by-side ratios of one group; the prediction follows specdec.metrics (mean draft length, c_loop)."""
    by = {k: [x for x in samples if x.contender == k] for k in CONTENDERS}
    tok_s = {k: _median_tok_s(v) for k, v in by.items()}
    m = spec_metrics(by["ours_spec"], costs)
    ratio = lambda a, b: tok_s[a] / tok_s[b] if tok_s.get(b) else None  # noqa: E731
    measured = ratio("ours_spec", "ours_plain")
    pred = m.predicted_speedup if m.drafted else None
    return {
        "tok_s": tok_s,
        "d/a": ratio("ours_spec", "hf_plain"),
        "d/b": ratio("ours_spec", "hf_assisted"),
        "c/a": ratio("ours_plain", "hf_plain"),
        "b/a": ratio("hf_assisted", "hf_plain"),
        "acceptance_rate": m.acceptance_rate if m.drafted else None,
        "alpha": m.alpha,
        "tokens_per_round": m.tokens_per_round if m.rounds else None,
        "mean_gamma": m.mean_gamma if m.rounds else None,
        "c_plain": m.c_plain,
        "c_loop": m.c_loop,
        "measured_speedup": measured,
        "predicted_speedup": pred,
        "measured/predicted": measured / pred if measured and pred else None,
    }


def run_one(pair, name, prompt, s: DecodeSettings) -> tuple[int, float, list]:
    if name in ("hf_plain", "hf_assisted"):
        return run_hf(pair, encode_prompt(pair.tokenizer, prompt, s.chat), s, name == "hf_assisted", s.gamma)
    if name == "ours_plain":
        return run_ours_plain(pair, prompt, s)
    return run_ours_spec(pair, prompt, s)


def _rotated(seq, k: int) -> list:
    """Interleaving order for the k-th prompt: A B C D, then B C D A, ... so no contender always runs first."""
    seq = list(seq)
    k %= len(seq)
    return seq[k:] + seq[:k]


def run_grid(pair, prompts, modes, gamma, max_new, repeats, contenders=CONTENDERS, log=print,
             draft_vocab=None, policy: str = "fixed") -> list[Sample]:
    jobs = _jobs(prompts, modes)
    kind, mode, prompt = jobs[0]
    for name in contenders:  # warm-up: first calls pay one-time allocation and dispatch costs
        run_one(pair, name, prompt, DecodeSettings(gamma=gamma, max_new_tokens=4, chat=kind == "chat"))
    samples = []
    for rep in range(1, repeats + 1):
        for j, (kind, mode, prompt) in enumerate(jobs):
            s = DecodeSettings(gamma=gamma, max_new_tokens=max_new, sampling=_sampling(mode), seed=rep,
                               chat=kind == "chat", draft_vocab=draft_vocab, gamma_policy=policy)
            for name in _rotated(contenders, j + rep - 1):
                n, sec, rounds = run_one(pair, name, prompt, s)
                samples.append(Sample(name, kind, mode, prompt, n, sec, rounds))
                log(f"  rep {rep} {mode:7s} {kind:5s} {name:11s} {n:3d} tok {sec:6.2f} s  {n / sec:6.2f} tok/s")
    return samples





def _fmt(x, spec="{:.2f}"):
    return "-" if x is None else spec.format(x)


def print_table(groups: dict, out=None) -> None:
    out = out or sys.stdout
    head = (f"{'group':16s} {'hf_plain':>8s} {'hf_assist':>9s} {'ours_pl':>8s} {'ours_sp':>8s} {'(d)/(a)':>8s} "
            f"{'(d)/(b)':>8s} {'(c)/(a)':>8s} {'alpha':>6s} {'tok/rnd':>7s} {'c_lp':>5s} {'meas':>5s} {'pred':>5s} "
            f"{'m/p':>5s}")
    print(head, file=out)
    print("-" * len(head), file=out)
    for name, g in groups.items():
        t = g["tok_s"]
        print(f"{name:16s} {t['hf_plain']:8.2f} {t['hf_assisted']:9.2f} {t['ours_plain']:8.2f} {t['ours_spec']:8.2f} "
              f"{_fmt(g['d/a']):>8s} {_fmt(g['d/b']):>8s} {_fmt(g['c/a']):>8s} {_fmt(g['alpha']):>6s} "
              f"{_fmt(g['tokens_per_round']):>7s} {_fmt(g['c_loop']):>5s} {_fmt(g['measured_speedup']):>5s} "
              f"{_fmt(g['predicted_speedup']):>5s} {_fmt(g['measured/predicted']):>5s}", file=out)


def _parse_range(text: str) -> list[int]:
    if ".." in text:
        a, b = text.split("..")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def _tok_s(samples: list[Sample]) -> float:
    secs = sum(x.seconds for x in samples)
    return sum(x.tokens for x in samples) / secs if secs else 0.0


def sweep(pair, gammas, prompts, modes, max_new, repeats, costs, log, draft_vocab=None) -> list[dict]:
    """Our plain baseline and our loop at each gamma, interleaved per prompt: measured vs predicted speedup."""
    jobs = _jobs(prompts, modes)
    run_ours_spec(pair, jobs[0][2], DecodeSettings(gamma=gammas[0], max_new_tokens=4))  # warm-up
    base: list[Sample] = []
    spec: dict[int, list[Sample]] = {g: [] for g in gammas}
    for rep in range(1, repeats + 1):
        for j, (kind, mode, prompt) in enumerate(jobs):
            s = DecodeSettings(max_new_tokens=max_new, sampling=_sampling(mode), seed=rep, chat=kind == "chat",
                               draft_vocab=draft_vocab)
            for g in _rotated([0, *gammas], j + rep - 1):  # 0: our plain baseline
                if g == 0:
                    n, sec, _ = run_ours_plain(pair, prompt, s)
                    base.append(Sample("ours_plain", kind, mode, prompt, n, sec))
                    continue
                n, sec, rounds = run_ours_spec(pair, prompt, replace(s, gamma=g))
                spec[g].append(Sample(f"ours_spec-{g}", kind, mode, prompt, n, sec, rounds))
                log(f"  rep {rep} {mode:7s} {kind:5s} gamma={g:2d} {n:3d} tok {sec:6.2f} s  {n / sec:6.2f} tok/s")
    rows = []
    for g, xs in spec.items():
        m = spec_metrics(xs, costs)
        rows.append({"gamma": g, "mean_gamma": m.mean_gamma, "alpha": m.alpha, "c_loop": m.c_loop, "tok_s": _tok_s(xs),
                     "measured_speedup": _tok_s(xs) / _tok_s(base), "predicted_speedup": m.predicted_speedup})
    return rows


ADAPTIVE_POLICIES = (("heuristic", 4), ("confidence", 8), ("expected", 4))  # (policy, starting / maximum gamma)


def adaptive_compare(pair, prompts, modes, max_new, fixed, repeats, log, draft_vocab=None) -> list[dict]:
    """Each adaptive policy against fixed gammas on the mixed prompt set, interleaved per prompt after a warm-up."""
    policies = [("fixed", g) for g in fixed] + list(ADAPTIVE_POLICIES)
    jobs = _jobs(prompts, modes)
    run_ours_spec(pair, jobs[0][2], DecodeSettings(max_new_tokens=4))  # warm-up: every policy runs the same loop
    samples: dict[tuple, list[Sample]] = {pg: [] for pg in policies}
    for rep in range(1, repeats + 1):
        for j, (kind, mode, prompt) in enumerate(jobs):
            for policy, g in _rotated(policies, j + rep - 1):
                s = DecodeSettings(gamma=g, max_new_tokens=max_new, sampling=_sampling(mode), seed=rep,
                                   chat=kind == "chat", gamma_policy=policy, draft_vocab=draft_vocab)
                n, sec, rounds = run_ours_spec(pair, prompt, s)
                samples[(policy, g)].append(Sample(f"{policy}-{g}", kind, mode, prompt, n, sec, rounds))
                log(f"  rep {rep} {mode:7s} {kind:5s} {policy:10s} gamma={g:2d} {n:3d} tok {sec:6.2f} s "
                    f"{n / sec:6.2f} tok/s  mean gamma {summarize(rounds).mean_gamma:.1f}")
    rows = []
    for (policy, g), xs in samples.items():
        m = spec_metrics(xs)
        rows.append({"policy": policy, "gamma": g, "tok_s": _tok_s(xs), "mean_gamma": m.mean_gamma, "alpha": m.alpha})
    best_fixed = max(r["tok_s"] for r in rows if r["policy"] == "fixed")
    for r in rows:
        r["vs_best_fixed"] = r["tok_s"] / best_fixed
    return rows


def render_overhead(runs: list[list[Round]], costs, log) -> dict:
    """Replay the rounds of timed speculative runs through the app's renderers (tokens, phases, stats and both
    charts for every round: the worst case, the app redraws charts at most once a second) and compare the
    render time with the generation time of those same rounds."""
    from components import pq_figure, render_phases, render_round, render_stats, speedup_figure

    gen_ms = render_ms = 0.0
    for rounds in runs:
        for i, rnd in enumerate(rounds):
            t0 = time.perf_counter()
            render_round(rnd)
            render_phases(rnd)
            render_stats(summarize(rounds[: i + 1], costs))
            pq_figure(rnd, rnd.rejected_at or 0).to_json()
            speedup_figure(rounds[: i + 1], costs).to_json()
            render_ms += (time.perf_counter() - t0) * 1e3
            gen_ms += rnd.round_ms
    frac = render_ms / gen_ms if gen_ms else 0.0
    log(f"render overhead: {render_ms:.0f} ms rendering vs {gen_ms:.0f} ms generating = {frac:.2%}")
    return {"render_ms": render_ms, "generation_ms": gen_ms, "fraction": frac}


def cmd_bench(args, load) -> int:
    """`load()` returns the pair the command line asked for (the CLI owns model arguments)."""
    if getattr(args, "drafter", None):  # one drafter against its transformers equivalent
        from .drafter_bench import cmd_drafter_bench
        return cmd_drafter_bench(args, load)
    if args.batch:  # batched decoding has its own measurement
        from .batch_bench import cmd_batch_bench
        return cmd_batch_bench(args, load)
    if getattr(args, "predicted", False):  # predicted output has its own edit tasks
        from .predicted_bench import cmd_predicted_bench
        return cmd_predicted_bench(args, load)
    if args.overhead:  # per-round time outside the forward passes has its own measurement
        from .overhead import cmd_overhead
        return cmd_overhead(args, load)
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    kinds = [k for k in args.kinds.split(",") if k]
    modes = [m for m in args.modes.split(",") if m]
    max_new = args.max_new_tokens or (20 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 3)
    prompts = {k: PROMPTS[k][:1] if args.quick else PROMPTS[k] for k in kinds}
    dv = args.draft_vocab
    pair = load()
    costs = measure_step_costs(pair, n_tokens=8 if args.quick else 16, draft_vocab=dv)
    log(f"step cost: target {costs.target_ms:.1f} ms/token, draft {costs.draft_ms:.1f} ms/token, "
        f"c_plain = {costs.c_plain:.3f}")
    result = {"models": pair.describe(), "draft_vocab": dv, "max_new_tokens": max_new, "repeats": repeats,
              "c_plain": costs.c_plain, "target_ms": costs.target_ms, "draft_ms": costs.draft_ms,
              "torch_threads": torch.get_num_threads()}
    if args.sweep_gamma:
        rows = sweep(pair, _parse_range(args.sweep_gamma), prompts, modes, max_new, repeats, costs, log, dv)
        print(f"{'gamma':>5s} {'alpha':>6s} {'c_loop':>6s} {'measured':>9s} {'predicted':>9s}")
        for r in rows:
            print(f"{r['gamma']:5d} {r['alpha']:6.3f} {_fmt(r['c_loop']):>6s} {r['measured_speedup']:9.2f} "
                  f"{_fmt(r['predicted_speedup']):>9s}")
        result["sweep"] = rows
    elif args.gamma == "auto":
        rows = adaptive_compare(pair, prompts, modes, max_new, [2, 3, 4, 6, 8], repeats, log, dv)
        print(f"{'policy':10s} {'gamma':>5s} {'tok/s':>6s} {'vs best fixed':>13s} {'mean gamma':>10s} {'alpha':>6s}")
        for r in rows:
            print(f"{r['policy']:10s} {r['gamma']:5d} {r['tok_s']:6.2f} {r['vs_best_fixed']:13.2f} "
                  f"{r['mean_gamma']:10.2f} {r['alpha']:6.3f}")
        result["adaptive"] = rows
    else:
        gamma = int(args.gamma)
        samples = run_grid(pair, prompts, modes, gamma, max_new, repeats, log=log, draft_vocab=dv,
                           policy=args.policy)
        if args.policy != "fixed":
            print(f"our loop (d): gamma policy '{args.policy}' starting at {gamma}; (b): constant gamma {gamma}; the "
                  "predicted column uses the mean draft length")
        groups = {}
        for mode in modes:
            for kind in kinds:
                groups[f"{mode}/{kind}"] = summarize_group([x for x in samples if (x.mode, x.kind) == (mode, kind)],
                                                           costs)
            groups[f"{mode}/all"] = summarize_group([x for x in samples if x.mode == mode], costs)
        groups["all"] = summarize_group(samples, costs)
        print_table(groups)
        result.update(gamma=gamma, policy=args.policy, groups=groups,
                      samples=[{"contender": x.contender, "kind": x.kind, "mode": x.mode, "prompt": x.prompt,
                                "tokens": x.tokens, "seconds": x.seconds, "rounds": len(x.rounds)} for x in samples])
        result["render"] = render_overhead([x.rounds for x in samples if x.rounds], costs, log)
        print(f"render overhead (app components, charts every round): {result['render']['fraction']:.2%} of "
              "generation time")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    log(f"wrote {out}")
    return 0
