"""Side-by-side benchmark (`python -m specdec bench`): transformers generate(), transformers assisted generation,
our plain baseline and our speculative loop, interleaved (A B C D, B C D A, ...) on the same pair, prompts, gamma
and sampling settings; with --sweep-gamma our loop at each gamma, with --gamma auto the adaptive policies.

Ratios measured in one run are what to compare; absolute tok/s on shared machines are noisy.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial
from typing import Callable

import torch

from specdec.bench.defaults import resolve
from specdec.bench.harness import (Column, Contender, Job, Sample, assistant_for, by_group, compare, jobs_for, log,
                                   loop_figures, of, pooled_tok_s, run_interleaved, spec_metrics, table,
                                   timed_generate, timed_plain, timed_spec, write_result)
from specdec.core.metrics import StepCosts
from specdec.core.settings import DecodeSettings
from specdec.loop.plain import measure_step_costs
from specdec.prompts import PROMPTS

CONTENDERS = ("hf_plain", "hf_assisted", "ours_plain", "ours_spec")
ADAPTIVE_POLICIES = (("heuristic", 4), ("confidence", 8), ("expected", 4))  # (policy, starting / maximum gamma)
RATIOS = {"d/a": ("ours_spec", "hf_plain"), "d/b": ("ours_spec", "hf_assisted"), "c/a": ("ours_plain", "hf_plain"),
          "b/a": ("hf_assisted", "hf_plain"), "measured_speedup": ("ours_spec", "ours_plain")}
FIXED_GAMMAS = (2, 3, 4, 6, 8)  # what --gamma auto compares the policies with
RENDER_NOTE = ("render overhead: not measured here (the bench does not import the app); "
               "`python scripts/render_overhead.py` with the same flags runs this bench and adds it")


def contenders(pair) -> list[Contender]:
    """(a) generate(), (b) assisted generation at the run's constant gamma, (c) our plain loop, (d) our loop."""
    assisted = lambda p, s: timed_generate(pair, p, s, assistant_model=assistant_for(pair.draft, s.gamma))  # noqa: E731
    runs = (partial(timed_generate, pair), assisted, partial(timed_plain, pair), partial(timed_spec, pair))
    return [Contender(name, run) for name, run in zip(CONTENDERS, runs)]


def summarize_group(samples: list[Sample], costs) -> dict:
    """Side-by-side ratios of one group; the prediction follows specdec.core.metrics (mean draft length, c_loop)."""
    g = compare(samples, CONTENDERS, RATIOS)
    m = spec_metrics(of(samples, "ours_spec"), costs)
    g.update(loop_figures(m), alpha=m.alpha, acceptance_rate=m.kept_rate if m.drafted else None,
             c_plain=m.c_plain)
    measured, pred = g["measured_speedup"], g["predicted_speedup"]
    g["measured/predicted"] = measured / pred if measured and pred else None
    return g


def groups_of(samples: list[Sample], modes: list[str], kinds: list[str], costs) -> dict:
    """Every mode/kind group, every mode over all kinds, and everything."""
    groups = {}
    for mode in modes:
        groups.update({name: summarize_group(xs, costs) for name, xs in by_group(samples, [mode], kinds).items()})
        groups[f"{mode}/all"] = summarize_group([x for x in samples if x.mode == mode], costs)
    groups["all"] = summarize_group(samples, costs)
    return groups


SIDE_BY_SIDE = [Column("group", 16, "group", "{}", left=True), Column("hf_plain", 8, "hf_plain"),
                Column("hf_assist", 9, "hf_assisted"), Column("ours_pl", 8, "ours_plain"),
                Column("ours_sp", 8, "ours_spec"), Column("(d)/(a)", 8, "d/a"), Column("(d)/(b)", 8, "d/b"),
                Column("(c)/(a)", 8, "c/a"), Column("alpha", 6, "alpha"), Column("tok/rnd", 7, "tokens_per_round"),
                Column("c_lp", 5, "c_loop"), Column("meas", 5, "measured_speedup"),
                Column("pred", 5, "predicted_speedup"), Column("m/p", 5, "measured/predicted")]
SWEEP = [Column("gamma", 5, "gamma", "{:d}"), Column("alpha", 6, "alpha", "{:.3f}"), Column("c_loop", 6, "c_loop"),
         Column("measured", 9, "measured_speedup"), Column("predicted", 9, "predicted_speedup")]
ADAPTIVE = [Column("policy", 10, "policy", "{}", left=True), Column("gamma", 5, "gamma", "{:d}"),
            Column("tok/s", 6, "tok_s"), Column("vs best fixed", 13, "vs_best_fixed"),
            Column("mean gamma", 10, "mean_gamma"), Column("alpha", 6, "alpha", "{:.3f}")]


def print_table(groups: dict, out=None) -> None:
    rows = [{"group": name, **g["tok_s"], **g} for name, g in groups.items()]
    print("\n".join(table(SIDE_BY_SIDE, rows, rule=True)), file=out or sys.stdout)


def parse_range(text: str) -> list[int]:
    """'1..4' -> [1, 2, 3, 4]; '2,5' -> [2, 5]."""
    if ".." in text:
        a, b = text.split("..")
        return list(range(int(a), int(b) + 1))
    return [int(x) for x in text.split(",")]


