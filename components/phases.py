"""Round anatomy: one Round drawn as its four phases, draft → verify → accept/reject → repair or bonus.

Shown for the latest round; in step mode it is the main view of what a single round does. The cards fade in one
after another (CSS), in the order the phases run.
"""

from __future__ import annotations

import html

from specdec.core import events
from specdec.core.stop import stop_label
from specdec.core.events import RULE_HINTS, Round

from .tokens import BONUS, FATE_KIND, KEPT, PLAIN, REPAIRED, fmt_prob, piece_html, quoted


def _chip(kind: str, piece: str, round_index: int, position: int) -> str:
    return f'<span class="tok tok-{kind}" data-r="{round_index}" data-p="{position}">{piece_html(piece)}</span>'


def _row(chip: str, cell: str, title: str = "") -> str:
    """A chip on the left, its numbers on the right; the right side wraps under itself, never under the chip,
    so in a narrow card each line still clearly belongs to its token."""
    t = f' title="{html.escape(title, quote=True)}"' if title else ""
    return f'<div class="sd-row sd-row2"{t}>{chip}<div class="sd-cell">{cell}</div></div>'


def _pct(x: float) -> str:
    return f"{100 * max(0.0, min(1.0, x)):.1f}%"


def _card(step: int, title: str, subtitle: str, body: str) -> str:
    return (
        f'<div class="sd-phase" style="--ph:{step - 1}"><div class="sd-phase-head"><span class="sd-phase-n">{step}</span>'
        f'<span class="sd-phase-title">{html.escape(title)}</span></div>'
        f'<div class="sd-phase-sub">{html.escape(subtitle)}</div><div class="sd-phase-body">{body}</div></div>'
    )


def _draft_card(rnd: Round) -> str:
    if rnd.asked_nothing:
        return _card(1, "Draft", "round one asks for no guesses: it is plain decoding's first step",
                     '<div class="sd-row sd-muted">the prompt alone goes through the target, and that pass is timed '
                     'as plain decoding\'s first step for the measured speedup; guessing starts next round</div>')
    if rnd.gamma == 0:
        return _card(1, "Draft", f"the {rnd.drafter} drafter had nothing to propose this round ({rnd.draft_ms:.0f} ms)",
                     '<div class="sd-row sd-muted">no guesses: this round is a plain target step</div>')
    q_note = " (one-hot: a deterministic proposal)" if rnd.one_hot else ""
    rows = "".join(
        f'<div class="sd-row">{_chip("draft", rnd.draft_pieces[i], rnd.index, i)}'
        f'<span class="sd-num">q = {fmt_prob(rnd.q_draft[i])}</span></div>'
        for i in range(rnd.gamma)
    )
    who = "the draft model" if rnd.drafter == "model" else f"the {rnd.drafter} drafter"
    sub = f"{who} guessed {rnd.gamma} tokens{q_note} ({rnd.draft_ms:.0f} ms)"
    return _card(1, "Draft", sub, rows)


def _verify_card(rnd: Round) -> str:
    if rnd.asked_nothing:
        sub = f"the target read the prompt in one forward pass ({rnd.verify_ms:.0f} ms), as plain decoding does first"
        return _card(2, "Verify", sub, '<div class="sd-row sd-muted">its last row is p for the first new token; '
                     'this pass\'s time is plain decoding\'s first step in the measured speedup</div>')
    rows = []
    for i in range(rnd.gamma):
        p, q = rnd.p_draft[i], rnd.q_draft[i]
        rows.append(_row(
            _chip("draft", rnd.draft_pieces[i], rnd.index, i),
            f'<span class="sd-bars" title="p = {fmt_prob(p)} (purple), q = {fmt_prob(q)} (blue)">'
            f'<span class="sd-bar sd-bar-p" style="width:{_pct(p)}"></span>'
            f'<span class="sd-bar sd-bar-q" style="width:{_pct(q)}"></span></span>'
            f'<span class="sd-num">p = {fmt_prob(p)}</span>',
        ))
    rows.append(f'<div class="sd-row sd-muted">+ row {rnd.gamma}: p for the token after the last guess</div>')
    sub = f"the target scored all {rnd.gamma + 1} positions in one forward pass ({rnd.verify_ms:.0f} ms)"
    return _card(2, "Verify", sub, "".join(rows))


