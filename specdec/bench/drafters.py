"""Input-grounded prompts, and the drafter benchmark: `python -m specdec bench --drafter model|ngram|early-exit|cross`.

Grounded prompts give the model a text to work on (a function to edit, a paragraph to summarise, a passage to
answer from): the answer copies much of its input, which is where prompt lookup shines.
"""

from __future__ import annotations

import contextlib
import sys
from dataclasses import replace
from functools import partial

import torch

from specdec.bench.defaults import resolve
from specdec.bench.harness import (Column, Contender, Sample, assistant_for, by_group, compare, constant_gamma,
                                   jobs_for, loop_figures, of, run_interleaved, spec_metrics, table, timed_generate,
                                   timed_plain, timed_spec, write_result)
from specdec.core.errors import InvalidInputError
from specdec.core.settings import DecodeSettings
from specdec.drafters.early_exit import resolve_exit_layer
from specdec.models.cross import load_cross_draft
from specdec.prompts import GROUNDED, PROMPTS

CONTENDERS = ("hf_plain", "hf_equiv", "ours_plain", "ours")
HF_EQUIVALENT = {
    "model": "assistant_model=draft",
    "ngram": "prompt_lookup_num_tokens=gamma, max_matching_ngram_size=ngram_max",
    "early-exit": "assistant_early_exit=k",
    "cross": "assistant_model=SmolLM2, tokenizer=, assistant_tokenizer=",
}
RATIOS = {"ours/hf_plain": ("ours", "hf_plain"), "ours/hf_equiv": ("ours", "hf_equiv"),
          "hf_equiv/hf_plain": ("hf_equiv", "hf_plain"), "ours/ours_plain": ("ours", "ours_plain")}


def drafter_prompts(kinds: list[str], quick: bool) -> dict[str, list[tuple[str, bool]]]:
    """(prompt, chat) per kind: 'grounded' from GROUNDED (chat template on), the others from PROMPTS."""
    out = {}
    for kind in kinds:
        if kind == "grounded":
            rows = [(g["prompt"], True) for g in GROUNDED]
        elif kind in PROMPTS:
            rows = [(p, kind == "chat") for p in PROMPTS[kind]]
        else:
            raise InvalidInputError(f"unknown prompt kind {kind!r}; choose from grounded, {', '.join(PROMPTS)}")
        out[kind] = rows[:2] if quick else rows
    return out


@contextlib.contextmanager
def _assistant_knobs(model: torch.nn.Module, gamma: int):
    """transformers' early exit drafts with the target itself and reads its knobs from the target's own
    generation_config: constant gamma, no confidence stop, restored afterwards."""
    saved = model.generation_config
    model.generation_config = constant_gamma(saved, gamma)
    try:
        yield
    finally:
        model.generation_config = saved


def run_equivalent(pair, cross_draft, equiv_gamma: int | None, prompt, s: DecodeSettings):
    """transformers generate() with the drafter's transformers equivalent (at equiv_gamma if given, else at the
    run's gamma)."""
    s = replace(s, gamma=equiv_gamma or s.gamma)
    if s.drafter == "model":
        return timed_generate(pair, prompt, s, assistant_model=assistant_for(pair.draft, s.gamma))
    if s.drafter == "ngram":
        return timed_generate(pair, prompt, s, prompt_lookup_num_tokens=s.gamma, max_matching_ngram_size=s.ngram_max)
    if s.drafter == "early-exit":
        return timed_generate(pair, prompt, s, _assistant_knobs(pair.target, s.gamma),
                              assistant_early_exit=resolve_exit_layer(pair.target, s.exit_layer))
    return timed_generate(pair, prompt, s, assistant_model=assistant_for(cross_draft.model, s.gamma),
                          tokenizer=pair.tokenizer, assistant_tokenizer=cross_draft.tokenizer)


