"""RunRecord: everything one run produced, typed -- the one thing the playground, trace files, replay, the Learn
tab, the CLI and the bench pass around.

A decoder makes one (`SpeculativeDecoder.record()`), `specdec.io.trace` writes it as JSON and reads it back (dicts
exist only at that boundary), and every consumer reads rounds, settings and metrics from it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from specdec.core.events import Round
from specdec.core.metrics import RunMetrics, StepCosts, summarize
from specdec.core.settings import DecodeSettings



@dataclass(frozen=True)
class PairInfo:
    """What a record says about the models that produced it (no weights: a replay needs none)."""

    name: str = ""
    target: str = ""
    draft: str = ""
    device: str = "cpu"
    dtype: str = "float32"
    vocab_size: int = 0
    draft_quant: str = ""  # the draft's weight quantization ("int8", "int4", "int4-all"); "": none
    engine: str = "eager"  # how chain passes ran (specdec.core.static_cache.ENGINES)
    prepacked: bool = False  # the linear layers ran on prepacked CPU kernels (specdec.models.prepack)

    @property
    def label(self) -> str:
        return self.name if self.name and self.name != "custom" else f"{self.target} + {self.draft}"


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class RunRecord:
    prompt: str | list  # what the person typed, or chat messages [{role, content}, ...]
    prompt_ids: list[int]
    settings: DecodeSettings
    pair: PairInfo
    rounds: list[Round] = field(default_factory=list)
    text: str = ""
    stop_reason: str | None = None
    costs: StepCosts | None = None  # plain per-token costs of both models measured on this machine at load
    # Plain target ms per token timed side by side with the run: a race's plain lane, or plain steps timed between
    # the rounds (SpeculativeDecoder(plain_probe=True)); None: the measured speedup falls back to `costs`.
    baseline_ms_per_token: float | None = None
    baseline_steps: int = 0  # how many plain steps that baseline is the median of (0: a race lane, or none)
    baseline_prompt_ms: float | None = None  # plain decoding's first step (the prompt pass), timed in this run
    label: str = ""
    created: str = field(default_factory=now_iso)

    @property
    def metrics(self) -> RunMetrics:
        return summarize(self.rounds, self.costs, self.baseline_ms_per_token, self.baseline_prompt_ms)

    @property
    def generated_ids(self) -> list[int]:
        return [t for r in self.rounds for t in r.committed_ids]

    @property
    def gamma_schedule(self) -> list[int]:
        """The gamma each round asked the drafter for: enough to reproduce the run on the same pair, seed and
        settings. (Not the guesses drafted: a drafter may propose fewer -- a confidence stop, a re-tokenization that
        merges -- and asking for fewer draws fewer random numbers. Older traces lack `asked`: their gamma stands in.)"""
        return [r.gamma if r.asked is None else r.asked for r in self.rounds]

    @property
    def display_label(self) -> str:
        return self.label or f"{self.settings.drafter} γ={self.settings.gamma} ({self.pair.label})"
