"""Stats panel and status messages as HTML strings."""

from __future__ import annotations

import html

from specdec.core.metrics import RunMetrics


def passes_saved(m: RunMetrics) -> int:
    """Target forward passes plain decoding would have needed beyond ours: one per token vs one per round."""
    return m.generated - m.rounds


def _stat(label: str, value: str, hint: str, key: str) -> str:
    return (f'<div class="sd-stat" data-stat="{key}" title="{html.escape(hint, quote=True)}">'
            f'<div class="sd-stat-value">{html.escape(value)}</div>'
            f'<div class="sd-stat-label">{html.escape(label)}</div></div>')


def _per_position(m: RunMetrics) -> str:
    if not m.kept_per_position:
        return ""
    bars = "".join(
        f'<span class="sd-pp" title="draft position {i}: kept in {100 * a:.0f}% of rounds that drafted it">'
        f'<span class="sd-pp-fill" style="height:{100 * a:.0f}%"></span><span class="sd-pp-i">{i}</span></span>'
        for i, a in enumerate(m.kept_per_position)
    )
    return (f'<div class="sd-pp-wrap"><div class="sd-stat-label">kept by draft position</div>'
            f'<div class="sd-pp-row">{bars}</div></div>')


def _c_words(m: RunMetrics) -> str:
    """Which cost ratio the prediction used, by name (specdec/core/metrics.py defines both)."""
    if m.c_loop is not None:
        return f"c_loop = {m.c_loop:.2f} (draft ms per guess ÷ verify ms per round, as this run paid it)"
    if m.c_plain is not None:
        return f"c_plain = {m.c_plain:.2f} (draft ÷ target ms per token in plain decoding)"
    return "no cost ratio measured yet"


def baseline_words(steps: int, prompt_ms: float | None = None) -> str:
    """How the plain cost under the measured speedup was timed (RunRecord.baseline_steps, .baseline_prompt_ms)."""
    if steps:
        prompt = f"its prompt pass ({prompt_ms:.0f} ms, timed in this run), then " if prompt_ms else ""
        return (f"plain target cost: {prompt}the median of {steps} plain decoding step{'s' if steps > 1 else ''} "
                "timed between this run's rounds, under the same load")
    return "plain target cost: timed when the model pair loaded"


def render_stats(m: RunMetrics | None, baseline_steps: int = 0) -> str:
    """Acceptance, tokens per round, tok/s, passes saved, measured and predicted speedup, from a run's metrics
    (RunRecord.metrics); every number is computed in specdec.core.metrics, none here. baseline_steps: how many plain
    steps timed beside the run the measured speedup divides by (0: the load-time cost)."""
    if m is None or not m.rounds:
        return '<div class="sd-stats sd-stats-empty">Stats appear after the first round.</div>'
    cells = [
        _stat("acceptance rate", f"{100 * m.kept_rate:.0f}%" if m.drafted else "—",
              f"{m.kept} of {m.drafted} draft tokens kept (accepted and committed); per-token α = {m.alpha:.2f} (kept / "
              f"tested guesses, {m.kept}/{m.tested}: guesses after a rejection or past the end of the text are "
              "never tested)", "acceptance"),
        _stat("tokens per round", f"{m.tokens_per_round:.2f}",
              "committed tokens per round, counting the repaired or bonus token (1 to γ+1)", "tokens_per_round"),
        _stat("tokens / s", f"{m.tok_s:.1f}",
              "speculative throughput over round wall time (round one includes the prompt)"
              + (f"; plain target decoding: {m.baseline_tok_s:.1f} tok/s" if m.baseline_tok_s else ""), "tok_s"),
        _stat("target passes saved", f"{passes_saved(m)}",
              f"{m.generated} tokens generated with {m.rounds} target passes (plain decoding needs one per token)",
              "passes_saved"),
    ]
    if m.speedup is not None:
        cells.append(_stat("measured speedup", f"{m.speedup:.2f}×",
                           "speculative tok/s ÷ plain target tok/s for the same tokens, both measured on this "
                           "machine; " + baseline_words(baseline_steps, m.baseline_prompt_ms), "speedup"))
    if m.predicted_speedup is not None:
        cells.append(_stat("predicted speedup", f"{m.predicted_speedup:.2f}×",
                           f"Leviathan et al.: (1 − α^(γ+1)) / ((1 − α)(γc + 1)) with per-token α = {m.alpha:.2f}, "
                           f"γ = the mean draft length {m.mean_gamma:.2f}, {_c_words(m)}", "predicted"))
    foot = f"{m.rounds} rounds · {m.generated} tokens · mean γ = {m.mean_gamma:.2f}"
    if m.c_loop is not None:
        foot += f" · c_loop (paid in this run) = {m.c_loop:.2f}"
    if m.c_plain is not None:
        foot += f" · c_plain (plain step costs) = {m.c_plain:.2f}"
    if m.baseline_step_ms:
        foot += f" · {baseline_words(baseline_steps, m.baseline_prompt_ms)}: {m.baseline_step_ms:.0f} ms/token"
    return (f'<div class="sd-stats"><div class="sd-stat-grid">{"".join(cells)}</div>{_per_position(m)}'
            f'<div class="sd-stats-foot">{html.escape(foot)}</div></div>')


STATUS_KINDS = ("info", "busy", "ok", "error")


def render_status(kind: str, message: str) -> str:
    """A one-line status box; kind picks the colour (info, busy, ok, error)."""
    if kind not in STATUS_KINDS:
        kind = "info"
    return f'<div class="sd-status sd-status-{kind}" role="status">{html.escape(message)}</div>'


def render_model_status(state: str, message: str, details: dict | None = None, fraction: float | None = None) -> str:
    """The model badge in the header: loading progress (a bar when `fraction` says how far), ready (with pair
    details), or a load error."""
    kind = {"loading": "busy", "ready": "ok", "error": "error"}.get(state, "info")
    extra = ""
    if fraction is not None and state == "loading":
        pct = round(100 * max(0.0, min(1.0, fraction)))
        extra += (f'<progress class="sd-model-progress" max="100" value="{pct}" aria-label="loading the models"'
                  f' title="{pct}%">{pct}%</progress>')
    if details:
        cells = " · ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in details.items())
        extra += f'<span class="sd-model-details">{cells}</span>'
    return (f'<div class="sd-model sd-status-{kind}" data-state="{html.escape(state)}">'
            f'<span class="sd-model-msg">{html.escape(message)}</span>{extra}</div>')
