"""Tree view: one tree round (a `TreeRoundEvent`) as nested HTML drawn left to right by depth, and its per-node
p-vs-q chart.

Each node is a chip whose classes say what the rule did with it: `tn-accepted` (on the accepted path, lit, with
its connector), `tn-rejected` (tried and refused, struck through), `tn-untried` (never reached, dimmed); an accepted
node the text ended before (EOS or the token budget) also gets `tn-cut`. The emitted token closes the path as a
`tn-emit tn-repair` or `tn-emit tn-bonus` chip among the last accepted node's children. Every chip's tooltip gives
p, q (or "chosen deterministically" for a one-hot q), and for a tried node r and u with the keep chance they were
compared against; the same numbers ride in data attributes (data-p, data-q, data-rx for r, data-u; data-r is
the round, as on the token chips).

Token pieces are untrusted text: everything goes through html.escape. Styles: assets/tree.css.
"""

from __future__ import annotations

import html

from specdec.core.tree_events import TREE_ACCEPTED, TREE_REJECTED, TREE_UNTRIED, TreeNodeView, TreeRoundEvent

from .style import COLORS, axis, empty_figure, figure
from .tokens import fmt_prob, quoted, visible_piece

DETERMINISTIC = "chosen deterministically"
FATE_WORDS = {TREE_ACCEPTED: "accepted", TREE_REJECTED: "rejected", TREE_UNTRIED: "untried"}
FATE_GLYPH = {TREE_ACCEPTED: "✓", TREE_REJECTED: "✗", TREE_UNTRIED: "·"}
LEGEND = (("tn-accepted", "x", "accepted path"), ("tn-rejected", "x", "refused"), ("tn-untried", "x", "never tried"),
          ("tn-emit tn-repair", "y", "repair"), ("tn-emit tn-bonus", "b", "bonus"))


def q_text(event: TreeRoundEvent, node: TreeNodeView) -> str:
    """q(x) as the tooltip says it: a number, or that the node was picked without a draw."""
    return DETERMINISTIC + " (one-hot q = 1)" if event.one_hot else fmt_prob(node.q)


def node_tooltip(event: TreeRoundEvent, node: TreeNodeView) -> str:
    parent = "the committed text" if node.parent < 0 else f"node {node.parent}"
    lines = [
        f"node {node.node} · depth {node.depth}: {quoted(node.piece)} (id {node.token_id}) · {FATE_WORDS[node.fate]}",
        f"p(x) = {fmt_prob(node.p)}  (target, after {parent})",
        f"q(x) = {q_text(event, node)}",
    ]
    if node.tried:
        lines += [
            f"r(x) = {fmt_prob(node.r)}  (residual when tried)",
            f"keep chance min(1, r/q) = {fmt_prob(node.accept_prob)}",
            (f"u = {fmt_prob(node.uniform)} {'<' if node.fate == TREE_ACCEPTED else '≥'} "
             f"{fmt_prob(node.accept_prob)}  →  {FATE_WORDS[node.fate]}"),
        ]
    else:
        lines += ["r(x) = —  u = —", "never tried: its parent was not reached, or an earlier sibling was accepted"]
    return "\n".join(lines)


def emitted_tooltip(event: TreeRoundEvent) -> str:
    where = "the committed text" if event.end_node < 0 else f"node {event.end_node}"
    head = f"{event.emitted_kind} token after {where}: {quoted(event.emitted_piece)} (id {event.emitted_id})"
    if event.bonus:
        how = "bonus: the path reached a node without children, so p there was sampled (no draft, q = 0)"
        dist = f"p(x) = {fmt_prob(event.emitted_p)}"
    else:
        how = "repair: every child tried here was refused, so the residual normalize(max(0, r − q)) was sampled"
        dist = f"p(x) = {fmt_prob(event.emitted_p)}   r(x) = {fmt_prob(event.emitted_r)}  (residual it was drawn from)"
    cut = "" if event.n_committed > len(event.path) else "\n(not committed: the text ended before it)"
    return f"{head}\n{how}\n{dist}{cut}"


def _num(x: float | None) -> str:
    return "" if x is None else f"{x:.6g}"


