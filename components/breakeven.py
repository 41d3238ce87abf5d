"""Rendering for the measured break-even map (specdec/learn/breakeven.py): a heat map of predicted speedup over (α, γ)
with the slower-than-plain region marked and the user's runs placed on it, beside the per-token delay
(verify + draft) / tokens per round that the speedup is made of, and a table of advice per run.
"""

from __future__ import annotations

import html
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specdec.core.settings import DRAFTER_LABELS
from specdec.learn.breakeven import Costs, PlacedRun, best_gamma, delay_ms, measured_break_even, speedup_grid

from .style import COLORS, axis, empty_figure, layout

ALPHAS = np.round(np.linspace(0.0, 0.99, 100), 3)
SYMBOLS = {"model": "circle", "ngram": "diamond", "early-exit": "square", "cross": "triangle-up"}
# Red below 1x (slower than plain decoding), white at 1x, green above; the colour axis is centred at 1.
SPEEDUP_SCALE = [[0.0, "#b91c1c"], [0.45, "#fca5a5"], [0.5, "#f8fafc"], [0.6, "#bbf7d0"], [1.0, "#15803d"]]


def drafter_choices(costs: Costs | None) -> list[tuple[str, str]]:
    names = list(costs.draft_ms) if costs else ["model"]
    return [(DRAFTER_LABELS.get(n, n), n) for n in names]


def _delay_alphas(runs: Sequence[PlacedRun]) -> list[tuple[float, str]]:
    """α values for the delay panel: the runs' own, else three typical ones."""
    if runs:
        seen, out = set(), []
        for r in runs:
            a = round(r.alpha, 2)
            if a not in seen:
                seen.add(a)
                out.append((r.alpha, f"α = {r.alpha:.2f} ({html.escape(r.label)})"))
        return out[:4]
    return [(a, f"α = {a:.1f}") for a in (0.5, 0.7, 0.9)]


def breakeven_figure(costs: Costs | None, drafter: str, runs: Sequence[PlacedRun] = ()) -> go.Figure:
    """Left: predicted speedup heat map (contour at 1x, best γ per α, runs as markers labelled with their measured
    speedup). Right: expected ms per emitted token against γ, with plain decoding's ms per token as the line to
    beat."""
    if costs is None:
        return empty_figure("Press “Measure this machine” to time the loaded pair.")
    if drafter not in costs.draft_ms:
        return empty_figure(f"The {drafter} drafter was not measured on this pair.")
    gammas = list(range(1, costs.max_gamma + 1))
    z = speedup_grid(costs, drafter, ALPHAS)
    zmax = max(2.0, float(np.nanmax(z)))
    zmin = min(0.0, float(np.nanmin(z)))
    span = max(zmax - 1.0, 1.0 - zmin)
    fig = make_subplots(rows=1, cols=2, column_widths=[0.6, 0.4], horizontal_spacing=0.11,
                        subplot_titles=(f"Predicted speedup, {DRAFTER_LABELS.get(drafter, drafter)}",
                                        "Delay per token ≈ (verify + draft) / tokens per round"))
    fig.add_trace(go.Heatmap(
        x=ALPHAS, y=gammas, z=z, colorscale=SPEEDUP_SCALE, zmid=1.0, zmin=1.0 - span, zmax=1.0 + span,
        colorbar=dict(title=dict(text="speedup ×", side="right"), x=0.555, len=0.9, thickness=12),
        hovertemplate="α %{x:.2f}, γ %{y}: %{z:.2f}×<extra></extra>", name="predicted speedup"), row=1, col=1)
    fig.add_trace(go.Contour(
        x=ALPHAS, y=gammas, z=z, showscale=False, contours=dict(start=1.0, end=1.0, size=1.0, coloring="none",
                                                                 showlabels=True, labelfont=dict(size=11)),
        line=dict(color="#111827", width=2.5, dash="dash"), name="break-even (1×): slower than plain to its left",
        showlegend=True, hoverinfo="skip"), row=1, col=1)
    # The best γ at each α, drawn only where it beats plain decoding (elsewhere the best γ is "don't speculate").
    best = [best_gamma(costs, drafter, float(a)) for a in ALPHAS]
    fig.add_scatter(x=ALPHAS, y=[g if s > 1 else None for g, s in best], mode="lines", connectgaps=False,
                    line=dict(color="#111827", width=1.5, shape="hv"), name="best γ where it beats plain",
                    row=1, col=1)
    mine = [r for r in runs if r.drafter == drafter]
    if mine:
        fig.add_scatter(
            x=[r.alpha for r in mine], y=[r.mean_gamma for r in mine], mode="markers+text",
            marker=dict(size=12, color=COLORS["engine"], symbol=SYMBOLS.get(drafter, "circle"),
                        line=dict(color="#111827", width=1.5)),
            text=[f"{r.measured_speedup:.2f}×" if r.measured_speedup is not None else "run" for r in mine],
            textposition="top center", textfont=dict(size=11, color="#111827"),
            customdata=[[html.escape(r.label), r.predicted_here or 0.0] for r in mine],
            hovertemplate="%{customdata[0]}<br>α %{x:.3f}, mean γ %{y:.2f}<br>measured %{text}, map predicts "
                          "%{customdata[1]:.2f}×<extra></extra>",
            name="your runs (measured speedup)", row=1, col=1)
    # Right panel: ms per token against γ at a few α, plain decoding as the line to beat.
    palette = [COLORS["engine"], COLORS["p"], COLORS["q"], COLORS["kept"]]
    for i, (a, label) in enumerate(_delay_alphas(mine)):
        fig.add_scatter(x=gammas, y=[delay_ms(costs, drafter, a, g) for g in gammas], mode="lines+markers",
                        line=dict(color=palette[i % len(palette)], width=2), marker=dict(size=5),
                        name=f"delay at {label}", row=1, col=2,
                        hovertemplate="γ %{x}: %{y:.1f} ms per token<extra></extra>")
    fig.add_scatter(x=[gammas[0], gammas[-1]], y=[costs.target_step_ms] * 2, mode="lines",
                    line=dict(color=COLORS["text"], dash="dash", width=2),
                    name=f"plain decoding, {costs.target_step_ms:.1f} ms per token", row=1, col=2)
    fig.update_layout(**layout("", 480, margin={"l": 56, "r": 16, "t": 40, "b": 110}))
    fig.update_layout(legend={"y": -0.2})
    fig.update_annotations(font_size=12)
    fig.update_xaxes(axis(title_text="α (chance each guess is kept)", range=[0, 0.99]), row=1, col=1)
    fig.update_yaxes(axis(title_text="γ (guesses per round)", dtick=1 if len(gammas) <= 16 else None), row=1, col=1)
    fig.update_xaxes(axis(title_text="γ", dtick=2), row=1, col=2)
    fig.update_yaxes(axis(title_text="ms per emitted token", rangemode="tozero"), row=1, col=2)
    return fig


