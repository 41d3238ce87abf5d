"""Rendering for the Learn tab: HTML strings and Plotly figures, computed from plain data and nothing else.

No event handling and no model access here; ui/learn_tab.py wires these to gradio. Every piece of text that
comes from a user or a tokenizer is escaped before it goes into HTML or a Plotly label (Plotly reads a
subset of HTML in labels too).
"""

from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from specdec.lab import REPAIRS, HundredPoints, LabResult, RealCheck, RunPoint, format_p_value, speedup_curve

# Colours chosen to read on both the light and the dark gradio theme.
TOKEN_COLORS = ["#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2"]
C_TARGET = "#4c78a8"
C_DRAFT = "#9d9da6"
C_OUTPUT = "#2ca02c"
C_WRONG = "#d62728"
C_ENGINE = "#ff7f0e"
AXIS_GREY = "rgba(128,128,128,0.25)"
FONT = dict(color="#808693", size=13)


def show_piece(piece: str) -> str:
    """A token as visible, HTML-safe text: spaces and control characters get symbols so nothing is blank."""
    if piece == "":
        return "∅"
    s = piece.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")
    return html.escape(s)


def _fig_layout(fig: go.Figure, height: int, **extra) -> go.Figure:
    fig.update_layout(
        height=height,
        margin=dict(l=50, r=20, t=30, b=50),
        paper_bgcolor="rgba(0,0,0,0)",
        plot_bgcolor="rgba(0,0,0,0)",
        font=FONT,
        legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0, bgcolor="rgba(0,0,0,0)"),
        **extra,
    )
    fig.update_xaxes(gridcolor=AXIS_GREY, zerolinecolor=AXIS_GREY, linecolor=AXIS_GREY)
    fig.update_yaxes(gridcolor=AXIS_GREY, zerolinecolor=AXIS_GREY, linecolor=AXIS_GREY)
    return fig


def message_html(text: str, kind: str = "info") -> str:
    """A one-line notice (kind: info, warn, error) with its text escaped."""
    return f'<div class="learn-msg learn-msg-{kind}">{html.escape(text)}</div>'


# ------------------------------------------------------------------------------------------ walkthrough

STEPS = [
    ("Draft guesses", "draft"),
    ("One parallel check", "check"),
    ("Keep the good prefix", "keep"),
    ("First bad guess stops the round", "stop"),
    ("Repair", "repair"),
    ("Bonus token", "bonus"),
    ("Round result", "result"),
]
N_STEPS = len(STEPS)

Cell = tuple[str, str, str]  # (state class, main text (already escaped), small text (already escaped))


def _top_text(rows: list[dict] | None, k: int = 1) -> str:
    if not rows:
        return ""
    return ", ".join(f"{show_piece(t['piece'])} {t['prob']:.2f}" for t in rows[:k])


def walkthrough_cells(rnd: dict, step: int) -> dict[str, list[Cell | None]]:
    """The strip after `step` (0-based): three rows of gamma+1 cells, None where a cell is still empty.

    Rows: what the draft guessed, what the one target pass computed, and what the round has emitted so far.
    Each step only adds to or restyles the previous one, so diffing consecutive steps shows what changed.
    """
    g = int(rnd["gamma"])
    n = int(rnd["n_accepted"])
    rej = rnd.get("rejected_at")
    pieces = [show_piece(p) for p in rnd["draft_pieces"]]
    q, p, a, u = rnd["q_draft"], rnd["p_draft"], rnd["accept_probs"], rnd["uniforms"]
    guess: list[Cell | None] = [None] * (g + 1)
    check: list[Cell | None] = [None] * (g + 1)
    out: list[Cell | None] = [None] * (g + 1)
    for s in range(step + 1):
        kind = STEPS[s][1]
        if kind == "draft":
            guess[:g] = [("draft", pieces[i], f"q = {q[i]:.2f}") for i in range(g)]
        elif kind == "check":
            check[:g] = [("check", f"p = {p[i]:.2f}", f"keep chance {a[i]:.2f}") for i in range(g)]
            p_top = rnd.get("p_top") or []
            nxt = _top_text(p_top[g]) if len(p_top) > g else ""
            check[g] = ("check-extra", "next slot", f"p ready: {nxt}" if nxt else "p ready")
        elif kind == "keep":
            for i in range(n):
                guess[i] = ("kept", pieces[i], f"u {u[i]:.2f} &lt; {a[i]:.2f}")
                out[i] = ("out-kept", pieces[i], "kept")
        elif kind == "stop" and rej is not None:
            guess[rej] = ("rejected", pieces[rej], f"u {u[rej]:.2f} ≥ {a[rej]:.2f}")
            for i in range(rej + 1, g):
                guess[i] = ("discarded", pieces[i], "thrown away")
        elif kind == "repair" and rej is not None:
            out[rej] = ("out-repair", show_piece(rnd["emitted_piece"]), "repair")
        elif kind == "bonus" and rej is None:
            out[g] = ("out-bonus", show_piece(rnd["emitted_piece"]), "bonus")
    return {"guess": guess, "check": check, "out": out}