def _chip(event: TreeRoundEvent, node: TreeNodeView, round_index: int, path_pos: int | None) -> str:
    classes = ["tn", f"tn-{node.fate}"]
    if path_pos is not None and path_pos >= event.n_committed:
        classes.append("tn-cut")
    # Two short lines keep deep trees narrow; a one-hot q (always 1) is said once, in the summary line.
    sub = f"p {fmt_prob(node.p)}" + ("" if event.one_hot else f" · q {fmt_prob(node.q)}")
    sub2 = f'<span class="tn-sub">r {fmt_prob(node.r)} · u {fmt_prob(node.uniform)}</span>' if node.tried else ""
    attrs = (f'data-r="{round_index}" data-node="{node.node}" data-fate="{node.fate}" data-p="{_num(node.p)}" '
             f'data-q="{_num(node.q)}" data-rx="{_num(node.r)}" data-u="{_num(node.uniform)}"')
    title = html.escape(node_tooltip(event, node), quote=True)
    return (f'<span class="{" ".join(classes)}" {attrs} title="{title}">'
            f'<span class="tn-piece">{html.escape(visible_piece(node.piece))}</span>'
            f'<span class="tn-sub">{html.escape(sub)}</span>{sub2}</span>')


def _emitted_chip(event: TreeRoundEvent, round_index: int) -> str:
    classes = ["tn", "tn-emit", f"tn-{event.emitted_kind}"]
    if event.n_committed <= len(event.path):
        classes.append("tn-cut")
    sub = f"p {fmt_prob(event.emitted_p)}" + ("" if event.bonus else f" · r {fmt_prob(event.emitted_r)}")
    title = html.escape(emitted_tooltip(event), quote=True)
    return (f'<span class="{" ".join(classes)}" data-r="{round_index}" data-kind="{event.emitted_kind}" '
            f'data-p="{_num(event.emitted_p)}" data-rx="{_num(event.emitted_r)}" title="{title}">'
            f'<span class="tn-tag">{html.escape(event.emitted_kind)}</span>'
            f'<span class="tn-piece">{html.escape(visible_piece(event.emitted_piece))}</span>'
            f'<span class="tn-sub">{html.escape(sub)}</span></span>')


def _kids(event: TreeRoundEvent, node: int, round_index: int, path_index: dict[int, int],
          show_emitted: bool = True) -> str:
    """The children of `node` (-1: the root) as a column of branches, the emitted token last at the path's end."""
    branches = []
    for child in event.children(node):
        on_path = child.node in path_index
        inner = _kids(event, child.node, round_index, path_index, show_emitted)
        cls = "tn-branch tn-on-path" if on_path else "tn-branch"
        branches.append(f'<div class="{cls}">{_chip(event, child, round_index, path_index.get(child.node))}'
                        f"{inner}</div>")
    if node == event.end_node and show_emitted:
        branches.append(f'<div class="tn-branch tn-on-path tn-end">{_emitted_chip(event, round_index)}</div>')
    return f'<div class="tn-kids">{"".join(branches)}</div>' if branches else ""


def tree_summary(event: TreeRoundEvent) -> str:
    shape = ",".join(map(str, event.widths)) if event.widths else "?"
    tried = len(event.steps)
    q = "one-hot q: children chosen deterministically" if event.one_hot else "q: the draw distribution"
    kept = len(event.path)
    return (f"tree {shape} · {event.mode} · {len(event.nodes)} nodes, {tried} tried · {kept} accepted + "
            f"{event.emitted_kind} {quoted(event.emitted_piece)} · {q}")


def render_tree(event: TreeRoundEvent | None, round_index: int = 0, committed_text: str | None = "",
                show_emitted: bool = True) -> str:
    """One tree round as HTML (see the module docstring); `committed_text` (what the round added) is shown under
    the tree (None: no such line); show_emitted=False leaves out the repair or bonus chip (a walk not yet over)."""
    if event is None:
        return ('<div class="sd-tree sd-tree-empty">Turn on “Token tree” and press Generate or Step: each round\'s '
                "token tree appears here.</div>")
    path_index = {n: k for k, n in enumerate(event.path)}
    root_title = html.escape("the root: the committed text so far; its children are the depth-1 guesses", quote=True)
    body = (f'<div class="tn-branch tn-on-path tn-rootbranch"><span class="tn tn-root" title="{root_title}">'
            f'<span class="tn-piece">▸</span><span class="tn-sub">context</span></span>'
            f"{_kids(event, -1, round_index, path_index, show_emitted)}</div>")
    legend = "".join(f'<span class="tn-key"><span class="tn-sample {cls}">{html.escape(sample)}</span>'
                     f"{html.escape(label)}</span>" for cls, sample, label in LEGEND)
    legend += '<span class="tn-key tn-hint">hover a node for p, q, r and u</span>'

    text = "" if committed_text is None else (
        f'<div class="tn-commit">committed this round: <span class="tn-commit-text">'
        f"{html.escape(visible_piece(committed_text)) if committed_text else '∅'}</span></div>")
    return (f'<div class="sd-tree" data-r="{round_index}">'
            f'<div class="tn-head"><b>Round {round_index + 1}</b> · {html.escape(tree_summary(event))}</div>'
            f'<div class="tn-legend">{legend}</div>'
            f'<div class="tn-scroll"><div class="tn-tree">{body}</div></div>{text}</div>')


