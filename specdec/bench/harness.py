"""What every bench mode shares, written once.

- Contenders (a name and a run) take turns on each job, the order rotated by one per job and per repeat, so all
  of them see the same machine drift and none always runs first (`interleaved`); each runs once, briefly, before
  timing starts (`warm_up`).
- Timed runs of our plain loop, our speculative loop and transformers' `generate()` on the one clock
  (specdec.core.clock), as `Timed` (the tokens, the seconds, our loop's rounds).
- The sampling modes ("greedy", "sampled" = temperature 0.7), medians, ratios, number formatting, tables, and the
  JSON result written at the end (`write_result`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import torch

from specdec.bench.defaults import BENCH_OUT
from specdec.core.clock import Stopwatch
from specdec.core.events import Round
from specdec.core.metrics import RunMetrics, StepCosts, summarize
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings, encode_prompt
from specdec.drafters import make_drafter
from specdec.loop.decoder import SpeculativeDecoder
from specdec.loop.plain import plain_decode
from specdec.models.prepack import plain_kernels

MODES = {"greedy": SamplingConfig(), "sampled": SamplingConfig(temperature=0.7)}
WARM_UP_TOKENS = 4
# Our timed loop builds the display candidates as the app's would, so a comparison includes that work (its share is
# measured separately by scripts/render_overhead.py and by `--overhead`).
TIMED_TOP_K = 8


def log(message: str) -> None:
    """Progress goes to stderr; tables go to stdout."""
    print(message, file=sys.stderr, flush=True)


def split_list(text: str) -> list[str]:
    """'a,b,,c' -> ['a', 'b', 'c']."""
    return [x for x in str(text).split(",") if x]


def sampling_for(mode: str) -> SamplingConfig:
    """A mode's sampling: "sampled" is temperature 0.7, anything else greedy."""
    return MODES["sampled"] if mode == "sampled" else MODES["greedy"]


# ------------------------------------------------------------------------------------------- the schedule


@dataclass(frozen=True)
class Contender:
    """One way of decoding a prompt: `run(prompt, settings)`; calling the contender calls its run."""

    name: str
    run: Callable

    def __call__(self, prompt, settings: DecodeSettings):
        return self.run(prompt, settings)


@dataclass(frozen=True)
class Job:
    """One prompt in one sampling mode."""

    kind: str
    mode: str
    prompt: object
    chat: bool


def jobs_for(prompts: dict[str, list[tuple[object, bool]]], modes: list[str]) -> list[Job]:
    """Every (prompt, chat) of every kind in every mode, in benchmark order (mode, then kind, then prompt)."""
    return [Job(kind, mode, p, chat) for mode in modes for kind in prompts for p, chat in prompts[kind]]


def rotated(seq: Sequence, k: int) -> list:
    """The k-th rotation: A B C D, then B C D A, ..."""
    seq = list(seq)
    k %= len(seq)
    return seq[k:] + seq[:k]


def interleaved(jobs: Sequence, contenders: Sequence, repeats: int, offset: int = 0
                ) -> Iterator[tuple[int, object, list]]:
    """(repeat, job, contenders in run order) for repeats 1..repeats, every job in turn; the k-th job of repeat r
    starts with contender (offset + k + r - 1), so no contender always runs first."""
    for rep in range(1, repeats + 1):
        for k, job in enumerate(jobs):
            yield rep, job, rotated(contenders, offset + k + rep - 1)


def warm_up(contenders: Sequence[Callable], prompt, settings: DecodeSettings) -> None:
    """First calls pay one-time allocation and dispatch costs: every contender once, a few tokens, untimed."""
    short = replace(settings, max_new_tokens=WARM_UP_TOKENS)
    for run in contenders:
        run(prompt, short)


# ---------------------------------------------------------------------------------------------- timed runs


@dataclass(frozen=True)
class Timed:
    """One timed run: the tokens it produced, its wall time and (our speculative loop) its rounds."""

    ids: list[int]
    seconds: float
    rounds: list[Round] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return len(self.ids)


def timed_plain(pair, prompt, s: DecodeSettings) -> Timed:
    """Our plain target-only decoding."""
    clock = Stopwatch(pair.device)
    res = plain_decode(pair, prompt, s)
    return Timed(res.ids, clock.total() / 1e3)


def timed_spec(pair, prompt, s: DecodeSettings, hybrid_lead: str = "copy") -> Timed:
    """Our speculative loop, display candidates included (TIMED_TOP_K); `hybrid_lead` as in make_drafter."""
    clock = Stopwatch(pair.device)
    drafter = None
    if hybrid_lead != "copy":
        drafter = make_drafter(pair, s, encode_prompt(pair.tokenizer, prompt, s.chat), hybrid_lead=hybrid_lead)
    dec = SpeculativeDecoder(pair, prompt, s, drafter=drafter, top_k=TIMED_TOP_K)
    for _ in dec:
        pass
    return Timed(dec.generated_ids, clock.total() / 1e3, dec.rounds)


