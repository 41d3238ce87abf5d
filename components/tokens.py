"""Token view: each Round becomes a run of coloured chips.

A round reads left to right as it happened: kept draft tokens, then (at a rejection) the rejected guess struck
through, the repaired token in its place and the later guesses that were thrown away untested; or, when every guess
passed, the bonus token. Every chip carries p, q, min(1, p/q) and u in its tooltip and its round/position in data
attributes, so a click can point the p-vs-q chart at it.

Everything a model produced is passed through html.escape: token pieces are untrusted text.
"""

from __future__ import annotations

import html
from dataclasses import dataclass

from specdec.core import events
from specdec.core.events import Round

# Chip kinds double as CSS classes (tok-<kind>); tests and the browser rely on these names.
KEPT, REJECTED, REPAIRED, DISCARDED, BONUS, CUT = "acc", "rej", "rep", "disc", "bonus", "cut"
PLAIN = "plain"  # a round that drafted nothing: one token sampled from p, as plain decoding would
KIND_LABELS = {
    KEPT: "kept draft",
    REJECTED: "rejected draft",
    REPAIRED: "repaired (resampled)",
    DISCARDED: "discarded guess",
    BONUS: "bonus token",
    PLAIN: "plain step (nothing drafted)",
    CUT: "not committed (after end of text)",
}
# Whitespace would be invisible inside a chip, so it is drawn with stand-in glyphs.
WHITESPACE_GLYPHS = {" ": "·", "\n": "↵", "\t": "⇥", "\r": "␍"}
EMPTY_PIECE = "∅"  # a token that decodes to nothing (special or partial byte token)
# A draft position's fate (decided once, by Round.fates) -> its chip kind.
FATE_KIND = {events.KEPT: KEPT, events.REJECTED: REJECTED, events.DISCARDED: DISCARDED, events.CUT: CUT}


def visible_piece(piece: str) -> str:
    """The piece with whitespace made visible (not yet escaped)."""
    if piece == "":
        return EMPTY_PIECE
    return "".join(WHITESPACE_GLYPHS.get(ch, ch) for ch in piece)


def piece_html(piece: str) -> str:
    """The piece with whitespace made visible, escaped for HTML (and for Plotly labels, which read HTML too)."""
    return html.escape(visible_piece(piece))


def quoted(piece: str) -> str:
    return f"“{visible_piece(piece)}”"


def fmt_prob(x: float | None) -> str:
    if x is None:
        return "?"
    if x == 0:
        return "0"
    return f"{x:.3f}" if x >= 0.001 else f"{x:.1e}"


@dataclass
class Chip:
    kind: str
    piece: str
    position: int  # index within the round: draft i, or n_accepted for the repaired/bonus token
    tooltip: str
    newline_after: int = 0  # line breaks to draw after a committed chip that ends a line


def one_hot_note(rnd: Round) -> str:
    """Why q is 1 on a deterministic proposal, and what the keep chance then is."""
    return (f"q is one-hot: the {rnd.drafter} drafter proposed this token deterministically, so q = 1 on it and 0 "
            "elsewhere, and it is kept with probability min(1, p/1) = p")


def prediction_note(rnd: Round) -> str | None:
    """For the predicted drafter: which prediction tokens this round drew from, and whether it re-aligned there."""
    n = rnd.note
    if n is None or n.drafter != "predicted" or rnd.asked_nothing:
        return None
    if n.source_start is None:
        return ("predicted output: the output has left the prediction and its last tokens match nowhere in it yet, "
                "so nothing was proposed")
    if rnd.gamma == 0:
        return f"predicted output: the output has reached the end of the prediction ({n.source_start} tokens)"
    span = f"prediction tokens {n.source_start}–{n.source_start + max(rnd.gamma, 1) - 1}"
    if n.match_len:
        return (f"predicted output: drew {span}, re-aligned after the output departed from the prediction "
                f"(its last {n.match_len} token(s) match just before there)")
    return f"predicted output: drew {span}, straight on from where the output is in the prediction"


SOURCE_WORDS = {"prompt": "the prompt", "output": "this run's own output", "earlier run": "an earlier run of yours"}


def copy_source_note(rnd: Round) -> str | None:
    """For the suffix drafter: where this round's copy came from (the prompt, the output so far, an earlier run)."""
    n = rnd.note
    if n is None or n.drafter != "suffix" or n.source is None:
        return None
    where = SOURCE_WORDS.get(n.source, n.source)
    at = "" if n.source_start is None else f" (from its token {n.source_start} on)"
    return (f"suffix index: copied from {where}{at}, the continuation seen most often after the text's last "
            f"{n.match_len} token(s)")


def _draft_tooltip(rnd: Round, i: int, fate: str) -> str:
    p, q, a, u = rnd.p_draft[i], rnd.q_draft[i], rnd.accept_probs[i], rnd.uniforms[i]
    lines = [
        f"round {rnd.index + 1} · draft position {i}: {quoted(rnd.draft_pieces[i])}",
        f"q (draft) = {fmt_prob(q)}   p (target) = {fmt_prob(p)}",
        f"{rnd.test_name} = {fmt_prob(a)}" + ("" if rnd.verify == "pq" else f"  ({rnd.verify} verification)"),
    ]
    if rnd.one_hot:
        lines.append(one_hot_note(rnd))
    if prediction_note(rnd):
        lines.append(prediction_note(rnd))
    if copy_source_note(rnd):
        lines.append(copy_source_note(rnd))
    if fate == events.KEPT:
        lines.append(f"u = {fmt_prob(u)} < {fmt_prob(a)}  →  accepted")
    elif fate == events.REJECTED:
        lines.append(f"u = {fmt_prob(u)} ≥ {fmt_prob(a)}  →  rejected")
        if prediction_note(rnd):
            lines.append("the model departs from the prediction here")
    elif fate == events.DISCARDED:
        lines.append(f"u = {fmt_prob(u)} (never used: an earlier guess was rejected, so this one was discarded)")
    else:
        sign = "<" if u < a else "≥"
        lines.append(f"u = {fmt_prob(u)} {sign} {fmt_prob(a)}, but not committed: the text ended (end of text or "
                     "token limit) before this position")
    return "\n".join(lines)


