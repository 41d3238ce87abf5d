"""Batched speculative decoding, drawn: pure functions from a batch benchmark result (specdec.bench.batch) or a
run's rounds (specdec.loop.batched.BatchRound dicts) to Plotly figures and HTML strings. No Gradio in here.

- `batch_figure`: latency vs throughput (plain and speculative, one point per batch size) beside speedup vs batch
  size, measured next to the prediction from measured costs, with the crossover marked.
- `cost_figure`: one verification pass against the B×(γ+1) tokens it scores, one draft pass and one plain step
  against B, each with its fitted line.
- `render_batch_view`: B token streams advancing together round by round; rows that kept more guesses than the
  slowest row visibly wait (their extra tokens are shown as held back), the slowest row is marked.
- `crossover_reading`: the plain-words reading of where speculation stops paying and why.
- `loop_figure`, `pace_figure`, `render_ragged_view`, `render_both_views`: the ragged commit rule (specdec.loop.batched)
  beside lockstep: throughput and p90 latency per loop against B, each request's tokens over time in both loops,
  and the ragged run's token streams, where rows gain different counts per round.
"""

from __future__ import annotations

import html
import math

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .charts import COLORS, empty_figure
from .tokens import visible_piece

MODE_DASH = {"greedy": "solid", "sampled": "dash"}
MODE_LABEL = {"greedy": "greedy", "sampled": "T = 0.7"}
SPEC_COLOR = COLORS["kept"]
PLAIN_COLOR = COLORS["p"]


def _layout(fig: go.Figure, title: str, height: int) -> go.Figure:
    fig.update_layout(
        title={"text": title, "font": {"size": 13}, "x": 0, "xanchor": "left"},
        height=height, margin={"l": 56, "r": 16, "t": 64, "b": 96},
        paper_bgcolor="rgba(0,0,0,0)", plot_bgcolor="rgba(0,0,0,0)",
        font={"color": COLORS["text"], "size": 12},
        legend={"orientation": "h", "y": -0.22, "yanchor": "top", "x": 0, "font": {"size": 11}},
    )
    fig.update_xaxes(gridcolor=COLORS["grid"], zerolinecolor=COLORS["grid"], linecolor=COLORS["grid"])
    fig.update_yaxes(gridcolor=COLORS["grid"], zerolinecolor=COLORS["grid"], linecolor=COLORS["grid"])
    return fig


def _rows(result: dict, mode: str) -> list[dict]:
    return sorted((r for r in result.get("rows", []) if r["mode"] == mode), key=lambda r: r["batch"])


def _modes(result: dict) -> list[str]:
    return [m for m in result.get("modes", []) if _rows(result, m)]


