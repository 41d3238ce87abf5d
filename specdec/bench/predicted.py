"""Predicted-output benchmark (`python -m specdec bench --predicted`): light edits of a given text, where the user
can hand the original text to the decoder as the expected output.

Per edit task, greedy, interleaved and rotated round-robin (plain, ngram, predicted, then ngram, predicted, plain,
...) on the same pair, prompt and gamma:
- plain: our target-only decoding (specdec.loop.decoder.plain_decode);
- ngram: prompt lookup WITHOUT a prediction (the original text is in the prompt, so it can copy from it too);
- predicted: the original text as the prediction.
Reported per task and pooled: how much of the output the prediction covers (tokens of the output inside blocks
that also occur, in order, in the prediction, by difflib), tokens per target pass, tok/s, and the predicted
drafter's speedup over plain and over ngram. The headline pools only the tasks whose output is >= 80 % covered
(the case predicted output is for); the others are listed, not hidden.
"""

from __future__ import annotations

import difflib
from dataclasses import replace
from functools import partial

import torch

from specdec.bench.defaults import resolve
from specdec.bench.harness import (Column, Contender, Timed, interleaved, log, ratio, table, timed_plain, timed_spec,
                                   upper_median, warm_up, write_result)
from specdec.core.errors import InvalidInputError
from specdec.core.metrics import summarize
from specdec.core.settings import DecodeSettings, encode_prompt

MIN_COVERAGE = 0.8
CONTENDERS = ("plain", "ngram", "predicted")

_SCALE = '''def scale(values, factor):
    out = []
    for v in values:
        out.append(v * factor)
    return out
'''
_TOTAL = '''def total_price(items, tax_rate):
    """Sum the prices of the items and add the tax."""
    t = 0.0
    for item in items:
        t += item["price"] * item["quantity"]
    return round(t * (1 + tax_rate), 2)
'''
_WORDS = '''def count_words(path):
    counts = {}
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            for word in line.lower().split():
                word = word.strip(".,;:!?\\"'()")
                if word:
                    counts[word] = counts.get(word, 0) + 1
    return sorted(counts.items(), key=lambda kv: kv[1], reverse=True)
'''
_PARA = ("The lighthouse stood on a rock at the edge of the bay. Every evening the keeper climbed the stairs, "
         "lit the lamp and wrote the weather in his log. Ships passed in the night and never knew his name, but "
         "they trusted the light, and that was enough for him.")


def _fenced(code: str) -> str:
    return f"```python\n{code}```"


# (name, chat request, prediction). The prediction is what the user expects back: the original text, as the model
# will quote it (code in a fence).
TASKS = [
    ("rename a variable", f"Rename the variable `t` to `subtotal` in this function. Reply with the code only.\n\n"
                          f"{_fenced(_TOTAL)}", _fenced(_TOTAL)),
    ("add type hints", f"Add type hints to this function and change nothing else. Reply with the code only.\n\n"
                       f"{_fenced(_SCALE)}", _fenced(_SCALE)),
    ("add a docstring", f"Add a one-line docstring to this function and change nothing else. Reply with the code "
                        f"only.\n\n{_fenced(_WORDS)}", _fenced(_WORDS)),
    ("fix one word", f"Replace the word \"rock\" with \"cliff\" in this paragraph and change nothing else. Reply with "
                     f"the paragraph only.\n\n{_PARA}", _PARA),
]


def coverage(output_ids: list[int], prediction_ids: list[int]) -> float:
    """Share of the output's tokens that lie in blocks it shares, in order, with the prediction."""
    if not output_ids:
        return 0.0
    sm = difflib.SequenceMatcher(None, prediction_ids, output_ids, autojunk=False)
    return sum(b.size for b in sm.get_matching_blocks()) / len(output_ids)


def task_contenders(pair, prediction: str) -> list[Contender]:
    """plain, ngram (no prediction) and predicted (the original text as the prediction) on one task."""
    return [Contender("plain", partial(timed_plain, pair)),
            Contender("ngram", lambda p, s: timed_spec(pair, p, replace(s, drafter="ngram"))),
            Contender("predicted", lambda p, s: timed_spec(pair, p, replace(s, drafter="predicted",
                                                                             prediction=prediction)))]


def figures(runs: list[Timed], ref: list[int]) -> dict:
    """One contender's row on a task: the median time of its repeats, tokens per target pass, acceptance, and
    whether every repeat wrote the plain loop's text `ref`."""
    secs = upper_median(x.seconds for x in runs)
    x = runs[0]  # greedy: every repeat commits the same tokens in the same rounds
    m = summarize(x.rounds)
    passes = m.rounds if x.rounds else x.tokens  # one target pass per round; the plain loop: one per token
    return {"seconds": secs, "tokens": x.tokens, "passes": passes, "tok_s": x.tokens / secs if secs else 0.0,
            "tokens_per_pass": x.tokens / passes if passes else 0.0,
            "acceptance": m.kept_rate if m.drafted else None,
            "same_text": all(y.ids == ref for y in runs)}


