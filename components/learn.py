"""Rendering for the Learn tab: HTML strings and Plotly figures, computed from Rounds and the lab's results.

No event handling and no model access here; ui/learn_tab.py wires these to gradio. Tokens are drawn as the
playground draws them (components.tokens.piece_html), figures take the app's palette and layout
(components.style), and the speedup-vs-α chart is components.charts.speedup_curves_figure. Every piece of text that
comes from a user or a tokenizer is escaped before it goes into HTML or a Plotly label (Plotly reads a
subset of HTML in labels too).
"""

from __future__ import annotations

import dataclasses
import html
import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go

from specdec.core import events
from specdec.core.events import Round, TokenProb
from specdec.core.tree_events import TREE_ACCEPTED, TREE_UNTRIED, TreeRoundEvent
from specdec.learn.lab import LEVEL, HundredPoints, LabResult, RealCheck, RunPoint, format_p_value, speedup_curve

from .phases import same_draft_html
from .tree import render_tree
from .style import COLORS, TOKEN_COLORS, layout
from .tokens import piece_html

# What the exactness lab's repair choices are called on screen (specdec.learn.lab.REPAIRS holds the functions).
REPAIR_LABELS = {
    "correct": "Correct: draw from max(0, p − q)",
    "fresh-p": "Wrong: fresh draw from p",
    "from-q": "Wrong: draw from q again",
}


def _style(fig: go.Figure, height: int, **extra) -> go.Figure:
    """The app's one figure layout (components.style) on a figure built trace by trace."""
    extra.setdefault("margin", {"l": 52, "r": 12, "t": 30, "b": 60})
    fig.update_layout(**layout("", height, **extra))
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


def _top_text(rows: list[TokenProb] | None, k: int = 1) -> str:
    if not rows:
        return ""
    return ", ".join(f"{piece_html(t.piece)} {t.prob:.2f}" for t in rows[:k])


def _emitted_committed(rnd: Round) -> bool:
    return rnd.n_accepted < len(rnd.committed_ids)  # EOS or the token budget can end the text before it


def walkthrough_cells(rnd: Round, step: int) -> dict[str, list[Cell | None]]:
    """The strip after `step` (0-based): three rows of gamma+1 cells, None where a cell is still empty.

    Rows: what the draft guessed, what the one target pass computed, and what the round has emitted so far.
    Each step only adds to or restyles the previous one, so diffing consecutive steps shows what changed.
    """
    g, rej, fates = rnd.gamma, rnd.rejected_at, rnd.fates
    pieces = [piece_html(p) for p in rnd.draft_pieces]
    q, p, a, u = rnd.q_draft, rnd.p_draft, rnd.accept_probs, rnd.uniforms
    guess: list[Cell | None] = [None] * (g + 1)
    check: list[Cell | None] = [None] * (g + 1)
    out: list[Cell | None] = [None] * (g + 1)
    for s in range(step + 1):
        kind = STEPS[s][1]
        if kind == "draft":
            guess[:g] = [("draft", pieces[i], f"q = {q[i]:.2f}") for i in range(g)]
        elif kind == "check":
            check[:g] = [("check", f"p = {p[i]:.2f}", f"keep chance {a[i]:.2f}") for i in range(g)]
            nxt = _top_text(rnd.p_top[g]) if len(rnd.p_top) > g else ""
            check[g] = ("check-extra", "next slot", f"p ready: {nxt}" if nxt else "p ready")
        elif kind == "keep":
            for i in range(rnd.n_accepted):
                guess[i] = ("kept", pieces[i], f"u {u[i]:.2f} &lt; {a[i]:.2f}")
                out[i] = ("out-kept", pieces[i], "kept") if fates[i] == events.KEPT else None
        elif kind == "stop" and rej is not None:
            guess[rej] = ("rejected", pieces[rej], f"u {u[rej]:.2f} ≥ {a[rej]:.2f}")
            for i in range(rej + 1, g):
                guess[i] = ("discarded", pieces[i], "thrown away")
        elif kind == "repair" and rej is not None and _emitted_committed(rnd):
            out[rej] = ("out-repair", piece_html(rnd.emitted_piece), "repair")
        elif kind == "bonus" and rej is None and _emitted_committed(rnd):
            out[g] = ("out-bonus", piece_html(rnd.emitted_piece), "plain step" if g == 0 else "bonus")
    return {"guess": guess, "check": check, "out": out}


def _changed(rnd: Round, step: int) -> dict[str, list[bool]]:
    now = walkthrough_cells(rnd, step)
    before = walkthrough_cells(rnd, step - 1) if step > 0 else {k: [None] * len(v) for k, v in now.items()}
    return {k: [a != b for a, b in zip(now[k], before[k])] for k in now}


