"""The engines side by side: `python -m specdec bench --engines`.

On one loaded pair, every engine of specdec.core.static_cache (eager: transformers' DynamicCache; static: the
preallocated cache with eager passes; compiled: that cache with the model body under torch.compile) runs plain
target decoding and the draft-model loop, interleaved per prompt (harness.run_interleaved, rotated order). Before
the timed runs each engine runs once untimed: for the compiled engine this is where inductor compiles every bucket
shape a chain uses (`static_cache.precompile`; CUDA graphs are captured on a GPU), and its seconds are reported as
`first_run_s`.

Per engine: tok/s of plain and of the loop, the loop's speedup over the same engine's plain decoding and over eager
plain decoding, c_loop, draft ms per guess, verify ms per round, tokens per pass, and whether every greedy run wrote
exactly the eager engine's tokens. Greedy by default, on code and prose prompts. JSON to bench-results/engines.json.
"""

from __future__ import annotations

import dataclasses
import time
from functools import partial

import torch

from specdec.bench.drafters import drafter_prompts
from specdec.bench.defaults import resolve
from specdec.bench.harness import (Column, Contender, jobs_for, log, loop_parts, median_tok_s, of, ratio,
                                   run_interleaved, spec_metrics, table, timed_plain, timed_spec, write_result)
from specdec.core.settings import DecodeSettings
from specdec.core.settings import encode_prompt
from specdec.core.static_cache import ENGINES, SLACK, precompile, slots_for



def contenders_for(pair, engines, outputs: dict) -> list[Contender]:
    """plain-<engine> and model-<engine> for every engine, recording each timed run's ids in `outputs`."""
    out = []
    for engine in engines:
        p = dataclasses.replace(pair, engine=engine)
        for kind, run in (("plain", partial(timed_plain, p)), ("model", partial(timed_spec, p))):
            name = f"{kind}-{engine}"

            def wrapped(prompt, s, run=run, name=name):
                t = run(prompt, s)
                outputs.setdefault((name, str(prompt), s.sampling.greedy, s.seed, s.max_new_tokens), list(t.ids))
                return t

            out.append(Contender(name, wrapped))
    return out


def engine_rows(samples, engines, outputs: dict, first_run_s: dict) -> list[dict]:
    eager_plain = median_tok_s(of(samples, "plain-eager")) if "eager" in engines else None
    rows = []
    for engine in engines:
        plain, loop = of(samples, f"plain-{engine}"), of(samples, f"model-{engine}")
        m = spec_metrics(loop)
        same = []  # greedy runs only: the eager engine's run of the same contender, prompt and seed wrote the same ids
        for (name, prompt, greedy, seed, n), ids in outputs.items():
            ref = outputs.get((name.rsplit("-", 1)[0] + "-eager", prompt, greedy, seed, n))
            if name.endswith(f"-{engine}") and greedy and ref is not None:
                same.append(ids == ref)
        rows.append({"engine": engine, "plain_tok_s": median_tok_s(plain), "model_tok_s": median_tok_s(loop),
                     "speedup": ratio(median_tok_s(loop), median_tok_s(plain)),
                     "plain_vs_eager": ratio(median_tok_s(plain), eager_plain),
                     "model_vs_eager_plain": ratio(median_tok_s(loop), eager_plain),
                     "c_loop": m.c_loop, **loop_parts(loop), "tokens_per_pass": m.tokens_per_round if m.rounds else None,
                     "alpha": m.alpha if m.tested else None, "same_as_eager": f"{sum(same)}/{len(same)}",
                     "first_run_s": first_run_s.get(engine)})
    return rows


COLUMNS = [Column("engine", 9, "engine", "{}", left=True), Column("plain", 6, "plain_tok_s"),
           Column("model", 6, "model_tok_s"), Column("speedup", 7, "speedup"),
           Column("pl/eager", 8, "plain_vs_eager"), Column("md/eager", 8, "model_vs_eager_plain"),
           Column("c_loop", 6, "c_loop", "{:.3f}"), Column("ms/guess", 8, "draft_ms_per_guess", "{:.1f}"),
           Column("ms/verify", 9, "verify_ms_per_round", "{:.1f}"), Column("tok/pass", 8, "tokens_per_pass"),
           Column("=eager", 6, "same_as_eager", "{}"), Column("first s", 7, "first_run_s", "{:.1f}")]


def cmd_engines_bench(args, load) -> int:
    run = resolve(args, "engines")
    kinds, modes, max_new, repeats, gamma = run.kinds, run.modes, run.max_new_tokens, run.repeats, run.fixed_gamma
    engines = list(ENGINES)
    prompts = {k: rows[:1] if run.quick else rows[:2] for k, rows in drafter_prompts(kinds, False).items()}
    jobs = jobs_for(prompts, modes)
    pair = load()
    base = DecodeSettings(max_new_tokens=max_new, gamma=gamma, draft_vocab=args.draft_vocab)
    outputs: dict[tuple, list[int]] = {}
    contenders = contenders_for(pair, engines, outputs)
    first_run_s = {}
    for engine in engines:  # compilation (and graph capture) happens here, timed apart from the measurement
        t0 = time.perf_counter()
        if engine == "compiled":  # every bucket a chain uses, on every cache length the runs get
            for n in sorted({slots_for(len(encode_prompt(pair.tokenizer, j.prompt, j.chat)) + max_new) for j in jobs}):
                for model in (pair.target, pair.draft):
                    precompile(model, pair.vocab_size, n - SLACK)
        for c in contenders:
            if c.name.endswith(f"-{engine}"):
                c(jobs[0].prompt, dataclasses.replace(base, chat=jobs[0].chat))
        first_run_s[engine] = time.perf_counter() - t0
        log(f"first runs on the {engine} engine: {first_run_s[engine]:.1f} s")
    samples = run_interleaved(jobs, contenders, repeats, base)
    rows = engine_rows(samples, engines, outputs, first_run_s)
    print("\n".join(table(COLUMNS, rows, rule=True)))
    print(f"(tok/s: median over {repeats} repeat(s) per prompt; {torch.get_num_threads()} torch threads; speedup = "
          "the loop over the same engine's plain decoding; first s = untimed first runs, compilation included)")
    result = {"models": pair.describe(), "gamma": gamma, "max_new_tokens": max_new, "repeats": repeats,
              "modes": modes, "kinds": kinds, "engines": engines, "torch_threads": torch.get_num_threads(),
              "rows": rows, "samples": [x.to_json(80) for x in samples]}
    write_result(result, run.out)
    return 0
