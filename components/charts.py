"""Plotly figures: p vs q at one position of a Round, the running speedup over a run, and the expected speedup
against α (the Learn tab) -- the one home of both speedup charts.

A Round carries the top candidates of p and q per position (plus the exact p and q of the drafted and emitted
tokens), not whole distributions. A value outside a top list is therefore unknown unless the list is complete
(shorter than the round's `top_k` because the rest of the vocabulary has probability 0); unknown values are left out
(None), never drawn as 0, and the "other" bar holds the mass not shown.
"""

from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from plotly.colors import sample_colorscale

from specdec.core import events
from specdec.core.events import Round
from specdec.learn.lab import RunPoint, speedup_curve
from specdec.core.metrics import PHASES, StepCosts, TimeBreakdown, alpha_estimate, loop_cost_ratio, running_speedup
from specdec.core.speedup import run_predicted_speedup

from .style import COLORS, axis, empty_figure, figure  # noqa: F401  (empty_figure: re-exported for older imports)
from .tokens import fmt_prob, piece_html, visible_piece

OTHER = "other"
MAX_BARS = 12  # candidates charted per position; the rest of the mass goes to "other" (keeps labels legible)
__all__ = ["pq_candidates", "pq_figure", "speedup_curves_figure", "speedup_figure", "speedup_series"]


@dataclass
class Candidate:
    id: int | None  # None for the "other" bucket
    label: str
    p: float | None
    q: float | None
    residual: float | None = None
    role: str = ""  # "draft", "repair", "bonus" or ""

    @property
    def kept(self) -> float | None:
        """min(p, q): the part of q that survives verification; None when either side is unknown."""
        if self.p is None or self.q is None:
            return None
        return min(self.p, self.q)


def position_roles(rnd: Round, position: int) -> dict:
    """What happened at one position of a round: the draft token there and its fate (Round.fates), the emitted
    token."""
    out = {"draft_id": None, "fate": None, "emitted_id": None}
    if position < rnd.gamma:
        out["draft_id"] = rnd.draft_ids[position]
        out["fate"] = rnd.fates[position]
    if position == rnd.n_accepted:
        out["emitted_id"] = rnd.emitted_id
    return out


def pq_candidates(rnd: Round, position: int, max_bars: int = MAX_BARS) -> list[Candidate]:
    """Tokens to chart at one position (union of p's and q's top lists, drafted, emitted, residual), then "other"."""
    if not 0 <= position <= rnd.gamma:
        raise ValueError(f"position {position} is outside round {rnd.index} (0..{rnd.gamma})")
    p_row = rnd.p_top[position]
    q_row = rnd.q_top[position] if position < rnd.gamma else []
    q_known_zero = position == rnd.gamma  # no draft at the bonus position: q is 0 everywhere
    p_complete = len(p_row) < rnd.top_k
    # A one-hot q (deterministic proposal) is 1 on the guess and exactly 0 everywhere else.
    q_complete = q_known_zero or rnd.one_hot or len(q_row) < rnd.top_k

    pieces: dict[int, str] = {}
    p: dict[int, float] = {}
    q: dict[int, float] = {}
    for t in p_row:
        pieces[t.id], p[t.id] = t.piece, t.prob
    for t in q_row:
        pieces[t.id], q[t.id] = t.piece, t.prob
    roles = position_roles(rnd, position)
    if roles["draft_id"] is not None:
        i = roles["draft_id"]
        pieces[i], p[i], q[i] = rnd.draft_pieces[position], rnd.p_draft[position], rnd.q_draft[position]
    if roles["emitted_id"] is not None:
        i = roles["emitted_id"]
        pieces[i], p[i] = rnd.emitted_piece, rnd.emitted_p
    residual: dict[int, float] = {}
    if position == rnd.rejected_at and rnd.residual_top:
        for t in rnd.residual_top:
            pieces.setdefault(t.id, t.piece)
            residual[t.id] = t.prob

    def role(i: int) -> str:
        if i == roles["emitted_id"]:
            return "bonus" if rnd.is_bonus else "repair"
        return "draft" if i == roles["draft_id"] else ""

    cands = []
    for i in pieces:
        pv = p.get(i, 0.0 if p_complete else None)
        qv = q.get(i, 0.0 if q_complete else None)
        rv = residual.get(i)
        if rv is None and position == rnd.rejected_at and pv is not None and qv is not None and pv <= qv:
            rv = 0.0  # max(0, p - q) is exactly 0 where q covers p
        cands.append(Candidate(i, visible_piece(pieces[i]), pv, qv, rv, role(i)))
    cands = _most_telling(cands, max_bars)
    _dedupe_labels(cands)
    p_shown = sum(c.p for c in cands if c.p is not None)
    q_shown = sum(c.q for c in cands if c.q is not None)
    cands.append(Candidate(None, OTHER, max(0.0, 1.0 - p_shown), 0.0 if q_known_zero else max(0.0, 1.0 - q_shown)))
    return cands