def _changed(rnd: dict, step: int) -> dict[str, list[bool]]:
    now = walkthrough_cells(rnd, step)
    before = walkthrough_cells(rnd, step - 1) if step > 0 else {k: [None] * len(v) for k, v in now.items()}
    return {k: [a != b for a, b in zip(now[k], before[k])] for k in now}


def _narrative(rnd: dict, step: int) -> str:
    g, n, rej = int(rnd["gamma"]), int(rnd["n_accepted"]), rnd.get("rejected_at")
    kind = STEPS[step][1]
    words = " ".join(show_piece(p) for p in rnd["draft_pieces"])
    emitted = show_piece(rnd["emitted_piece"])
    if kind == "draft":
        return (f"The small draft model writes {g} guesses, one after another: <b>{words}</b>. "
                "Each guess comes with the chance q the draft gave it. Nothing is final yet.")
    if kind == "check":
        return (f"The large target model reads all {g} guesses in <b>one</b> forward pass and gets its own chance p "
                f"for each, plus the chances for the slot after the last guess. A guess is kept with chance "
                f"min(1, p/q): a guess the target likes at least as much as the draft did is always kept.")
    if kind == "keep":
        if n == 0:
            return "The first guess already fails its check, so no guess is kept this round."
        return (f"Reading left to right, each guess draws a random number u and passes if u is below its keep chance. "
                f"The first {n} guess{'es' if n != 1 else ''} pass{'' if n != 1 else 'es'} and become output.")
    if kind == "stop":
        if rej is None:
            return f"No guess failed: all {g} passed the check, so nothing is thrown away."
        later = g - rej - 1
        tail = (f" The {later} guess{'es' if later != 1 else ''} after it {'are' if later != 1 else 'is'} thrown away "
                "unchecked: they were written after text the target did not accept.") if later else ""
        bad = show_piece(rnd["draft_pieces"][rej])
        return (f"Guess {rej + 1} (<b>{bad}</b>) fails: u = {rnd['uniforms'][rej]:.2f} "
                f"is not below {rnd['accept_probs'][rej]:.2f}. The round stops there.{tail}")
    if kind == "repair":
        if rej is None:
            return "No repair is needed: no guess was rejected."
        return (f"The empty slot is filled from the chances the draft under-supplied, normalize(max(0, p − q)). "
                f"This round it drew <b>{emitted}</b>. Sampling from p again, or from q, would skew the output.")
    if kind == "bonus":
        if rej is None:
            return (f"Every guess passed, so the target's row for the next slot, already computed in the same pass, "
                    f"gives one more token for free: <b>{emitted}</b>.")
        return "No bonus this round: a guess failed, and the repaired token was this round's extra token."
    made = n + 1
    committed = rnd.get("committed_pieces") or []
    cut = ""
    if len(committed) < made:
        cut = f" (the run stopped early, so only {len(committed)} of them were committed)"
    return (f"Round output: <b>{' '.join(show_piece(p) for p in committed) or '∅'}</b>: {made} token"
            f"{'s' if made != 1 else ''} from one target pass{cut}. Plain decoding needs one target pass per token.")


def _cell_html(cell: Cell | None, changed: bool) -> str:
    if cell is None:
        return '<div class="learn-cell learn-empty"></div>'
    cls, main, sub = cell
    ch = " learn-changed" if changed else ""
    return (f'<div class="learn-cell learn-{cls}{ch}"><span class="learn-tok">{main}</span>'
            f'<span class="learn-sub">{sub}</span></div>')