def run_task(pair, request: str, prediction: str, gamma: int, max_new: int, repeats: int, offset: int) -> dict:
    """All contenders on one task, `repeats` times, in an order rotated by repeat and task; medians of the times."""
    prompt = [{"role": "user", "content": request}]
    base = DecodeSettings(max_new_tokens=max_new, chat=True, gamma=gamma)
    runs: dict[str, list[Timed]] = {k: [] for k in CONTENDERS}
    for _, _, order in interleaved([prompt], task_contenders(pair, prediction), repeats, offset):
        for c in order:
            runs[c.name].append(c(prompt, base))
    ref = runs["plain"][0].ids
    pred_ids = pair.tokenizer(prediction, add_special_tokens=False)["input_ids"]
    row = {"coverage": coverage(ref, pred_ids), "tokens": len(ref), "prompt_tokens": len(encode_prompt(
        pair.tokenizer, prompt, True)), "text": pair.tokenizer.decode(ref, skip_special_tokens=True)}
    for name, rs in runs.items():
        row[name] = figures(rs, ref)
    return row


def pooled(rows: list[dict]) -> dict | None:
    """Totals over tasks: tokens over the summed median times, tokens over summed target passes."""
    if not rows:
        return None
    out = {}
    for name in CONTENDERS:
        tokens = sum(r[name]["tokens"] for r in rows)
        secs = sum(r[name]["seconds"] for r in rows)
        passes = sum(r[name]["passes"] for r in rows)
        out[name] = {"tok_s": tokens / secs if secs else 0.0, "tokens_per_pass": tokens / passes if passes else 0.0}
    out["predicted/plain"] = out["predicted"]["tok_s"] / out["plain"]["tok_s"]
    out["predicted/ngram"] = out["predicted"]["tok_s"] / out["ngram"]["tok_s"]
    out["ngram/plain"] = out["ngram"]["tok_s"] / out["plain"]["tok_s"]
    return out


def _same(r: dict) -> str:
    return "yes" if all(r[k]["same_text"] for k in CONTENDERS) else "NO"


BAR = Column("|", 1, lambda r: "|", "{}")
COLUMNS = [Column("task", 18, "task", "{}", left=True), Column("cover", 5, "coverage", "{:.0%}"),
           Column("tok", 4, "tokens", "{:d}"), BAR, Column("tok/s plain", 11, lambda r: r["plain"]["tok_s"]),
           Column("ngram", 6, lambda r: r["ngram"]["tok_s"]), Column("pred", 6, lambda r: r["predicted"]["tok_s"]), BAR,
           Column("tok/pass ngram", 14, lambda r: r["ngram"]["tokens_per_pass"]),
           Column("pred", 5, lambda r: r["predicted"]["tokens_per_pass"]), BAR,
           Column("pred/plain", 10, lambda r: ratio(r["predicted"]["tok_s"], r["plain"]["tok_s"])),
           Column("pred/ngram", 10, lambda r: ratio(r["predicted"]["tok_s"], r["ngram"]["tok_s"])),
           Column("same", 4, _same, "{}")]


def cmd_predicted_bench(args, load) -> int:
    run = resolve(args, "predicted")
    if run.gamma is None:
        raise InvalidInputError(f"--predicted takes a fixed --gamma (a whole number), got {args.gamma!r}")
    # 128 tokens lets each edited text end by itself (EOS); one repeat keeps a full run near 4 minutes on 2 cores
    # (the plain runs dominate): pass --repeats 3 on a quiet machine for medians.
    gamma, max_new, repeats = run.gamma, run.max_new_tokens, run.repeats
    tasks = TASKS[:1] if run.quick else TASKS
    pair = load()
    warm_up(task_contenders(pair, tasks[0][2]), [{"role": "user", "content": tasks[0][1]}],
            DecodeSettings(chat=True, gamma=gamma))
    rows = []
    for i, (name, request, prediction) in enumerate(tasks):
        log(f"[{i + 1}/{len(tasks)}] {name}")
        row = run_task(pair, request, prediction, gamma, max_new, repeats, i)
        row["task"] = name
        rows.append(row)
    covered = [r for r in rows if r["coverage"] >= MIN_COVERAGE]
    result = {"models": pair.describe(), "gamma": gamma, "max_new_tokens": max_new, "repeats": repeats,
              "torch_threads": torch.get_num_threads(), "min_coverage": MIN_COVERAGE, "tasks": rows,
              "pooled_covered": pooled(covered), "pooled_all": pooled(rows)}
    print(f"greedy, gamma = {gamma}, up to {max_new} new tokens, median of {repeats} interleaved repeat(s)")
    print("\n".join(table(COLUMNS, rows)))
    for label, key in ((f"pooled, coverage >= {MIN_COVERAGE:.0%} ({len(covered)} tasks)", "pooled_covered"),
                       (f"pooled, all tasks ({len(rows)})", "pooled_all")):
        p = result[key]
        if p:
            print(f"{label}: tokens/pass ngram {p['ngram']['tokens_per_pass']:.2f}, predicted "
                  f"{p['predicted']['tokens_per_pass']:.2f}; speedup predicted/plain {p['predicted/plain']:.2f}x, "
                  f"predicted/ngram {p['predicted/ngram']:.2f}x, ngram/plain {p['ngram/plain']:.2f}x")
    write_result(result, run.out)
    return 0
