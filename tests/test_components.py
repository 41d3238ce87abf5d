"""The playground's pure renderers: token markup, escaping, round anatomy, p-vs-q and speedup figures, stats.

Rounds come from two places: a recorded run of the tiny pair (real engine output) and rounds built by hand to pin
down each case (all accepted + bonus, rejection at 0, rejection mid-way with discarded guesses, hostile pieces).
"""

from __future__ import annotations

import html
import math
import re

import pytest

from components import (
    pq_candidates,
    pq_figure,
    render_phases,
    render_round,
    render_stats,
    render_tokens,
    round_chips,
    speedup_figure,
    visible_piece,
)
from components.charts import OTHER, running_alpha
from components.labels import describe_round, position_choices, round_choices
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.core.events import DraftNote, Round, TokenProb, Totals
from specdec.core.metrics import StepCosts, rounds_cost_ratio, running_speedup, summarize
from specdec.core.speedup import leviathan_speedup
from specdec.core.sampling import SamplingConfig

SCRIPT = "<script>alert(1)</script>"
IMG = '<img src=x onerror="alert(2)">'

# ------------------------------------------------------------------------------------------ hand-built rounds

VOCAB: dict[str, int] = {}


def tid(piece: str) -> int:
    return VOCAB.setdefault(piece, len(VOCAB) + 10)


def row(*pairs) -> list[TokenProb]:
    return [TokenProb(tid(piece), piece, prob) for piece, prob in pairs]


def make_round(drafts, q, p, u, n_accepted, emitted, emitted_p, *, q_top=None, p_top=None, residual=None,
               committed=None, index=0, stop_reason=None, note=None) -> Round:
    gamma = len(drafts)
    accept = [min(1.0, pi / qi) for pi, qi in zip(p, q)]
    rejected = n_accepted if n_accepted < gamma else None
    if committed is None:
        committed = list(drafts[:n_accepted]) + [emitted]
    return Round(
        index=index, position=0, gamma=gamma,
        draft_ids=[tid(d) for d in drafts], draft_pieces=list(drafts),
        q_draft=list(q), p_draft=list(p), accept_probs=accept, uniforms=list(u),
        n_accepted=n_accepted, rejected_at=rejected,
        emitted_id=tid(emitted), emitted_piece=emitted, is_bonus=rejected is None, emitted_p=emitted_p,
        q_top=q_top if q_top is not None else [row((d, qi)) for d, qi in zip(drafts, q)],
        p_top=p_top if p_top is not None else [row((d, pi)) for d, pi in zip(drafts, p)] + [row((emitted, emitted_p))],
        residual_top=residual,
        committed_ids=[tid(c) for c in committed], committed_pieces=list(committed),
        draft_ms=5.0, verify_ms=10.0, round_ms=16.0,
        totals=Totals(rounds=index + 1), stop_reason=stop_reason, note=note,
    )


@pytest.fixture
def bonus_round() -> Round:
    """All three guesses kept, so the target's p at position 3 gives a bonus token."""
    return make_round(["The", " cat", " sat"], q=[0.5, 0.4, 0.6], p=[0.7, 0.5, 0.65], u=[0.3, 0.9, 0.2],
                      n_accepted=3, emitted=" down", emitted_p=0.4,
                      p_top=[row(("The", 0.7), ("A", 0.2)), row((" cat", 0.5), (" dog", 0.3)),
                             row((" sat", 0.65), (" ran", 0.2)), row((" down", 0.4), (" up", 0.35), ("\n", 0.1))])


@pytest.fixture
def reject_first() -> Round:
    """The first guess fails (u 0.5 >= 1/6); the second is discarded untested; 'cat' comes from the residual."""
    return make_round(["dog", "ran"], q=[0.6, 0.3], p=[0.1, 0.2], u=[0.5, 0.1], n_accepted=0,
                      emitted="cat", emitted_p=0.5,
                      q_top=[row(("dog", 0.6), ("cat", 0.1), ("owl", 0.05)), row(("ran", 0.3))],
                      p_top=[row(("cat", 0.5), ("owl", 0.25), ("dog", 0.1)), row(("ran", 0.2)), row(("!", 0.9))],
                      residual=row(("cat", 0.8), ("owl", 0.2)))