def hf_sampling(s: DecodeSettings) -> dict:
    """The run's sampling as generate() keyword arguments."""
    cfg = s.sampling
    if cfg.greedy:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": cfg.temperature, "top_k": cfg.top_k or None, "top_p": cfg.top_p}


def constant_gamma(config, gamma: int):
    """A copy of a generation config whose assistant drafts `gamma` tokens every round, with no confidence stop."""
    gc = copy.deepcopy(config)
    gc.num_assistant_tokens, gc.num_assistant_tokens_schedule = gamma, "constant"
    gc.assistant_confidence_threshold = 0.0
    return gc


def assistant_for(draft: torch.nn.Module, gamma: int) -> torch.nn.Module:
    """The draft as transformers' assisted generation should run it here (constant gamma, no confidence stop).

    transformers reads these knobs from the assistant's generation_config; a shallow copy of the module with its
    own config changes them without touching the shared pair (the weights are the same objects)."""
    view = copy.copy(draft)
    view.generation_config = constant_gamma(draft.generation_config, gamma)
    return view


@torch.inference_mode()
def timed_generate(pair, prompt, s: DecodeSettings, knobs=None, **extra) -> Timed:
    """transformers' generate() on the target with the run's sampling and seed; `extra` adds its own drafting
    (assistant_model=..., prompt_lookup_num_tokens=...), `knobs` a context held around the timed call.
    transformers runs as it ships: on F.linear, not on this engine's prepacked kernels (models.prepack)."""
    ids = torch.tensor([encode_prompt(pair.tokenizer, prompt, s.chat)], device=pair.device)
    torch.manual_seed(s.seed)
    with knobs or contextlib.nullcontext(), plain_kernels():
        clock = Stopwatch(pair.device)
        out = pair.target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=s.max_new_tokens,
                                   min_new_tokens=0, pad_token_id=pair.tokenizer.pad_token_id, **hf_sampling(s),
                                   **extra)
        seconds = clock.total() / 1e3
    return Timed(out[0, ids.shape[1]:].tolist(), seconds)


# ------------------------------------------------------------------------------------------------ samples


@dataclass
class Sample:
    contender: str
    kind: str
    mode: str
    prompt: str
    tokens: int
    seconds: float
    rounds: list[Round] = field(default_factory=list)  # our speculative loop's rounds (empty for other contenders)

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def to_json(self, prompt_chars: int | None = None) -> dict:
        return {"contender": self.contender, "kind": self.kind, "mode": self.mode, "prompt": self.prompt[:prompt_chars],
                "tokens": self.tokens, "seconds": self.seconds, "rounds": len(self.rounds)}


def progress_line(rep: int, x: Sample) -> str:
    line = (f"  rep {rep} {x.mode:7s} {x.kind:8s} {x.contender:11s} {x.tokens:3d} tok {x.seconds:6.2f} s  "
            f"{x.tok_s:6.2f} tok/s")
    return line + (f"  mean gamma {summarize(x.rounds).mean_gamma:.1f}" if x.rounds else "")


def run_interleaved(jobs: list[Job], contenders: list[Contender], repeats: int, base: DecodeSettings,
                    say: Callable[[str], None] = log) -> list[Sample]:
    """Warm up, then every contender on every job, `repeats` times, interleaved and rotated; the seed of a run is
    its repeat's number."""
    warm_up(contenders, jobs[0].prompt, replace(base, chat=jobs[0].chat))
    samples = []
    for rep, job, order in interleaved(jobs, contenders, repeats):
        s = replace(base, sampling=sampling_for(job.mode), seed=rep, chat=job.chat)
        for c in order:
            t = c(job.prompt, s)
            samples.append(Sample(c.name, job.kind, job.mode, job.prompt, t.tokens, t.seconds, list(t.rounds)))
            say(progress_line(rep, samples[-1]))
    return samples


def of(samples: list[Sample], name: str) -> list[Sample]:
    """One contender's samples."""
    return [x for x in samples if x.contender == name]


def by_group(samples: list[Sample], modes: list[str], kinds: list[str]) -> dict[str, list[Sample]]:
    """Samples per "mode/kind" group."""
    return {f"{m}/{k}": [x for x in samples if (x.mode, x.kind) == (m, k)] for m in modes for k in kinds}


# ----------------------------------------------------------------------------------------------- figures