def _details_table(rnd: dict, step: int) -> str:
    """Per-guess numbers, with columns revealed as the walkthrough reaches them."""
    g, rej = int(rnd["gamma"]), rnd.get("rejected_at")
    show_p, show_u = step >= 1, step >= 2
    head = "<tr><th>#</th><th>guess</th><th>q(guess)</th>"
    head += "<th>p(guess)</th><th>keep chance</th>" if show_p else ""
    head += "<th>u</th><th>verdict</th>" if show_u else ""
    rows = []
    for i in range(g):
        piece = show_piece(rnd["draft_pieces"][i])
        r = f"<td>{i + 1}</td><td><code>{piece}</code></td><td>{rnd['q_draft'][i]:.3f}</td>"
        if show_p:
            r += f"<td>{rnd['p_draft'][i]:.3f}</td><td>{rnd['accept_probs'][i]:.3f}</td>"
        if show_u:
            if rej is not None and i > rej:
                r += "<td>—</td><td>not checked</td>"
            elif i < int(rnd["n_accepted"]):
                r += f"<td>{rnd['uniforms'][i]:.3f}</td><td>kept</td>"
            elif step >= 3:
                r += f"<td>{rnd['uniforms'][i]:.3f}</td><td>rejected</td>"
            else:
                r += "<td></td><td></td>"
        rows.append(f"<tr>{r}</tr>")
    return f'<table class="learn-table">{head}</tr>{"".join(rows)}</table>'


def _mini_bars(title: str, rows: list[dict] | None, color: str, k: int = 6) -> str:
    if not rows:
        return ""
    items = "".join(
        f'<div class="learn-bar-row"><code>{show_piece(t["piece"])}</code>'
        f'<span class="learn-bar" style="width:{max(1.0, 100 * t["prob"]):.1f}%;background:{color}"></span>'
        f'<span>{t["prob"]:.3f}</span></div>'
        for t in rows[:k]
    )
    return f'<div class="learn-mini"><div class="learn-mini-title">{html.escape(title)}</div>{items}</div>'


def _side_panels(rnd: dict, step: int) -> str:
    kind, g, rej = STEPS[step][1], int(rnd["gamma"]), rnd.get("rejected_at")
    p_top, q_top = rnd.get("p_top") or [], rnd.get("q_top") or []
    if kind == "repair" and rej is not None:
        return (_mini_bars(f"draft q at guess {rej + 1}", q_top[rej] if rej < len(q_top) else None, C_DRAFT)
                + _mini_bars(f"target p at guess {rej + 1}", p_top[rej] if rej < len(p_top) else None, C_TARGET)
                + _mini_bars("repair: normalize(max(0, p − q))", rnd.get("residual_top"), "#e8a33d"))
    if kind == "bonus" and rej is None:
        return _mini_bars(f"target p at slot {g + 1} (bonus)", p_top[g] if g < len(p_top) else None, "#8e6bbf")
    return ""


def walkthrough_html(rnd: dict, step: int, title: str = "") -> str:
    """The whole walkthrough panel for one step: progress, strip with changes outlined, story, numbers."""
    step = max(0, min(N_STEPS - 1, int(step)))
    g = int(rnd["gamma"])
    cells, changed = walkthrough_cells(rnd, step), _changed(rnd, step)
    labels = {"guess": "small model guesses", "check": "large model, one pass", "out": "round output"}
    cols = "".join(f'<div class="learn-colhead">slot {i + 1}</div>' for i in range(g + 1))
    grid = [f'<div class="learn-rowlabel"></div>{cols}']
    for key in ("guess", "check", "out"):
        row = "".join(_cell_html(c, ch) for c, ch in zip(cells[key], changed[key]))
        grid.append(f'<div class="learn-rowlabel">{labels[key]}</div>{row}')
    dots = "".join(
        f'<span class="learn-dot{" learn-dot-on" if i == step else ""}{" learn-dot-done" if i < step else ""}" '
        f'title="{html.escape(name)}">{i + 1}</span>'
        for i, (name, _) in enumerate(STEPS)
    )
    context = rnd.get("context")
    ctx = (f'<div class="learn-context">Text so far: <code>{html.escape(str(context))}</code></div>' if context
           else f'<div class="learn-context">Round {int(rnd.get("index", 0)) + 1}, after {int(rnd.get("position", 0))} '
                f'generated tokens</div>')
    return (
        f'<div class="learn-walk">'
        f'<div class="learn-steps">{dots}<span class="learn-step-name" id="learn-step-name">'
        f'Step {step + 1} of {N_STEPS}: {html.escape(STEPS[step][0])}</span></div>'
        f'{ctx}'
        f'<div class="learn-grid" style="grid-template-columns: 11em repeat({g + 1}, minmax(5.5em, 1fr))">'
        f'{"".join(grid)}</div>'
        f'<p class="learn-story">{_narrative(rnd, step)}</p>'
        f'<div class="learn-details">{_details_table(rnd, step)}{_side_panels(rnd, step)}</div>'
        f"</div>"
    )


