"""A Spec-Bench-shaped suite: `python -m specdec bench --suite`.

Six task kinds (specdec.prompts.SUITE: multi-turn conversation, translation, summarization, question answering,
math reasoning, retrieval-augmented answers), greedy, batch 1, wall time including prefill, every contender
interleaved and rotated on every prompt (bench.harness). Per kind: each contender's speedup over plain
transformers `generate()` and its mean tokens per target pass; in the last columns the best of ours over the
best of transformers' -- the Spec-Bench leaderboard's shape.

Tokens per target pass are counted the same way for every contender: a forward pre-hook on the target's body
(`base_model`, which both transformers' head-and-body forward and our scorer's body-then-head call once a pass)
counts its calls during the run (prefill included), so transformers' loops are measured by the same rule as ours.

Contenders:
- ours: the draft model at γ 4 (`model`) and with each round's γ chosen by the expected policy from the run's own
  acceptance and cost (`model_expected`, loop.gamma), the same with its int8, int4 and int4-all drafts (`model_int8`,
  `model_int4`, `model_int4all`, models.quant; bf16 pairs on a CPU), prompt lookup at γ 32 (`ngram`) and with each
  copy's length chosen by expected gain (`ngram_gain`, the expected policy), the suffix index (`suffix`), the hybrid
  drafter at γ 4 (`auto`) and with the int4 draft at γ 16 under the confidence policy at 0.6, the model leading each
  round (`auto_int4`) -- our speculative loop with its display candidates, as the app runs it;
- our plain decoding (`plain`, no drafting): how much of a speedup is this engine's prepacked CPU kernels
  (models.prepack) rather than speculation; not counted among ours for the best-of columns;
- transformers, as it ships (on F.linear, `prepack.plain_kernels`): plain `generate()` (the baseline), assisted
  generation with the draft at its own generation config (`hf_assisted`), at a constant γ 4 (`hf_assisted_g4`),
  and prompt lookup at 5, 10 (transformers' documented example) and 20 tokens (`hf_lookup_5/10/20`).

Lookup against lookup (`copy_vs_copy`): the best of our copy drafters (ngram, ngram_gain, suffix) over the best of
transformers' three prompt lookups. Prompts come in two halves (`--split`, specdec.prompts.SUITE_SPLITS): `tune`,
the prompts the app's defaults were chosen on, and `test` (the default), prompts no default saw.
"""

from __future__ import annotations

import math
import sys
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import NamedTuple

import torch

from specdec.bench.defaults import resolve
from specdec.bench.harness import (Column, Contender, Job, assistant_for, interleaved, log, middle, ratio, table,
                                   timed_generate, timed_plain, timed_spec, warm_up, write_result)
from specdec.core.errors import InvalidInputError
from specdec.core.settings import DRAFTERS, DecodeSettings
from specdec.prompts import SUITE, SUITE_SPLITS



class Ours(NamedTuple):
    """One contender of ours: the draft's quantization ("" for the pair's own draft), the settings the run changes,
    and who leads a hybrid round (make_drafter's hybrid_lead)."""

    quant: str
    settings: dict
    hybrid_lead: str = "copy"


OURS = {"model": Ours("", {"drafter": "model", "gamma": 4}),
        "model_expected": Ours("", {"drafter": "model", "gamma": 4, "gamma_policy": "expected"}),
        "ngram": Ours("", {"drafter": "ngram", "gamma": 32}),
        "ngram_gain": Ours("", {"drafter": "ngram", "gamma": 32, "gamma_policy": "expected"}),
        "suffix": Ours("", {"drafter": "suffix", "gamma": 32}),
        "auto": Ours("", {"drafter": "auto", "gamma": 4}),
        "model_int8": Ours("int8", {"drafter": "model", "gamma": 4}),
        "model_int4": Ours("int4", {"drafter": "model", "gamma": 4}),
        "model_int4all": Ours("int4-all", {"drafter": "model", "gamma": 4}),
        "auto_int4": Ours("int4", {"drafter": "auto", "gamma": 16, "gamma_policy": "confidence",
                                   "confidence_threshold": 0.6}, hybrid_lead="model")}
LOOKUP_TOKENS = (5, 10, 20)  # transformers' prompt lookup at each num_pred_tokens (10: its documented example)
THEIRS = ("hf_assisted", "hf_assisted_g4", *(f"hf_lookup_{n}" for n in LOOKUP_TOKENS))
OUR_COPIES = ("ngram", "ngram_gain", "suffix")  # lookup against lookup: our copy drafters ...
THEIR_COPIES = tuple(f"hf_lookup_{n}" for n in LOOKUP_TOKENS)  # ... against transformers' prompt lookup
BASELINE = "hf_plain"
OUR_PLAIN = "plain"  # our own plain decoding: what the engine's kernels alone gain (not a speculative contender)