@pytest.fixture
def reject_midway() -> Round:
    """Two kept, the hostile third guess rejected, the fourth discarded; the repair is hostile too."""
    return make_round(["a", " b\n", SCRIPT, "d"], q=[0.3, 0.4, 0.5, 0.2], p=[0.6, 0.4, 0.05, 0.3],
                      u=[0.7, 0.99, 0.6, 0.01], n_accepted=2, emitted=IMG, emitted_p=0.3, index=4,
                      residual=row((IMG, 0.6), ("e", 0.4)))


@pytest.fixture(scope="module")
def recorded(tiny_pair) -> list[Round]:
    """A real run of the tiny pair at temperature 0.7, long enough to contain rejections and bonus tokens."""
    rounds = []
    for seed in range(3):
        s = DecodeSettings(gamma=4, max_new_tokens=48, sampling=SamplingConfig(temperature=0.7), seed=seed)
        rounds += list(SpeculativeDecoder(tiny_pair, "Hello world", s))
    return rounds


def kinds(html_text: str) -> list[str]:
    return re.findall(r'class="tok tok-(\w+)"', html_text)


def chip_texts(html_text: str) -> list[str]:
    return [html.unescape(t) for t in re.findall(r'class="tok tok-\w+"[^>]*>([^<]*)</span>', html_text)]


# ------------------------------------------------------------------------------------------------ token view


def test_all_accepted_ends_with_a_bonus_chip(bonus_round):
    out = render_round(bonus_round)
    assert kinds(out) == ["acc", "acc", "acc", "bonus"]
    assert chip_texts(out) == ["The", "·cat", "·sat", "·down"]


def test_rejection_at_zero_shows_rejected_repaired_then_discarded(reject_first):
    out = render_round(reject_first)
    assert kinds(out) == ["rej", "rep", "disc"]
    assert chip_texts(out) == ["dog", "cat", "ran"]


def test_rejection_midway_keeps_prefix_and_fades_later_guesses(reject_midway):
    chips = round_chips(reject_midway)
    assert [c.kind for c in chips] == ["acc", "acc", "rej", "rep", "disc"]
    assert [c.position for c in chips] == [0, 1, 2, 2, 3]  # the repair takes the rejected guess's place
    out = render_round(reject_midway)
    assert 'data-r="4"' in out


def test_the_five_kinds_have_distinct_classes(bonus_round, reject_midway):
    classes = set(kinds(render_round(bonus_round) + render_round(reject_midway)))
    assert classes == {"acc", "rej", "rep", "disc", "bonus"}


def test_token_text_and_tooltips_are_escaped(reject_midway):
    out = render_tokens([reject_midway], prompt="<b>prompt</b> & more")
    assert "<script" not in out and "<img" not in out and "<b>" not in out
    assert html.escape(SCRIPT) in out
    assert "&lt;img·src=x·onerror=&quot;alert(2)&quot;&gt;" in out  # spaces drawn as ·
    assert "&lt;b&gt;prompt&lt;/b&gt; &amp; more" in out
    # every attribute value is closed where it should be: no raw quote leaks out of title="..."
    for title in re.findall(r'title="([^"]*)"', out):
        assert "<" not in title and ">" not in title


def test_whitespace_is_visible():
    assert visible_piece(" the") == "·the"
    assert visible_piece("\n\t") == "↵⇥"
    assert visible_piece("") == "∅"


def test_committed_newline_breaks_the_line_but_a_discarded_one_does_not(reject_midway):
    out = render_round(reject_midway)
    assert "·b↵</span><br>" in out  # accepted " b\n"
    discarded_nl = make_round(["x", "\n"], q=[0.5, 0.5], p=[0.1, 0.5], u=[0.9, 0.1], n_accepted=0,
                              emitted="y", emitted_p=0.2)
    assert "<br>" not in render_round(discarded_nl)