def _most_telling(cands: list[Candidate], max_bars: int) -> list[Candidate]:
    """The drafted/emitted tokens and the target's favourite, then the largest others (by their biggest known
    value), sorted by p."""
    size = lambda c: max(v for v in (c.p, c.q, c.residual, 0.0) if v is not None)  # noqa: E731
    favourite = max(cands, key=lambda c: c.p if c.p is not None else -1.0, default=None)
    keep = [c for c in cands if c.role or c is favourite]
    rest = [c for c in cands if not (c.role or c is favourite)]
    keep += sorted(rest, key=size, reverse=True)[: max(0, max_bars - len(keep))]
    return sorted(keep, key=lambda c: -(c.p if c.p is not None else -1.0))


def _dedupe_labels(cands: list[Candidate]) -> None:
    """Plotly merges equal category names, so two tokens that look alike get their id appended."""
    seen: dict[str, int] = {}
    for c in cands:
        seen[c.label] = seen.get(c.label, 0) + 1
    for c in cands:
        if seen[c.label] > 1 or c.label == OTHER:
            c.label = f"{c.label} #{c.id}"


def pq_title(rnd: Round, position: int) -> str:
    roles = position_roles(rnd, position)
    where = f"Round {rnd.index + 1}, position {position}"
    fate = roles["fate"]
    if fate is not None:
        a, u = rnd.accept_probs[position], rnd.uniforms[position]
        tok = piece_html(rnd.draft_pieces[position])
        if fate == events.KEPT:
            sign = "<" if rnd.passed(position) else "≥"
            what = f"draft “{tok}” accepted: u {fmt_prob(u)} {sign} {rnd.test_name} {fmt_prob(a)}"
        elif fate == events.REJECTED:
            what = (f"draft “{tok}” rejected: u {fmt_prob(u)} ≥ {rnd.test_name} {fmt_prob(a)}; "
                    f"repaired with “{piece_html(rnd.emitted_piece)}”")
        elif fate == events.DISCARDED:
            what = f"draft “{tok}” discarded (after the rejection; p is conditioned on discarded guesses)"
        else:
            what = f"draft “{tok}” not committed: the text ended before this position"
        if rnd.one_hot:  # short: the title has the width of half the page
            what += f"<br>one-hot q ({html.escape(rnd.drafter)}): 1 on the guess, 0 elsewhere; kept with probability p"
    elif rnd.gamma == 0:
        what = (f"nothing drafted ({html.escape(rnd.drafter)} drafter): a plain target step, "
                f"“{piece_html(rnd.emitted_piece)}” sampled from p")
    elif roles["emitted_id"] is not None:
        what = f"bonus “{piece_html(rnd.emitted_piece)}” sampled from p (no draft here, q = 0)"
    else:
        what = "after the rejection: never used"
    return f"{where}<br><span style='font-size:11px'>{what}</span>"