def contenders(pair, cross_draft=None, equiv_gamma: int | None = None) -> list[Contender]:
    runs = (partial(timed_generate, pair), partial(run_equivalent, pair, cross_draft, equiv_gamma),
            partial(timed_plain, pair), partial(timed_spec, pair))
    return [Contender(name, run) for name, run in zip(CONTENDERS, runs)]


def summarize(samples: list[Sample], costs=None) -> dict:
    """tok/s per contender (median over repeats per prompt, summed over prompts), ratios, alpha, tokens per round,
    c and the measured / predicted speedup of our loop (specdec.core.metrics conventions)."""
    return {**compare(samples, CONTENDERS, RATIOS), **loop_figures(spec_metrics(of(samples, "ours"), costs))}


COLUMNS = [Column("group", 16, "group", "{}", left=True), Column("plain gen", 9, "hf_plain"),
           Column("hf equiv", 9, "hf_equiv"), Column("our plain", 9, "ours_plain"), Column("ours", 7, "ours"),
           Column("ours/gen", 8, "ours/hf_plain"), Column("ours/equiv", 10, "ours/hf_equiv"),
           Column("equiv/gen", 9, "hf_equiv/hf_plain"), Column("alpha", 6, "alpha", "{:.3f}"),
           Column("tok/rnd", 7, "tokens_per_round"), Column("c", 6, "c_loop", "{:.3f}"),
           Column("meas", 5, "ours/ours_plain"), Column("pred", 5, "predicted_speedup")]


def print_table(drafter: str, gamma: int, groups: dict, out=None, equiv_gamma: int | None = None) -> None:
    theirs = f" at gamma {equiv_gamma}" if equiv_gamma else ""
    lines = [f"drafter {drafter}, gamma {gamma}; transformers equivalent: {HF_EQUIVALENT[drafter]}{theirs}",
             *table(COLUMNS, [{"group": name, **g["tok_s"], **g} for name, g in groups.items()]),
             "tok/s: median over repeats per prompt, summed over prompts. ours/gen and ours/equiv: our speculative "
             "loop over plain generate() and over transformers' equivalent; meas = ours / our plain; pred = Leviathan "
             "at the run's alpha, mean gamma and c (c = c_loop: drafting ms per guess / verify ms per round)."]
    print("\n".join(lines), file=out or sys.stdout)


def cmd_drafter_bench(args, load) -> int:
    """`python -m specdec bench --drafter NAME`: the four contenders interleaved (rotating who goes first) on the
    grounded prompt set (or --kinds), greedy unless --modes says otherwise."""
    run = resolve(args, "drafter")
    kinds, modes, max_new, repeats, gamma = run.kinds, run.modes, run.max_new_tokens, run.repeats, run.fixed_gamma
    jobs = jobs_for(drafter_prompts(kinds, run.quick), modes)
    pair = load()
    cross = load_cross_draft(pair) if args.drafter == "cross" else None
    base = DecodeSettings(drafter=args.drafter, gamma=gamma, gamma_policy=args.policy, draft_vocab=args.draft_vocab,
                          max_new_tokens=max_new)
    samples = run_interleaved(jobs, contenders(pair, cross, args.equiv_gamma), repeats, base)
    groups = {name: summarize(xs) for name, xs in by_group(samples, modes, kinds).items()}
    if len(groups) > 1:
        groups["all"] = summarize(samples)
    print_table(args.drafter, gamma, groups, equiv_gamma=args.equiv_gamma)
    result = {"models": pair.describe(), "drafter": args.drafter, "gamma": gamma,
              "equiv_gamma": args.equiv_gamma or gamma, "policy": args.policy,
              "hf_equivalent": HF_EQUIVALENT[args.drafter], "max_new_tokens": max_new, "repeats": repeats,
              "torch_threads": torch.get_num_threads(), "groups": groups,
              "samples": [x.to_json(prompt_chars=60) for x in samples]}
    write_result(result, run.out)
    return 0