def test_tooltips_carry_p_q_accept_prob_and_u(reject_first):
    titles = [html.unescape(t) for t in re.findall(r'title="([^"]*)"', render_round(reject_first))]
    rejected = titles[0]
    assert "q (draft) = 0.600" in rejected and "p (target) = 0.100" in rejected
    assert "min(1, p/q) = 0.167" in rejected and "u = 0.500 ≥ 0.167" in rejected and "rejected" in rejected
    assert "normalize(max(0, p − q))" in titles[1] and "residual probability = 0.800" in titles[1]
    assert "discarded" in titles[2]


def test_tokens_after_an_end_of_text_are_marked_not_committed():
    rnd = make_round(["a", "<eos>", "b"], q=[0.5, 0.5, 0.5], p=[0.6, 0.6, 0.6], u=[0.1, 0.1, 0.1], n_accepted=3,
                     emitted="c", emitted_p=0.2, committed=["a", "<eos>"], stop_reason="eos")
    assert kinds(render_round(rnd)) == ["acc", "acc", "cut", "cut"]


def test_recorded_rounds_render_consistently(recorded):
    assert any(r.rejected_at is not None for r in recorded) and any(r.is_bonus for r in recorded)
    for r in recorded:
        k = kinds(render_round(r))
        cut = len(r.committed_ids) < r.n_accepted + 1
        if not cut:
            assert k.count("acc") == r.n_accepted
            assert k.count("bonus") == int(r.is_bonus)
            assert k.count("rep") == int(not r.is_bonus)
        assert k.count("rej") == int(r.rejected_at is not None)
        assert k.count("disc") == (r.gamma - r.rejected_at - 1 if r.rejected_at is not None else 0)
        # replaying a stored trace draws exactly the same thing
        assert render_round(Round.from_dict(r.to_dict())) == render_round(r)


def test_token_view_only_grows_as_rounds_arrive(recorded):
    run = recorded[:6]
    views = [render_tokens(run[:n], prompt="Hello world") for n in range(len(run) + 1)]
    assert all(b.startswith(a) for a, b in zip(views, views[1:]))


# --------------------------------------------------------------------------------------------- round anatomy


def test_phases_show_all_four_steps_for_a_rejection(reject_midway):
    out = render_phases(reject_midway)
    for phase in ("Draft", "Verify", "Accept / reject", "Repair"):
        assert f'<span class="sd-phase-title">{phase}</span>' in out
    assert "0.600 ≥ 0.100 ✗" in out and "u = 0.600 ≥ min(1, p/q) = 0.100 → reject" in out
    assert "not tested — discarded" in out
    assert "<script" not in out and html.escape(visible_piece(SCRIPT)) in out


def test_phases_for_a_bonus_round(bonus_round):
    out = render_phases(bonus_round)
    assert '<span class="sd-phase-title">Bonus</span>' in out and "→ reject" not in out
    assert out.count("→ keep") == 3 and out.count("✓</span>") == 3


# ------------------------------------------------------------------------------------------------- p vs q


def trace(fig, name_start: str):
    matches = [t for t in fig.data if t.name.startswith(name_start)]
    assert len(matches) == 1, [t.name for t in fig.data]
    return matches[0]


def values(fig, name_start: str) -> dict[str, float | None]:
    t = trace(fig, name_start)
    return {html.unescape(x): y for x, y in zip(t.x, t.y)}


def test_pq_bars_at_a_rejection_carry_the_rounds_numbers(reject_first):
    fig = pq_figure(reject_first, 0)
    p, q, res, kept = values(fig, "p ("), values(fig, "q ("), values(fig, "residual"), values(fig, "kept")
    assert q["dog"] == pytest.approx(0.6) and p["dog"] == pytest.approx(0.1)  # the drafted token, exactly
    assert p["cat"] == pytest.approx(0.5) and q["cat"] == pytest.approx(0.1)
    assert res["cat"] == pytest.approx(0.8) and res["owl"] == pytest.approx(0.2)
    assert res["dog"] == 0.0  # p < q there: max(0, p - q) is exactly 0
    assert kept["dog"] == pytest.approx(0.1) and kept["cat"] == pytest.approx(0.1)
    assert p[OTHER] == pytest.approx(1 - 0.5 - 0.25 - 0.1)
    assert q[OTHER] == pytest.approx(1 - 0.6 - 0.1 - 0.05)
    assert "rejected" in fig.layout.title.text