def middle(items: Sequence, key=None):
    """The middle item when sorted (a real one: the upper of an even count)."""
    items = sorted(items, key=key)
    return items[len(items) // 2]


def upper_median(values) -> float | None:
    """The middle of the values that are not None (the upper of an even count); None if there are none."""
    values = [v for v in values if v is not None]
    return middle(values) if values else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, or None when either is missing or b is zero."""
    return None if a is None or not b else a / b


def pooled_tok_s(samples: list[Sample]) -> float:
    """Total tokens over total seconds."""
    secs = sum(x.seconds for x in samples)
    return sum(x.tokens for x in samples) / secs if secs else 0.0


def median_tok_s(samples: list[Sample]) -> float:
    """Median over repeats per (prompt, mode), then summed across prompts: total tokens over total time of the
    median runs, so a long prompt counts for its tokens and one noisy repeat does not move the result."""
    runs: dict[tuple, list[Sample]] = {}
    for x in samples:
        runs.setdefault((x.prompt, x.mode), []).append(x)
    return pooled_tok_s([middle(rs, key=lambda x: x.tok_s) for rs in runs.values()])


def spec_metrics(samples: list[Sample], costs: StepCosts | None = None) -> RunMetrics:
    """Acceptance, c_loop and the predicted speedup of our loop's timed runs, pooled (specdec.core.metrics)."""
    return summarize([r for x in samples for r in x.rounds], costs)


def compare(samples: list[Sample], names: Sequence[str], ratios: dict[str, tuple[str, str]]) -> dict:
    """Median tok/s per contender ("tok_s") and the named ratios of them ("a/b": (a, b))."""
    tok_s = {k: median_tok_s(of(samples, k)) for k in names}
    return {"tok_s": tok_s, **{label: ratio(tok_s[a], tok_s[b]) for label, (a, b) in ratios.items()}}


def loop_figures(m: RunMetrics) -> dict:
    """Our loop's alpha, tokens per round, mean gamma, c_loop and predicted speedup; None where nothing counts."""
    return {"alpha": m.alpha if m.tested else None, "tokens_per_round": m.tokens_per_round if m.rounds else None,
            "mean_gamma": m.mean_gamma if m.rounds else None, "c_loop": m.c_loop,
            "predicted_speedup": m.predicted_speedup if m.drafted else None}


# ------------------------------------------------------------------------------------------------ output


def fmt(x, spec: str = "{:.2f}") -> str:
    """A number as text; "-" for a missing one."""
    return "-" if x is None else spec.format(x)


@dataclass(frozen=True)
class Column:
    """A table column: its header, width, the cell's value from a row (a key or a function) and its format."""

    head: str
    width: int
    value: str | Callable
    spec: str = "{:.2f}"
    left: bool = False

    def cell(self, text: str) -> str:
        return f"{text:{'<' if self.left else '>'}{self.width}s}"

    def of(self, row) -> str:
        return self.cell(fmt(self.value(row) if callable(self.value) else row.get(self.value), self.spec))


def table(columns: list[Column], rows: list, rule: bool = False) -> list[str]:
    """The header (and a rule under it), then one line per row; cells are separated by one space."""
    head = " ".join(c.cell(c.head) for c in columns)
    return [head, *(["-" * len(head)] if rule else []), *(" ".join(c.of(r) for c in columns) for r in rows)]


def loop_parts(samples: list[Sample]) -> dict:
    """c_loop's two halves over the samples' rounds: draft ms per drafted guess and verify ms per round, over all
    rounds and over the steady state (every round after each run's first). Round one's draft time includes the
    draft's prefill of the prompt, as its verify time includes the target's, so the steady columns are the per-step
    costs of decoding and c_steady their ratio."""
    def halves(rounds, suffix: str) -> dict:
        drafted, n = sum(r.gamma for r in rounds), len(rounds)
        return {f"draft_ms_per_guess{suffix}": sum(r.draft_ms for r in rounds) / drafted if drafted else None,
                f"verify_ms_per_round{suffix}": sum(r.verify_ms for r in rounds) / n if n else None}
    parts = {**halves([r for x in samples for r in x.rounds], ""),
             **halves([r for x in samples for r in x.rounds[1:]], "_steady")}
    return {**parts, "c_steady": ratio(parts["draft_ms_per_guess_steady"], parts["verify_ms_per_round_steady"])}


def write_result(result: dict, out: str | None, default: str = BENCH_OUT, note: str = "") -> Path:
    """Write the result as JSON to `out` (`defaults.resolve` fills in the mode's own file; None: `default`), with
    the CPU it was measured on, and say where."""
    from specdec.models.pair import cpu_name

    path = Path(out or default)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**result, "cpu": result.get("cpu") or cpu_name()}, indent=2))
    log(f"wrote {path}{note}")
    return path