# ------------------------------------------------------------------------------------------- 100 points


def hundred_points_figure(hp: HundredPoints) -> go.Figure:
    """Stacked bars in points out of 100: draft q, target p, kept, the gap, repair filling it, final = p.

    Trace order fixes the stacking: an invisible base lifts the gap and repair bars to height alpha, then
    each token's kept part and repair part, then the empty outline of the gap on the kept bar.
    """
    bars = ["Draft q", "Target p", "Kept min(p,q)", "Gap 1−α", "Repair max(0,p−q)", "Final"]
    pts = lambda a: [100 * float(v) for v in a]  # noqa: E731
    p, q, kept, res = pts(hp.p), pts(hp.q), pts(hp.kept), pts(hp.residual)
    alpha, gap = 100 * hp.alpha, 100 * hp.gap
    fig = go.Figure()
    fig.add_bar(x=bars, y=[0, 0, 0, alpha, alpha, 0], marker_color="rgba(0,0,0,0)", hoverinfo="skip", showlegend=False)
    for i, tok in enumerate(hp.tokens):
        color = TOKEN_COLORS[i % len(TOKEN_COLORS)]
        name = html.escape(tok)
        solid = [q[i], p[i], kept[i], 0, 0, kept[i]]
        fig.add_bar(
            x=bars, y=solid, name=name, legendgroup=name, marker_color=color,
            text=[f"{name} {v:.0f}" if v >= 4 else "" for v in solid], textposition="inside",
            hovertemplate=f"{name}: %{{y:.1f}} points<extra>%{{x}}</extra>",
        )
        rep = [0, 0, 0, 0, res[i], res[i]]
        fig.add_bar(
            x=bars, y=rep, name=f"{name} (repair)", legendgroup=name, showlegend=False, marker_color=color,
            marker_pattern_shape="/", marker_pattern_fgcolor="rgba(255,255,255,0.7)",
            text=[f"{name} +{v:.0f}" if v >= 4 else "" for v in rep], textposition="inside",
            hovertemplate=f"{name} repair: %{{y:.1f}} points<extra>%{{x}}</extra>",
        )
    hole = [0, 0, gap, gap, 0, 0]
    fig.add_bar(
        x=bars, y=hole, name="gap", marker_color="rgba(128,128,128,0.06)",
        marker_line=dict(color="rgba(128,128,128,0.9)", width=2),
        text=[f"gap {v:.0f}" if v >= 4 else "" for v in hole], textposition="inside",
        hovertemplate="gap: %{y:.1f} points<extra>%{x}</extra>",
    )
    fig.update_traces(textfont=dict(color="white", size=12), insidetextanchor="middle", selector=dict(type="bar"))
    fig.data[-1].textfont = dict(color="#808693", size=12)
    _fig_layout(fig, 420, barmode="stack", bargap=0.25)
    fig.update_yaxes(range=[0, 100.5], title_text="points out of 100", dtick=20)
    return fig


def _points(x: float) -> str:
    """Points out of 100, whole when they are whole."""
    v = 100 * x
    return f"{v:.0f}" if abs(v - round(v)) < 0.05 else f"{v:.1f}"


def hundred_points_summary(hp: HundredPoints) -> str:
    rows = "".join(
        f"<tr><td><code>{html.escape(t)}</code></td><td>{100 * p:.1f}</td><td>{100 * q:.1f}</td>"
        f"<td>{100 * k:.1f}</td><td>{100 * r:.1f}</td><td>{100 * f:.1f}</td></tr>"
        for t, p, q, k, r, f in zip(hp.tokens, hp.p, hp.q, hp.kept, hp.residual, hp.final)
    )
    notes = "".join(message_html(n, "warn") for n in hp.notes)
    return (
        f'{notes}<div class="learn-stats"><span id="learn-alpha">α = Σ min(p, q) = {hp.alpha:.3f}</span>'
        f'<span id="learn-repair-prob">repair probability 1 − α = {hp.gap:.3f}</span></div>'
        f'<table class="learn-table"><tr><th>token</th><th>target p</th><th>draft q</th><th>kept</th>'
        f"<th>repair adds</th><th>final</th></tr>{rows}</table>"
        f'<p class="learn-note">A guess is kept with chance min(1, p/q), so each token keeps min(p, q) of its points. '
        f"The {_points(hp.gap)} missing points are exactly max(0, p − q), and the repair hands them out, so the final "
        f"bar matches the target's.</p>"
    )