def batch_figure(result: dict | None, height: int = 430) -> go.Figure:
    """Left: mean per-request latency against throughput over all rows, one point per B, plain and speculative.
    Right: speculative / plain throughput against B, measured (steady state) beside the prediction, 1 = break-even."""
    if not result or not _modes(result):
        return empty_figure("run the batch benchmark or load its JSON to see latency vs throughput")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("latency vs throughput (one point per batch size B)",
                                        "speedup vs batch size: measured and predicted"))
    top = max(result["batches"])
    for mode in _modes(result):
        rows = _rows(result, mode)
        dash, label = MODE_DASH.get(mode, "dot"), MODE_LABEL.get(mode, mode)
        for kind, color in (("plain", PLAIN_COLOR), ("spec", SPEC_COLOR)):
            pts = [r for r in rows if r[f"{kind}_tok_s"] and r[f"{kind}_latency_ms"] is not None]
            name = f"{'speculative' if kind == 'spec' else 'plain'} · {label}"
            fig.add_trace(go.Scatter(
                x=[r[f"{kind}_tok_s"] for r in pts], y=[r[f"{kind}_latency_ms"] / 1e3 for r in pts],
                mode="lines+markers+text", customdata=[r["batch"] for r in pts],
                # only the two ends are labelled (the rest crowd each other); hover names every point
                text=[f"B={r['batch']}" if r in (pts[0], pts[-1]) else "" for r in pts], textposition="top center",
                textfont={"size": 10}, name=name, line={"color": color, "dash": dash}, legendgroup=name,
                hovertemplate="B=%{customdata}: %{x:.2f} tok/s, %{y:.2f} s per request<extra>" + name + "</extra>",
            ), row=1, col=1)
        meas = [r for r in rows if r.get("steady_speedup") is not None]
        fig.add_trace(go.Scatter(
            x=[r["batch"] for r in meas], y=[r["steady_speedup"] for r in meas], mode="lines+markers",
            name=f"measured · {label}", line={"color": COLORS["measured"], "dash": dash},
            hovertemplate="B=%{x}: measured %{y:.2f}×<extra></extra>",
        ), row=1, col=2)
        curve = [c for c in result.get("prediction_curve", {}).get(mode, []) if c["batch"] <= max(2 * top, 4)]
        if curve:
            fig.add_trace(go.Scatter(
                x=[c["batch"] for c in curve], y=[c["speedup"] for c in curve], mode="lines",
                name=f"predicted · {label}", line={"color": COLORS["predicted"], "dash": dash, "width": 1.5},
                hovertemplate="B=%{x}: predicted %{y:.2f}×<extra></extra>",
            ), row=1, col=2)
        cx = result.get("crossover", {}).get(mode, {}).get("measured_steady")
        if cx is not None:
            y = next(r["steady_speedup"] for r in rows if r["batch"] == cx)
            # annotations on a log axis take log10 coordinates
            fig.add_annotation(x=math.log10(cx), y=y, text=f"crossover B={cx}", showarrow=True, arrowhead=2, ax=0,
                               ay=-36, font={"size": 11, "color": COLORS["measured"]}, row=1, col=2)
    fig.add_hline(y=1.0, line={"color": COLORS["text"], "dash": "dot", "width": 1}, row=1, col=2)
    fig.update_xaxes(title_text="throughput, tokens/s over all rows", row=1, col=1)
    fig.update_yaxes(title_text="mean latency per request (s)", row=1, col=1)
    fig.update_xaxes(title_text="batch size B", type="log", dtick=0.30103, row=1, col=2)
    fig.update_yaxes(title_text="speculative ÷ plain tok/s", row=1, col=2)
    return _layout(fig, _subtitle(result), height)


def _subtitle(result: dict) -> str:
    m = result.get("models", {})
    who = m.get("name") or m.get("target", "")
    return (f"{html.escape(str(who))} on {result.get('device', '?')} ({result.get('dtype', '?')}), γ = {result['gamma']}, "
            f"{result.get('max_new_tokens', '?')} new tokens per request")


def cost_figure(result: dict | None, height: int = 360) -> go.Figure:
    """Measured per-pass costs with their fitted lines: verification vs B×(γ+1) tokens, draft pass and plain
    step vs B. These fits are what the prediction is made of."""
    if not result or not _modes(result):
        return empty_figure("pass costs appear with a benchmark result")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("one verification pass vs tokens scored, B×(γ+1)",
                                        "one draft pass and one plain step vs B"))
    for mode in _modes(result):
        rows, fits = _rows(result, mode), result.get("fits", {}).get(mode, {})
        dash, label = MODE_DASH.get(mode, "dot"), MODE_LABEL.get(mode, mode)
        panels = (("verify", "verify_tokens", "verify_ms", COLORS["p"], 1, "verify"),
                  ("draft", "batch", "draft_pass_ms", COLORS["q"], 2, "draft pass"),
                  ("plain", "batch", "plain_step_ms", COLORS["text"], 2, "plain step"))
        for key, xk, yk, color, col, name in panels:
            pts = [r for r in rows if r.get(yk) is not None]
            fig.add_trace(go.Scatter(x=[r[xk] for r in pts], y=[r[yk] for r in pts], mode="markers",
                                     name=f"{name} · {label}", marker={"color": color, "size": 8},
                                     hovertemplate="%{x}: %{y:.1f} ms<extra>" + name + "</extra>"), row=1, col=col)
            f = fits.get(key)
            if f and pts:
                xs = [min(r[xk] for r in pts), max(r[xk] for r in pts)]
                fig.add_trace(go.Scatter(x=xs, y=[f[0] + f[1] * x for x in xs], mode="lines",
                                         name=f"fit {f[0]:.1f} + {f[1]:.2f}·x", line={"color": color, "dash": dash},
                                         hoverinfo="skip"), row=1, col=col)
    fig.update_xaxes(title_text="tokens in the pass", row=1, col=1)
    fig.update_xaxes(title_text="batch size B", row=1, col=2)
    fig.update_yaxes(title_text="ms per pass", row=1, col=1)
    fig.update_yaxes(title_text="ms per pass", row=1, col=2)
    return _layout(fig, "what a pass costs on this machine (measured points, fitted lines)", height)


