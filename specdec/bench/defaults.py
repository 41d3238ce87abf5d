"""What each bench mode runs when a flag is left out: one table (`BENCH_DEFAULTS`) that every mode reads through
`resolve`, so a mode's prompt kinds, sampling modes, token budget, repeats and JSON file are stated once.

The command line leaves --kinds, --modes, --max-new-tokens, --repeats and --out unset (None) unless given, and
`resolve` fills each from the mode's row; --quick picks the first of each (quick, full) pair.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from specdec.core.errors import InvalidInputError
from specdec.prompts import SUITE

BENCH_OUT = "bench-results/bench.json"  # the side-by-side bench's file; every other mode has its own
BENCH_KINDS = "code,prose,chat"
BENCH_MODES = "greedy,sampled"
FIXED_GAMMA = 4  # the draft length of a mode that needs a fixed one when --gamma is "auto"
# The Learn tab reads the verification-rule bench's points from the repository's assets.
VERIFY_MODES_ASSET = str(Path(__file__).resolve().parents[2] / "assets" / "verify_modes.json")


@dataclass(frozen=True)
class ModeDefaults:
    out: str  # the JSON file ({drafter} is filled in by the drafter bench)
    kinds: str = BENCH_KINDS  # prompt kinds, comma-separated
    modes: str = BENCH_MODES  # sampling modes, comma-separated
    max_new_tokens: tuple[int, int] = (20, 64)  # (with --quick, without)
    repeats: tuple[int, int] = (1, 3)  # (with --quick, without)


BENCH_DEFAULTS: dict[str, ModeDefaults] = {
    "speed": ModeDefaults(BENCH_OUT),
    "drafter": ModeDefaults("bench-results/drafter-{drafter}.json", kinds="grounded", modes="greedy",
                            max_new_tokens=(24, 64), repeats=(1, 2)),
    # The full sweep, both sampling modes, in well under 10 min on 2 CPU cores (bf16); prompts from its own pool.
    "batch": ModeDefaults("bench-results/batch.json", max_new_tokens=(16, 16), repeats=(1, 1)),
    "tree": ModeDefaults("bench-results/trees.json", kinds="code,prose,chat,grounded", max_new_tokens=(20, 48),
                         repeats=(1, 1)),
    "suite": ModeDefaults("bench-results/suite.json", kinds=",".join(SUITE), modes="greedy", max_new_tokens=(24, 56),
                          repeats=(1, 1)),
    "engines": ModeDefaults("bench-results/engines.json", kinds="code,prose", modes="greedy", max_new_tokens=(24, 48),
                            repeats=(1, 2)),
    "quant-draft": ModeDefaults("bench-results/quant-draft.json", kinds="code,prose,chat,grounded", modes="greedy",
                                max_new_tokens=(20, 64), repeats=(1, 3)),
    "verify-modes": ModeDefaults(VERIFY_MODES_ASSET, max_new_tokens=(32, 32), repeats=(1, 1)),
    "predicted": ModeDefaults("bench-results/predicted.json", max_new_tokens=(48, 128), repeats=(1, 1)),
    "overhead": ModeDefaults("bench-results/overhead.json", max_new_tokens=(24, 48), repeats=(1, 1)),
}


@dataclass(frozen=True)
class BenchRun:
    """A mode's flags with every default filled in from its row of BENCH_DEFAULTS."""

    quick: bool
    kinds: list[str]
    modes: list[str]
    max_new_tokens: int
    repeats: int
    gamma: int | None  # --gamma as a whole number; None for "auto" (see `fixed_gamma`)
    out: str

    @property
    def fixed_gamma(self) -> int:
        """--gamma, or FIXED_GAMMA when it was "auto", for modes that run one draft length."""
        return FIXED_GAMMA if self.gamma is None else self.gamma


def _items(text: str) -> list[str]:
    return [x for x in str(text).split(",") if x]


def resolve(args, mode: str) -> BenchRun:
    """The flags of `args` (an argparse namespace from specdec.bench.cli) for bench `mode`, defaults filled in."""
    d = BENCH_DEFAULTS[mode]
    quick = bool(getattr(args, "quick", False))
    pick = 0 if quick else 1
    max_new, repeats = getattr(args, "max_new_tokens", None), getattr(args, "repeats", None)
    gamma = str(getattr(args, "gamma", "auto"))
    if not gamma.isdigit() and gamma != "auto":
        raise InvalidInputError(f"--gamma must be a whole number or 'auto', got {gamma!r}")
    out = getattr(args, "out", None) or d.out.format(drafter=getattr(args, "drafter", None))
    return BenchRun(quick=quick, kinds=_items(getattr(args, "kinds", None) or d.kinds),
                    modes=_items(getattr(args, "modes", None) or d.modes),
                    max_new_tokens=max_new or d.max_new_tokens[pick], repeats=repeats or d.repeats[pick],
                    gamma=int(gamma) if gamma.isdigit() else None, out=out)
