"""What drawing the rounds costs next to generating them: the side-by-side bench, then the app's renderers.

    python scripts/render_overhead.py --quick            # the flags of `python -m specdec bench` (side by side)

Runs `python -m specdec bench` with the same flags (its table and JSON), then replays the rounds of its timed
speculative runs through the app's renderers (tokens, phases, stats and both charts for every round: the worst
case, the app redraws charts at most once a second) and compares the render time with the generation time of
those same rounds. The JSON gains "render": {render_ms, generation_ms, fraction}. It lives here, outside the
package's layers, because the bench (specdec.bench) may not import the app's components.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from components import pq_figure, render_phases, render_round, render_stats, speedup_figure  # noqa: E402
from specdec.bench.harness import log  # noqa: E402
from specdec.bench.speed import cmd_speed  # noqa: E402
from specdec.cli import build_parser, load_from_args  # noqa: E402
from specdec.core.clock import Stopwatch  # noqa: E402
from specdec.core.errors import SpecDecError  # noqa: E402
from specdec.core.events import Round  # noqa: E402
from specdec.core.metrics import summarize  # noqa: E402

OTHER_MODES = ("drafter", "batch", "predicted", "overhead", "sweep_gamma")


def render_overhead(runs: list[list[Round]], costs) -> dict:
    """Render every round of every run as the app would and compare with the rounds' own generation time."""
    gen_ms = render_ms = 0.0
    for rounds in runs:
        for i, rnd in enumerate(rounds):
            clock = Stopwatch(torch.device("cpu"))
            render_round(rnd)
            render_phases(rnd)
            render_stats(summarize(rounds[: i + 1], costs))
            pq_figure(rnd, rnd.rejected_at or 0).to_json()
            speedup_figure(rounds[: i + 1], costs).to_json()
            render_ms += clock.total()
            gen_ms += rnd.round_ms
    frac = render_ms / gen_ms if gen_ms else 0.0
    log(f"render overhead: {render_ms:.0f} ms rendering vs {gen_ms:.0f} ms generating = {frac:.2%}")
    return {"render_ms": render_ms, "generation_ms": gen_ms, "fraction": frac}


def add_render(samples, costs) -> dict:
    """The bench's hook: the "render" entry of its JSON, and the line under its table."""
    render = render_overhead([x.rounds for x in samples if x.rounds], costs)
    print(f"render overhead (app components, charts every round): {render['fraction']:.2%} of generation time")
    return {"render": render}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    other = [f"--{name.replace('_', '-')}" for name in OTHER_MODES if getattr(args, name)]
    other += ["--gamma auto"] if args.gamma == "auto" else []
    if other:
        print(f"error: render overhead replays the side-by-side bench's rounds; drop {', '.join(other)}",
              file=sys.stderr)
        return 2
    try:
        return cmd_speed(args, lambda: load_from_args(args), extra=add_render)
    except SpecDecError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