# ------------------------------------------------------------------------------------------ plain words


def _fmt(x, spec="{:.2f}") -> str:
    return "?" if x is None else spec.format(x)


def crossover_reading(result: dict | None) -> str:
    """HTML paragraphs: per mode, the speedup at the smallest and largest B, the crossover, and why."""
    if not result or not _modes(result):
        return "<p>No result yet.</p>"
    parts = []
    g = result["gamma"]
    for mode in _modes(result):
        rows = _rows(result, mode)
        lo, hi = rows[0], rows[-1]
        cx = result.get("crossover", {}).get(mode, {})
        meas, pred = cx.get("measured_steady"), cx.get("predicted")
        label = MODE_LABEL.get(mode, mode)
        if meas is None:
            where = (f"speculation still pays at every measured batch size, up to B = {hi['batch']}"
                     + (f"; the cost model expects it to stop paying at B = {pred}" if pred else ""))
        elif meas == lo["batch"]:
            where = (f"speculation does not pay even at B = {meas} on this machine"
                     " (the draft is too slow relative to the target here)")
        else:
            where = f"<b>speculation stops paying at B = {meas}</b>" + (
                f" (the cost model predicts B = {pred})" if pred else "")
        why = []
        if lo.get("verify_ms") and hi.get("verify_ms") and hi["batch"] > lo["batch"]:
            facts = (f"one verification pass scores B×(γ+1) tokens: {lo['verify_tokens']} at B = {lo['batch']} costs "
                     f"{_fmt(lo['verify_ms'], '{:.0f}')} ms, {hi['verify_tokens']} at B = {hi['batch']} costs "
                     f"{_fmt(hi['verify_ms'], '{:.0f}')} ms, while a plain step (B tokens) goes from "
                     f"{_fmt(lo.get('plain_step_ms'), '{:.0f}')} to {_fmt(hi.get('plain_step_ms'), '{:.0f}')} ms")
            grew_v = hi["verify_ms"] / lo["verify_ms"]
            grew_p = (hi["plain_step_ms"] / lo["plain_step_ms"]) if lo.get("plain_step_ms") and hi.get(
                "plain_step_ms") else None
            if grew_p is not None and grew_v > max(1.5, 1.2 * grew_p):  # it really grew, and faster than a step
                facts += (". At small B the machine mostly waits on reading the weights, so checking γ+1 tokens costs "
                          "about one step; as B grows it becomes compute-bound and the γ extra tokens per row are "
                          "paid in full")
            else:
                facts += (". Here verification grew no faster than a plain step: at these batch sizes the machine "
                          "still has compute to spare, and what the batch loses is in the tokens per round below")
            why.append(facts)
        if lo.get("tokens_per_round_per_row") and hi.get("tokens_per_round_per_row"):
            why.append(
                f"each row advances {_fmt(lo['tokens_per_round_per_row'])} tokens per round at B = {lo['batch']} but "
                f"only {_fmt(hi['tokens_per_round_per_row'])} at B = {hi['batch']}: the batch commits the smallest "
                f"accepted count + 1 (a row that ends this round excepted), so it moves at the pace of its "
                f"least-accepted row "
                f"({_fmt(hi.get('thrown_per_round'), '{:.1f}')} accepted tokens thrown away per round at B = "
                f"{hi['batch']})")
        speed = (f"Speculative ÷ plain throughput (steady state): {_fmt(lo.get('steady_speedup'))}× at "
                 f"B = {lo['batch']}, {_fmt(hi.get('steady_speedup'))}× at B = {hi['batch']}.")
        parts.append(f"<p><b>{html.escape(label)}</b>: {where}. {speed}</p>"
                     + ("<ul>" + "".join(f"<li>{w}.</li>" for w in why) + "</ul>" if why else ""))
    note = (f"<p class='sdb-note'>γ = {g}; measured on {html.escape(str(result.get('device', '?')))} "
            f"({html.escape(str(result.get('dtype', '?')))}, {result.get('torch_threads', '?')} threads). Latency "
            "per request falls with speculation at small B; at large B the batch is throughput-bound and "
            "speculation spends compute it no longer has to spare.</p>")
    return "<div class='sdb-reading'>" + "".join(parts) + note + "</div>"