def pq_figure(rnd: Round, position: int, height: int = 380):
    """Grouped bars of q and p over the top tokens at one position, min(p, q) marked, residual at a rejection."""
    cands = pq_candidates(rnd, position)
    # Plotly reads tick labels, titles and hover text as a small HTML subset: token text must be escaped.
    x = [html.escape(c.label) for c in cands]
    q_hover = "q(%{x}) = %{y:.4f}<extra></extra>"
    if rnd.one_hot and position < rnd.gamma:
        q_hover = "q(%{x}) = %{y:.0f}: a deterministic proposal has q = 1 on the guess, 0 elsewhere<extra></extra>"
    traces = [
        {"type": "bar", "name": "q (draft)" + (", one-hot" if rnd.one_hot else ""), "x": x, "y": [c.q for c in cands],
         "marker": {"color": COLORS["q"]}, "hovertemplate": q_hover},
        {"type": "bar", "name": "p (target)", "x": x, "y": [c.p for c in cands], "marker": {"color": COLORS["p"]},
         "hovertemplate": "p(%{x}) = %{y:.4f}<extra></extra>"},
    ]
    if position == rnd.rejected_at:
        traces.append({"type": "bar", "name": "residual ∝ max(0, p−q)", "x": x, "y": [c.residual for c in cands],
                       "marker": {"color": COLORS["residual"]},
                       "hovertemplate": "repair distribution(%{x}) = %{y:.4f}<extra></extra>"})
    width = max(10, min(30, 240 // len(cands)))  # the dash spans a category's bar group
    traces.append({"type": "scatter", "name": "kept: min(p, q)", "x": x, "y": [c.kept for c in cands],
                   "mode": "markers", "hovertemplate": "min(p, q) = %{y:.4f}<extra></extra>",
                   "marker": {"symbol": "line-ew-open", "size": width, "line": {"width": 3, "color": COLORS["kept"]}}})
    notes = []
    for c in cands:
        if c.role:
            color = {"draft": COLORS["q"], "repair": COLORS["residual"], "bonus": COLORS["bonus"]}[c.role]
            top = max(v for v in (c.p, c.q, c.residual, 0.0) if v is not None)
            text = "plain step" if c.role == "bonus" and rnd.gamma == 0 else c.role
            notes.append({"x": html.escape(c.label), "y": top, "text": text, "showarrow": True, "arrowhead": 2,
                          "arrowsize": 0.8, "ax": 0, "ay": -22, "font": {"color": color, "size": 11},
                          "arrowcolor": color})
    return figure(
        traces, pq_title(rnd, position), height,
        barmode="group", bargap=0.25, bargroupgap=0.05, annotations=notes,
        xaxis=axis(type="category", tickangle=0 if len(cands) <= 7 else -45, automargin=True),
        yaxis=axis(title={"text": "probability"}, rangemode="tozero"),
    )


# ------------------------------------------------------------------------------------------ running speedup


def running_alpha(rounds: list[Round]) -> list[float]:
    """Per-token acceptance probability (metrics.alpha_estimate over Round.kept / Round.tested) after each round."""
    out, kept, tested = [], 0, 0
    for r in rounds:
        kept += r.kept
        tested += r.tested
        out.append(alpha_estimate(kept, tested))
    return out


def running_predicted(rounds: list[Round], costs: StepCosts | None) -> list[float | None]:
    """The predicted speedup after each round, by the one convention (speedup.run_predicted_speedup): per-token alpha,
    the mean draft length so far, c_loop from the rounds' timings (c_plain from `costs` as the fallback)."""
    c_plain = costs.c_plain if costs and costs.target_ms and costs.draft_ms else None
    out, drafted, draft_ms, verify_ms = [], 0, 0.0, 0.0
    for n, (r, alpha) in enumerate(zip(rounds, running_alpha(rounds)), 1):
        drafted += r.gamma
        draft_ms += r.draft_ms
        verify_ms += r.verify_ms
        out.append(run_predicted_speedup(alpha, drafted / n, loop_cost_ratio(draft_ms, drafted, verify_ms, n), c_plain))
    return out


def speedup_series(rounds: list[Round], costs: StepCosts | None, baseline_ms_per_token: float | None = None,
                   baseline_prompt_ms: float | None = None) -> dict:
    """Per-round series for the speedup chart; measured is None until a plain step cost is known (one timed beside
    the run, `baseline_ms_per_token` with its prompt pass `baseline_prompt_ms`, else the pair's load-time `costs`)."""
    base = baseline_ms_per_token or (costs.target_ms if costs else None)
    measured = running_speedup(rounds, base, baseline_prompt_ms if baseline_ms_per_token else None) if base else None
    predicted = running_predicted(rounds, costs)
    return {"round": [r.index + 1 for r in rounds], "tokens_per_pass": [len(r.committed_ids) for r in rounds],
            "measured": measured, "predicted": predicted if any(v is not None for v in predicted) else None}


def speedup_figure(rounds: list[Round], costs: StepCosts | None, baseline_ms_per_token: float | None = None,
                   height: int = 380, baseline_prompt_ms: float | None = None):
    """Tokens per target pass per round, with cumulative measured and predicted (Leviathan) speedup."""
    s = speedup_series(rounds, costs, baseline_ms_per_token, baseline_prompt_ms)
    traces = [{"type": "bar", "name": "tokens per target pass", "x": s["round"], "y": s["tokens_per_pass"],
               "marker": {"color": COLORS["p"]}, "opacity": 0.45,
               "hovertemplate": "round %{x}: %{y} tokens for 1 target pass<extra></extra>"}]
    if s["measured"] is not None:
        traces.append({"type": "scatter", "name": "measured speedup (cumulative)", "x": s["round"],
                       "y": s["measured"], "mode": "lines+markers", "marker": {"size": 5},
                       "line": {"color": COLORS["measured"], "width": 2.5},
                       "hovertemplate": "after round %{x}: %{y:.2f}× plain decoding<extra></extra>"})
    if s["predicted"] is not None:
        traces.append({"type": "scatter", "name": "predicted (Leviathan, measured α and c_loop)", "x": s["round"],
                       "y": s["predicted"], "mode": "lines", "line": {"color": COLORS["predicted"], "width": 2,
                                                                       "dash": "dash"},
                       "hovertemplate": "after round %{x}: predicted %{y:.2f}×<extra></extra>"})
    n = len(s["round"])
    traces.append({"type": "scatter", "name": "plain decoding = 1×", "x": [0.5, n + 0.5], "y": [1, 1],
                   "mode": "lines", "hoverinfo": "skip", "line": {"color": COLORS["text"], "width": 1, "dash": "dot"}})
    title = "Speedup vs plain decoding on this machine"
    if s["measured"] is None:
        title += "<br><span style='font-size:11px'>measuring the models' step costs…</span>"
    return figure(
        traces, title, height,
        xaxis=axis(title={"text": "round"}, dtick=max(1, len(rounds) // 10), range=[0.5, n + 0.5]),
        yaxis=axis(title={"text": "tokens per pass  /  speedup ×"}, rangemode="tozero"),
    )


PHASE_COLORS = {"draft": "#3b82f6", "verify": "#8b5cf6", "rule": "#f97316", "cache": "#14b8a6",
                "display": "#a3a3a3", "other": "#d4d4d4"}
PHASE_WORDS = {"draft": "draft", "verify": "target pass", "rule": "the rule", "cache": "cache roll-back",
               "display": "display", "other": "other"}


def time_breakdown_figure(b: TimeBreakdown, height: int = 380):
    """Where each round's milliseconds went, stacked by phase, beside what plain steps would have paid for the
    same tokens; the title carries the run total and the one-line reading."""
    if not b.rounds:
        return empty_figure("No rounds yet: the time breakdown appears after the first round.")
    x = list(range(1, len(b.rounds) + 1))
    traces = [{"type": "bar", "name": f"{PHASE_WORDS[k]} {getattr(b.total, k) / 1e3:.2f} s", "x": x,
               "y": [getattr(t, k) for t in b.rounds], "marker": {"color": PHASE_COLORS[k]},
               "hovertemplate": f"round %{{x}}: {PHASE_WORDS[k]} %{{y:.1f}} ms<extra></extra>"} for k in PHASES]
    if b.plain_ms is not None:
        traces.append({"type": "scatter", "mode": "markers", "name": f"plain steps {sum(b.plain_ms) / 1e3:.2f} s",
                       "x": x, "y": b.plain_ms,
                       "marker": {"symbol": "line-ew-open", "size": 16, "color": COLORS["text"], "line": {"width": 2}},
                       "hovertemplate": "round %{x}: plain decoding would take %{y:.0f} ms<extra></extra>"})
    # the reading is one sentence "cost and acceptance: verdict"; two lines keep it inside a half-width chart
    head, _, tail = b.reading.partition(": ")
    verdict, _, spent = tail.partition(" (")
    parts = [head + ":" if tail else head] + ([verdict] if verdict else []) + (["(" + spent] if spent else [])
    lines = "<br>".join(html.escape(t) for t in parts)
    title = (f"Where the milliseconds went: {b.total.total:.0f} ms over {len(b.rounds)} rounds"
             f"<br><span style='font-size:10px'>{lines}</span>")
    return figure(traces, title, height + 40, barmode="stack", margin={"l": 52, "r": 12, "t": 108, "b": 80},
                  legend={"orientation": "h", "y": -0.12, "yanchor": "top", "x": 0, "font": {"size": 10}},
                  xaxis=axis(dtick=max(1, len(x) // 10)),
                  yaxis=axis(title={"text": "ms"}, rangemode="tozero"))


def acceptance_histogram_figure(per_request: dict, height: int = 300):
    """The run's acceptance-length histogram (guesses kept per drafting round), one bar group per draft length:
    the per-request shape `specdec.io.server_metrics.per_request` exports."""
    by_len = per_request.get("acceptance_histogram_by_draft_length") or {}
    if not by_len:
        return empty_figure("No drafting rounds yet: the acceptance histogram appears after the first.", height)
    kmax = max(int(k) for row in by_len.values() for k in row)
    x = list(range(kmax + 1))
    traces = [{"type": "bar", "name": f"γ = {g}", "x": x, "y": [row.get(str(k), 0) for k in x],
               "hovertemplate": f"γ {g}: %{{y}} rounds kept %{{x}} guesses<extra></extra>"}
              for g, row in by_len.items()]
    mean = per_request.get("mean_acceptance_length", 1.0)
    title = (f"Guesses kept per round<br><span style='font-size:10px'>mean acceptance length {mean:.2f} "
             f"(the bonus or repaired token included)</span>")
    return figure(traces, title, height, barmode="stack", xaxis=axis(title={"text": "guesses kept"}, dtick=1),
                  yaxis=axis(title={"text": "rounds"}, rangemode="tozero"))


def server_comparison_figure(server, run_rates: Sequence[float], height: int = 320):
    """Acceptance per draft position: a vLLM server's (from its /metrics scrape, a ServerAcceptance) beside this
    run's (vLLM's definition: drafts whose guess at position i was accepted / drafts)."""
    n = max(len(server.per_position_rate), len(run_rates))
    x = list(range(n))
    traces = [
        {"type": "bar", "name": f"vLLM server (mean acceptance length {server.mean_acceptance_length:.2f})", "x": x,
         "y": list(server.per_position_rate) + [None] * (n - len(server.per_position_rate)),
         "marker": {"color": COLORS["predicted"]},
         "hovertemplate": "server, position %{x}: %{y:.1%} of drafts<extra></extra>"},
        {"type": "bar", "name": "this run", "x": x, "y": list(run_rates) + [None] * (n - len(run_rates)),
         "marker": {"color": COLORS["measured"]},
         "hovertemplate": "this run, position %{x}: %{y:.1%} of drafts<extra></extra>"},
    ]
    return figure(traces, "Acceptance by draft position: a vLLM server beside this run", height, barmode="group",
                  xaxis=axis(title={"text": "draft position"}, dtick=1),
                  yaxis=axis(title={"text": "accepted / drafts"}, range=[0, 1]))


RULE_COLORS = {"pq": "#8b5cf6", "strict": "#f97316", "block": "#16a34a"}


def verify_modes_figure(points: Sequence, pair_label: str = "", height: int = 360):
    """Share of guesses kept against temperature, one line per verification rule, measured on the same drafts
    (`specdec.bench.verify_modes`); the hover adds tokens per target pass."""
    if not points:
        return empty_figure("No measurement shipped: run python -m specdec bench --verify-modes.", height)
    traces = []
    for mode in RULE_COLORS:
        pts = sorted((p for p in points if p.mode == mode), key=lambda p: p.temperature)
        if not pts:
            continue
        traces.append({"type": "scatter", "mode": "lines+markers", "name": mode,
                       "x": [p.temperature for p in pts], "y": [p.kept_share for p in pts],
                       "customdata": [[p.tokens_per_pass, p.rounds] for p in pts],
                       "line": {"color": RULE_COLORS[mode], "width": 2.5},
                       "hovertemplate": f"{mode}, T %{{x}}: %{{y:.1%}} of guesses kept, %{{customdata[0]:.2f}} "
                                        f"tokens per target pass (%{{customdata[1]}} rounds)<extra></extra>"})
    sub = f"measured on {html.escape(pair_label)}, the same drafts for every rule" if pair_label else \
        "the same drafts for every rule"
    return figure(traces, f"Guesses kept against temperature<br><span style='font-size:11px'>{sub}</span>", height,
                  xaxis=axis(title={"text": "temperature"}), yaxis=axis(title={"text": "share kept"}, range=[0, 1]))


# ------------------------------------------------------------------------------------------ speedup theory


def speedup_curves_figure(c: float, points: Sequence[RunPoint] = (), gammas: Sequence[int] = range(1, 13)):
    """Leviathan et al.'s expected speedup against α for each γ at cost ratio c, slower-than-plain region shaded,
    with recorded runs placed on it (the Learn tab's "When is it faster?")."""
    alphas = np.linspace(0.0, 0.99, 199)
    curves = {g: speedup_curve(g, c, alphas) for g in gammas}
    top = max(1.6, max(max(v) for v in curves.values()) * 1.05, *[(p.measured_speedup or 0) * 1.1 for p in points])
    traces = []
    n = len(curves)
    for j, (g, ys) in enumerate(curves.items()):
        color = sample_colorscale("Viridis", [0.85 * j / max(1, n - 1)])[0]  # stop before Viridis' pale yellow
        traces.append({"type": "scatter", "x": alphas, "y": ys, "mode": "lines", "name": f"γ={g}",
                       "line": {"color": color, "width": 1.6},
                       "hovertemplate": f"γ={g}<br>α=%{{x:.2f}}<br>speedup %{{y:.2f}}×<extra></extra>"})
    shapes = [{"type": "rect", "x0": 0, "x1": 1, "y0": 0, "y1": 1, "fillcolor": "rgba(220,38,38,0.10)",
               "line": {"width": 0}, "layer": "below"},
              {"type": "line", "x0": 0, "x1": 1, "y0": 1, "y1": 1, "line": {"color": "rgba(220,38,38,0.7)",
                                                                         "width": 1, "dash": "dash"}}]
    for pt in points:
        pred = speedup_curve(pt.mean_gamma, c, [pt.alpha])[0]  # the run's mean draft length (metrics convention)
        label = html.escape(pt.label)
        shapes.append({"type": "line", "x0": pt.alpha, "x1": pt.alpha, "y0": 0, "y1": 1, "yref": "paper",
                       "line": {"color": COLORS["engine"], "width": 1, "dash": "dot"}})
        traces.append({"type": "scatter", "x": [pt.alpha], "y": [pred], "mode": "markers",
                       "name": f"{label}: α={pt.alpha:.2f}, γ≈{pt.mean_gamma:.1f} (model)",
                       "marker": {"size": 12, "color": "rgba(0,0,0,0)",
                                  "line": {"color": COLORS["engine"], "width": 2.5}},
                       "hovertemplate": f"{label}<br>α=%{{x:.3f}}<br>predicted %{{y:.2f}}× at c={c:.2f}<extra></extra>"})
        if pt.measured_speedup is not None:
            traces.append({"type": "scatter", "x": [pt.alpha], "y": [pt.measured_speedup], "mode": "markers",
                           "name": f"{label}: measured {pt.measured_speedup:.2f}×",
                           "marker": {"size": 13, "color": COLORS["engine"], "symbol": "diamond",
                                      "line": {"color": "white", "width": 1}},
                           "hovertemplate": f"{label}<br>α=%{{x:.3f}}<br>measured %{{y:.2f}}×<extra></extra>"})
    note = {"x": 0.98, "y": 0.08, "xanchor": "right", "yanchor": "bottom", "showarrow": False,
            "text": "below 1×: slower than plain decoding", "font": {"color": COLORS["wrong"], "size": 13}}
    return figure(
        traces, "", 440, shapes=shapes, annotations=[note],
        legend={"orientation": "v", "y": 1, "x": 1.01, "yanchor": "top", "xanchor": "left", "font": {"size": 11}},
        margin={"l": 52, "r": 10, "t": 30, "b": 50},
        xaxis=axis(range=[0, 1], title={"text": "α: chance a draft guess is accepted"}),
        yaxis=axis(range=[0, top], title={"text": "expected speedup over plain decoding (×)"}),
    )
