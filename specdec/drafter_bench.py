"""Input-grounded prompts, and the drafter benchmark: `python -m specdec bench --drafter model|ngram|early-exit|cross`.

Grounded prompts give the model a text to work on (a function to edit, a paragraph to summarise, a passage to
answer from): the answer copies much of its input, which is where prompt lookup shines.
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

# ------------------------------------------------------------------------------------------------ the bench

CONTENDERS = ("hf_plain", "hf_equiv", "ours_plain", "ours")
HF_EQUIVALENT = {
    "model": "assistant_model=draft",
    "ngram": "prompt_lookup_num_tokens=gamma, max_matching_ngram_size=ngram_max",
    "early-exit": "assistant_early_exit=k",
    "cross": "assistant_model=SmolLM2, tokenizer=, assistant_tokenizer=",
}
BENCH_DEFAULT_KINDS = "code,prose,chat"  # bench.py's --kinds default: the drafter bench then uses the grounded set
BENCH_DEFAULT_MODES = "greedy,sampled"  # bench.py's --modes default: the drafter bench then runs greedy only


def drafter_prompts(kinds: list[str], quick: bool) -> dict[str, list[tuple[str, bool]]]:
    """(prompt, chat) per kind: 'grounded' from GROUNDED (chat template on), the others from bench.PROMPTS."""
    from .prompts import GROUNDED, PROMPTS

    out = {}
    for kind in kinds:
        if kind == "grounded":
            rows = [(g["prompt"], True) for g in GROUNDED]
        elif kind in PROMPTS:
            rows = [(p, kind == "chat") for p in PROMPTS[kind]]
        else:
            from .errors import InvalidInputError

            raise InvalidInputError(f"unknown prompt kind {kind!r}; choose from grounded, {', '.join(PROMPTS)}")
        out[kind] = rows[:2] if quick else rows
    return out


@contextlib.contextmanager
def _assistant_knobs(model: torch.nn.Module, gamma: int):
    """transformers' early exit drafts with the target itself and reads its knobs from the target's own
    generation_config: constant gamma, no confidence stop, restored afterwards."""
    saved = model.generation_config
    gc = copy.deepcopy(saved)
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = gamma, "constant"
    gc.assistant_confidence_threshold = 0.0
    model.generation_config = gc
    try:
        yield
    finally:
        model.generation_config = saved


@torch.inference_mode()
def run_hf(pair, prompt_ids, s, equivalent: bool, cross_draft=None, equiv_gamma: int | None = None
           ) -> tuple[int, float]:
    """transformers generate(): plain, or with the drafter's transformers equivalent (at equiv_gamma if given, else
    at the run's gamma)."""
    from .bench import _hf_kwargs, assistant_for
    from .decoder import synchronize
    from .drafters.early_exit import resolve_exit_layer

    ids = torch.tensor([prompt_ids], device=pair.device)
    kw = _hf_kwargs(s)
    knobs = contextlib.nullcontext()
    if equivalent:
        s = replace(s, gamma=equiv_gamma or s.gamma)
        if s.drafter == "model":
            kw["assistant_model"] = assistant_for(pair.draft, s.gamma)
        elif s.drafter == "ngram":
            kw.update(prompt_lookup_num_tokens=s.gamma, max_matching_ngram_size=s.ngram_max)
        elif s.drafter == "early-exit":
            kw["assistant_early_exit"] = resolve_exit_layer(pair.target, s.exit_layer)
            knobs = _assistant_knobs(pair.target, s.gamma)
        elif s.drafter == "cross":
            kw.update(assistant_model=assistant_for(cross_draft.model, s.gamma), tokenizer=pair.tokenizer,
                      assistant_tokenizer=cross_draft.tokenizer)
    torch.manual_seed(s.seed)
    with knobs:
        synchronize(pair.device)
        t0 = time.perf_counter()
        out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.max_new_tokens,
                                   min_new_tokens=0, pad_token_id=pair.tokenizer.pad_token_id, **kw)
        synchronize(pair.device)
    return out.shape[1] - ids.shape[1], time.perf_counter() - t0


def run_contender(pair, name: str, prompt: str, s, cross_draft=None, equiv_gamma: int | None = None):
    """(tokens, seconds, rounds) for one contender on one prompt."""
    from .bench import run_ours_plain, run_ours_spec
    from .decoder import encode_prompt

    if name in ("hf_plain", "hf_equiv"):
        n, sec = run_hf(pair, encode_prompt(pair.tokenizer, prompt, s.chat), s, name == "hf_equiv", cross_draft,
                        equiv_gamma)
        return n, sec, []
    if name == "ours_plain":
        return run_ours_plain(pair, prompt, s)
    return run_ours_spec(pair, prompt, s)


def summarize(samples, costs=None) -> dict:
    """tok/s per contender (median over repeats per prompt, summed over prompts), ratios, alpha, tokens per round,
    c and the measured / predicted speedup of our loop (specdec.metrics conventions)."""
    from .bench import _median_tok_s, spec_metrics

    tok_s = {k: _median_tok_s([x for x in samples if x.contender == k]) for k in CONTENDERS}
    m = spec_metrics([x for x in samples if x.contender == "ours"], costs)
    ratio = lambda a, b: tok_s[a] / tok_s[b] if tok_s.get(b) else None  # noqa: E731
    return {
        "tok_s": tok_s,
        "ours/hf_plain": ratio("ours", "hf_plain"),
        "ours/hf_equiv": ratio("ours", "hf_equiv"),
        "hf_equiv/hf_plain": ratio("hf_equiv", "hf_plain"),
        "ours/ours_plain": ratio("ours", "ours_plain"),
        "alpha": m.alpha if m.tested else None,
        "tokens_per_round": m.tokens_per_round if m.rounds else None,
        "mean_gamma": m.mean_gamma if m.rounds else None,
        "c_loop": m.c_loop,
        "predicted_speedup": m.predicted_speedup if m.drafted else None,
    }


