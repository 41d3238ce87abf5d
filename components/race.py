"""Race rendering: one card per lane (its text streaming in, tok/s, tokens per target pass, speedup against the
race's plain lane) with what its drafter did last, and a tokens-over-time chart. Pure functions of a RaceView.

What each drafter's card shows about its last proposal:
- ngram: the stretch of prompt/text it copied from, the matched suffix and the copied tokens highlighted;
- early exit: k of the target's L layers drafting;
- cross: the draft's own tokens beside the target tokens they became, with boundaries only one side has dashed;
- draft model: how many guesses were kept.

Everything a model produced is escaped: token pieces are untrusted text.
"""

from __future__ import annotations

import html
from itertools import accumulate

import plotly.graph_objects as go

from specdec.core.settings import DRAFTER_LABELS
from specdec.loop.race import Lane, RaceView

from .tokens import piece_html

LANE_COLORS = ["#64748b", "#4f46e5", "#059669", "#d97706", "#db2777", "#0891b2", "#7c3aed"]
CONTEXT = 14  # tokens shown either side of an ngram source

RACE_CSS = """
<style>
.race-note{padding:8px 12px;border-radius:8px;margin:0 0 10px;font-size:.92em;
  background:color-mix(in srgb,#4f46e5 10%,transparent);border:1px solid color-mix(in srgb,#4f46e5 35%,transparent)}
.race-grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(320px,1fr));gap:10px}
.race-lane{border:1px solid var(--border-color-primary,#d4d4d8);border-radius:10px;padding:10px 12px;
  border-top:4px solid var(--lane,#64748b);background:var(--block-background-fill,transparent);min-width:0}
.race-head{display:flex;justify-content:space-between;align-items:baseline;gap:8px;flex-wrap:wrap}
.race-name{font-weight:650}
.race-badge{font-size:.78em;padding:1px 7px;border-radius:999px;border:1px solid var(--border-color-primary,#d4d4d8);
  opacity:.85}
.race-stats{display:flex;gap:12px;flex-wrap:wrap;font-size:.88em;margin:6px 0}
.race-stats b{font-size:1.15em;font-variant-numeric:tabular-nums}
.race-speed-up b{color:#059669}.race-speed-down b{color:#dc2626}
.race-bar{height:4px;border-radius:2px;margin-bottom:8px;
  background:color-mix(in srgb,var(--lane,#64748b) 18%,transparent)}
.race-bar>div{height:4px;border-radius:2px;background:var(--lane,#64748b)}
.race-text{font-family:var(--font-mono,ui-monospace,monospace);font-size:.84em;white-space:pre-wrap;
  word-break:break-word;max-height:260px;overflow:auto;line-height:1.45}
.race-text .rt-g{background:color-mix(in srgb,#10b981 24%,transparent);border-radius:3px}
.race-detail{margin-top:8px;padding-top:6px;border-top:1px dashed var(--border-color-primary,#d4d4d8);font-size:.82em}
.race-detail .rt-ctx{font-family:var(--font-mono,ui-monospace,monospace);white-space:pre-wrap;word-break:break-word;
  opacity:.9;margin-top:3px}
.rt-match{background:color-mix(in srgb,#f59e0b 30%,transparent);border-radius:3px}
.rt-src{background:color-mix(in srgb,#10b981 30%,transparent);border-radius:3px;text-decoration:underline}
.rt-toks{display:flex;flex-wrap:wrap;gap:3px;margin:3px 0;align-items:center}
.rt-toks .rt-lbl{min-width:92px;opacity:.75}
.rt-tok{font-family:var(--font-mono,ui-monospace,monospace);padding:0 4px;border-radius:4px;
  border:1px solid var(--border-color-primary,#d4d4d8)}
.rt-tok.rt-split{border-style:dashed;border-color:#d97706}
.rt-layers{display:inline-flex;gap:1px;vertical-align:middle;margin-left:6px}
.rt-layers i{width:6px;height:12px;border-radius:1px;background:color-mix(in srgb,#64748b 30%,transparent)}
.rt-layers i.on{background:#059669}
.race-legend{font-size:.8em;opacity:.8;margin-top:8px}
</style>
"""