def _plural(n: int, word: str, plural: str | None = None) -> str:
    return f"{n} {word if n == 1 else plural or word + 's'}"


def _narrative(rnd: Round, step: int) -> str:
    g, n, rej = rnd.gamma, rnd.n_accepted, rnd.rejected_at
    kind = STEPS[step][1]
    words = " ".join(piece_html(p) for p in rnd.draft_pieces)
    emitted = piece_html(rnd.emitted_piece)
    if g == 0 and kind in ("draft", "check", "keep", "stop", "repair"):
        return {
            "draft": ("Round one asks for no guesses: it is plain decoding's first step, the prompt alone through "
                      "the target, timed so the measured speedup can count the prompt on both sides."
                      if rnd.asked_nothing else
                      f"The {html.escape(rnd.drafter)} drafter had nothing to propose this round (no earlier text "
                      "matched), so there are no guesses."),
            "check": "The target still runs its one forward pass: it gives p for the next slot.",
        }.get(kind, "Nothing to check: with no guesses, this round is one plain target step.")
    if kind == "draft":
        who = "The small draft model" if rnd.drafter == "model" else f"The {html.escape(rnd.drafter)} drafter"
        text = (f"{who} writes {_plural(g, 'guess', 'guesses')}, one after another: <b>{words}</b>. "
                "Each guess comes with the chance q the draft gave it. Nothing is final yet.")
        if rnd.one_hot:
            text += (" These guesses are copied, not sampled: q is 1 on each guess and 0 elsewhere, so a guess is "
                     "kept with chance exactly p.")
        return text
    if kind == "check":
        return (f"The large target model reads all {g} guesses in <b>one</b> forward pass and gets its own chance p "
                f"for each, plus the chances for the slot after the last guess. A guess is kept with chance "
                f"min(1, p/q): a guess the target likes at least as much as the draft did is always kept.")
    if kind == "keep" and rnd.verify != "pq":
        rule = ("strict: the target draws its own token at each slot and a guess passes only if it is that token"
                if rnd.verify == "strict" else
                "block: the guesses are judged together, and the longest run whose last check passes is kept")
        return f"This run checks with {rule}. {_plural(n, 'guess', 'guesses')} of {g} become output."
    if kind == "keep":
        if n == 0:
            return "The first guess already fails its check, so no guess is kept this round."
        return (f"Reading left to right, each guess draws a random number u and passes if u is below its keep chance. "
                f"The first {_plural(n, 'guess', 'guesses')} pass{'' if n != 1 else 'es'} and become output.")
    if kind == "stop":
        if rej is None:
            return f"No guess failed: all {g} passed the check, so nothing is thrown away."
        later = g - rej - 1
        tail = (f" The {_plural(later, 'guess', 'guesses')} after it {'are' if later != 1 else 'is'} thrown away "
                "unchecked: they were written after text the target did not accept.") if later else ""
        bad = piece_html(rnd.draft_pieces[rej])
        return (f"Guess {rej + 1} (<b>{bad}</b>) fails: u = {rnd.uniforms[rej]:.2f} "
                f"is not below {rnd.accept_probs[rej]:.2f}. The round stops there.{tail}")
    if kind == "repair":
        if rej is None:
            return "No repair is needed: no guess was rejected."
        return (f"The empty slot is filled from the chances the draft under-supplied, normalize(max(0, p − q)). "
                f"This round it drew <b>{emitted}</b>. Sampling from p again, or from q, would skew the output.")
    if kind == "bonus":
        if g == 0:
            return f"The target's p for the next slot gives this round's one token: <b>{emitted}</b>."
        if rej is None:
            return (f"Every guess passed, so the target's row for the next slot, already computed in the same pass, "
                    f"gives one more token for free: <b>{emitted}</b>.")
        return "No bonus this round: a guess failed, and the repaired token was this round's extra token."
    made = n + 1
    committed = rnd.committed_pieces
    cut = ""
    if len(committed) < made:
        cut = f" (the run stopped early, so only {len(committed)} of them were committed)"
    return (f"Round output: <b>{' '.join(piece_html(p) for p in committed) or '∅'}</b>: {_plural(made, 'token')} "
            f"from one target pass{cut}. Plain decoding needs one target pass per token.")


def _cell_html(cell: Cell | None, changed: bool) -> str:
    if cell is None:
        return '<div class="learn-cell learn-empty"></div>'
    cls, main, sub = cell
    ch = " learn-changed" if changed else ""
    return (f'<div class="learn-cell learn-{cls}{ch}"><span class="learn-tok">{main}</span>'
            f'<span class="learn-sub">{sub}</span></div>')