# ------------------------------------------------------------------------------------------------- lab


def lab_figure(res: LabResult) -> go.Figure:
    """Target p, draft q and the sampled output side by side, with 95 % binomial error bars on the output."""
    toks = [html.escape(t) for t in res.tokens]
    emp = res.empirical
    err = 1.96 * np.sqrt(np.maximum(emp * (1 - emp), 1e-12) / res.n)
    ok = res.repair == "correct"
    fig = go.Figure()
    fig.add_bar(x=toks, y=res.p, name="target p (what exactness promises)", marker_color=C_TARGET)
    fig.add_bar(x=toks, y=res.q, name="draft q", marker_color=C_DRAFT)
    fig.add_bar(
        x=toks, y=emp, name=f"rule output, {res.n:,} rounds" + ("" if ok else " (wrong repair)"),
        marker_color=C_OUTPUT if ok else C_WRONG, error_y=dict(type="data", array=err, color="#808693"),
    )
    _fig_layout(fig, 360, barmode="group", bargap=0.2)
    fig.update_yaxes(title_text="probability of the first emitted token", rangemode="tozero")
    return fig


def verdict_of(pv: float, alpha_level: float = 1e-3) -> tuple[str, str]:
    if math.isnan(pv):
        return "warn", "not enough samples to test"
    if pv < alpha_level:
        return "bad", f"p-value below {alpha_level:g}: the output does not follow p"
    return "good", "consistent with p"


def lab_result_html(res: LabResult) -> str:
    kind, verdict = verdict_of(res.test.p_value)
    note = f" ({html.escape(res.test.note)})" if res.test.note else ""
    return (
        f'<div class="learn-result learn-{kind}">'
        f'<div class="learn-pvalue">p-value = {format_p_value(res.test.p_value)}</div>'
        f"<div>{html.escape(verdict)}</div>"
        f'<div class="learn-note">chi-square = {res.test.statistic:.2f} on {res.test.dof} degrees of freedom{note}; '
        f"total-variation distance to p = {res.tv:.4f}; {res.n:,} rounds in {res.seconds * 1e3:.0f} ms through "
        f"verify_batch; repair: {html.escape(REPAIRS[res.repair][0])}</div></div>"
    )


# ------------------------------------------------------------------------------------------ real models


def _piece_labels(ids: Sequence[int], pieces: Sequence[str]) -> list[str]:
    """Unique, escaped x labels: two ids may decode to the same text, so repeats get their id appended."""
    seen: dict[str, int] = {}
    out = []
    for i, pc in zip(ids, pieces):
        lab = show_piece(pc)
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} #{i}")
    return out


def real_figure(chk: RealCheck, pieces: dict[int, str], top: int = 12) -> go.Figure:
    """The target's p0 for its most likely tokens (plus everything else pooled) against both kinds of samples."""
    p0 = chk.rows.p0.double().numpy()
    q0 = chk.rows.q0.double().numpy()
    sup = chk.draws.support.numpy()
    vec = np.zeros_like(p0)
    vec[sup] = chk.draws.counts / max(1.0, chk.draws.counts.sum())
    eng = np.bincount(np.asarray(chk.engine_ids, dtype=np.int64), minlength=len(p0)).astype(np.float64)
    eng = eng / eng.sum() if eng.sum() else eng
    order = np.argsort(-p0)[:top]
    order = order[p0[order] > 0]
    labels = _piece_labels(order.tolist(), [pieces.get(int(i), str(int(i))) for i in order])
    rest = lambda a: float(max(0.0, 1.0 - a[order].sum()))  # noqa: E731
    labels.append("all other tokens")
    col = lambda a: list(a[order]) + [rest(a) if a.sum() else 0.0]  # noqa: E731
    fig = go.Figure()
    fig.add_bar(x=labels, y=col(p0), name="target p0 (exact)", marker_color=C_TARGET)
    fig.add_bar(x=labels, y=col(q0), name="draft q0", marker_color=C_DRAFT)
    fig.add_bar(x=labels, y=col(vec), name=f"verify_batch on p0/q0, {chk.draws.n:,} rounds", marker_color=C_OUTPUT)
    if chk.engine_ids:
        fig.add_bar(x=labels, y=col(eng), name=f"real decoder rounds, {len(chk.engine_ids)}", marker_color=C_ENGINE)
    _fig_layout(fig, 380, barmode="group", bargap=0.15)
    fig.update_yaxes(title_text="probability of the first emitted token", rangemode="tozero")
    fig.update_xaxes(tickangle=-30)
    return fig