# ------------------------------------------------------------------------------------------- batch view

BATCH_CSS = """
.sdb-wrap { overflow-x: auto; font-size: 13px; }
.sdb-grid { display: grid; gap: 3px 0; align-items: stretch; }
.sdb-head { font-size: 11px; color: var(--body-text-color-subdued, #8a8f99); padding: 2px 6px;
  border-left: 1px solid var(--border-color-primary, #ccc); white-space: nowrap; }
.sdb-name { font-size: 12px; padding: 3px 6px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis;
  max-width: 14em; color: var(--body-text-color-subdued, #8a8f99); }
.sdb-cell { padding: 3px 4px; border-left: 1px solid var(--border-color-primary, #ccc); white-space: nowrap; }
.sdb-chip { display: inline-block; padding: 0 3px; margin: 0 1px; border-radius: 4px; border: 1px solid;
  font-family: var(--font-mono, monospace); font-size: 12px; }
.sdb-kept { background: var(--sd-acc-bg, #dcfce7); color: var(--sd-acc-fg, #14532d); border-color: var(--sd-acc-bd, #86efac); }
.sdb-rep { background: var(--sd-rep-bg, #fef3c7); color: var(--sd-rep-fg, #92400e); border-color: var(--sd-rep-bd, #f59e0b); }
.sdb-bonus { background: var(--sd-bonus-bg, #fae8ff); color: var(--sd-bonus-fg, #86198f); border-color: var(--sd-bonus-bd, #d946ef); }
.sdb-held { display: inline-block; padding: 0 4px; margin-left: 3px; border-radius: 4px; font-size: 11px;
  border: 1px dashed var(--sd-disc-bd, #94a3b8); color: var(--sd-disc-fg, #64748b); }
.sdb-wait { background: repeating-linear-gradient(135deg, transparent 0 6px, rgba(148,163,184,0.18) 6px 12px); }
.sdb-slow { box-shadow: inset 3px 0 0 var(--sd-rej-bd, #dc2626); }
.sdb-slowtag { font-size: 10px; color: var(--sd-rej-fg, #b91c1c); margin-left: 3px; }
.sdb-done { color: var(--body-text-color-subdued, #8a8f99); font-size: 11px; font-style: italic; }
.sdb-legend { font-size: 12px; margin: 4px 0 8px; display: flex; flex-wrap: wrap; gap: 12px; align-items: center; }
.sdb-reading ul { margin: 2px 0 8px 18px; }
.sdb-note { font-size: 12px; color: var(--body-text-color-subdued, #8a8f99); }
.sdb-len { font-size: 10px; color: var(--body-text-color-subdued, #8a8f99); margin-left: 3px; }
.sdb-title { font-size: 12px; font-weight: 600; margin: 10px 0 2px; }
"""


