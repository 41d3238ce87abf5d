"""Is the command line's first run as fast as a warm one? `generate --compare` in a fresh process (every call is a
first run: the pair loads, then plain decoding and the speculative run each meet their pass widths for the first
time) against the same command run again inside one process (warm), for the grounded examples.

    python scripts/cli_first_run.py                 # the app's default pair, the three first grounded examples
    python scripts/cli_first_run.py --pair tiny     # the random-weight test pair (seconds)

Reports per prompt the fresh and the warm speedup (speculative tok/s over plain tok/s, as `--compare` prints
them) and their ratio; JSON on stdout and to --out.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def command(example: dict, pair: str, max_new: int) -> list[str]:
    """The `generate --compare --json` arguments for one playground example."""
    args = ["generate", "--pair", pair, "--prompt", example["prompt"], "--drafter", example["drafter"],
            "--gamma", str(example["gamma"]), "--temperature", str(example["temperature"]),
            "--max-new-tokens", str(max_new), "--compare", "--json"]
    return args + (["--chat"] if example.get("chat") else [])


def summary_of(stdout: str) -> dict:
    """The run's summary: the last JSON line `generate --json` prints."""
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    doc = json.loads(lines[-1])
    if "speedup" not in doc:
        raise ValueError("no speedup in the summary: was --compare given?")
    return doc


def fresh(args: list[str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "specdec", *args], cwd=ROOT, capture_output=True, text=True,
                          check=True)
    return summary_of(proc.stdout)


def warm(args: list[str], times: int = 2) -> dict:
    """The same command `times` times in this process (the pair is loaded once and shared); the last one."""
    from specdec.cli import main

    for _ in range(times):
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            if main(args) != 0:
                raise RuntimeError("generate failed")
    return summary_of(out.getvalue())


def compare_row(label: str, firsts: list[dict], agains: list[dict]) -> dict:
    """One prompt's fresh runs against its warm ones: the median speedup of each side and their ratio; the median
    of the ratios repeat by repeat (each fresh run beside the warm run made right after it, so a machine that
    drifts faster or slower over the minutes of the check moves both alike); every speedup listed, and whether
    every run gave the same text."""
    def med(xs):
        return statistics.median(xs)

    fresh_s, warm_s = [x["speedup"] for x in firsts], [x["speedup"] for x in agains]
    return {"example": label, "fresh_speedup": med(fresh_s), "warm_speedup": med(warm_s),
            "fresh_over_warm": med(fresh_s) / med(warm_s),
            "fresh_over_warm_paired": med([f / w for f, w in zip(fresh_s, warm_s)]),
            "same_text": len({x["text"] for x in firsts + agains}) == 1,
            "fresh_tok_s": med([x["speculative_tok_s"] for x in firsts]),
            "warm_tok_s": med([x["speculative_tok_s"] for x in agains]),
            "fresh_speedups": fresh_s, "warm_speedups": warm_s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", default=None, help="pair preset (default: the app's default pair)")
    ap.add_argument("--examples", type=int, default=3, help="how many grounded examples (prompts.GROUNDED)")
    ap.add_argument("--max-new", type=int, default=64, help="tokens per run")
    ap.add_argument("--repeats", type=int, default=1,
                    help="fresh processes and warm runs per prompt; the medians are compared (each --compare "
                         "speedup is one plain run against one speculative run)")
    ap.add_argument("--out", default=str(ROOT / "bench-results" / "cli-first-run.json"))
    args = ap.parse_args(argv)

    from specdec.models.pair import cpu_name
    from specdec.prompts import GROUNDED
    from ui.loader import default_pair_name

    pair = args.pair or default_pair_name()
    rows = []
    for ex in GROUNDED[: args.examples]:
        cmd = command(ex, pair, args.max_new)
        firsts, agains = [], []
        for _ in range(max(1, args.repeats)):
            firsts.append(fresh(cmd))
            agains.append(warm(cmd))
        rows.append(compare_row(ex["label"], firsts, agains))
        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    doc = {"pair": pair, "max_new_tokens": args.max_new, "cpu": cpu_name(), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