VERDICT_WORDS = {events.KEPT: "kept", events.REJECTED: "rejected", events.CUT: "past the end of the text"}


def _details_table(rnd: Round, step: int) -> str:
    """Per-guess numbers, with columns revealed as the walkthrough reaches them."""
    show_p, show_u = step >= 1, step >= 2
    head = "<tr><th>#</th><th>guess</th><th>q(guess)</th>"
    head += "<th>p(guess)</th><th>keep chance</th>" if show_p else ""
    head += "<th>u</th><th>verdict</th>" if show_u else ""
    rows = []
    for i, fate in enumerate(rnd.fates):
        r = f"<td>{i + 1}</td><td><code>{piece_html(rnd.draft_pieces[i])}</code></td><td>{rnd.q_draft[i]:.3f}</td>"
        if show_p:
            r += f"<td>{rnd.p_draft[i]:.3f}</td><td>{rnd.accept_probs[i]:.3f}</td>"
        if show_u:
            if fate == events.DISCARDED:
                r += "<td>—</td><td>not checked</td>"
            elif fate == events.REJECTED and step < 3:
                r += "<td></td><td></td>"
            else:
                r += f"<td>{rnd.uniforms[i]:.3f}</td><td>{VERDICT_WORDS[fate]}</td>"
        rows.append(f"<tr>{r}</tr>")
    return f'<table class="learn-table">{head}</tr>{"".join(rows)}</table>'


def _mini_bars(title: str, rows: list[TokenProb] | None, color: str, k: int = 6) -> str:
    if not rows:
        return ""
    items = "".join(
        f'<div class="learn-bar-row"><code>{piece_html(t.piece)}</code>'
        f'<span class="learn-bar" style="width:{max(1.0, 100 * t.prob):.1f}%;background:{color}"></span>'
        f'<span>{t.prob:.3f}</span></div>'
        for t in rows[:k]
    )
    return f'<div class="learn-mini"><div class="learn-mini-title">{html.escape(title)}</div>{items}</div>'


def _side_panels(rnd: Round, step: int) -> str:
    kind, g, rej = STEPS[step][1], rnd.gamma, rnd.rejected_at
    p_top, q_top = rnd.p_top, rnd.q_top
    if kind == "repair" and rej is not None:
        return (_mini_bars(f"draft q at guess {rej + 1}", q_top[rej] if rej < len(q_top) else None, COLORS["q"])
                + _mini_bars(f"target p at guess {rej + 1}", p_top[rej] if rej < len(p_top) else None, COLORS["p"])
                + _mini_bars("repair: normalize(max(0, p − q))", rnd.residual_top, COLORS["residual"]))
    if kind == "bonus" and rej is None:
        return _mini_bars(f"target p at slot {g + 1} ({'plain step' if g == 0 else 'bonus'})",
                          p_top[g] if g < len(p_top) else None, COLORS["bonus"])
    return ""


def walkthrough_html(rnd: Round, step: int, context: str | None = None) -> str:
    """The whole walkthrough panel for one step: progress, strip with changes outlined, story, numbers.

    context: the text the round continues (the built-in examples have one); else the round's place in its run.
    """
    step = max(0, min(N_STEPS - 1, int(step)))
    g = rnd.gamma
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
    ctx = (f'<div class="learn-context">Text so far: <code>{html.escape(context)}</code></div>' if context
           else f'<div class="learn-context">Round {rnd.index + 1}, after {rnd.position} generated tokens</div>')
    return (
        f'<div class="learn-walk">'
        f'<div class="learn-steps">{dots}<span class="learn-step-name" id="learn-step-name">'
        f'Step {step + 1} of {N_STEPS}: {html.escape(STEPS[step][0])}</span></div>'
        f'{ctx}'
        f'<div class="learn-grid" style="grid-template-columns: 11em repeat({g + 1}, minmax(5.5em, 1fr))">'
        f'{"".join(grid)}</div>'
        f'<p class="learn-story">{_narrative(rnd, step)}</p>'
        f'{same_draft_html(rnd) if STEPS[step][1] == "keep" else ""}'
        f'<div class="learn-details">{_details_table(rnd, step)}{_side_panels(rnd, step)}</div>'
        f"</div>"
    )


# ------------------------------------------------------------------------------------- tree walkthrough
#
# A tree round steps as: the drafted tree, the one pass that scores it, one step per child the rule tried (in the
# order it tried them), the repair or bonus that ends the path, the round's result. Each step draws the tree with
# only the tries made so far decided (components.tree.render_tree on a partial copy of the event).