def print_table(drafter: str, gamma: int, groups: dict, out=None, equiv_gamma: int | None = None) -> None:
    from .bench import _fmt

    out = out or sys.stdout
    theirs = f" at gamma {equiv_gamma}" if equiv_gamma else ""
    print(f"drafter {drafter}, gamma {gamma}; transformers equivalent: {HF_EQUIVALENT[drafter]}{theirs}", file=out)
    head = (f"{'group':16s} {'plain gen':>9s} {'hf equiv':>9s} {'our plain':>9s} {'ours':>7s} {'ours/gen':>8s} "
            f"{'ours/equiv':>10s} {'equiv/gen':>9s} {'alpha':>6s} {'tok/rnd':>7s} {'c':>6s} {'meas':>5s} {'pred':>5s}")
    print(head, file=out)
    for name, g in groups.items():
        t = g["tok_s"]
        print(f"{name:16s} {t['hf_plain']:9.2f} {t['hf_equiv']:9.2f} {t['ours_plain']:9.2f} {t['ours']:7.2f} "
              f"{_fmt(g['ours/hf_plain']):>8s} {_fmt(g['ours/hf_equiv']):>10s} {_fmt(g['hf_equiv/hf_plain']):>9s} "
              f"{_fmt(g['alpha'], '{:.3f}'):>6s} {_fmt(g['tokens_per_round']):>7s} {_fmt(g['c_loop'], '{:.3f}'):>6s} "
              f"{_fmt(g['ours/ours_plain']):>5s} {_fmt(g['predicted_speedup']):>5s}", file=out)
    print("tok/s: median over repeats per prompt, summed over prompts. ours/gen and ours/equiv: our speculative loop "
          "over plain generate() and over transformers' equivalent; meas = ours / our plain; pred = Leviathan at the "
          "run's alpha, mean gamma and c (c = c_loop: drafting ms per guess / verify ms per round).", file=out)


def cmd_drafter_bench(args, load) -> int:
    """`python -m specdec bench --drafter NAME`: the four contenders interleaved (rotating who goes first) on the
    grounded prompt set (or --kinds), greedy unless --modes says otherwise."""
    from .bench import Sample, _rotated, _sampling
    from .decoder import DecodeSettings
    from .drafters.cross import load_cross_draft

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    kinds = ["grounded"] if args.kinds == BENCH_DEFAULT_KINDS else [k for k in args.kinds.split(",") if k]
    modes = ["greedy"] if args.modes == BENCH_DEFAULT_MODES else [m for m in args.modes.split(",") if m]
    max_new = args.max_new_tokens or (24 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 2)
    gamma = 4 if args.gamma == "auto" else int(args.gamma)
    prompts = drafter_prompts(kinds, args.quick)
    pair = load()
    cross = load_cross_draft(pair) if args.drafter == "cross" else None
    base = DecodeSettings(drafter=args.drafter, gamma=gamma, gamma_policy=args.policy, draft_vocab=args.draft_vocab,
                          max_new_tokens=max_new)
    jobs = [(k, m, p, chat) for m in modes for k in prompts for p, chat in prompts[k]]
    for name in CONTENDERS:  # warm-up: one-time allocation and dispatch costs
        k, m, p, chat = jobs[0]
        run_contender(pair, name, p, replace(base, max_new_tokens=4, chat=chat), cross, args.equiv_gamma)
    samples = []
    for rep in range(1, repeats + 1):
        for j, (kind, mode, prompt, chat) in enumerate(jobs):
            s = replace(base, sampling=_sampling(mode), seed=rep, chat=chat)
            for name in _rotated(CONTENDERS, j + rep - 1):
                n, sec, rounds = run_contender(pair, name, prompt, s, cross, args.equiv_gamma)
                samples.append(Sample(name, kind, mode, prompt, n, sec, rounds))
                log(f"  rep {rep} {mode:7s} {kind:8s} {name:10s} {n:3d} tok {sec:6.2f} s  {n / sec:6.2f} tok/s")
    groups = {}
    for mode in modes:
        for kind in kinds:
            groups[f"{mode}/{kind}"] = summarize([x for x in samples if (x.mode, x.kind) == (mode, kind)])
    if len(groups) > 1:
        groups["all"] = summarize(samples)
    print_table(args.drafter, gamma, groups, equiv_gamma=args.equiv_gamma)
    result = {"models": pair.describe(), "drafter": args.drafter, "gamma": gamma, "equiv_gamma": args.equiv_gamma or gamma,
              "policy": args.policy,
              "hf_equivalent": HF_EQUIVALENT[args.drafter], "max_new_tokens": max_new, "repeats": repeats,
              "torch_threads": torch.get_num_threads(), "groups": groups,
              "samples": [{"contender": x.contender, "kind": x.kind, "mode": x.mode, "prompt": x.prompt[:60],
                           "tokens": x.tokens, "seconds": x.seconds, "rounds": len(x.rounds)} for x in samples]}
    out = Path(args.out if args.out != "bench-results/bench.json" else f"bench-results/drafter-{args.drafter}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    log(f"wrote {out}")
    return 0