def test_pq_bonus_position_has_zero_q_and_no_residual(bonus_round):
    fig = pq_figure(bonus_round, 3)
    p, q = values(fig, "p ("), values(fig, "q (")
    assert p["·down"] == pytest.approx(0.4) and p["·up"] == pytest.approx(0.35)
    assert all(v == 0.0 for v in q.values())
    assert not [t for t in fig.data if t.name.startswith("residual")]
    assert any(a.text == "bonus" for a in fig.layout.annotations)


def test_pq_unknown_values_are_left_out_not_zeroed(recorded):
    # Full top lists (the round's top_k long) say nothing about tokens outside them: those bars must be None, not 0.
    rnd = next(r for r in recorded if len(r.q_top[0]) == r.top_k)
    cands = pq_candidates(rnd, 0)
    q_ids = {t.id for t in rnd.q_top[0]} | {rnd.draft_ids[0]}
    for c in cands[:-1]:
        if c.id not in q_ids:
            assert c.q is None and c.kept is None


def test_pq_figures_match_recorded_rounds(recorded):
    for r in recorded[:12]:
        for pos in range(r.gamma + 1):
            fig = pq_figure(r, pos)
            p, q = trace(fig, "p ("), trace(fig, "q (")
            ids = [c.id for c in pq_candidates(r, pos)]
            if pos < r.gamma:
                i = ids.index(r.draft_ids[pos])
                assert p.y[i] == pytest.approx(r.p_draft[pos]) and q.y[i] == pytest.approx(r.q_draft[pos])
            assert r.p_top[pos][0].id in ids  # the target's favourite is always charted
            for t in r.p_top[pos]:
                if t.id in ids:
                    assert p.y[ids.index(t.id)] == pytest.approx(t.prob)
            assert sum(v for v in p.y if v is not None) == pytest.approx(1.0, abs=1e-4)
            if pos == r.rejected_at:
                res = trace(fig, "residual")
                for t in r.residual_top:
                    if t.id in ids:
                        assert res.y[ids.index(t.id)] == pytest.approx(t.prob)


def test_pq_labels_are_escaped_for_plotly(reject_midway):
    fig = pq_figure(reject_midway, 2)
    labels = list(trace(fig, "p (").x)
    assert html.escape(visible_piece(SCRIPT)) in labels and not any("<script" in x for x in labels)
    assert "<script" not in fig.layout.title.text


def test_pq_keeps_at_most_max_bars_and_always_the_drafted_and_emitted_tokens(recorded):
    rnd = next(r for r in recorded if r.rejected_at is not None and r.residual_top)
    k = rnd.rejected_at
    cands = pq_candidates(rnd, k, max_bars=4)
    assert len(cands) == 5 and cands[-1].id is None  # four tokens + "other"
    ids = [c.id for c in cands]
    assert rnd.draft_ids[k] in ids and rnd.emitted_id in ids
    # "other" holds exactly the p mass not charted, so the p bars still sum to 1
    assert sum(c.p for c in cands if c.p is not None) == pytest.approx(1.0, abs=1e-5)


def test_pq_rejects_positions_outside_the_round(bonus_round):
    with pytest.raises(ValueError):
        pq_figure(bonus_round, 4)


# ------------------------------------------------------------------------------------------ speedup and stats