def sweep(pair, gammas: list[int], jobs: list[Job], base: DecodeSettings, repeats: int, costs) -> list[dict]:
    """Our plain baseline and our loop at each gamma, interleaved per prompt: measured vs predicted speedup."""
    spec = lambda g: lambda p, s: timed_spec(pair, p, replace(s, gamma=g))  # noqa: E731
    runs = [Contender(f"ours_spec-{g}", spec(g)) for g in gammas]
    samples = run_interleaved(jobs, [Contender("ours_plain", partial(timed_plain, pair)), *runs], repeats, base)
    plain = pooled_tok_s(of(samples, "ours_plain"))
    rows = []
    for g in gammas:
        xs = of(samples, f"ours_spec-{g}")
        m = spec_metrics(xs, costs)
        rows.append({"gamma": g, "mean_gamma": m.mean_gamma, "alpha": m.alpha, "c_loop": m.c_loop,
                     "tok_s": pooled_tok_s(xs), "measured_speedup": pooled_tok_s(xs) / plain,
                     "predicted_speedup": m.predicted_speedup})
    return rows


def adaptive_compare(pair, jobs: list[Job], base: DecodeSettings, repeats: int) -> list[dict]:
    """Each adaptive policy against fixed gammas on the mixed prompt set, interleaved per prompt after a warm-up."""
    policies = [("fixed", g) for g in FIXED_GAMMAS] + list(ADAPTIVE_POLICIES)
    spec = lambda pol, g: lambda p, s: timed_spec(pair, p, replace(s, gamma=g, gamma_policy=pol))  # noqa: E731
    samples = run_interleaved(jobs, [Contender(f"{pol}-{g}", spec(pol, g)) for pol, g in policies], repeats, base)
    rows = []
    for policy, g in policies:
        xs = of(samples, f"{policy}-{g}")
        m = spec_metrics(xs)
        rows.append({"policy": policy, "gamma": g, "tok_s": pooled_tok_s(xs), "mean_gamma": m.mean_gamma,
                     "alpha": m.alpha})
    best_fixed = max(r["tok_s"] for r in rows if r["policy"] == "fixed")
    for r in rows:
        r["vs_best_fixed"] = r["tok_s"] / best_fixed
    return rows


def side_by_side(pair, jobs: list[Job], base: DecodeSettings, repeats: int, costs, modes, kinds
                 ) -> tuple[dict, list[Sample]]:
    """The four contenders interleaved; the table printed; the result's entries and the samples."""
    samples = run_interleaved(jobs, contenders(pair), repeats, base)
    if base.gamma_policy != "fixed":
        print(f"our loop (d): gamma policy '{base.gamma_policy}' starting at {base.gamma}; (b): constant gamma "
              f"{base.gamma}; the predicted column uses the mean draft length")
    groups = groups_of(samples, modes, kinds, costs)
    print_table(groups)
    return {"gamma": base.gamma, "policy": base.gamma_policy, "groups": groups,
            "samples": [x.to_json() for x in samples]}, samples


def cmd_speed(args, load, extra: Callable[[list[Sample], StepCosts], dict] | None = None) -> int:
    """`load()` returns the pair the command line asked for (the CLI owns model arguments). `extra(samples, costs)`
    adds entries to the side-by-side result (scripts/render_overhead.py adds "render")."""
    run = resolve(args, "speed")
    kinds, modes, max_new, repeats = run.kinds, run.modes, run.max_new_tokens, run.repeats
    jobs = jobs_for({k: [(p, k == "chat") for p in (PROMPTS[k][:1] if args.quick else PROMPTS[k])] for k in kinds},
                    modes)
    dv = args.draft_vocab
    pair = load()
    costs = measure_step_costs(pair, n_tokens=8 if args.quick else 16, draft_vocab=dv)
    log(f"step cost: target {costs.target_ms:.1f} ms/token, draft {costs.draft_ms:.1f} ms/token, "
        f"c_plain = {costs.c_plain:.3f}")
    result = {"models": pair.describe(), "draft_vocab": dv, "max_new_tokens": max_new, "repeats": repeats,
              "c_plain": costs.c_plain, "target_ms": costs.target_ms, "draft_ms": costs.draft_ms,
              "torch_threads": torch.get_num_threads()}
    base = DecodeSettings(max_new_tokens=max_new, draft_vocab=dv)
    if args.sweep_gamma:
        result["sweep"] = sweep(pair, parse_range(args.sweep_gamma), jobs, base, repeats, costs)
        print("\n".join(table(SWEEP, result["sweep"])))
    elif args.gamma == "auto":
        result["adaptive"] = adaptive_compare(pair, jobs, base, repeats)
        print("\n".join(table(ADAPTIVE, result["adaptive"])))
    else:
        part, samples = side_by_side(pair, jobs, replace(base, gamma=int(args.gamma), gamma_policy=args.policy),
                                     repeats, costs, modes, kinds)
        result.update(part)
        if extra is None:
            print(RENDER_NOTE)
        else:
            result.update(extra(samples, costs))
    write_result(result, run.out)
    return 0