def _emitted_tooltip(rnd: Round) -> str:
    k = rnd.n_accepted
    head = f"round {rnd.index + 1} · position {k}: {quoted(rnd.emitted_piece)}"
    if rnd.gamma == 0:
        why = ("round one asks for no guesses (plain decoding's first step, timed for the measured speedup)"
               if rnd.asked_nothing else f"the {rnd.drafter} drafter had nothing to propose this round")
        return "\n".join([
            head,
            f"plain target step: {why}, so the token was",
            "sampled from the target's own distribution p, as plain decoding would",
            f"p (target) = {fmt_prob(rnd.emitted_p)}",
        ] + ([prediction_note(rnd)] if prediction_note(rnd) else []))
    if rnd.is_bonus:
        return "\n".join([
            head,
            f"bonus token: all {rnd.gamma} guesses were accepted, so the target's own next-token",
            f"distribution p at position {k} (already computed in the verify pass) was sampled for free",
            f"p (target) = {fmt_prob(rnd.emitted_p)}",
        ])
    residual = next((t.prob for t in rnd.residual_top or [] if t.id == rnd.emitted_id), None)
    lines = [
        head,
        f"repaired token: sampled from normalize(max(0, p − q)) at position {k}",
        f"p (target) = {fmt_prob(rnd.emitted_p)}",
    ]
    if residual is not None:
        lines.append(f"residual probability = {fmt_prob(residual)}")
    return "\n".join(lines)


def _newlines(piece: str) -> int:
    return min(piece.count("\n"), 2)


def round_chips(rnd: Round) -> list[Chip]:
    """The chips of one round in display order: each guess by its fate, the repaired token right after the
    rejected guess it replaces, or the bonus token at the end."""
    chips: list[Chip] = []
    for i, fate in enumerate(rnd.fates):
        kind, piece = FATE_KIND[fate], rnd.draft_pieces[i]
        chips.append(Chip(kind, piece, i, _draft_tooltip(rnd, i, fate), _newlines(piece) if kind == KEPT else 0))
        if i == rnd.rejected_at:
            chips.append(_emitted_chip(rnd))
    if rnd.rejected_at is None:
        chips.append(_emitted_chip(rnd))
    return chips


def _emitted_chip(rnd: Round) -> Chip:
    kind = PLAIN if rnd.gamma == 0 else BONUS if rnd.is_bonus else REPAIRED
    committed = rnd.n_accepted < len(rnd.committed_ids)  # EOS or the token budget can cut the round before it
    tooltip = _emitted_tooltip(rnd) + ("" if committed else "\n(not committed: generation ended before it)")
    return Chip(kind if committed else CUT, rnd.emitted_piece, rnd.n_accepted, tooltip,
                _newlines(rnd.emitted_piece) if committed else 0)


def chip_html(chip: Chip, round_index: int, order: int) -> str:
    text = html.escape(visible_piece(chip.piece))
    title = html.escape(chip.tooltip, quote=True)
    br = "<br>" * chip.newline_after
    return (
        f'<span class="tok tok-{chip.kind}" style="--i:{order}" data-r="{round_index}" data-p="{chip.position}" '
        f'title="{title}">{text}</span>{br}'
    )


def render_round(rnd: Round) -> str:
    """One round as a <span class="rnd">; rounds are immutable, so callers may cache this string."""
    chips = "".join(chip_html(c, rnd.index, k) for k, c in enumerate(round_chips(rnd)))
    src = rnd.note.source if rnd.note is not None and rnd.note.source and rnd.gamma else None
    mark = f' data-src="{html.escape(src, quote=True)}"' if src else ""  # a suffix copy's source (copy_source_note)
    return f'<span class="rnd" data-r="{rnd.index}"{mark}>{chips}</span>'


def render_prompt(prompt: str, max_chars: int = 400) -> str:
    """The prompt, shortened from the left, in muted text before the generated tokens."""
    text = prompt if len(prompt) <= max_chars else "…" + prompt[-max_chars:]
    return f'<span class="sd-prompt" title="prompt">{html.escape(text)}</span>'


def render_tokens(rounds: list[Round], prompt: str = "") -> str:
    """The token view body: the prompt, then every round. Append-only as rounds arrive, so streams stay small."""
    return (render_prompt(prompt) if prompt else "") + "".join(render_round(r) for r in rounds)


def render_legend() -> str:
    samples = [
        ("draft", "x", "a draft guess as it arrives"),
        (KEPT, "x", KIND_LABELS[KEPT]),
        (REJECTED, "x", KIND_LABELS[REJECTED]),
        (REPAIRED, "y", KIND_LABELS[REPAIRED]),
        (DISCARDED, "z", KIND_LABELS[DISCARDED]),
        (BONUS, "b", KIND_LABELS[BONUS]),
        (PLAIN, "t", KIND_LABELS[PLAIN]),
    ]
    items = "".join(
        f'<span class="sd-legend-item"><span class="tok tok-{k}">{html.escape(t)}</span>{html.escape(label)}</span>'
        for k, t, label in samples
    )
    hint = "hover a token for p, q, min(1, p/q) and u · click it to chart p vs q · · = space, ↵ = newline"
    return f'<div class="sd-legend">{items}<span class="sd-legend-hint">{html.escape(hint)}</span></div>'
