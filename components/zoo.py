"""Rendering for the bug zoo (specdec/learn/zoo.py): where each bug's wrong mass goes, its verdict, and an overview table.

Pure functions of ZooResults; ui/learn_tab.py wires them. Token text is escaped (tokenizer pieces and the learner's
labels reach HTML and Plotly labels, which read HTML too).
"""

from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from specdec.learn.lab import MAX_LAB_ROUNDS, format_p_value
from specdec.learn.zoo import ENTRIES, LEVEL, ZooEntry, ZooResult, chart_cells, describe_sampling

from .style import COLORS, axis, layout
from .tokens import piece_html

ZOO_CHOICES = [(e.title if e.key == "none" else f"Bug: {e.title}", e.key) for e in ENTRIES.values()]
# The real-rows check has first-token rows only; entries that need more run in the lab alone.
ZOO_REAL_CHOICES = [(label, key) for label, key in ZOO_CHOICES if not ENTRIES[key].lab_only]
VERDICT_KIND = {"caught": "bad", "hidden": "warn", "exact": "good", "false alarm": "warn"}


def fmt_n(n: float) -> str:
    """A round count for people: 1,234 / 3.1 million / never."""
    if math.isinf(n):
        return "never (the output is exact)"
    if n < 1e6:
        return f"{max(1, round(n)):,}"
    if n < 1e9:
        return f"{n / 1e6:.1f} million"
    return f"{n:.1e}"


def _labels(res: ZooResult, cells: list[int]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for i in cells:
        lab = res.labels[i]
        lab = lab if lab == "all other tokens" else piece_html(lab)
        seen[lab] = seen.get(lab, 0) + 1
        out.append(lab if seen[lab] == 1 else f"{lab} #{res.ids[i]}")
    return out


def zoo_figure(res: ZooResult, top: int = 10) -> go.Figure:
    """Top: the promised (warped target) distribution, the bug's exact output and the sampled output. Bottom: exact
    output minus promised per token -- where the wrong mass goes (up: too often, down: too rarely)."""
    cells = chart_cells(res, top)
    shown = set(cells)
    rest = [i for i in range(len(res.labels)) if i not in shown]
    labels = _labels(res, cells)
    promised, exact = res.promised, res.exact
    emp = res.counts / max(1.0, res.counts.sum())

    def col(a):
        vals = [float(a[i]) for i in cells]
        return vals + ([float(a[rest].sum())] if rest else [])

    if rest:
        labels = labels + [f"{len(rest):,} more tokens"]
    err = 1.96 * np.sqrt(np.maximum(np.array(col(emp)) * (1 - np.array(col(emp))), 1e-12) / max(res.n, 1))
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.64, 0.36], vertical_spacing=0.06)
    wrong = res.entry.is_bug
    fig.add_bar(x=labels, y=col(promised), name="target p, warped (what the output must follow)",
                marker_color=COLORS["p"], row=1, col=1)
    fig.add_bar(x=labels, y=col(exact), name="exact output of this construction",
                marker_color=COLORS["wrong"] if wrong and res.tv_exact > 1e-6 else COLORS["kept"], row=1, col=1)
    fig.add_bar(x=labels, y=col(emp), name=f"sampled through {res.rule_function}, {res.n:,} rounds",
                marker_color=COLORS["measured"], error_y=dict(type="data", array=err, color=COLORS["text"]),
                row=1, col=1)
    diff = np.array(col(exact)) - np.array(col(promised))
    fig.add_bar(x=labels, y=diff.tolist(), name="exact output − target (wrong mass)", showlegend=True,
                marker_color=[COLORS["wrong"] if d > 0 else COLORS["q"] for d in diff], row=2, col=1,
                hovertemplate="%{x}: %{y:+.4f}<extra></extra>")
    fig.update_layout(**layout("", 470, barmode="group", bargap=0.18, margin={"l": 60, "r": 12, "t": 30, "b": 110}))
    fig.update_layout(legend={"y": -0.22})
    fig.update_yaxes(axis(title_text="probability", rangemode="tozero"), row=1, col=1)
    fig.update_yaxes(axis(title_text="output − p", zeroline=True, zerolinecolor=COLORS["text"]), row=2, col=1)
    fig.update_xaxes(axis(tickangle=-30), row=2, col=1)
    fig.update_xaxes(axis(), row=1, col=1)
    return fig


def verdict_line(res: ZooResult, max_n: int = MAX_LAB_ROUNDS) -> str:
    """One sentence: what the chi-square test says at this N and, if it cannot see the bug, what N would."""
    v = res.verdict
    pw = res.power
    if v == "exact":
        return (f"Consistent with p (p-value {format_p_value(res.test.p_value)}): this construction is exact, the "
                "test has nothing to find at any N.")
    if v == "false alarm":
        return (f"The test failed on an exact construction (p-value {format_p_value(res.test.p_value)}): at level "
                f"{LEVEL:g} that happens once in {round(1 / LEVEL):,} runs; try another seed.")
    if v == "caught":
        return (f"Caught at N = {res.n:,}: p-value {format_p_value(res.test.p_value)} < {LEVEL:g}. The test catches "
                f"this bug half the time from about {fmt_n(pw.n50)} rounds (95 % of the time from {fmt_n(pw.n95)}).")
    beyond = f", beyond the lab's maximum of {max_n:,}" if pw.n50 > max_n else ""
    return (f"Not visible at N = {res.n:,} (p-value {format_p_value(res.test.p_value)}; at this N the test catches "
            f"it only {100 * pw.at_n:.1f} % of the time). The output is wrong by a total-variation distance of "
            f"{res.tv_exact:.2g}; the chi-square test needs about {fmt_n(pw.n50)} rounds for even odds of seeing it "
            f"and {fmt_n(pw.n95)} for 95 %{beyond}.")


