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
and the predicted speedup is their ratio, compared with the measured steady-state speedup. The fits extend past
the largest measured B to name a predicted crossover that the sweep did not reach.
"""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from scipy.optimize import nnls

from specdec.bench.harness import (MODES, Column, Contender, fmt, interleaved, log, ratio, split_list, table,
                                   upper_median, warm_up, write_result)
from specdec.core.clock import Stopwatch
from specdec.core.errors import InvalidInputError
from specdec.core.settings import DecodeSettings
from specdec.loop.batched import MAX_BATCH, BatchResult, plain_batch_decode, speculative_batch_decode

DEFAULT_BATCHES = (1, 2, 4, 8, 16)
DEFAULT_OUT = "bench-results/batch.json"
PREDICT_UP_TO = 64  # batch sizes the fitted cost model is evaluated at, to name a crossover past the sweep

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


def _summary(runs: list[BatchResult]) -> dict:
    """Median over repeats of each figure (repeats are separate runs of the same batch)."""
    stats = []
    for r in runs:
        s = r.stats()
        s["steady_tok_s"] = _steady_tok_s(r)
        s["mean_latency_ms"] = sum(r.latency_ms) / len(r.latency_ms)
        s["max_latency_ms"] = max(r.latency_ms)
        stats.append(s)
    keys = ("tok_s", "steady_tok_s", "mean_latency_ms", "max_latency_ms", "tokens_per_round_per_row", "alpha",
            "thrown_per_round", "verify_ms", "verify_tokens", "draft_pass_ms", "step_ms")
    out = {k: upper_median(s.get(k) for s in stats) for k in keys}
    out["tokens"] = sum(s["tokens"] for s in stats)
    out["accepted"] = sum(s.get("accepted") or 0 for s in stats)
    out["tested"] = sum(s.get("tested") or 0 for s in stats)
    return out


def run_batches(pair, batches: list[int], modes: list[str], gamma: int, max_new: int, repeats: int,
                draft_vocab: int | None = None, log: Callable[[str], None] = print,
                progress: Callable[[float, str], None] | None = None) -> dict:
    """Measure every (mode, B): plain and speculative runs alternate (their order flips each repeat), after a
    warm-up of both. Returns the JSON-ready result, predictions and crossovers included."""
    for m in modes:
        if m not in MODES:
            raise InvalidInputError(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    contenders = [Contender("plain", partial(plain_batch_decode, pair)),
                  Contender("spec", partial(speculative_batch_decode, pair))]
    warm_up(contenders, PROMPT_POOL[:2], DecodeSettings(gamma=gamma, draft_vocab=draft_vocab))
    groups = [(m, b) for m in modes for b in batches]
    runs: dict[tuple, dict[str, list[BatchResult]]] = {g: {"plain": [], "spec": []} for g in groups}
    example = None
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
                log(f"  {mode:7s} B={b:2d} rep {rep} {c.name:5s} {res.tokens:4d} tok {res.elapsed_ms / 1e3:6.2f} s "
                    f"{res.tok_s:7.2f} tok/s")
        if example is None or (mode == modes[-1] and b == min(4, max(batches))):
            example = {"mode": mode, "batch": b, "gamma": gamma, "prompts": prompts,
                       "rounds": [r.to_dict() for r in slot["spec"][-1].rounds]}
    if progress is not None:
        progress(1.0, "done")
    rows = []
    for (mode, b), slot in runs.items():
        p, s = _summary(slot["plain"]), _summary(slot["spec"])
        rows.append({
            "mode": mode, "batch": b, "gamma": gamma,
            "plain_tok_s": p["tok_s"], "spec_tok_s": s["tok_s"],
            "speedup": ratio(s["tok_s"], p["tok_s"]),
            "plain_steady_tok_s": p["steady_tok_s"], "spec_steady_tok_s": s["steady_tok_s"],
            "steady_speedup": ratio(s["steady_tok_s"], p["steady_tok_s"]),
            "plain_latency_ms": p["mean_latency_ms"], "spec_latency_ms": s["mean_latency_ms"],
            "plain_max_latency_ms": p["max_latency_ms"], "spec_max_latency_ms": s["max_latency_ms"],
            "tokens_per_round_per_row": s["tokens_per_round_per_row"], "alpha": s["alpha"],
            "accepted": s["accepted"], "tested": s["tested"],
            "thrown_per_round": s["thrown_per_round"],
            "verify_ms": s["verify_ms"], "verify_tokens": s["verify_tokens"],
            "draft_pass_ms": s["draft_pass_ms"], "plain_step_ms": p["step_ms"],
        })
    result = {
        "models": pair.describe(), "device": str(pair.device), "dtype": str(pair.dtype).replace("torch.", ""),
        "torch_threads": torch.get_num_threads(), "gamma": gamma, "max_new_tokens": max_new, "repeats": repeats,
        "batches": batches, "modes": modes, "draft_vocab": draft_vocab, "rows": rows,
        "seconds": clock.total() / 1e3, "example": example,
    }
    add_predictions(result)
    return result


# ------------------------------------------------------------------------------------------- prediction


def line_fit(xs: list[float], ys: list[float]) -> tuple[float, float] | None:
    """(intercept, slope) of the least-squares line through the points with both kept >= 0 (scipy's nnls): a pass
    costs a fixed part plus a part per token, neither negative. Timing noise could otherwise fit a negative
    intercept (absurd predictions at small B) or a falling cost. One distinct x gives a flat line at the mean."""
    pts = [(float(x), float(y)) for x, y in zip(xs, ys) if x is not None and y is not None]
    if not pts:
        return None
    if len({x for x, _ in pts}) == 1:
        return float(np.mean([y for _, y in pts])), 0.0
    a = np.array([[1.0, x] for x, _ in pts])
    (intercept, slope), _ = nnls(a, np.array([y for _, y in pts]))
    return float(intercept), float(slope)


def expected_tokens_per_row(alpha: float, gamma: int, batch: int) -> float:
    """1 + E[min over B rows of kept guesses] for i.i.d. per-token acceptance alpha: 1 + Σ_{k=1..γ} α^(kB)."""
    return 1.0 + sum(alpha ** (k * batch) for k in range(1, gamma + 1))


def predict(alpha: float, gamma: int, batch: int, fits: dict) -> dict:
    """Predicted tok/s of both loops and their ratio at one batch size, from the fitted per-pass costs (ms)."""
    at = lambda f, x: max(f[0] + f[1] * x, 1e-9)  # noqa: E731  -- a fitted cost, never zero or negative
    tpr = expected_tokens_per_row(alpha, gamma, batch)
    spec_ms = gamma * at(fits["draft"], batch) + at(fits["verify"], batch * (gamma + 1))
    spec = 1e3 * batch * tpr / spec_ms
    plain = 1e3 * batch / at(fits["plain"], batch)
    return {"tokens_per_round_per_row": tpr, "spec_tok_s": spec, "plain_tok_s": plain, "speedup": spec / plain}


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
    modes = split_list(args.modes)
    gamma = int(args.gamma) if str(args.gamma).isdigit() else 4
    max_new = args.max_new_tokens or 16  # the full sweep, both modes, in well under 10 min on 2 CPU cores (bf16)
    repeats = args.repeats or 1
    pair = load()
    result = run_batches(pair, batches, modes, gamma, max_new, repeats, args.draft_vocab, log)
    print(format_table(result))
    write_result(result, args.out, DEFAULT_OUT, f" ({result['seconds']:.0f} s of measurement)")
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
    return data

