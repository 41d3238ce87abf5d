"""Latency vs throughput: batched speculative decoding against plain batched decoding, for several batch sizes.

`python -m specdec bench --batch 1,2,4,8,16` runs, for each sampling mode and batch size B, plain batched decoding
and the batched speculative loop (specdec.loop.batched) on the first B prompts of PROMPT_POOL (different lengths, so rows
are padded), interleaved and repeated, and reports:

- plain and speculative tok/s over all rows (whole run, prompt pass included) and in the steady state (rounds
  after the first, which also runs the prompts), per-request latency (time until a row's text is done);
- tokens per round per row (the batch commits its smallest accepted count + 1), tokens thrown away per round;
- the cost of one verification pass against the B×(γ+1) tokens it scores, one draft pass against B, one plain
  step against B;
- the prediction from those measured costs beside the measurement, and the crossover B where speculation stops
  paying on this machine.

Prediction (stated so it can be checked): with per-token acceptance α (pooled over the mode's runs), a row keeps
at least k guesses with probability α^k, so the batch's smallest accepted count m has E[m] = Σ_{k=1..γ} α^(kB) and each
row advances 1 + Σ_k α^(kB) tokens per round. Costs are straight-line fits of the measured passes: verify(n) =
a + b·n for n = B(γ+1) tokens, draft(B) and plain step(B) likewise. Then
  speculative tok/s = B (1 + Σ_k α^(kB)) / (γ draft(B) + verify(B(γ+1))),  plain tok/s = B / step(B),
and the predicted speedup is their ratio (specdec.core.speedup), compared with the measured steady-state speedup.
The fits extend past the largest measured B to name a predicted crossover that the sweep did not reach.

Loops side by side (`loops`, `--loops`): beside plain batched decoding, one run measures any of
- lockstep: specdec.loop.batched under commit="lockstep", every row commits the batch's smallest accepted count + 1 (the `spec_*` figures
  and the prediction above are this loop's, or the ragged loop's when lockstep is left out);
- ragged: the same loop under commit="ragged", every row commits its own accepted count + 1, fixed γ;
- scheduled: the ragged loop with γ per number of active rows from `specdec.loop.schedule` (γ = 0: speculation off).
- tree: token trees as ragged rows (`specdec.loop.tree_batch`, the default top-k tree shape): each row its own tree
  and accepted path, one batched target pass; its "γ" is the trees' depth.
  Its table is fixed before the measurement: per mode, α from a short ragged pilot run and the cost of target
  passes over B×k tokens and draft passes over B rows, timed on this machine (`calibrate`).
For each loop and B: tok/s over all rows, the speedup over plain, per-request latency (mean and p90), tokens per
round per row, guesses thrown away per round (drafted guesses that did not end up in the text: rejected, or
accepted but cut by lockstep or a stop), the verify pass's ms, and per loop the crossover B.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from specdec.bench.defaults import resolve
from specdec.bench.harness import (MODES, Column, Contender, fmt, interleaved, log, ratio, split_list, table,
                                   upper_median, warm_up, write_result)
from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.settings import DecodeSettings
from specdec.core.sampling import distribution
from specdec.core.settings import encode_prompt
from specdec.core.speedup import lockstep_tokens_per_row, speedup_from_costs
from specdec.drafters import resolve_draft_vocab
from specdec.core.kvcache import CachedLM
from specdec.loop.batched import (MAX_BATCH, BatchResult, plain_batch_decode, ragged_batch_decode,
                                  speculative_batch_decode)
from specdec.loop.tree_batch import tree_batch_decode
from specdec.loop.schedule import BatchCosts, gamma_for_batch, gamma_table, line_fit, off_from, schedule_fn

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
PREDICT_UP_TO = 64  # batch sizes the fitted cost model is evaluated at, to name a crossover past the sweep
LOOPS = ("lockstep", "ragged", "scheduled", "tree")  # the speculative loops measured beside plain batched decoding
LOOP_LABEL = {"plain": "plain", "lockstep": "lockstep", "ragged": "ragged", "scheduled": "ragged, scheduled γ",
              "tree": "tree rows"}
GAMMA_MAX = 8  # the longest draft the schedule may choose

# 16 prompts of different lengths (code and prose), so every batch above 1 has padded rows.
PROMPT_POOL = [
    "def fibonacci(n):",
    "The history of the printing press begins",
    "import numpy as np\n\ndef moving_average(x, k):",
    "Once upon a time, in a small village by the sea,",
    "class Stack:\n    \"\"\"A simple LIFO stack.\"\"\"\n\n    def __init__(self):",
    "Rain fell on the city all night, and by morning",
    "# Python: read a CSV file and print the sum of the 'amount' column\nimport csv\n",
    "The three laws of thermodynamics state that",
    "def is_prime(n: int) -> bool:",
    "In 1969, the first humans walked on the Moon. The mission",
    "SELECT name, COUNT(*) FROM orders",
    "A good commit message",
    "function debounce(fn, ms) {",
    "The recipe calls for two cups of flour, one egg and",
    "#include <stdio.h>\n\nint main(void) {",
    "Photosynthesis is the process by which",
]


def parse_batches(text: str) -> list[int]:
    """'1,2,4,8,16' -> [1, 2, 4, 8, 16]; each from 1 to MAX_BATCH, no repeats."""
    try:
        out = [int(x) for x in str(text).split(",") if x.strip()]
    except ValueError:
        raise InvalidInputError(f"--batch takes a comma list of whole numbers, e.g. 1,2,4,8,16; got {text!r}") from None
    if not out:
        raise InvalidInputError("--batch needs at least one batch size, e.g. 1,2,4,8,16")
    bad = [b for b in out if not 1 <= b <= MAX_BATCH]
    if bad:
        raise InvalidInputError(f"batch sizes must be from 1 to {MAX_BATCH}; got {bad}")
    if len(set(out)) != len(out):
        raise InvalidInputError(f"batch sizes repeat in {text!r}")
    return sorted(out)


# ------------------------------------------------------------------------------------------ measurement


def _steady_tok_s(res: BatchResult) -> float | None:
    """Tokens per second over rounds after the first (the first also runs the prompts)."""
    later = res.rounds[1:]
    ms = sum(r.round_ms for r in later)
    toks = sum(len(c) for r in later for c in r.committed)
    return 1e3 * toks / ms if ms else None


def parse_loops(text) -> list[str]:
    """'lockstep,ragged' (or a list) -> the loops to measure beside plain, in LOOPS order; refuses unknown names."""
    names = split_list(text) if isinstance(text, str) else list(text or [])
    bad = [n for n in names if n not in LOOPS]
    if bad:
        raise InvalidInputError(f"unknown loop(s) {', '.join(map(str, bad))}; choose from {', '.join(LOOPS)}")
    if not names:
        raise InvalidInputError(f"--loops needs at least one of {', '.join(LOOPS)}")
    return [n for n in LOOPS if n in names]


def _p90(xs: list[float]) -> float | None:
    """The 90th percentile (linear between order statistics, as numpy's default)."""
    return float(np.percentile(xs, 90)) if xs else None


def _wasted_per_round(res: BatchResult) -> float | None:
    """Drafted guesses that did not end up in the text, summed over the active rows, per round: rejected guesses,
    and accepted ones that lockstep (or a stop) cut."""
    if not res.rounds:
        return None
    total = 0
    for r in res.rounds:
        for b, a in enumerate(r.active):
            if a and r.gamma:
                total += r.gamma - (len(r.committed[b]) - int(bool(r.own[b])))
    return total / len(res.rounds)


def _summary(runs: list[BatchResult]) -> dict:
    """Median over repeats of each figure (repeats are separate runs of the same batch)."""
    stats = []
    for r in runs:
        s = r.stats()
        s["steady_tok_s"] = _steady_tok_s(r)
        s["mean_latency_ms"] = sum(r.latency_ms) / len(r.latency_ms)
        s["max_latency_ms"] = max(r.latency_ms)
        s["p90_latency_ms"] = _p90(r.latency_ms)
        s["wasted_per_round"] = _wasted_per_round(r)
        s["mean_gamma"] = sum(x.gamma for x in r.rounds) / len(r.rounds) if r.rounds else None
        stats.append(s)
    keys = ("tok_s", "steady_tok_s", "mean_latency_ms", "max_latency_ms", "p90_latency_ms", "tokens_per_round_per_row",
            "alpha", "thrown_per_round", "wasted_per_round", "mean_gamma", "verify_ms", "verify_tokens",
            "draft_pass_ms", "step_ms")
    out = {k: upper_median(s.get(k) for s in stats) for k in keys}
    out["tokens"] = sum(s["tokens"] for s in stats)
    out["kept"] = sum(s.get("kept") or 0 for s in stats)
    out["tested"] = sum(s.get("tested") or 0 for s in stats)
    return out


# ------------------------------------------------------------------------------------------ calibration


def _mode_of(settings: DecodeSettings) -> str:
    return next((m for m, cfg in MODES.items() if cfg == settings.sampling), "greedy")


@torch.inference_mode()
def measure_pass_costs(pair, batches: list[int], ks: list[int], cfg, repeats: int = 3,
                       draft_vocab: int | None = None) -> BatchCosts:
    """Median ms of a target pass scoring B rows × k tokens (+ the warp) after the first B prompts of PROMPT_POOL,
    and of a draft pass over B rows, for every B in batches and k in ks, through the scorer the batched loop runs on
    (`CachedLM.score` with its padding, masks included). The first pass of each shape is untimed (allocation, kernel choice)."""
    target_pts, draft_pts = [], []
    dev = pair.device
    for b in batches:
        ids = [encode_prompt(pair.tokenizer, p) for p in PROMPT_POOL[:b]]
        w = max(len(x) for x in ids)
        block = torch.tensor([[0] * (w - len(x)) + x for x in ids], device=dev)
        valid = torch.tensor([[False] * (w - len(x)) + [True] * len(x) for x in ids], device=dev)
        lms = (CachedLM(pair.target, pair.vocab_size),
               CachedLM(pair.draft, pair.vocab_size, resolve_draft_vocab(pair, draft_vocab), pair.eos_token_ids))
        for lm in lms:
            lm.score(block, pad=~valid, n_logits=1)
        target, draft = lms

        def timed(lm, k, b=b, block=block):
            fed, ok = block[:, -1:].expand(b, k), torch.ones(b, k, dtype=torch.bool, device=dev)  # values: no matter
            lm.score(fed, pad=~ok, n_logits=k)  # warm this shape
            lm.valid[:, -k:] = False
            lm.trim()
            times = []
            for _ in range(repeats):
                clock = Stopwatch(dev)
                distribution(lm.score(fed, pad=~ok, n_logits=k), cfg)
                times.append(clock.lap())
                lm.valid[:, -k:] = False
                lm.trim()
            return sorted(times)[len(times) // 2]

        for k in ks:
            target_pts.append((b * k, timed(target, k)))
        draft_pts.append((b, timed(draft, 1)))
    return BatchCosts.from_points(target_pts, draft_pts)


def calibrate(pair, batches: list[int], modes: list[str], gamma: int, gamma_max: int, max_new: int,
              draft_vocab: int | None = None, log: Callable[[str], None] = print) -> dict:
    """Per mode, the schedule the `scheduled` loop runs with: α pooled from a ragged pilot run (γ = `gamma`, the
    first min(4, max B) prompts, seed 1000 so no measured run repeats it), the measured pass costs, and the table
    {B: γ} over B = 1..max(batches) from `specdec.loop.schedule.gamma_table`, read from the costs' fitted lines
    (`BatchCosts.fitted`)."""
    ks = sorted({1, 2, 3, 5, gamma + 1, gamma_max + 1})
    out = {}
    for mode in modes:
        cfg = MODES[mode]
        pilot = ragged_batch_decode(pair, PROMPT_POOL[: min(4, max(batches))],
                                    DecodeSettings(gamma=gamma, max_new_tokens=max(8, max_new), sampling=cfg,
                                                   seed=1000, draft_vocab=draft_vocab))
        st = pilot.stats()
        alpha = st["alpha"] or 0.0
        costs = measure_pass_costs(pair, batches, ks, cfg, draft_vocab=draft_vocab).fitted()
        top = max(batches)
        table = gamma_table(alpha, costs, up_to=top, gamma_max=gamma_max)
        out[mode] = {
            "alpha": alpha, "costs": costs.to_dict(), "off_from": off_from(table),
            "table": [{"batch": b, "gamma": table[b],
                       "predicted_speedup": gamma_for_batch(b, alpha, costs, gamma_max)[1]} for b in range(1, top + 1)],
        }
        log(f"  schedule {mode}: alpha {alpha:.3f}; gamma by B " +
            " ".join(f"{b}:{table[b]}" for b in range(1, top + 1)) +
            (f"; off from B = {out[mode]['off_from']}" if out[mode]["off_from"] else ""))
    return out


def _table_of(schedule: dict, mode: str) -> dict[int, int]:
    return {int(e["batch"]): int(e["gamma"]) for e in schedule.get(mode, {}).get("table", [])}


def run_batches(pair, batches: list[int], modes: list[str], gamma: int, max_new: int, repeats: int,
                draft_vocab: int | None = None, log: Callable[[str], None] = print,
                progress: Callable[[float, str], None] | None = None, loops=LOOPS,
                gamma_max: int = GAMMA_MAX) -> dict:
    """Measure every (mode, B): plain and each of `loops` alternate (their order rotates each repeat), after a
    warm-up of all. Returns the JSON-ready result, predictions, schedules and crossovers included."""
    for m in modes:
        if m not in MODES:
            raise InvalidInputError(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    loops = parse_loops(loops)
    schedule = calibrate(pair, batches, modes, gamma, gamma_max, max_new, draft_vocab, log) \
        if "scheduled" in loops else {}

    def scheduled(prompts, s):
        return ragged_batch_decode(pair, prompts, s, gamma_for=schedule_fn(_table_of(schedule, _mode_of(s)), gamma))

    runners = {"lockstep": partial(speculative_batch_decode, pair), "ragged": partial(ragged_batch_decode, pair),
               "scheduled": scheduled, "tree": partial(tree_batch_decode, pair)}
    contenders = [Contender("plain", partial(plain_batch_decode, pair))] + [Contender(n, runners[n]) for n in loops]
    names = [c.name for c in contenders]
    warm_up(contenders, PROMPT_POOL[:2], DecodeSettings(gamma=gamma, draft_vocab=draft_vocab))
    groups = [(m, b) for m in modes for b in batches]
    runs: dict[tuple, dict[str, list[BatchResult]]] = {g: {n: [] for n in names} for g in groups}
    example = None
    ref = "lockstep" if "lockstep" in loops else loops[0]  # the loop the spec_* figures and the prediction use
    clock = Stopwatch(pair.device)
    for i, (mode, b) in enumerate(groups):
        prompts = PROMPT_POOL[:b]
        slot = runs[(mode, b)]
        for rep, _, order in interleaved([(mode, b)], contenders, repeats, offset=i):
            if progress is not None:
                done = (i * repeats + rep - 1) / (len(groups) * repeats)
                progress(done, f"{mode}, batch {b}, repeat {rep}/{repeats}")
            s = DecodeSettings(gamma=gamma, max_new_tokens=max_new, sampling=MODES[mode], seed=rep,
                               draft_vocab=draft_vocab)
            for c in order:
                res = c(prompts, s)
                slot[c.name].append(res)
                log(f"  {mode:7s} B={b:2d} rep {rep} {c.name:9s} {res.tokens:4d} tok {res.elapsed_ms / 1e3:6.2f} s "
                    f"{res.tok_s:7.2f} tok/s")
        if example is None or (mode == modes[-1] and b == min(4, max(batches))):
            example = {"mode": mode, "batch": b, "gamma": gamma, "prompts": prompts, "loop": ref,
                       "rounds": [r.to_dict() for r in slot[ref][-1].rounds]}
            for n in LOOPS:
                if n in slot:
                    example[f"{n}_rounds"] = [r.to_dict() for r in slot[n][-1].rounds]
    if progress is not None:
        progress(1.0, "done")
    rows = []
    for (mode, b), slot in runs.items():
        p = _summary(slot["plain"])
        sums = {n: _summary(slot[n]) for n in loops}
        s = sums[ref]
        row = {
            "mode": mode, "batch": b, "gamma": gamma,
            "plain_tok_s": p["tok_s"], "spec_tok_s": s["tok_s"],
            "speedup": ratio(s["tok_s"], p["tok_s"]),
            "plain_steady_tok_s": p["steady_tok_s"], "spec_steady_tok_s": s["steady_tok_s"],
            "steady_speedup": ratio(s["steady_tok_s"], p["steady_tok_s"]),
            "plain_latency_ms": p["mean_latency_ms"], "spec_latency_ms": s["mean_latency_ms"],
            "plain_max_latency_ms": p["max_latency_ms"], "spec_max_latency_ms": s["max_latency_ms"],
            "plain_p90_latency_ms": p["p90_latency_ms"],
            "tokens_per_round_per_row": s["tokens_per_round_per_row"], "alpha": s["alpha"],
            "accepted": s["kept"], "tested": s["tested"],  # the JSON name of the kept count
            "thrown_per_round": s["thrown_per_round"],
            "verify_ms": s["verify_ms"], "verify_tokens": s["verify_tokens"],
            "draft_pass_ms": s["draft_pass_ms"], "plain_step_ms": p["step_ms"],
        }
        for n, m in sums.items():
            row.update({
                f"{n}_tok_s": m["tok_s"], f"{n}_steady_tok_s": m["steady_tok_s"],
                f"{n}_speedup": ratio(m["tok_s"], p["tok_s"]),
                f"{n}_steady_speedup": ratio(m["steady_tok_s"], p["steady_tok_s"]),
                f"{n}_latency_ms": m["mean_latency_ms"], f"{n}_p90_latency_ms": m["p90_latency_ms"],
                f"{n}_tokens_per_round_per_row": m["tokens_per_round_per_row"], f"{n}_alpha": m["alpha"],
                f"{n}_wasted_per_round": m["wasted_per_round"], f"{n}_verify_ms": m["verify_ms"],
                f"{n}_mean_gamma": m["mean_gamma"],
            })
        if "scheduled" in loops:
            row["scheduled_gamma"] = _table_of(schedule, mode).get(b)
        rows.append(row)
    result = {
        "models": pair.describe(), "device": str(pair.device), "dtype": str(pair.dtype).replace("torch.", ""),
        "torch_threads": torch.get_num_threads(), "gamma": gamma, "max_new_tokens": max_new, "repeats": repeats,
        "batches": batches, "modes": modes, "draft_vocab": draft_vocab, "loops": loops, "reference_loop": ref,
        "gamma_max": gamma_max, "schedule": schedule, "rows": rows,
        "seconds": clock.total() / 1e3, "example": example,
    }
    add_predictions(result)
    return result


# ------------------------------------------------------------------------------------------- prediction


def predict(alpha: float, gamma: int, batch: int, fits: dict) -> dict:
    """Predicted tok/s of both loops and their ratio at one batch size, from the fitted per-pass costs (ms): the
    speedup model of specdec.core.speedup with the lockstep loop's tokens per row."""
    at = lambda f, x: max(f[0] + f[1] * x, 1e-9)  # noqa: E731  -- a fitted cost, never zero or negative
    tpr = lockstep_tokens_per_row(alpha, gamma, batch)
    draft_ms, verify_ms = at(fits["draft"], batch), at(fits["verify"], batch * (gamma + 1))
    plain_ms = at(fits["plain"], batch)
    plain = 1e3 * batch / plain_ms
    speedup = speedup_from_costs(tpr, gamma, draft_ms, verify_ms, plain_ms)
    return {"tokens_per_round_per_row": tpr, "spec_tok_s": plain * speedup, "plain_tok_s": plain, "speedup": speedup}


def crossover(points: list[tuple[int, float | None]]) -> int | None:
    """The smallest batch size from which speculation no longer pays (speedup < 1), or None if it always pays."""
    for b, s in sorted(points):
        if s is not None and s < 1.0:
            return b
    return None


def add_predictions(result: dict) -> None:
    """Per mode: pooled alpha, the three cost fits, predictions beside each measured row, both crossovers."""
    gamma = result["gamma"]
    result["fits"], result["crossover"], result["prediction_curve"] = {}, {}, {}
    for mode in result["modes"]:
        rows = [r for r in result["rows"] if r["mode"] == mode]
        tested = sum(r["tested"] for r in rows)
        alpha = sum(r["accepted"] for r in rows) / tested if tested else 0.0
        fits = {
            "verify": line_fit([r["verify_tokens"] for r in rows], [r["verify_ms"] for r in rows]),
            "draft": line_fit([r["batch"] for r in rows], [r["draft_pass_ms"] for r in rows]),
            "plain": line_fit([r["batch"] for r in rows], [r["plain_step_ms"] for r in rows]),
        }
        result["fits"][mode] = {"alpha": alpha, **fits}
        if any(f is None for f in fits.values()):
            continue
        for r in rows:
            pr = predict(alpha, gamma, r["batch"], fits)
            r.update({f"predicted_{k}": v for k, v in pr.items()})
        curve = [(b, predict(alpha, gamma, b, fits)["speedup"]) for b in range(1, PREDICT_UP_TO + 1)]
        result["prediction_curve"][mode] = [{"batch": b, "speedup": s} for b, s in curve]
        result["crossover"][mode] = {
            "measured": crossover([(r["batch"], r["speedup"]) for r in rows]),
            "measured_steady": crossover([(r["batch"], r["steady_speedup"]) for r in rows]),
            "predicted": crossover(curve),
        }
    add_loop_crossovers(result)


def add_loop_crossovers(result: dict) -> None:
    """Per mode and measured loop: the smallest B from which it no longer beats plain (whole run, steady state)."""
    result["loop_crossover"] = {}
    for mode in result["modes"]:
        rows = [r for r in result["rows"] if r["mode"] == mode]
        result["loop_crossover"][mode] = {
            n: {"measured": crossover([(r["batch"], r.get(f"{n}_speedup")) for r in rows]),
                "measured_steady": crossover([(r["batch"], r.get(f"{n}_steady_speedup")) for r in rows])}
            for n in result.get("loops", []) if any(f"{n}_speedup" in r for r in rows)}


# ------------------------------------------------------------------------------------------------ output


def _seconds(key: str) -> Callable[[dict], float | None]:
    return lambda r: None if r[key] is None else r[key] / 1e3


COLUMNS = [Column("mode", 7, "mode", "{}", left=True), Column("B", 3, "batch", "{:d}"),
           Column("plain", 7, "plain_tok_s"), Column("spec", 7, "spec_tok_s"), Column("speedup", 7, "speedup"),
           Column("steady", 6, "steady_speedup"), Column("pred", 5, "predicted_speedup"),
           Column("lat pl", 7, _seconds("plain_latency_ms")), Column("lat sp", 7, _seconds("spec_latency_ms")),
           Column("tok/rnd", 7, "tokens_per_round_per_row"), Column("pred", 5, "predicted_tokens_per_round_per_row"),
           Column("alpha", 5, "alpha"), Column("thrown", 6, "thrown_per_round", "{:.1f}"),
           Column("verify", 7, "verify_ms", "{:.1f}"), Column("B(g+1)", 6, "verify_tokens", "{:d}"),
           Column("draft", 6, "draft_pass_ms", "{:.1f}"), Column("step", 6, "plain_step_ms", "{:.1f}")]


def _loop_columns(loops: list[str]) -> list[Column]:
    short = {"lockstep": "lock", "ragged": "rag", "scheduled": "sched", "tree": "tree"}
    cols = [Column("mode", 7, "mode", "{}", left=True), Column("B", 3, "batch", "{:d}"),
            Column("plain", 7, "plain_tok_s"), Column("p90 pl", 6, _seconds("plain_p90_latency_ms"))]
    for n in loops:
        k = short[n]
        cols += [Column(k, 7, f"{n}_tok_s"), Column("×", 5, f"{n}_speedup"),
                 Column("lat", 6, _seconds(f"{n}_latency_ms")), Column("p90", 6, _seconds(f"{n}_p90_latency_ms")),
                 Column("t/rnd", 5, f"{n}_tokens_per_round_per_row"),
                 Column("waste", 5, f"{n}_wasted_per_round", "{:.1f}"),
                 Column("verify", 6, f"{n}_verify_ms", "{:.1f}")]
    if "scheduled" in loops:
        cols.append(Column("γ(B)", 4, "scheduled_gamma", "{:d}"))
    return cols


def format_loops(result: dict) -> list[str]:
    """The loops side by side (one line per mode and B), the schedules and every loop's crossover."""
    loops = result.get("loops") or []
    if not loops or not any(f"{loops[0]}_tok_s" in r for r in result["rows"]):
        return []
    lines = ["", "loops side by side: tok/s over all rows, × = tok/s over plain, lat/p90 = mean/p90 per-request "
             "latency (s), t/rnd = tokens per round per row, waste = guesses thrown away per round, verify = ms",
             *table(_loop_columns(loops), result["rows"], rule=True)]
    for mode, sc in (result.get("schedule") or {}).items():
        gs = " ".join(f"{e['batch']}:{e['gamma']}" for e in sc["table"])
        off = sc.get("off_from")
        lines.append(f"{mode}: schedule from alpha {sc['alpha']:.3f} and measured pass costs, γ by B {gs}" +
                     (f"; speculation off from B = {off}" if off else "; speculation on at every B"))
    for mode, by_loop in (result.get("loop_crossover") or {}).items():
        parts = [f"{LOOP_LABEL.get(n, n)} {_cx_words(cx.get('measured'))}" for n, cx in by_loop.items()]
        lines.append(f"{mode}: stops beating plain at: " + "; ".join(parts))
    return lines


def _cx_words(b) -> str:
    return "never in the sweep" if b is None else f"B = {b}"


def format_table(result: dict) -> str:
    lines = [f"gamma {result['gamma']}, {result['max_new_tokens']} new tokens per row, {result['repeats']} repeat(s), "
             f"{result['models'].get('name', '')} on {result['device']} ({result['dtype']}, "
             f"{result['torch_threads']} threads)",
             "tok/s over all rows; steady = rounds after the first; lat = mean per-request latency (s); "
             "verify/draft/step = ms per pass", *table(COLUMNS, result["rows"], rule=True)]
    for mode, fit in result["fits"].items():
        cx = result["crossover"].get(mode, {})
        lines.append(f"{mode}: alpha {fit['alpha']:.3f}; verify ≈ {_fit(fit['verify'])} ms per B(γ+1) tokens, "
                     f"draft ≈ {_fit(fit['draft'])} ms per B, plain step ≈ {_fit(fit['plain'])} ms per B")
        lines.append(f"{mode}: {crossover_sentence(cx, result['batches'])}")
    lines += format_loops(result)
    return "\n".join(lines)


def _fit(f) -> str:
    return fmt(f, "{0[0]:.1f} + {0[1]:.2f}·x")


def crossover_sentence(cx: dict, batches: list[int]) -> str:
    """Plain words for the crossover of one mode: measured and predicted."""
    top = max(batches)
    m, p = cx.get("measured"), cx.get("predicted")
    meas = (f"speculation stops paying at B = {m} (measured)" if m is not None
            else f"speculation still pays at every measured batch size (up to B = {top})")
    if p is None:
        pred = f"the cost model predicts it keeps paying up to B = {PREDICT_UP_TO}"
    elif p > top:
        pred = f"the cost model predicts the crossover at B = {p}, past the sweep"
    else:
        pred = f"the cost model predicts B = {p}"
    return f"{meas}; {pred}."


def cmd_batch_bench(args, load) -> int:
    """`python -m specdec bench --batch 1,2,4,8,16`: the table on stdout, the JSON result in --out."""
    batches = parse_batches(args.batch)
    run = resolve(args, "batch")
    modes, gamma, max_new, repeats = run.modes, run.fixed_gamma, run.max_new_tokens, run.repeats
    loops = parse_loops(getattr(args, "loops", None) or ",".join(LOOPS))
    gamma_max = getattr(args, "gamma_max", None) or GAMMA_MAX
    pair = load()
    result = run_batches(pair, batches, modes, gamma, max_new, repeats, args.draft_vocab, log, loops=loops,
                         gamma_max=gamma_max)
    print(format_table(result))
    write_result(result, run.out, note=f" ({result['seconds']:.0f} s of measurement)")
    return 0


def load_result(path_or_text) -> dict:
    """Read a bench JSON written by cmd_batch_bench (a path or the text itself); refuse anything else clearly."""
    try:
        text = Path(path_or_text).read_text() if not str(path_or_text).lstrip().startswith("{") else path_or_text
        data = json.loads(text)
    except (OSError, ValueError) as exc:
        raise InvalidInputError(f"could not read the batch benchmark file: {exc}") from None
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or "gamma" not in data:
        raise InvalidInputError("this is not a batch benchmark file (no 'rows'); write one with "
                                "`python -m specdec bench --batch 1,2,4,8,16`")
    if "fits" not in data:
        add_predictions(data)
    elif "loop_crossover" not in data:
        add_loop_crossovers(data)
    return data