def _fmt(x: float | None, digits: int = 2, suffix: str = "") -> str:
    return "–" if x is None else f"{x:.{digits}f}{suffix}"


def _text_html(lane: Lane) -> str:
    """The lane's text: tokens a drafter guessed (and the rule kept) highlighted, the target's own plain."""
    out = []
    for piece, origin in zip(lane.pieces, lane.origins):
        esc = html.escape(piece)
        out.append(f'<span class="rt-g">{esc}</span>' if origin == "guess" else esc)
    return "".join(out) or '<span style="opacity:.6">…</span>'


def _last_proposal(lane: Lane):
    for r in reversed(lane.rounds):
        if r.gamma > 0:
            return r
    return None


def _ngram_detail(lane: Lane, prompt_pieces: list[str]) -> str:
    r = _last_proposal(lane)
    last = lane.rounds[-1] if lane.rounds else None
    lines = []
    if last is not None and last.gamma == 0:
        lines.append("Last round: no earlier match of the text's end, so no guess — a plain target step.")
    if r is None or r.note is None or r.note.source_start is None:
        return "".join(f"<div>{ln}</div>" for ln in lines) or "<div>No proposal yet.</div>"
    context = prompt_pieces + lane.pieces[: r.position]
    src, n = r.note.source_start, r.note.match_len or 0
    where = "the prompt" if src < len(prompt_pieces) else "its own earlier text"
    lines.append(f"Round {r.index + 1}: matched the last {n} token{'s' if n != 1 else ''} in {where} at token "
                 f"{src - n}; "
                 f"copied the {r.gamma} that followed, kept {r.n_accepted}.")
    lo, hi = max(0, src - n - CONTEXT), min(len(context), src + r.gamma + CONTEXT)
    spans = []
    for i in range(lo, hi):
        cls = "rt-match" if src - n <= i < src else "rt-src" if src <= i < src + r.gamma else ""
        esc = html.escape(context[i])
        spans.append(f'<span class="{cls}">{esc}</span>' if cls else esc)
    ctx = ("…" if lo > 0 else "") + "".join(spans) + ("…" if hi < len(context) else "")
    return ("".join(f"<div>{ln}</div>" for ln in lines)
            + f'<div class="rt-ctx" title="amber: the matched suffix; green: the copied guesses">{ctx}</div>')


def _suffix_detail(lane: Lane, prompt_pieces: list[str]) -> str:
    """The suffix lane: its copies come from the prompt or the lane's own text (a race passes no earlier runs), shown
    as the n-gram lane's are, with the index's match length."""
    r = _last_proposal(lane)
    if r is not None and r.note is not None and r.note.source == "earlier run":
        return (f"<div>Round {r.index + 1}: copied {r.gamma} tokens from an earlier run after a "
                f"{r.note.match_len}-token match; kept {r.n_accepted}.</div>")
    return _ngram_detail(lane, prompt_pieces)


def _split_flags(pieces: list[str], other: list[str]) -> list[bool]:
    """For each piece: does it end at a character offset where the other tokenization has no boundary?"""
    mine = list(accumulate(len(p) for p in pieces))
    theirs = set(accumulate(len(p) for p in other))
    limit = min(mine[-1] if mine else 0, max(theirs, default=0))
    return [end not in theirs and end < limit for end in mine]


def _chips(label: str, pieces: list[str], flags: list[bool]) -> str:
    chips = "".join(f'<span class="rt-tok{" rt-split" if f else ""}">{piece_html(p)}</span>'
                    for p, f in zip(pieces, flags))
    return f'<div class="rt-toks"><span class="rt-lbl">{label}</span>{chips}</div>'