def references_html(entry: ZooEntry) -> str:
    """The entry's references: each a link (where, and the thread's title) and one line on what it says."""
    items = "".join(
        f'<li class="zoo-ref-item"><a href="{html.escape(r.url, quote=True)}" target="_blank" rel="noopener">'
        f"{html.escape(r.name)}: {html.escape(r.title)}</a>"
        f'<div class="zoo-ref-summary">{html.escape(r.summary)}</div></li>' for r in entry.references)
    head = "Reference" if len(entry.references) == 1 else "References"
    return f'<div class="learn-note zoo-ref"><b>{head}</b><ul class="zoo-refs">{items}</ul></div>'


def zoo_result_html(res: ZooResult) -> str:
    e = res.entry
    kind = VERDICT_KIND[res.verdict]
    notes = "".join(f'<div class="learn-msg learn-msg-warn">{html.escape(n)}</div>' for n in res.notes)
    test_note = f" ({html.escape(res.test.note)})" if res.test.note else ""
    return (
        f"{notes}"
        f'<div class="learn-result learn-{kind} zoo-result" data-key="{html.escape(e.key)}" '
        f'data-verdict="{html.escape(res.verdict)}">'
        f'<div class="learn-pvalue zoo-verdict">{html.escape(res.verdict.upper())} · p-value = '
        f"{format_p_value(res.test.p_value)}</div>"
        f'<div class="zoo-verdict-line">{html.escape(verdict_line(res))}</div>'
        f'<div class="learn-note">chi-square {res.test.statistic:.2f} on {res.test.dof} d.o.f.{test_note}; exact '
        f"total-variation distance to the warped target {res.tv_exact:.4f} (sampled {res.tv_sampled:.4f}); "
        f"{res.n:,} rounds in {res.seconds * 1e3:.0f} ms through {res.rule_function}; sampling: "
        f"{html.escape(describe_sampling(res.sampling))}.</div></div>"
        f'<div class="zoo-explain"><b>{html.escape(e.title)}.</b> {html.escape(e.explanation)}</div>'
        f"{references_html(e)}"
    )


def zoo_table_html(results: Sequence[ZooResult]) -> str:
    """Every entry at the same N, side by side: verdict, p-value, TV and the N the test needs."""
    if not results:
        return ""
    rows = []
    for r in results:
        kind = VERDICT_KIND[r.verdict]
        n50 = "—" if math.isinf(r.power.n50) else fmt_n(r.power.n50)
        rows.append(
            f'<tr class="zoo-row" data-key="{html.escape(r.entry.key)}" data-verdict="{html.escape(r.verdict)}">'
            f"<td>{html.escape(r.entry.title)}</td>"
            f'<td><span class="zoo-badge zoo-{kind}">{html.escape(r.verdict)}</span></td>'
            f"<td>{format_p_value(r.test.p_value)}</td><td>{r.tv_exact:.4f}</td><td>{n50}</td>"
            f"<td>{100 * r.power.at_n:.1f} %</td></tr>"
        )
    n = results[0].n
    return (
        f'<table class="learn-table zoo-table"><tr><th>construction</th><th>verdict at N = {n:,}</th>'
        f"<th>p-value</th><th>TV (exact)</th><th>N for 50 % power</th><th>power at N</th></tr>{''.join(rows)}</table>"
        f'<p class="learn-note">Verdicts: <b>caught</b> = the chi-square test fails (p &lt; {LEVEL:g}); '
        f"<b>hidden</b> = the output is wrong but this N is too small to show it; <b>exact</b> = nothing to find. "
        f"TV is the exact total-variation distance between the construction's output and the warped target; the N "
        f"columns come from the noncentral chi-square distribution of the test under that exact output.</p>"
    )


# Styles for the zoo and break-even sections; the Learn tab adds them once (its own sheet is assets/learn.css).
ZOO_CSS = """
.zoo-badge { display: inline-block; padding: 0.05em 0.55em; border-radius: 999px; font-size: 0.85em; font-weight: 600; }
.zoo-bad { background: rgba(220, 38, 38, 0.18); color: #dc2626; }
.zoo-warn { background: rgba(245, 158, 11, 0.22); color: #b45309; }
.zoo-good { background: rgba(22, 163, 74, 0.18); color: #16a34a; }
.zoo-table td, .zoo-table th { padding: 0.25em 0.6em; text-align: left; }
.zoo-explain { margin: 0.5em 0 0.2em; line-height: 1.5; }
.zoo-verdict-line { margin: 0.2em 0; }
.be-table td, .be-table th { padding: 0.25em 0.6em; text-align: left; }
"""