def walk_steps(rnd: Round) -> int:
    """How many steps the walkthrough has for this round: the chain's STEPS, or a tree round's own count."""
    return N_STEPS if rnd.tree is None else len(rnd.tree.steps) + 4


def tree_step_name(event: TreeRoundEvent, step: int) -> str:
    tries = len(event.steps)
    if step == 0:
        return "Draft a token tree"
    if step == 1:
        return "One pass scores every node"
    if step < 2 + tries:
        node = event.nodes[event.steps[step - 2]]
        return f"Try {node.piece.strip() or repr(node.piece)} (depth {node.depth})"
    return {2 + tries: "Bonus token" if event.bonus else "Repair"}.get(step, "Round result")


def partial_tree(event: TreeRoundEvent, tried: int) -> TreeRoundEvent:
    """The event as it stands after the rule's first `tried` tries: later nodes undecided, the path so far."""
    done = set(event.steps[:tried])
    nodes = [n if n.node in done else dataclasses.replace(n, fate=TREE_UNTRIED, r=None, accept_prob=None, uniform=None)
             for n in event.nodes]
    return dataclasses.replace(event, nodes=nodes, path=[n for n in event.path if n in done])


def _tree_narrative(rnd: Round, event: TreeRoundEvent, step: int) -> str:
    tries = len(event.steps)
    shape = ",".join(map(str, event.widths)) or "?"
    how = ("chosen deterministically (the draft's likeliest tokens): each child's q is one-hot, so the rule keeps "
           "it with chance r(x), the residual's own probability" if event.one_hot else
           "drawn from the draft's distribution q, so the rule keeps each with chance min(1, r(x)/q(x))")
    if step == 0:
        return (f"The draft grows a tree instead of one chain: widths {html.escape(shape)}, "
                f"{_plural(len(event.nodes), 'node')} in all, one draft pass per depth. The children were {how}.")
    if step == 1:
        return ("The target scores the committed text plus <b>every</b> node in one forward pass. A tree attention "
                "mask lets each node see the text and its own ancestors only, never a sibling or a cousin, and its "
                "position is the text's length plus its depth. Each chip now shows p(x), the target's chance of "
                "the node after its parent.")
    if step < 2 + tries:
        node = event.nodes[event.steps[step - 2]]
        where = "the committed text" if node.parent < 0 else f"“{html.escape(event.nodes[node.parent].piece)}”"
        q = "1 (chosen deterministically)" if event.one_hot else f"{node.q:.3g}"
        verdict = (f"u = {node.uniform:.2f} &lt; {node.accept_prob:.2f}: <b>accepted</b>. The walk moves down to it "
                   "and tries its children with a fresh residual, the target's p after it."
                   if node.fate == TREE_ACCEPTED else
                   f"u = {node.uniform:.2f} ≥ {node.accept_prob:.2f}: <b>refused</b>. The residual loses it, "
                   "r ← normalize(max(0, r − q)), and the next sibling is tried against what is left.")
        return (f"At {where}, the rule tries <b>{piece_html(node.piece)}</b>: r(x) = {node.r:.3g}, q(x) = {q}, "
                f"keep chance {node.accept_prob:.3g}. {verdict}")
    emitted = piece_html(event.emitted_piece)
    if step == 2 + tries:
        if event.bonus:
            return (f"The walk reached a node with no children left to try, so the target's p there, already "
                    f"computed in the same pass, gives one more token for free: <b>{emitted}</b>.")
        return (f"Every child tried at the end of the path was refused, so the token is drawn from the residual that "
                f"is left, with the refused siblings removed: <b>{emitted}</b>. This keeps the output exactly the "
                "target's.")
    committed = rnd.committed_pieces
    return (f"Round output: <b>{' '.join(piece_html(p) for p in committed) or '∅'}</b>: "
            f"{_plural(len(committed), 'token')} from one target pass over {_plural(len(event.nodes), 'node')} "
            f"({_plural(len(event.path), 'accepted node')} plus the {html.escape(event.emitted_kind)}).")