@dataclass
class PassCounter:
    """Counts the target body's forward calls while it is installed (a forward pre-hook)."""

    calls: int = 0

    def __call__(self, module, args):
        self.calls += 1


@dataclass
class Run:
    """One timed run of one contender on one prompt."""

    contender: str
    kind: str
    prompt: str  # the last message, for the JSON
    tokens: int
    seconds: float
    passes: int  # target forward calls, prefill included


def contenders(pair, ours: list[str], quantized: dict | None = None) -> list[Contender]:
    """Plain generate(), transformers' three, our plain decoding, then ours; a contender of ours whose draft
    quantization has no pair in `quantized` (mode -> pair with that draft) is left out."""
    quantized = {"": pair, **(quantized or {})}
    out = [Contender(BASELINE, partial(timed_generate, pair)),
           Contender("hf_assisted", lambda p, s: timed_generate(pair, p, s, assistant_model=pair.draft)),
           Contender("hf_assisted_g4", lambda p, s: timed_generate(pair, p, s,
                                                                   assistant_model=assistant_for(pair.draft, 4))),
           *(Contender(f"hf_lookup_{n}", lambda p, s, n=n: timed_generate(pair, p, s, prompt_lookup_num_tokens=n))
             for n in LOOKUP_TOKENS),
           Contender(OUR_PLAIN, partial(timed_plain, pair))]
    for name in ours:
        cfg = OURS[name]
        if cfg.quant in quantized:
            out.append(Contender(name, lambda p, s, q=quantized[cfg.quant], c=cfg:
                                 timed_spec(q, p, replace(s, **c.settings), c.hybrid_lead)))
    return out


def run_suite(pair, jobs: list[Job], field: list[Contender], repeats: int, base: DecodeSettings) -> list[Run]:
    """Every contender on every prompt, interleaved and rotated (bench.harness.interleaved), the target's
    forward calls counted per run."""
    counter = PassCounter()
    hook = pair.target.base_model.register_forward_pre_hook(counter)
    try:
        warm_up(field, jobs[0].prompt, base)
        runs = []
        for rep, job, order in interleaved(jobs, field, repeats):
            s = replace(base, seed=rep)
            for c in order:
                before = counter.calls
                t = c(job.prompt, s)
                runs.append(Run(c.name, job.kind, job.prompt[-1]["content"], t.tokens, t.seconds,
                                counter.calls - before))
                x = runs[-1]
                log(f"  rep {rep} {x.kind:13s} {x.contender:15s} {x.tokens:3d} tok {x.seconds:6.2f} s "
                    f"{x.tokens / max(x.passes, 1):5.2f} tok/pass")
    finally:
        hook.remove()
    return runs


def summarize_kind(samples: list[Run], names: list[str]) -> dict:
    """Per contender: speedup over plain generate() (median run per prompt, pooled over prompts) and tokens per
    target pass; then the best of ours against the best of transformers'."""
    by_prompt: dict[str, dict[str, list[Run]]] = {}
    for x in samples:
        by_prompt.setdefault(x.prompt, {}).setdefault(x.contender, []).append(x)
    secs = {n: 0.0 for n in names}
    toks = {n: 0 for n in names}
    passes = {n: 0 for n in names}
    for runs in by_prompt.values():
        for n in names:
            if n in runs:
                m = middle(runs[n], key=lambda x: x.seconds)
                secs[n] += m.seconds
                toks[n] += m.tokens
                passes[n] += m.passes
    tok_s = {n: toks[n] / secs[n] if secs[n] else None for n in names}
    speedup = {n: ratio(tok_s[n], tok_s[BASELINE]) for n in names}
    per_pass = {n: toks[n] / passes[n] if passes[n] else None for n in names}

    def best(group) -> str | None:  # the fastest of `group` that ran (None: none of them did)
        ran = [n for n in group if n in names]
        return max(ran, key=lambda n: speedup[n] or 0.0) if ran else None

    def versus(a, b) -> float | None:
        return ratio(speedup[a], speedup[b]) if a and b else None

    best_ours = best([n for n in names if n not in (BASELINE, OUR_PLAIN) and n not in THEIRS])
    best_theirs = best(THEIRS)
    out = {"tok_s": tok_s, "speedup": speedup, "tokens_per_pass": per_pass, "best_ours": best_ours,
           "best_theirs": best_theirs, "best_vs_best": versus(best_ours, best_theirs)}
    ours_copy, theirs_copy = best(OUR_COPIES), best(THEIR_COPIES)
    if ours_copy:  # lookup against lookup: our best copy drafter over transformers' best prompt lookup
        out.update(best_copy_ours=ours_copy, best_copy_theirs=theirs_copy, copy_vs_copy=versus(ours_copy, theirs_copy))
    return out