def costs_html(costs: Costs) -> str:
    """The measured numbers behind the map."""
    v = costs.verify_ms
    ks = [1, 2, 4, 8, len(v)]
    ver = ", ".join(f"k={k}: {v[k - 1]:.1f}" for k in dict.fromkeys(ks) if k <= len(v))
    drafts = ", ".join(f"{html.escape(DRAFTER_LABELS.get(n, n))} {ms:.2f} ms" for n, ms in costs.draft_ms.items())
    notes = "".join(f'<div class="learn-msg learn-msg-warn">{html.escape(n)}</div>' for n in costs.notes)
    return (
        f'<p class="learn-note" id="be-costs">Measured on this machine ({html.escape(costs.pair)} pair, '
        f"{html.escape(costs.device)}, {costs.prefix_tokens}-token prefix in the KV cache, median of {costs.repeats} "
        f"repeat(s), {costs.seconds:.1f} s in all). Target pass over k new tokens (ms): {ver}. Draft cost per guess: "
        f"{drafts}. Each round costs γ · draft + verify(γ + 1); plain decoding costs verify(1) per token.</p>{notes}"
    )


def advice_html(costs: Costs, drafter: str, runs: Sequence[PlacedRun]) -> str:
    """Per run: measured vs the map's prediction, and the γ the map recommends at the run's α."""
    lines = []
    for g in (1, 4, 8):
        if g <= costs.max_gamma and drafter in costs.draft_ms:
            a = measured_break_even(costs, drafter, g)
            lines.append(f"γ = {g}: {'never pays off here' if a is None else f'pays off above α ≈ {a:.2f}'}")
    head = (f'<p class="learn-note">Break-even for the {html.escape(DRAFTER_LABELS.get(drafter, drafter))}: '
            f"{'; '.join(lines)}.</p>") if lines else ""
    if not runs:
        return head + ('<div class="learn-msg learn-msg-info">No recorded run yet: generate in the playground, then '
                       "press “Place my runs”.</div>")
    rows = []
    for r in runs:
        meas = f"{r.measured_speedup:.2f}×" if r.measured_speedup is not None else "no baseline"
        pred = f"{r.predicted_here:.2f}×" if r.predicted_here is not None else "—"
        adv = (f"γ = {r.best_gamma} ({r.best_speedup:.2f}×)" if r.best_gamma is not None
               else "drafter not measured")
        rows.append(f'<tr class="be-run"><td>{html.escape(r.label)}</td><td>{html.escape(r.drafter)}</td>'
                    f"<td>{r.alpha:.3f}</td><td>{r.mean_gamma:.2f}</td><td>{meas}</td><td>{pred}</td>"
                    f"<td>{adv}</td></tr>")
    return head + (
        '<table class="learn-table be-table" id="be-advice"><tr><th>run</th><th>drafter</th><th>α</th>'
        "<th>mean γ</th><th>measured</th><th>map predicts</th><th>recommended γ at this α</th></tr>"
        f"{''.join(rows)}</table>"
        '<p class="learn-note">α and mean γ come from each run\'s own metrics (kept ÷ tested guesses; '
        "drafted ÷ rounds). The map assumes independent acceptances; a measured speedup far from its prediction "
        "usually means acceptance varied along the text, or the run's timings were taken under other load.</p>"
    )