def tree_walkthrough_html(rnd: Round, step: int, context: str | None = None) -> str:
    """The walkthrough panel for a tree round (rnd.tree set): progress dots, the tree as it stands, the story."""
    event = rnd.tree
    total = walk_steps(rnd)
    step = max(0, min(total - 1, int(step)))
    tries = len(event.steps)
    tried = 0 if step < 2 else min(tries, step - 1)
    shown = partial_tree(event, tried) if tried < tries else event
    dots = "".join(
        f'<span class="learn-dot{" learn-dot-on" if i == step else ""}{" learn-dot-done" if i < step else ""}" '
        f'title="{html.escape(tree_step_name(event, i))}">{i + 1}</span>' for i in range(total))
    ctx = (f'<div class="learn-context">Text so far: <code>{html.escape(context)}</code></div>' if context
           else f'<div class="learn-context">Round {rnd.index + 1}, after {rnd.position} generated tokens</div>')
    done = step >= 2 + tries
    tree = render_tree(shown, rnd.index, "".join(rnd.committed_pieces) if step == total - 1 else None, done)
    return (f'<div class="learn-walk learn-tree-walk" data-step="{step}">'
            f'<div class="learn-steps">{dots}<span class="learn-step-name" id="learn-step-name">'
            f'Step {step + 1} of {total}: {html.escape(tree_step_name(event, step))}</span></div>{ctx}'
            f'<div class="learn-tree{" learn-tree-scored" if step >= 1 else ""}">{tree}</div>'
            f'<p class="learn-story">{_tree_narrative(rnd, event, step)}</p></div>')


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
    fig.data[-1].textfont = dict(color=COLORS["text"], size=12)
    _style(fig, 420, barmode="stack", bargap=0.25)
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
    fig.add_bar(x=toks, y=res.p, name="target p (what exactness promises)", marker_color=COLORS["p"])
    fig.add_bar(x=toks, y=res.q, name="draft q", marker_color=COLORS["q"])
    fig.add_bar(
        x=toks, y=emp, name=f"rule output, {res.n:,} rounds" + ("" if ok else " (wrong repair)"),
        marker_color=COLORS["kept"] if ok else COLORS["wrong"], error_y=dict(type="data", array=err, color=COLORS["text"]),
    )
    _style(fig, 360, barmode="group", bargap=0.2)
    fig.update_yaxes(title_text="probability of the first emitted token", rangemode="tozero")
    return fig


def verdict_of(pv: float, alpha_level: float = LEVEL) -> tuple[str, str]:
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
        f"verify_batch; repair: {html.escape(REPAIR_LABELS.get(res.repair, res.repair))}</div></div>"
    )


# ------------------------------------------------------------------------------------------ real models


def _piece_labels(ids: Sequence[int], pieces: Sequence[str]) -> list[str]:
    """Unique, escaped x labels: two ids may decode to the same text, so repeats get their id appended."""
    seen: dict[str, int] = {}
    out = []
    for i, pc in zip(ids, pieces):
        lab = piece_html(pc)
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} #{i}")
    return out


def real_chart_ids(chk: RealCheck, top: int = 12) -> list[int]:
    """The tokens the real-model chart names: the target's most likely ones at the prefix, and every token the
    real decoder rounds emitted (their text is what the caller decodes for the labels)."""
    p0 = chk.rows.p0.double().numpy()
    order = [int(i) for i in np.argsort(-p0)[:top] if p0[i] > 0]
    return sorted(set(order) | {int(i) for i in chk.engine_ids})


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
    fig.add_bar(x=labels, y=col(p0), name="target p0 (exact)", marker_color=COLORS["p"])
    fig.add_bar(x=labels, y=col(q0), name="draft q0", marker_color=COLORS["q"])
    fig.add_bar(x=labels, y=col(vec), name=f"verify_batch on p0/q0, {chk.draws.n:,} rounds", marker_color=COLORS["kept"])
    if chk.engine_ids:
        fig.add_bar(x=labels, y=col(eng), name=f"real decoder rounds, {len(chk.engine_ids)}", marker_color=COLORS["engine"])
    _style(fig, 380, barmode="group", bargap=0.15)
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
        pred = speedup_curve(pt.mean_gamma, c, [pt.alpha])[0]  # at the run's mean draft length (metrics convention)
        meas = (f"measured speedup {pt.measured_speedup:.2f}×" if pt.measured_speedup is not None
                else "no measured speedup (the run has no plain-decoding baseline), so only the model's point is shown")
        c_est = ""
        if pt.c_plain is not None:
            c_est += f"; c_plain = {pt.c_plain:.2f} (draft ÷ target ms per token, timed when the pair loaded)"
        if pt.c_loop is not None:
            c_est += f"; c_loop = {pt.c_loop:.2f} (draft ms per guess ÷ verify ms per round, as this run paid it)"
        lines.append(
            f"<div class='learn-run'><b>{html.escape(pt.label)}</b>: {pt.rounds} rounds, α = {pt.alpha:.3f}, mean γ = "
            f"{pt.mean_gamma:.2f}, {pt.tokens_per_round:.2f} tokens per round; "
            f"model predicts {pred:.2f}× at c = {c:.2f}; "
            f"{meas}{c_est}.</div>"
        )
    return "".join(lines)