def real_result_html(chk: RealCheck, pair_name: str, k_requested: int) -> str:
    v_kind, v_verdict = verdict_of(chk.test.p_value)
    cap = ""
    if chk.draws.capped_from:
        cap = message_html(
            f"p0 and q0 are non-zero on {len(chk.draws.support):,} tokens (no top-k/top-p), so the vectorized check "
            f"ran {chk.draws.n:,} of the {chk.draws.capped_from:,} requested rounds within its time budget. "
            "Set top-k to sample more.",
            "warn",
        )
    v_note = f" ({html.escape(chk.test.note)})" if chk.test.note else ""
    parts = [
        cap,
        f'<div class="learn-result learn-{v_kind}"><div class="learn-pvalue" id="learn-real-pvalue">'
        f"p-value = {format_p_value(chk.test.p_value)}</div><div>{html.escape(v_verdict)}</div>"
        f'<div class="learn-note"><b>Vectorized rounds</b>: {chk.draws.n:,} one-guess rounds through verify_batch on '
        f"the exact rows p0 (target) and q0 (draft) the engine computed at this prefix, in "
        f"{chk.draws.seconds * 1e3:.0f} ms; "
        f"chi-square {chk.test.statistic:.2f}, {chk.test.dof} d.o.f.{v_note}; total-variation distance to p0 "
        f"{chk.tv:.4f}. Chance the draft's first guess is kept here: α = {chk.alpha:.3f}.</div></div>",
    ]
    if chk.engine_test is not None:
        e_kind, e_verdict = verdict_of(chk.engine_test.p_value)
        e_note = f" ({html.escape(chk.engine_test.note)})" if chk.engine_test.note else ""
        outside = (f" {chk.engine_outside} of them emitted a token p0 gives probability 0." if chk.engine_outside
                   else " Every one emitted a token p0 allows.")
        parts.append(
            f'<div class="learn-result learn-{e_kind}"><div class="learn-pvalue" id="learn-engine-pvalue">'
            f"p-value = {format_p_value(chk.engine_test.p_value)}</div><div>{html.escape(e_verdict)}</div>"
            f'<div class="learn-note"><b>Real decoder rounds</b>: the first token of {len(chk.engine_ids)} full '
            f"SpeculativeDecoder rounds (draft model, target pass, verify), one seed each; chi-square "
            f"{chk.engine_test.statistic:.2f}, {chk.engine_test.dof} d.o.f.{e_note}.{outside} "
            f"With this few rounds the test only catches large errors.</div></div>"
        )
    elif k_requested:
        parts.append(message_html("The real decoder rounds were not run.", "warn"))
    parts.append(f'<div class="learn-note">Model pair: {html.escape(pair_name)}. '
                 f"Prompt: {len(chk.rows.prompt_ids)} tokens; temperature {chk.rows.sampling.temperature:g}, "
                 f"top-k {chk.rows.sampling.top_k}, top-p {chk.rows.sampling.top_p:g}.</div>")
    return "".join(parts)


# --------------------------------------------------------------------------------------------- speedup


