"""Chains against token trees: `python -m specdec bench --tree`.

On the bench's prompt kinds (code, prose, chat and the input-grounded set), greedy and sampled (T = 0.7), one run
interleaves and rotates (bench.harness): our plain decoding, the draft model's chain (γ 4) against its top-k trees and
its confidence-shaped (dynamic) tree, and prompt lookup's chain (γ 32) against its copy tree (a branch per distinct
earlier continuation). Per group: tokens per target pass, draft and verify ms per round, and the measured speedup over
our plain decoding, plus transformers' assisted generation (γ 4) on the same prompts for the best-vs-best column.
"""

from __future__ import annotations

import sys
from dataclasses import replace
from functools import partial

import torch

from specdec.bench.drafters import drafter_prompts
from specdec.bench.defaults import resolve
from specdec.bench.harness import (Column, Contender, Timed, assistant_for, by_group, jobs_for, median_tok_s, of,
                                   ratio, run_interleaved, table, timed_generate, timed_plain, timed_spec,
                                   write_result)
from specdec.core.clock import Stopwatch
from specdec.loop.tree import TreeDecoder

MODEL_TREES = {"model_tree_321": (3, 2, 1), "model_tree_2111": (2, 1, 1, 1)}
# Confidence-shaped trees (EAGLE-2): depth 5, the 4 likeliest frontier nodes get 4 children each, and each round
# keeps as many candidates (at most 64) as this run's measured width cost says pay.
DYNAMIC_TREES = {"model_dynamic_4x5": (4,) * 5}
NGRAM_TREE = (4,) + (1,) * 11  # up to four branches of twelve copied tokens (at most 48 nodes)


def timed_tree(pair, widths, prompt, s, mode: str = "top-k") -> Timed:
    """Our tree loop; its rounds as their chain views (Round), so tokens per pass and timings read as the chain's."""
    clock = Stopwatch(pair.device)
    dec = TreeDecoder(pair, prompt, s, widths, mode)
    rounds = [r.round for r in dec]
    return Timed(dec.generated_ids, clock.total() / 1e3, rounds)


def contenders(pair) -> list[Contender]:
    out = [Contender("plain", partial(timed_plain, pair)),
           Contender("hf_assisted_g4", lambda p, s: timed_generate(pair, p, s,
                                                                   assistant_model=assistant_for(pair.draft, 4))),
           Contender("model_chain", lambda p, s: timed_spec(pair, p, replace(s, drafter="model", gamma=4)))]
    for name, widths in MODEL_TREES.items():
        out.append(Contender(name, lambda p, s, w=widths: timed_tree(pair, w, p, replace(s, drafter="model"))))
    for name, widths in DYNAMIC_TREES.items():
        out.append(Contender(name, lambda p, s, w=widths: timed_tree(pair, w, p, replace(s, drafter="model"),
                                                                     "dynamic")))
    out += [Contender("ngram_chain", lambda p, s: timed_spec(pair, p, replace(s, drafter="ngram", gamma=32))),
            Contender("ngram_tree", lambda p, s: timed_tree(pair, NGRAM_TREE, p, replace(s, drafter="ngram")))]
    return out


def summarize(samples, names: list[str]) -> dict:
    tok_s = {n: median_tok_s(of(samples, n)) for n in names}
    out = {"speedup": {n: ratio(tok_s[n], tok_s["plain"]) for n in names}, "tok_s": tok_s}
    per_pass, draft_ms, verify_ms = {}, {}, {}
    for n in names:
        rounds = [r for x in of(samples, n) for r in x.rounds]
        tokens = sum(len(r.committed_ids) for r in rounds)
        per_pass[n] = tokens / len(rounds) if rounds else None
        draft_ms[n] = sum(r.draft_ms for r in rounds) / len(rounds) if rounds else None
        verify_ms[n] = sum(r.verify_ms for r in rounds) / len(rounds) if rounds else None
    ours = [n for n in names if n not in ("plain", "hf_assisted_g4")]
    best = max(ours, key=lambda n: out["speedup"][n] or 0.0)
    out.update(tokens_per_pass=per_pass, draft_ms=draft_ms, verify_ms=verify_ms, best_ours=best,
               best_vs_hf=ratio(out["speedup"][best], out["speedup"]["hf_assisted_g4"]))
    return out


def print_table(groups: dict, names: list[str], out=None) -> None:
    shown = [n for n in names if n != "plain"]
    rows = [{"group": g, **v} for g, v in groups.items()]
    cols = [Column("group", 16, "group", "{}", left=True)]
    lines = ["speedup over our plain decoding:",
             *table(cols + [Column(n, max(8, len(n)), lambda r, n=n: r["speedup"][n]) for n in shown]
                    + [Column("best ours", 15, "best_ours", "{}"), Column("best/hf", 7, "best_vs_hf")], rows, True),
             "", "tokens per target pass:",
             *table(cols + [Column(n, max(8, len(n)), lambda r, n=n: r["tokens_per_pass"][n]) for n in shown[1:]],
                    rows, True),
             "", "draft ms / verify ms per round:",
             *table(cols + [Column(n, max(13, len(n)), lambda r, n=n: f"{r['draft_ms'][n]:.0f}/{r['verify_ms'][n]:.0f}"
                                   if r["draft_ms"][n] is not None else None, "{}") for n in shown[1:]], rows, True)]
    print("\n".join(lines), file=out or sys.stdout)


def cmd_tree_bench(args, load) -> int:
    run = resolve(args, "tree")
    kinds, modes = run.kinds, run.modes
    jobs = jobs_for(drafter_prompts(kinds, run.quick), modes)
    pair = load()
    field = contenders(pair)
    from specdec.core.settings import DecodeSettings

    base = DecodeSettings(max_new_tokens=run.max_new_tokens)
    samples = run_interleaved(jobs, field, run.repeats, base)
    names = [c.name for c in field]
    groups = {g: summarize(xs, names) for g, xs in by_group(samples, modes, kinds).items() if xs}
    groups["all"] = summarize(samples, names)
    print_table(groups, names)
    write_result({"models": pair.describe(), "model_trees": {k: list(v) for k, v in MODEL_TREES.items()},
                  "dynamic_trees": {k: list(v) for k, v in DYNAMIC_TREES.items()},
                  "ngram_tree": list(NGRAM_TREE), "max_new_tokens": base.max_new_tokens,
                  "torch_threads": torch.get_num_threads(), "groups": groups,
                  "samples": [x.to_json(prompt_chars=60) for x in samples]}, run.out)
    return 0
