"""Trace export and replay for the playground (format: docs/trace-schema.md, code: specdec/trace.py).

Export writes the session's run to a JSON file that a gr.DownloadButton serves. Import validates an uploaded file
with `load_trace_file` and turns it into a RunLog: the rounds, text and settings of a run with no decoder and no
model behind it, which the playground renders exactly like a live run. The same RunLog holds runs decoded in a
ZeroGPU worker process (ui/gpu_run.py), whose decoder never comes back to the main process.
"""

from __future__ import annotations

import math
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from specdec.decoder import DecodeSettings
from specdec.events import Round
from specdec.metrics import summarize
from specdec.trace import Trace, build_trace, dumps_trace

KEEP_FILES_S = 3600.0  # exported files older than this are deleted at the next export (Gradio serves its own copy)

_dir_lock = threading.Lock()
_trace_dir: Path | None = None


# ------------------------------------------------------------------------------------------------ run log


class _Models:
    """Stands in for a ModelPair where only its description is known (build_trace calls pair.describe())."""

    def __init__(self, models: dict):
        self.models = dict(models)

    def describe(self) -> dict:
        return dict(self.models)


@dataclass
class RunLog:
    """A run known only by its rounds: a replayed trace, or a run decoded in a ZeroGPU worker.

    It offers the read-only part of SpeculativeDecoder that the views and `build_trace` use (rounds, text,
    generated_ids, done, stop_reason, settings, prompt_ids, pair.describe()); it cannot step.
    """

    settings: DecodeSettings
    models: dict
    prompt_ids: list[int]
    prompt: str | list = ""
    rounds: list[Round] = field(default_factory=list)
    text: str = ""
    stop_reason: str | None = None
    costs: tuple[float | None, float | None] = (None, None)  # plain target / draft ms per token, when known
    trace: Trace | None = None  # the loaded trace, for a replay (exported again unchanged)

    @property
    def generated_ids(self) -> list[int]:
        return [t for r in self.rounds for t in r.committed_ids]

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    @property
    def pair(self) -> _Models:
        return _Models(self.models)

    @property
    def label(self) -> str:
        name = self.models.get("name") or "?"
        return f"trace ({name})" if self.trace is not None else str(name)


def log_from_trace(tr: Trace) -> RunLog:
    """A replayable RunLog from a validated trace; no model is loaded."""
    stop = tr.rounds[-1].stop_reason if tr.rounds else None
    return RunLog(settings=tr.decode_settings(), models=dict(tr.models), prompt_ids=list(tr.prompt_ids),
                  prompt=tr.prompt, rounds=list(tr.rounds), text=tr.text, stop_reason=stop,
                  costs=trace_costs(tr.metrics), trace=tr)


def _positive(x) -> float | None:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) and x > 0 else None


def trace_costs(metrics: dict) -> tuple[float | None, float | None]:
    """The plain per-token costs a trace recorded (see export_extras), so a replay shows the same speedup lines.

    Traces from elsewhere may carry only baseline_tok_s (and c); anything missing or not a positive number is
    treated as unknown.
    """
    target = _positive(metrics.get("target_ms_per_token"))
    if target is None and _positive(metrics.get("baseline_tok_s")):
        target = 1e3 / _positive(metrics.get("baseline_tok_s"))
    draft = _positive(metrics.get("draft_ms_per_token"))
    if draft is None and target is not None and _positive(metrics.get("c")):
        draft = target * _positive(metrics.get("c"))
    return target, (draft if target is not None else None)


def prompt_text(prompt: str | list) -> str:
    """What the token view shows as the prompt: the text, or the chat messages' contents."""
    if isinstance(prompt, str):
        return prompt
    return "\n".join(m.get("content", "") for m in prompt if isinstance(m, dict))


# ---------------------------------------------------------------------------------------------------- export


def export_extras(rounds: list[Round], target_ms: float | None, draft_ms: float | None) -> dict:
    """Metrics only the app knows (from its timing of plain decoding), merged into the trace's summary."""
    m = summarize(rounds, target_ms, draft_ms)
    return {"baseline_tok_s": m.baseline_tok_s, "speedup": m.speedup, "c": m.c,
            "predicted_speedup": m.predicted_speedup, "target_ms_per_token": target_ms,
            "draft_ms_per_token": draft_ms}


def trace_json(run, costs: tuple[float | None, float | None], prompt: str, chat: bool) -> str:
    """The JSON text of a run: a SpeculativeDecoder, or a RunLog (a replay is written back as it was loaded).

    `prompt` is what the person typed; in chat mode the trace records it as the one user message the decoder
    wrapped it in. Raises TraceError when the trace would be over the size limit.
    """
    if isinstance(run, RunLog) and run.trace is not None:
        return dumps_trace(run.trace)
    recorded_prompt = [{"role": "user", "content": prompt}] if chat else prompt
    return dumps_trace(build_trace(run, export_extras(list(run.rounds), *costs), prompt=recorded_prompt))


def trace_dir() -> Path:
    global _trace_dir
    with _dir_lock:
        if _trace_dir is None or not _trace_dir.is_dir():
            _trace_dir = Path(tempfile.mkdtemp(prefix="specdec-traces-"))
        return _trace_dir


def _prune(folder: Path, keep_s: float = KEEP_FILES_S) -> None:
    cutoff = time.time() - keep_s
    for f in folder.glob("*.json"):
        try:
            if f.stat().st_mtime < cutoff:
                f.unlink()
        except OSError:
            pass


def write_trace(text: str, label: str) -> Path:
    """Write trace JSON to a fresh file in this process's trace folder; returns its path."""
    folder = trace_dir()
    _prune(folder)
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label).strip("-")[:40] or "run"
    stamp = time.strftime("%Y%m%d-%H%M%S")
    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, suffix=".json", delete=False,
                                     prefix=f"specdec-trace-{slug}-{stamp}-") as fh:
        fh.write(text)
    return Path(fh.name)


# ---------------------------------------------------------------------------------------------------- import


def describe_replay(log: RunLog) -> str:
    """The status line after a trace loads: what it is, which models made it, and what the buttons now do."""
    tr = log.trace
    m = log.models
    models = f"target {m.get('target', '?')} + draft {m.get('draft', '?')}"
    where = ", ".join(x for x in (m.get("device"), m.get("dtype")) if x)
    when = f", recorded {tr.created}" if tr is not None and tr.created else ""
    state = {"eos": "ended at end of text", "max_new_tokens": "reached its token limit"}.get(
        log.stop_reason or "", "was stopped before the end")
    return (f"Replaying a trace: {len(log.generated_ids)} tokens in {len(log.rounds)} rounds, made by {models}"
            f"{f' ({where})' if where else ''}{when}; the run {state}. No model was loaded. "
            "Click tokens or pick a round to inspect it; Generate or Step starts a new run on this app's models.")
