"""The quantized drafts (int8, int4) against the bf16 draft: `python -m specdec bench --quant-draft`.

On one loaded pair (bfloat16 or float16 on the CPU; the embedded default pair unless --pair says otherwise) the
draft is copied and quantized to weight-only int8 and to int4 (specdec.models.quant); the target is the same
object for every contender. Interleaved per prompt (harness.run_interleaved, rotated order, one warm-up each):

- plain      our plain target-only decoding, the baseline of every speedup
- bf16       our speculative loop with the float draft, reduced head at --draft-vocab (default 65,536 ids)
- int8       the same loop with the int8 draft, reduced head 65,536 ids
- int8-32k   the int8 draft with a 32,768-id reduced head
- int4       the loop with the int4 draft (groups of 32 weights), reduced head 65,536 ids
- int4-all   every draft layer and the head in 4 bits, reduced head 65,536 ids

Greedy by default (--modes picks others), on the code, prose, chat and grounded prompts (--kinds). Per kind and
overall, for each speculative contender: alpha; c_loop = draft ms per guess / verify ms per round (and both parts),
and c_steady, the same over every round after each run's first (round one's parts include both prefills);
c_plain = draft ms / target ms per token of plain decoding (measured once per draft variant before the timed
runs); tokens per target pass; tok/s; speedup over plain; and how many greedy runs wrote exactly the plain run's
tokens (bfloat16 rounds a γ+1-token verify pass and a one-token plain step differently, so a few may not).
Table on stdout, JSON to bench-results/quant-draft.json (or --out).
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from functools import partial

import torch

from specdec.bench.drafters import drafter_prompts
from specdec.bench.defaults import resolve
from specdec.bench.harness import (Column, Contender, Sample, by_group, jobs_for, log, loop_parts, median_tok_s, of,
                                   ratio, run_interleaved, spec_metrics, table, timed_plain, timed_spec, write_result)
from specdec.core.errors import InvalidInputError
from specdec.core.metrics import StepCosts
from specdec.core.settings import DecodeSettings
from specdec.loop.plain import measure_step_costs
from specdec.models.pair import quantized_draft_pair
from specdec.models.quant import QUANT_MODES

HEAD_BIG, HEAD_SMALL = 65536, 32768


def variants(pair, quantized: dict, draft_vocab: int | None) -> list[tuple[str, object, int | None, str]]:
    """(contender name, pair, draft head size, draft weights) of each speculative contender; `quantized`: the pair
    with its draft quantized, per mode of QUANT_MODES."""
    return [("bf16", pair, draft_vocab if draft_vocab is not None else HEAD_BIG, str(pair.dtype).replace("torch.", "")),
            ("int8", quantized["int8"], HEAD_BIG, "int8"),
            ("int8-32k", quantized["int8"], HEAD_SMALL, "int8"),
            *((mode, quantized[mode], HEAD_BIG, mode) for mode in QUANT_MODES if mode != "int8")]


def group_rows(samples: list[Sample], specs, costs: dict[str, StepCosts], same: dict[tuple, list[bool]]) -> list[dict]:
    """One row per speculative contender of a group of samples (plain's tok/s is the speedup's base)."""
    plain = median_tok_s(of(samples, "plain"))
    rows = []
    for name, _, head, weights in specs:
        xs = of(samples, name)
        m = spec_metrics(xs, costs[name])
        tok_s = median_tok_s(xs)
        agree = [ok for key in {(name, x.mode, str(x.prompt)) for x in xs} for ok in same.get(key, [])]
        rows.append({"contender": name, "draft": weights, "head": head, "alpha": m.alpha if m.tested else None,
                     "c_loop": m.c_loop, "c_plain": costs[name].c_plain, **loop_parts(xs),
                     "tokens_per_pass": m.tokens_per_round if m.rounds else None, "mean_gamma": m.mean_gamma,
                     "tok_s": tok_s, "plain_tok_s": plain, "speedup": ratio(tok_s, plain),
                     "same_as_plain": f"{sum(agree)}/{len(agree)}"})
    return rows


COLUMNS = [Column("group", 16, "group", "{}", left=True), Column("draft", 9, "contender", "{}", left=True),
           Column("head", 6, "head", "{:d}"), Column("alpha", 6, "alpha", "{:.3f}"),
           Column("c_loop", 6, "c_loop", "{:.3f}"),
           Column("c_plain", 7, "c_plain", "{:.3f}"), Column("ms/guess", 8, "draft_ms_per_guess", "{:.1f}"),
           Column("ms/verify", 9, "verify_ms_per_round", "{:.1f}"), Column("c_steady", 8, "c_steady", "{:.3f}"),
           Column("ms/g st", 7, "draft_ms_per_guess_steady", "{:.1f}"),
           Column("ms/v st", 7, "verify_ms_per_round_steady", "{:.1f}"), Column("tok/pass", 8, "tokens_per_pass"),
           Column("tok/s", 6, "tok_s"), Column("plain", 6, "plain_tok_s"), Column("speedup", 7, "speedup"),
           Column("=plain", 6, "same_as_plain", "{}")]


def cmd_quant_draft_bench(args, load) -> int:
    run = resolve(args, "quant-draft")
    kinds, modes, max_new, repeats, gamma = run.kinds, run.modes, run.max_new_tokens, run.repeats, run.fixed_gamma
    prompts = {k: rows[:1] if run.quick else rows for k, rows in drafter_prompts(kinds, False).items()}
    jobs = jobs_for(prompts, modes)
    pair = load()
    if pair.draft_quant:
        raise InvalidInputError("--quant-draft quantizes a copy of the pair's float draft itself; load the pair "
                                "without --draft-quant (and not the default-int8 or default-int4 preset)")
    quantized = {}
    for mode in QUANT_MODES:
        t0 = time.perf_counter()
        quantized[mode] = quantized_draft_pair(pair, mode)  # InvalidInputError for float32 activations or a GPU
        log(f"quantized a copy of the draft to {mode} in {time.perf_counter() - t0:.1f} s")
    specs = variants(pair, quantized, args.draft_vocab)

    costs: dict[str, StepCosts] = {}
    for name, p, head, _ in specs:
        costs[name] = measure_step_costs(p, n_tokens=8 if run.quick else 16, draft_vocab=head)
        log(f"step cost {name:9s} (head {head}): target {costs[name].target_ms:.1f} ms/token, draft "
            f"{costs[name].draft_ms:.1f} ms/token, c_plain = {costs[name].c_plain:.3f}")

    outputs: dict[tuple, list[int]] = {}  # (contender, mode, prompt, seed) -> generated ids

    def keep(name: str, run):
        def wrapped(prompt, s: DecodeSettings):
            t = run(prompt, s)
            if s.max_new_tokens == max_new:  # a timed run, not the harness's short warm-up
                mode = "greedy" if s.sampling.greedy else "sampled"
                outputs[(name, mode, str(prompt), s.seed)] = list(t.ids)
            return t
        return Contender(name, wrapped)

    base = DecodeSettings(max_new_tokens=max_new, gamma=gamma)
    contenders = [keep("plain", partial(timed_plain, pair))]
    for name, p, head, _ in specs:
        contenders.append(keep(name, lambda pr, s, p=p, head=head: timed_spec(p, pr, replace(s, draft_vocab=head))))
    samples = run_interleaved(jobs, contenders, repeats, base)

    same: dict[tuple, list[bool]] = {}  # greedy runs only: did the contender write the plain run's tokens?
    for (name, mode, prompt, seed), ids in outputs.items():
        ref = outputs.get(("plain", mode, prompt, seed))
        if name != "plain" and mode == "greedy" and ref is not None:
            same.setdefault((name, mode, prompt), []).append(ids == ref)

    groups = {}
    for name, xs in by_group(samples, modes, kinds).items():
        groups[name] = group_rows(xs, specs, costs, same)
    groups["all"] = group_rows(samples, specs, costs, same)
    rows = [{"group": g, **r} for g, rs in groups.items() for r in rs]
    print("\n".join(table(COLUMNS, rows, rule=True)))
    print(f"(tok/s: median over {repeats} repeat(s) per prompt; speedup = tok/s / plain target tok/s; "
          f"{torch.get_num_threads()} torch threads)", file=sys.stdout)
    result = {"models": pair.describe(), **{f"{mode}_models": p.describe() for mode, p in quantized.items()},
              "gamma": gamma,
              "max_new_tokens": max_new, "repeats": repeats, "modes": modes, "kinds": kinds,
              "torch_threads": torch.get_num_threads(),
              "step_costs": {k: {"target_ms": c.target_ms, "draft_ms": c.draft_ms, "c_plain": c.c_plain}
                             for k, c in costs.items()},
              "contenders": [{"name": n, "draft": w, "head": h} for n, _, h, w in specs],
              "groups": groups, "samples": [x.to_json(80) for x in samples]}
    write_result(result, run.out)
    return 0