def test_speedup_figure_traces(recorded):
    run = recorded[:10]
    costs = StepCosts(20.0, 5.0)
    fig = speedup_figure(run, costs)
    assert list(trace(fig, "tokens per").y) == [len(r.committed_ids) for r in run]
    assert list(trace(fig, "measured").y) == pytest.approx(running_speedup(run, 20.0))
    # per-token alpha: kept guesses over tested guesses (the prefix plus the first rejected one, within the text)
    kept = sum(f == "kept" for r in run for f in r.fates)
    alpha = kept / (kept + sum(f == "rejected" for r in run for f in r.fates))
    assert running_alpha(run)[-1] == pytest.approx(alpha)
    # the one convention: mean draft length, c_loop from the rounds' timings (speedup.run_predicted_speedup)
    mean_gamma = sum(r.gamma for r in run) / len(run)
    want = leviathan_speedup(alpha, mean_gamma, rounds_cost_ratio(run))
    assert trace(fig, "predicted").y[-1] == pytest.approx(want)
    assert trace(fig, "predicted").y[-1] == pytest.approx(summarize(run, costs).predicted_speedup)


def test_speedup_figure_without_costs_has_no_measured_line(recorded):
    fig = speedup_figure(recorded[:3], None)
    assert [t.name for t in fig.data if not t.name.startswith("predicted")] == ["tokens per target pass",
                                                                               "plain decoding = 1×"]
    assert "measuring" in fig.layout.title.text
    # the prediction needs no plain step costs: c_loop comes from the rounds' own timings
    assert trace(fig, "predicted").y[-1] == pytest.approx(summarize(recorded[:3]).predicted_speedup)


def test_stats_panel_numbers(bonus_round, reject_first, reject_midway):
    rounds = [bonus_round, reject_first, reject_midway]
    out = render_stats(summarize(rounds, StepCosts(20.0, 5.0)))
    generated = 4 + 1 + 3
    stat = lambda key: re.search(rf'data-stat="{key}"[^>]*><div class="sd-stat-value">([^<]*)<', out).group(1)  # noqa: E731
    assert stat("passes_saved") == str(generated - 3)
    assert stat("acceptance") == f"{100 * 5 / 9:.0f}%"
    assert stat("tokens_per_round") == f"{generated / 3:.2f}"
    tok_s = 1e3 * generated / (3 * 16.0)
    assert stat("tok_s") == f"{tok_s:.1f}"
    assert stat("speedup") == f"{tok_s / 50.0:.2f}×"
    assert not math.isnan(float(stat("predicted").rstrip("×")))
    # the two cost ratios are named apart: c_loop (paid in the run, used for the prediction) and c_plain
    assert "c_loop (paid in this run) = " in out and "c_plain (plain step costs) = 0.25" in out
    assert "c_loop = " in re.search(r'data-stat="predicted" title="([^"]*)"', out).group(1)


def test_stats_before_any_round():
    assert "after the first round" in render_stats(None)
    assert "after the first round" in render_stats(summarize([]))


# ------------------------------------------------------------------------- fates, empty and one-hot proposals


def test_a_rejection_past_the_end_of_the_text_is_not_drawn_as_rejected():
    # EOS was the first (kept) guess: the rejection after it and its repair never reached the text (Round.fates)
    rnd = make_round(["<eos>", "b"], q=[0.5, 0.5], p=[0.6, 0.1], u=[0.1, 0.9], n_accepted=1, emitted="c",
                     emitted_p=0.2, committed=["<eos>"], stop_reason="eos")
    assert rnd.fates == ["kept", "cut"]
    assert kinds(render_round(rnd)) == ["acc", "cut", "cut"]
    labels = [label for label, _ in position_choices(rnd)]
    assert labels[1].endswith("not committed") and "rejected" not in labels[1]
    assert describe_round(rnd).startswith("1/2 guesses kept")


@pytest.fixture
def empty_round() -> Round:
    """The n-gram drafter found nothing to copy: gamma 0, one plain target step."""
    return make_round([], q=[], p=[], u=[], n_accepted=0, emitted=" plain", emitted_p=0.3, index=2,
                      note=DraftNote("ngram", one_hot=True))