def node_label(node: TreeNodeView, limit: int = 8) -> str:
    """The chart's tick label: fate glyph, node number, the piece cut to `limit` characters (bounded, so rotated
    labels stay clear of the legend)."""
    piece = visible_piece(node.piece)
    piece = piece if len(piece) <= limit else piece[: limit - 1] + "…"
    return f"{FATE_GLYPH[node.fate]} n{node.node} {piece}"


def tree_pq_figure(event: TreeRoundEvent | None, round_index: int = 0, height: int = 360):
    """Grouped bars per node of the tree: p(x), q(x) and, at tried nodes, the residual r(x) they were tested
    against; the tick label's glyph gives the fate (✓ accepted, ✗ refused, · untried)."""
    if event is None or not event.nodes:
        return empty_figure("the per-node p vs q chart appears after the first tree round")
    # Plotly reads tick labels and hover text as a small HTML subset: token text must be escaped.
    x = [html.escape(node_label(n)) for n in event.nodes]
    q_hover = ("q = 1: " + DETERMINISTIC + "<extra></extra>") if event.one_hot else "q(x) = %{y:.4f}<extra></extra>"
    traces = [
        {"type": "bar", "name": "q (draft)" + (", one-hot" if event.one_hot else ""), "x": x,
         "y": [n.q for n in event.nodes], "marker": {"color": COLORS["q"]}, "hovertemplate": q_hover},
        {"type": "bar", "name": "p (target, after the parent)", "x": x, "y": [n.p for n in event.nodes],
         "marker": {"color": COLORS["p"]}, "hovertemplate": "p(x) = %{y:.4f}<extra></extra>"},
        {"type": "bar", "name": "r (residual when tried)", "x": x, "y": [n.r for n in event.nodes],
         "marker": {"color": COLORS["residual"]}, "hovertemplate": "r(x) = %{y:.4f}<extra></extra>"},
        {"type": "scatter", "name": "keep chance min(1, r/q)", "x": x, "y": [n.accept_prob for n in event.nodes],
         "mode": "markers", "marker": {"symbol": "line-ew-open", "size": 16, "color": COLORS["kept"],
                                       "line": {"width": 3, "color": COLORS["kept"]}},
         "hovertemplate": "min(1, r/q) = %{y:.4f}<extra></extra>"},
        {"type": "scatter", "name": "u (accepted iff u < keep chance)", "x": x,
         "y": [n.uniform for n in event.nodes], "mode": "markers",
         "marker": {"symbol": "circle", "size": 7, "color": COLORS["wrong"]},
         "hovertemplate": "u = %{y:.4f}<extra></extra>"},
    ]
    title = f"Round {round_index + 1}: p vs q at every node of the tree ({len(event.nodes)} nodes)"
    rotated = len(x) > 6
    # Rotated tick labels take up to ~70 px under the axis: the legend goes below them, in a taller margin.
    return figure(traces, html.escape(title), height + (40 if rotated else 0), barmode="group", bargap=0.2,
                  bargroupgap=0.04, margin={"l": 52, "r": 12, "t": 56, "b": 150 if rotated else 96},
                  legend={"orientation": "h", "y": -0.42 if rotated else -0.2, "yanchor": "top", "x": 0,
                          "font": {"size": 11}},
                  xaxis=axis(type="category", tickangle=-45 if rotated else 0, automargin=False),
                  yaxis=axis(title={"text": "probability"}, rangemode="tozero"))