def batch_legend() -> str:
    return ("<div class='sdb-legend'>"
            "<span><span class='sdb-chip sdb-kept'>a</span> kept guess</span>"
            "<span><span class='sdb-chip sdb-rep'>b</span> the row's own repair</span>"
            "<span><span class='sdb-chip sdb-bonus'>c</span> bonus</span>"
            "<span class='sdb-cell sdb-slow'>slowest row: sets the pace</span>"
            "<span class='sdb-cell sdb-wait'>waiting<span class='sdb-held'>+2 held</span></span>"
            "<span>(kept by this row, thrown away to stay in step)</span></div>")


def _chip(piece: str, cls: str) -> str:
    return f"<span class='sdb-chip {cls}'>{html.escape(visible_piece(piece))}</span>"


def render_batch_view(rounds: list[dict] | None, prompts: list[str] | None = None, upto: int | None = None,
                      max_rounds: int = 40) -> str:
    """B token streams, one line per request, one column per round (at most the first `max_rounds`, or the
    rounds up to `upto`). Every row gains the same number of tokens per round; a row that kept more guesses
    than the slowest one shows a striped, waiting cell with its held-back count, and the slowest row is marked."""
    if not rounds:
        return "<div class='sdb-wrap'><p class='sdb-note'>The batch view appears after a run.</p></div>"
    shown = rounds[: (upto if upto is not None else max_rounds)]
    b = len(shown[0]["committed"])
    names = list(prompts or [])[:b] + [f"request {i + 1}" for i in range(len(prompts or []), b)]
    cols = f"minmax(7em, 14em) repeat({len(shown)}, max-content)"
    cells = ["<div class='sdb-head'>request</div>"]
    for r in shown:
        m = _slowest(r)
        cells.append(f"<div class='sdb-head' title='smallest accepted count m = {m}, so every row that goes on emits "
                     f"{m + 1} tokens'>round {r['index'] + 1} · m={m}</div>")
    for i in range(b):
        cells.append(f"<div class='sdb-name' title='{html.escape(names[i])}'>{i + 1}. "
                     f"{html.escape(visible_piece(names[i][:40]))}</div>")
        for r in shown:
            cells.append(_cell(r, i))
    more = len(rounds) - len(shown)
    tail = f"<p class='sdb-note'>… {more} more round(s) not shown.</p>" if more > 0 else ""
    return (f"<div class='sdb-wrap'>{batch_legend()}<div class='sdb-grid' style='grid-template-columns: {cols}'>"
            + "".join(cells) + f"</div>{tail}</div>")


def _slowest(r: dict) -> int:
    """A round's smallest accepted count m ("kept" in bench files written before the glossary)."""
    return r["slowest"] if "slowest" in r else r["kept"]


def _cell(r: dict, i: int) -> str:
    if not r["active"][i]:
        return "<div class='sdb-cell sdb-done'>done</div>"
    pieces, n = r["pieces"][i], r["n_accepted"][i]
    held = (r.get("held") or [0] * len(r["active"]))[i]
    chips = []
    for j, piece in enumerate(pieces):
        last_own = r["own"][i] and j == len(pieces) - 1
        cls = ("sdb-bonus" if n == r["gamma"] else "sdb-rep") if last_own else "sdb-kept"
        chips.append(_chip(piece, cls))
    classes = ["sdb-cell"]
    extra = ""
    if n is not None and n == _slowest(r) and r.get("thrown", 0) > 0:  # someone waited on this row
        classes.append("sdb-slow")
        extra = "<span class='sdb-slowtag'>slowest</span>"
    elif held > 0:
        classes.append("sdb-wait")
        extra = f"<span class='sdb-held' title='kept by this row, thrown away to stay in step'>+{held} held</span>"
    tip = f"kept {n} of {r['gamma']} guesses" if n is not None else ""
    return f"<div class='{' '.join(classes)}' title='{tip}'>{''.join(chips)}{extra}</div>"


# ------------------------------------------------------------------------------------ ragged beside lockstep

LOOP_COLORS = {"plain": PLAIN_COLOR, "lockstep": SPEC_COLOR, "ragged": COLORS["measured"],
               "scheduled": COLORS["engine"]}
LOOP_NAMES = {"plain": "plain", "lockstep": "lockstep", "ragged": "ragged", "scheduled": "ragged, scheduled γ"}
ROW_COLORS = ["#3b82f6", "#f97316", "#16a34a", "#8b5cf6", "#dc2626", "#14b8a6", "#eab308", "#64748b"]