def _cross_detail(lane: Lane) -> str:
    r = _last_proposal(lane)
    if r is None or r.note is None or not r.note.draft_pieces:
        return "<div>No proposal yet.</div>"
    draft, target = r.note.draft_pieces, r.draft_pieces
    return (f"<div>Round {r.index + 1}: the draft wrote {len(draft)} tokens in its own vocabulary; re-tokenized they "
            f"are {len(target)} target tokens (kept {r.n_accepted}). Dashed: a split the other tokenizer does not "
            f"make.</div>"
            + _chips("draft tokens", draft, _split_flags(draft, target))
            + _chips("target tokens", target, _split_flags(target, draft)))


def _early_exit_detail(lane: Lane) -> str:
    note = lane.last_note
    if note is None or note.layers is None:
        return "<div>No proposal yet.</div>"
    k, total = note.layers, note.total_layers or note.layers
    cells = "".join(f'<i class="{"on" if i < k else ""}"></i>' for i in range(total))
    r = _last_proposal(lane)
    kept = f" Last round kept {r.n_accepted} of {r.gamma}." if r else ""
    return (f"<div>Drafts with the target's first <b>{k} of {total} layers</b><span class='rt-layers'>{cells}</span> "
            f"plus its final norm and head — the same weights, no second model.{kept}</div>")


def _model_detail(lane: Lane) -> str:
    r = _last_proposal(lane)
    if r is None:
        return "<div>No proposal yet.</div>"
    return (f"<div>The draft model samples each guess from its q. Round {r.index + 1} kept {r.n_accepted} of "
            f"{r.gamma}.</div>")


def _auto_detail(lane: Lane, prompt_pieces: list[str]) -> str:
    """The hybrid lane: each round's note says who drafted it. A mixed round's copy ran to the end of the text, so
    it is (text length - source_start) tokens long, and the draft model wrote the rest."""
    r = _last_proposal(lane)
    if r is None or r.drafter == "model":
        return _model_detail(lane)
    if r.drafter != "auto" or r.note.source_start is None:
        return _ngram_detail(lane, prompt_pieces)
    k = len(prompt_pieces) + r.position - r.note.source_start
    return (f"<div>Round {r.index + 1}: copied {k} token{'s' if k != 1 else ''} after a {r.note.match_len}-token "
            f"match, up to the end of the text; the draft model sampled {r.gamma - k} more. Kept {r.n_accepted} of "
            f"{r.gamma}.</div>")


def _detail(lane: Lane, prompt_pieces: list[str]) -> str:
    kind = lane.spec.drafter
    if kind == "auto":
        return _auto_detail(lane, prompt_pieces)
    if kind == "ngram":
        return _ngram_detail(lane, prompt_pieces)
    if kind == "suffix":
        return _suffix_detail(lane, prompt_pieces)
    if kind == "cross":
        return _cross_detail(lane)
    if kind == "early-exit":
        return _early_exit_detail(lane)
    if kind == "model":
        return _model_detail(lane)
    return "<div>The target alone: one forward pass per token.</div>"


def _badge(lane: Lane) -> str:
    if lane.plain:
        return "baseline"
    note = lane.last_note
    if lane.spec.drafter == "early-exit" and note is not None and note.layers:
        return f"{note.layers} of {note.total_layers} layers"
    return {"ngram": "copies text · q one-hot", "suffix": "copies the most frequent continuation · q one-hot",
            "cross": "other tokenizer · q one-hot",
            "model": "draft model · sampled q"}.get(lane.spec.drafter, DRAFTER_LABELS.get(lane.spec.drafter, ""))