def _accept_card(rnd: Round) -> str:
    if rnd.gamma == 0:
        return _card(3, "Accept / reject", "nothing to test", '<div class="sd-row sd-muted">no guesses</div>')
    rows = []
    for i, fate in enumerate(rnd.fates):
        a, u = rnd.accept_probs[i], rnd.uniforms[i]
        if fate == events.DISCARDED:
            rows.append(_row(_chip("disc", rnd.draft_pieces[i], rnd.index, i),
                             '<span class="sd-verdict sd-muted">not tested — discarded</span>'))
            continue
        kept = i < rnd.n_accepted  # the rule's own verdict; a kept guess past the end of the text is not committed
        kind = FATE_KIND[fate]
        sign = "<" if rnd.passed(i) else "≥"
        word, mark = ("keep", "✓") if kept else ("reject", "✗")
        if fate == events.CUT:
            word += ", but not committed: the text ended before it"
        gauge = (f'<span class="sd-gauge">'
                 f'<span class="sd-gauge-fill" style="width:{_pct(a)}"></span>'
                 f'<span class="sd-gauge-tick sd-gauge-{"acc" if kept else "rej"}" style="left:{_pct(u)}"></span></span>')
        # Short enough for a quarter-width card; the row's tooltip spells it out.
        full = (f"u = {fmt_prob(u)} {sign} {rnd.test_name} = {fmt_prob(a)} → {word} "
                f"(the tick is u, the bar {rnd.test_name})")
        if kept != rnd.passed(i):
            full += "; block verification keeps it all the same: the test of a longer prefix passed"
        if rnd.one_hot and rnd.verify != "block":
            full += f"; q is 1 on this deterministic guess, so {rnd.test_name} = p (pq and strict agree)"
        verdict = "acc" if kept else "rej"
        rows.append(_row(_chip(kind, rnd.draft_pieces[i], rnd.index, i),
                         f'{gauge}<span class="sd-verdict sd-verdict-{verdict}">{fmt_prob(u)} {sign} {fmt_prob(a)} '
                         f'{mark}</span>', title=full))
    sub = f"draw u ~ U(0,1) per guess; {RULE_HINTS.get(rnd.verify, RULE_HINTS['pq'])} (tick inside the bar: passed)"
    return _card(3, "Accept / reject", sub, "".join(rows))


def _emit_card(rnd: Round) -> str:
    k = rnd.n_accepted
    if rnd.gamma == 0:
        title, kind = "Plain step", PLAIN
        sub = "no guesses, so the target's p at the next position gives this round's one token"
    elif rnd.is_bonus:
        title, kind = "Bonus", BONUS
        sub = f"all {rnd.gamma} guesses kept, so the target's p at position {k} gives one more token for free"
    else:
        title, kind = "Repair", REPAIRED
        sub = f"guess {k} was rejected: resample position {k} from {REPAIR_WORDS.get(rnd.verify, REPAIR_WORDS['pq'])}"
    committed = "".join(_chip((KEPT if n < k else kind), piece, rnd.index, n)
                        for n, piece in enumerate(rnd.committed_pieces))
    body = (
        f'<div class="sd-row">{_chip(kind, rnd.emitted_piece, rnd.index, k)}'
        f'<span class="sd-num">p = {fmt_prob(rnd.emitted_p)}</span></div>'
        f'<div class="sd-row sd-commit">committed {len(rnd.committed_ids)} token'
        f'{"s" if len(rnd.committed_ids) != 1 else ""} for 1 target pass: {committed}</div>'
    )
    if rnd.stop_reason:
        body += f'<div class="sd-row sd-muted">generation stopped: {stop_label(rnd.stop_reason)}</div>'
    return _card(4, title, sub, body)


REPAIR_WORDS = {"pq": "normalize(max(0, p − q))", "strict": "p without the refused guess (the target's own draw)",
                "block": "normalize(max(0, w·p − q)), w the kept prefix's weight"}
RULE_WORDS = {"pq": "pq", "strict": "strict", "block": "block"}


def same_draft_html(rnd: Round) -> str:
    """One line: what each rule would have kept from this round's guesses with the same uniforms."""
    if not rnd.same_draft:
        return ""
    parts = []
    for v in rnd.same_draft:
        tests = ", ".join(fmt_prob(t) for t in v.tests)
        title = f"{v.mode}: tests {events.TEST_NAMES.get(v.mode, '')} = [{tests}] against u = " \
                f"[{', '.join(fmt_prob(u) for u in rnd.uniforms)}]"
        mine = " sd-rule-this" if v.mode == rnd.verify else ""
        parts.append(f'<span class="sd-rule{mine}" title="{html.escape(title, quote=True)}">'
                     f'<b>{html.escape(RULE_WORDS.get(v.mode, v.mode))}</b> keeps {v.n_accepted}/{rnd.gamma}</span>')
    note = " · with a one-hot q, pq and strict always agree" if rnd.one_hot else ""
    return (f'<div class="sd-same-draft">Same guesses, same u, three exact rules: {" · ".join(parts)}'
            f'<span class="sd-muted">{note} (this run uses {html.escape(rnd.verify)})</span></div>')


def render_phases(rnd: Round | None) -> str:
    """The four phase cards of one round, or an explanation of them before the first round."""
    if rnd is None:
        return (
            '<div class="sd-phases-empty">Each round has four phases: the small <b>draft</b> model guesses γ tokens, '
            "the big <b>target</b> model <b>verifies</b> all of them in one pass, each guess is <b>accepted or "
            "rejected</b> by comparing p and q, and one <b>repaired or bonus</b> token is added. Press <b>Step</b> "
            "(or the <kbd>S</kbd> key) to run one round.</div>"
        )
    head = (f'<div class="sd-phases-title">Round {rnd.index + 1} at token {rnd.position} · γ = {rnd.gamma} · '
            f'{rnd.kept}/{rnd.gamma} kept · {html.escape(quoted(rnd.emitted_piece))} '
            f'{"plain step" if rnd.gamma == 0 else "bonus" if rnd.is_bonus else "repaired"}</div>')
    cards = _draft_card(rnd) + _verify_card(rnd) + _accept_card(rnd) + _emit_card(rnd)
    # data-r changes every round, so the browser re-creates the cards and replays their entrance animation.
    return f'{head}<div class="sd-phases" data-r="{rnd.index}">{cards}</div>{same_draft_html(rnd)}'