def _loops(result: dict) -> list[str]:
    return [n for n in result.get("loops") or [] if any(f"{n}_tok_s" in r for r in result.get("rows", []))]


def loop_figure(result: dict | None, height: int = 430) -> go.Figure:
    """Left: tok/s over all rows against B for plain and every measured loop. Right: p90 per-request latency
    against B. One line per loop and mode."""
    if not result or not _modes(result) or not _loops(result):
        return empty_figure("run the batch benchmark with the ragged loop to compare the loops")
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12,
                        subplot_titles=("throughput vs batch size, per loop", "p90 latency per request vs batch size"))
    for mode in _modes(result):
        rows, dash, label = _rows(result, mode), MODE_DASH.get(mode, "dot"), MODE_LABEL.get(mode, mode)
        for n in ["plain", *_loops(result)]:
            tok, lat = f"{n}_tok_s", f"{n}_p90_latency_ms"
            name = f"{LOOP_NAMES.get(n, n)} · {label}"
            pts = [r for r in rows if r.get(tok) is not None]
            fig.add_trace(go.Scatter(x=[r["batch"] for r in pts], y=[r[tok] for r in pts], mode="lines+markers",
                                     name=name, legendgroup=name, line={"color": LOOP_COLORS.get(n), "dash": dash},
                                     hovertemplate="B=%{x}: %{y:.1f} tok/s<extra>" + name + "</extra>"), row=1, col=1)
            pts = [r for r in rows if r.get(lat) is not None]
            fig.add_trace(go.Scatter(x=[r["batch"] for r in pts], y=[r[lat] / 1e3 for r in pts], mode="lines+markers",
                                     name=name, legendgroup=name, showlegend=False,
                                     line={"color": LOOP_COLORS.get(n), "dash": dash},
                                     hovertemplate="B=%{x}: p90 %{y:.2f} s<extra>" + name + "</extra>"), row=1, col=2)
    for col in (1, 2):
        fig.update_xaxes(title_text="batch size B", type="log", dtick=0.30103, row=1, col=col)
    fig.update_yaxes(title_text="tokens/s over all rows", row=1, col=1)
    fig.update_yaxes(title_text="p90 latency per request (s)", row=1, col=2)
    return _layout(fig, "plain, lockstep and ragged batched decoding on this machine", height)


def _progress(rounds: list[dict]) -> list[tuple[list[float], list[list[int]]]]:
    """(elapsed seconds at the end of each round, tokens emitted so far per row) from a run's round dicts."""
    if not rounds:
        return []
    b = len(rounds[0]["committed"])
    done, t, n = [0] * b, [0.0], [[0] for _ in range(b)]
    for r in rounds:
        for i in range(b):
            done[i] += len(r["committed"][i])
            n[i].append(done[i])
        t.append(r.get("elapsed_ms", 0.0) / 1e3)
    return [(t, n)]


def pace_figure(example: dict | None, height: int = 360) -> go.Figure:
    """Tokens each request has emitted against wall time, lockstep beside ragged (the same prompts, mode and γ):
    lockstep rows climb together, ragged rows each at their own pace."""
    ex = example or {}
    runs = [(n, ex.get(f"{n}_rounds")) for n in ("lockstep", "ragged") if ex.get(f"{n}_rounds")]
    if not runs:
        return empty_figure("the pace of each request appears after a run with lockstep and ragged loops")
    fig = make_subplots(rows=1, cols=len(runs), horizontal_spacing=0.1, shared_yaxes=True,
                        subplot_titles=[f"{LOOP_NAMES[n]}: tokens per request over time" for n, _ in runs])
    prompts = ex.get("prompts") or []
    for col, (n, rounds) in enumerate(runs, 1):
        for t, counts in _progress(rounds):
            for i, c in enumerate(counts):
                name = f"{i + 1}. {prompts[i][:24] if i < len(prompts) else 'request'}"
                fig.add_trace(go.Scatter(x=t, y=c, mode="lines+markers", line={"shape": "hv",
                                         "color": ROW_COLORS[i % len(ROW_COLORS)]}, marker={"size": 4},
                                         name=name, legendgroup=name, showlegend=col == 1,
                                         hovertemplate="%{x:.2f} s: %{y} tokens<extra>" + html.escape(name) +
                                         "</extra>"), row=1, col=col)
        fig.update_xaxes(title_text="seconds since the batch started", row=1, col=col)
    fig.update_yaxes(title_text="tokens emitted", row=1, col=1)
    title = (f"B = {ex.get('batch', '?')}, {MODE_LABEL.get(ex.get('mode'), ex.get('mode', ''))}, "
             f"γ = {ex.get('gamma', '?')}: lockstep rows advance together, ragged rows at their own pace")
    return _layout(fig, title, height)