def _lane_html(view: RaceView, i: int) -> str:
    lane = view.lanes[i]
    speed = view.speedups[i]
    est = " (est.)" if view.estimated[i] else ""
    if lane.plain:
        speed_html = '<span>speedup <b>1×</b> (baseline)</span>'
    else:
        cls = "" if speed is None else "race-speed-up" if speed >= 1 else "race-speed-down"
        speed_html = (f'<span class="{cls}" title="plain lane time for the same number of tokens / this lane\'s time'
                      f'{"; estimated from the plain lane&#39;s rate while it is behind" if est else ""}">speedup '
                      f'<b>{_fmt(speed, 2, "×")}</b>{est}</span>')
    alpha = "" if lane.alpha is None else f"<span>α <b>{_fmt(lane.alpha)}</b></span>"
    pct = 100 * min(1.0, lane.tokens / max(1, view.max_new_tokens))
    state = "done" if lane.done else "running"
    return (
        f'<div class="race-lane" data-lane="{i}" data-state="{state}" '
        f'style="--lane:{LANE_COLORS[i % len(LANE_COLORS)]}">'
        f'<div class="race-head"><span class="race-name">{html.escape(lane.spec.label)}</span>'
        f'<span class="race-badge">{html.escape(_badge(lane))}</span></div>'
        f'<div class="race-stats"><span><b>{_fmt(lane.tok_s, 1)}</b> tok/s</span>'
        f'<span><b>{_fmt(lane.tokens_per_pass)}</b> tokens/pass</span>{speed_html}{alpha}'
        f'<span style="opacity:.7">{lane.tokens} tok · {lane.target_passes} passes</span></div>'
        f'<div class="race-bar"><div style="width:{pct:.1f}%"></div></div>'
        f'<div class="race-text">{_text_html(lane)}</div>'
        f'<div class="race-detail">{_detail(lane, view.prompt_pieces)}</div></div>'
    )


def render_race(view: RaceView | None, message: str = "") -> str:
    if view is None:
        body = html.escape(message or "Pick the lanes and press Run race.")
        return RACE_CSS + f'<div class="race-note">{body}</div>'
    note = html.escape(view.note)
    if view.done:
        spec = [(s, lane) for s, lane in zip(view.speedups, view.lanes) if not lane.plain and s is not None]
        if spec:
            s, best = max(spec, key=lambda x: x[0])
            verdict = "faster than" if s >= 1 else "slower than"
            note = (f"<b>{html.escape(best.spec.label)}</b> was the fastest lane: {s:.2f}× the plain lane "
                    f"({verdict} plain decoding on this machine, same load). " + note)
    lanes = "".join(_lane_html(view, i) for i in range(len(view.lanes)))
    legend = ('<div class="race-legend"><span class="rt-g">highlighted</span>: guessed by the drafter and kept by the '
              "rule; plain: written by the target (a repair, a bonus token or a plain step). Each lane's time is the "
              "sum of its own steps; the lanes take turns, one step each.</div>")
    extra = f'<div class="race-note">{html.escape(message)}</div>' if message else ""
    return (RACE_CSS + extra + f'<div class="race-note" id="race-note">{note}</div>'
            f'<div class="race-grid">{lanes}</div>' + legend)


def race_figure(view: RaceView | None):
    """Tokens written against each lane's own elapsed time: steeper is faster."""
    fig = go.Figure()
    if view is not None:
        for i, lane in enumerate(view.lanes):
            if not lane.cum_ms:
                continue
            color = LANE_COLORS[i % len(LANE_COLORS)]
            fig.add_trace(go.Scatter(x=[0.0] + [t / 1e3 for t in lane.cum_ms], y=list(range(len(lane.cum_ms) + 1)),
                                     mode="lines", name=lane.spec.label, line=dict(color=color, width=2.5, shape="hv")))
    fig.update_layout(title=dict(text="Tokens over each lane's own time (steeper = faster)", font=dict(size=14)),
                      xaxis_title="seconds", yaxis_title="tokens", height=320, margin=dict(l=50, r=20, t=50, b=40),
                      legend=dict(orientation="h", y=-0.25), template="plotly_white")
    return fig