def test_round_one_of_a_probed_run_says_it_is_plain_decodings_first_step(tiny_pair):
    from components.learn import _narrative

    for drafter in ("model", "ngram", "predicted"):
        s = DecodeSettings(max_new_tokens=6, gamma=2, drafter=drafter, prediction="hello world again")
        dec = SpeculativeDecoder(tiny_pair, "hello world", s, plain_probe=True)
        first = dec.step()
        assert first.asked_nothing and first.gamma == 0
        for out in (render_phases(first), html.unescape(render_round(first)), _narrative(first, 0)):
            assert "plain decoding's first step" in out and "nothing to propose" not in out
            assert "left the prediction" not in out
        assert "read the prompt in one forward pass" in render_phases(first)
        assert "after the last guess" not in render_phases(first)
        second = dec.step()
        assert not second.asked_nothing


def test_a_round_with_nothing_drafted_renders_everywhere(empty_round):
    out = render_round(empty_round)
    assert kinds(out) == ["plain"] and chip_texts(out) == ["·plain"]
    assert "plain target step" in html.unescape(out) and "nothing to propose" in html.unescape(out)
    phases = render_phases(empty_round)
    assert "Plain step" in phases and "nothing to propose" in phases and "no guesses" in phases
    fig = pq_figure(empty_round, 0)
    assert "plain target step" in fig.layout.title.text
    assert values(fig, "p (")["·plain"] == pytest.approx(0.3)
    assert describe_round(empty_round).startswith("nothing drafted")
    assert round_choices([empty_round]) == [("Round 3: nothing drafted (plain step)", 2)]
    assert [v for _, v in position_choices(empty_round)] == [0]
    stats = render_stats(summarize([empty_round]))
    assert 'data-stat="acceptance"' in stats and "—" in stats  # nothing drafted: no acceptance rate to show
    from components import learn

    for step in range(learn.N_STEPS):
        assert "learn-walk" in learn.walkthrough_html(empty_round, step)
    assert "nothing to propose" in learn.walkthrough_html(empty_round, 0)


@pytest.fixture
def one_hot_round() -> Round:
    """Two copied guesses (q = 1 on each): the first kept with chance p = 0.6, the second refused (u 0.5 >= 0.2)."""
    return make_round(["a", "b"], q=[1.0, 1.0], p=[0.6, 0.2], u=[0.3, 0.5], n_accepted=1, emitted="c",
                      emitted_p=0.5, q_top=[row(("a", 1.0)), row(("b", 1.0))],
                      p_top=[row(("a", 0.6), ("x", 0.3)), row(("c", 0.5), ("b", 0.2)), row(("d", 0.9))],
                      residual=row(("c", 0.625), ("x", 0.375)), note=DraftNote("ngram", one_hot=True, match_len=2))


def test_one_hot_q_is_one_on_the_guess_and_zero_elsewhere(one_hot_round):
    assert one_hot_round.accept_probs == [0.6, 0.2]  # min(1, p/1) = p
    fig = pq_figure(one_hot_round, 1)
    q = values(fig, "q (")
    assert q["b"] == 1.0 and q["c"] == 0.0  # known zeros, not unknown (None): q is exactly one-hot
    assert "one-hot" in trace(fig, "q (").name and "q = 1 on the guess" in trace(fig, "q (").hovertemplate
    assert "one-hot" in fig.layout.title.text and "kept with probability p" in fig.layout.title.text
    titles = [html.unescape(t) for t in re.findall(r'title="([^"]*)"', render_round(one_hot_round))]
    assert "q is one-hot" in titles[0] and "probability min(1, p/1) = p" in titles[0]
    assert "one-hot" in render_phases(one_hot_round)


def test_learn_walkthrough_reads_rounds_and_fates(recorded, reject_midway):
    from components import learn

    for rnd in recorded[:5] + [reject_midway]:
        for step in range(learn.N_STEPS):
            out = learn.walkthrough_html(rnd, step)
            assert "<script" not in out and "learn-walk" in out
    # the playground's token display: a space is '·' in both tabs
    assert "·b↵" in learn.walkthrough_html(reject_midway, 2)
    table = learn.walkthrough_html(reject_midway, 3)
    assert table.count("<td>kept</td>") == 2 and table.count("<td>rejected</td>") == 1
    assert "not checked" in table