def render_ragged_view(rounds: list[dict] | None, prompts: list[str] | None = None, max_rounds: int = 40) -> str:
    """B token streams of a ragged run, one line per request, one column per round: every row emits its own
    accepted guesses plus its own repair/bonus token, so rows gain different counts per round and none waits.
    Each cell ends with the row's length so far."""
    if not rounds:
        return "<div class='sdb-wrap'><p class='sdb-note'>The ragged view appears after a run with the ragged loop.</p></div>"
    shown = rounds[:max_rounds]
    b = len(shown[0]["committed"])
    names = list(prompts or [])[:b] + [f"request {i + 1}" for i in range(len(prompts or []), b)]
    cols = f"minmax(7em, 14em) repeat({len(shown)}, max-content)"
    cells = ["<div class='sdb-head'>request</div>"]
    for r in shown:
        tip = "speculation off: a plain step" if r["gamma"] == 0 else f"γ = {r['gamma']} guesses per row"
        cells.append(f"<div class='sdb-head' title='{tip}'>round {r['index'] + 1} · γ={r['gamma']}</div>")
    done = [0] * b
    for i in range(b):
        cells.append(f"<div class='sdb-name' title='{html.escape(names[i])}'>{i + 1}. "
                     f"{html.escape(visible_piece(names[i][:40]))}</div>")
        for r in shown:
            if not r["active"][i]:
                cells.append("<div class='sdb-cell sdb-done'>done</div>")
                continue
            done[i] += len(r["committed"][i])
            n, pieces = r["n_accepted"][i], r["pieces"][i]
            chips = []
            for j, piece in enumerate(pieces):
                last_own = r["own"][i] and j == len(pieces) - 1
                cls = (("sdb-bonus" if n == r["gamma"] and r["gamma"] else "sdb-rep") if last_own else "sdb-kept")
                chips.append(_chip(piece, cls))
            tip = f"kept {n} of {r['gamma']} guesses" if r["gamma"] else "plain step"
            cells.append(f"<div class='sdb-cell' title='{tip}'>{''.join(chips)}<span class='sdb-len'>{done[i]}</span>"
                         "</div>")
    more = len(rounds) - len(shown)
    tail = f"<p class='sdb-note'>… {more} more round(s) not shown.</p>" if more > 0 else ""
    return (f"<div class='sdb-wrap'><div class='sdb-grid' style='grid-template-columns: {cols}'>" + "".join(cells)
            + f"</div>{tail}</div>")


def render_both_views(example: dict | None) -> str:
    """The lockstep batch view and, when the run has one, the ragged view of the same prompts, one above the other."""
    ex = example or {}
    lock = ex.get("lockstep_rounds") or (ex.get("rounds") if ex.get("loop", "lockstep") == "lockstep" else None)
    parts = ["<div class='sdb-title'>lockstep: every row commits the batch's smallest accepted count + 1</div>",
             render_batch_view(lock, ex.get("prompts"))]
    if ex.get("ragged_rounds"):
        parts += ["<div class='sdb-title'>ragged: every row commits its own accepted count + 1</div>",
                  render_ragged_view(ex["ragged_rounds"], ex.get("prompts"))]
    return "".join(parts)