def geometric_mean(values) -> float | None:
    values = [v for v in values if v]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def print_table(kinds: dict, names: list[str], out=None) -> None:
    cols = [Column("kind", 13, "kind", "{}", left=True)]
    cols += [Column(n, max(7, len(n)), (lambda r, n=n: r["speedup"][n])) for n in names if n != BASELINE]
    cols += [Column("best ours", 10, "best_ours", "{}"), Column("best theirs", 14, "best_theirs", "{}"),
             Column("ours/theirs", 11, "best_vs_best"), Column("copy/copy", 9, "copy_vs_copy")]
    rows = [{"kind": k, **v} for k, v in kinds.items()]
    lines = ["speedup over plain transformers generate() (wall time incl. prefill, greedy, batch 1):",
             *table(cols, rows, rule=True), "", "tokens per target pass (prefill included):"]
    cols2 = [Column("kind", 13, "kind", "{}", left=True)]
    cols2 += [Column(n, max(7, len(n)), (lambda r, n=n: r["tokens_per_pass"][n])) for n in names]
    lines += table(cols2, rows, rule=True)
    gm = geometric_mean(v["best_vs_best"] for v in kinds.values())
    lines.append(f"geometric mean of best ours / best theirs over kinds: {gm:.3f}" if gm else "")
    print("\n".join(lines), file=out or sys.stdout)


def quantized_pairs(pair, modes) -> dict:
    """mode -> the pair with its draft quantized so, for each mode the kernels run for here (none when this pair's
    draft is already quantized)."""
    from specdec.core.errors import SpecDecError
    from specdec.models.pair import quantized_draft_pair

    out = {}
    if pair.draft_quant:
        return out
    for mode in modes:
        try:
            out[mode] = quantized_draft_pair(pair, mode, torch.bfloat16)
        except SpecDecError as exc:
            log(f"no {mode} draft contenders: {exc}")
    return out


def wanted_contenders(names: str | None) -> set[str] | None:
    """The contender names `names` (comma-separated) asks for, plain generate() always among them (every speedup
    is over it); None when `names` is empty (all of them). An unknown name is an InvalidInputError."""
    if not names:
        return None
    wanted = {n.strip() for n in names.split(",") if n.strip()} | {BASELINE}
    known = [BASELINE, *THEIRS, OUR_PLAIN, *OURS]
    unknown = wanted - set(known)
    if unknown:
        raise InvalidInputError(f"unknown suite contenders {sorted(unknown)}; choose from {', '.join(known)}")
    return wanted


def cmd_suite(args, load) -> int:
    run = resolve(args, "suite")
    try:
        wanted = wanted_contenders(getattr(args, "contenders", None))
    except InvalidInputError as exc:
        log(str(exc))
        return 2
    ours = [n for n, cfg in OURS.items() if cfg.settings["drafter"] in DRAFTERS and (wanted is None or n in wanted)]
    kinds = run.kinds
    prompts = SUITE_SPLITS[args.split]
    unknown = [k for k in kinds if k not in prompts]
    if unknown:
        log(f"unknown suite kinds {unknown}; choose from {', '.join(SUITE)}")
        return 2
    per_kind = 1 if run.quick else (args.per_kind or None)
    jobs = [Job(k, "greedy", p, True) for k in kinds for p in prompts[k][:per_kind]]
    pair = load()
    field = contenders(pair, ours, quantized_pairs(pair, sorted({OURS[n].quant for n in ours} - {""})))
    field = [c for c in field if wanted is None or c.name in wanted]
    base = DecodeSettings(max_new_tokens=run.max_new_tokens, chat=True)
    samples = run_suite(pair, jobs, field, run.repeats, base)
    names = [c.name for c in field]
    result_kinds = {k: summarize_kind([x for x in samples if x.kind == k], names) for k in kinds}
    print_table(result_kinds, names)
    write_result({"models": pair.describe(), "split": args.split, "contenders": names, "kinds": result_kinds,
                  "max_new_tokens": base.max_new_tokens, "torch_threads": torch.get_num_threads(),
                  "samples": [{**asdict(x), "prompt": x.prompt[:60]} for x in samples]},
                 run.out)
    return 0