def speedup_figure(c: float, points: Sequence[RunPoint] = (), gammas: Sequence[int] = range(1, 13)) -> go.Figure:
    """Leviathan et al.'s expected speedup against α for each γ at cost ratio c, slower-than-plain region shaded."""
    alphas = np.linspace(0.0, 0.99, 199)
    curves = {g: speedup_curve(g, c, alphas) for g in gammas}
    top = max(1.6, max(max(v) for v in curves.values()) * 1.05, *[(p.measured_speedup or 0) * 1.1 for p in points])
    fig = go.Figure()
    fig.add_shape(type="rect", x0=0, x1=1, y0=0, y1=1, fillcolor="rgba(214,39,40,0.10)", line_width=0, layer="below")
    fig.add_hline(y=1, line=dict(color="rgba(214,39,40,0.7)", width=1, dash="dash"))
    fig.add_annotation(x=0.98, y=0.08, xanchor="right", yanchor="bottom", text="below 1×: slower than plain decoding",
                       showarrow=False, font=dict(color="#d62728", size=13))
    n = len(curves)
    for j, (g, ys) in enumerate(curves.items()):
        color = sample_colorscale("Viridis", [0.85 * j / max(1, n - 1)])[0]  # stop before Viridis' pale yellow
        fig.add_scatter(x=alphas, y=ys, mode="lines", name=f"γ={g}", line=dict(color=color, width=1.6),
                        hovertemplate=f"γ={g}<br>α=%{{x:.2f}}<br>speedup %{{y:.2f}}×<extra></extra>")
    for pt in points:
        g = max(1, round(pt.mean_gamma))
        pred = speedup_curve(g, c, [pt.alpha])[0]
        label = html.escape(pt.label)
        fig.add_vline(x=pt.alpha, line=dict(color=C_ENGINE, width=1, dash="dot"))
        fig.add_scatter(
            x=[pt.alpha], y=[pred], mode="markers", name=f"{label}: α={pt.alpha:.2f}, γ≈{pt.mean_gamma:.1f} (model)",
            marker=dict(size=12, color="rgba(0,0,0,0)", line=dict(color=C_ENGINE, width=2.5)),
            hovertemplate=f"{label}<br>α=%{{x:.3f}}<br>predicted %{{y:.2f}}× at c={c:.2f}<extra></extra>",
        )
        if pt.measured_speedup is not None:
            fig.add_scatter(
                x=[pt.alpha], y=[pt.measured_speedup], mode="markers",
                name=f"{label}: measured {pt.measured_speedup:.2f}×",
                marker=dict(size=13, color=C_ENGINE, symbol="diamond", line=dict(color="white", width=1)),
                hovertemplate=f"{label}<br>α=%{{x:.3f}}<br>measured %{{y:.2f}}×<extra></extra>",
            )
    _fig_layout(fig, 440)
    fig.update_layout(legend=dict(orientation="v", y=1, x=1.01, yanchor="top", xanchor="left"), margin=dict(r=10))
    fig.update_xaxes(range=[0, 1], title_text="α: chance a draft guess is accepted")
    fig.update_yaxes(range=[0, top], title_text="expected speedup over plain decoding (×)")
    return fig


def speedup_summary(c: float, points: Sequence[RunPoint]) -> str:
    lines = [
        "<p class='learn-note'>Expected speedup = (1 − α<sup>γ+1</sup>) / ((1 − α)(γc + 1)) with "
        f"c = {c:.2f}, the cost "
        "of one draft step relative to one target step (Leviathan et al. 2022; it assumes each guess is accepted "
        "independently and that checking γ guesses costs one target step). Below the dashed line at 1× the "
        "draft costs more time than it saves.</p>"
    ]
    if not points:
        lines.append(message_html("No playground run recorded yet: generate text in the playground and your run "
                                  "appears here as a point.", "info"))
    for pt in points:
        g = max(1, round(pt.mean_gamma))
        pred = speedup_curve(g, c, [pt.alpha])[0]
        meas = (f"measured speedup {pt.measured_speedup:.2f}×" if pt.measured_speedup is not None
                else "no measured speedup (the run has no plain-decoding baseline), so only the model's point is shown")
        if pt.c_measured is not None:
            c_est = (f"; plain decoding timed for this pair gives c = {pt.c_measured:.2f} "
                     "(draft ms/token ÷ target ms/token)")
        elif pt.c_estimate is not None:
            c_est = (f"; your run's timings suggest c ≈ {pt.c_estimate:.2f} "
                     "(draft time per guess ÷ verify time per round)")
        else:
            c_est = ""
        lines.append(
            f"<div class='learn-run'><b>{html.escape(pt.label)}</b>: {pt.rounds} rounds, α = {pt.alpha:.3f}, mean γ = "
            f"{pt.mean_gamma:.2f}, {pt.tokens_per_round:.2f} tokens per round; "
            f"model predicts {pred:.2f}× at c = {c:.2f}; "
            f"{meas}{c_est}.</div>"
        )
    return "".join(lines)
