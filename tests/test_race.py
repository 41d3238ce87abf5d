"""The race engine on the tiny pair: interleaving, identical texts at T = 0, speedups against the race's own plain
lane, records, lane parsing; and its rendering."""

from __future__ import annotations


import pytest

from specdec.core.settings import DecodeSettings
from specdec.loop.plain import plain_decode
from specdec.prompts import GROUNDED
from specdec.core.errors import InvalidInputError
from specdec.loop.race import LaneSpec, Race, parse_lanes
from specdec.core.sampling import SamplingConfig

ALL = "model:4, ngram:8, early-exit:3, cross:4:expected"


@pytest.fixture(autouse=True)
def _one_thread(one_thread):
    """Every race test runs many tiny forward passes (see conftest.one_thread)."""


def test_parse_lanes():
    assert parse_lanes("model:4, ngram:8, ngram:auto, cross:3:confidence, early-exit") == [
        LaneSpec("model", 4), LaneSpec("ngram", 8), LaneSpec("ngram", 4, "expected"),
        LaneSpec("cross", 3, "confidence"), LaneSpec("early-exit", 4)]


def test_parse_tree_lanes():
    assert parse_lanes("model:tree321, ngram:tree4111:strict") == [
        LaneSpec("model", tree=(3, 2, 1)), LaneSpec("ngram", verify="strict", tree=(4, 1, 1, 1))]
    assert LaneSpec("model", tree=(3, 2, 1)).label == "draft model · tree 3,2,1"


@pytest.mark.parametrize("text,match", [
    ("", "at least one"), ("plain", "drafter"), ("model:fast", "neither a gamma"), ("ngram:4:9:1", "drafter"),
    (",".join(["model"] * 7), "at most 6"), ("model:4:tree21", "treeWIDTHS"), ("model:treex", "one digit per depth"),
    ("cross:tree21", "cross drafter has no trees"), ("model:tree888", "limit is 64"), ("model:tree09", "a tree width"),
])
def test_parse_lanes_refuses_bad_text(text, match):
    with pytest.raises(InvalidInputError, match=match):
        parse_lanes(text)


def test_greedy_race_lanes_write_the_same_text_interleaved(no_eos):
    race = Race(no_eos, GROUNDED[0]["prompt"], DecodeSettings(max_new_tokens=30, chat=True), parse_lanes(ALL))
    updates = list(race)
    # Round-robin: while every lane runs, the lanes take turns 0, 1, 2, ...
    n = len(race.lanes)
    assert [u.lane for u in updates[: 3 * n]] == list(range(n)) * 3
    assert race.texts_identical and "Temperature 0" in race.note
    ref = plain_decode(no_eos, GROUNDED[0]["prompt"], DecodeSettings(max_new_tokens=30, chat=True)).ids
    assert all(lane.ids == ref for lane in race.lanes)
    plain = race.lanes[0]
    assert plain.target_passes == plain.tokens == 30 and plain.origins == ["target"] * 30
    model = race.lanes[1]
    assert model.target_passes < 30 and "guess" in model.origins  # the draft model saves target passes here
    assert [lane.last_note.drafter for lane in race.lanes[1:]] == ["model", "ngram", "early-exit", "cross"]
    # Updates carry each lane's running totals; the last per lane matches the lane.
    last = {u.lane: u for u in updates}
    for lane in race.lanes:
        assert last[lane.index].tokens == lane.tokens and last[lane.index].done


def test_a_tree_lane_races_beside_a_chain(no_eos):
    """A token-tree lane steps like any other: greedy, it writes the plain lane's text; its rounds carry their
    tree for the views, and it keeps more per target pass than the plain lane."""
    from components.race import render_race

    prompt = "abcabcabcab"
    race = Race(no_eos, prompt, DecodeSettings(max_new_tokens=16), parse_lanes("model:4, model:tree321, ngram:tree411"))
    list(race)
    assert race.texts_identical
    tree = race.lanes[2]
    assert all(r.tree is not None for r in tree.rounds) and tree.target_passes < 16
    assert race.summary()["lanes"][2]["tree"] == [3, 2, 1]
    assert "tree 3,2,1" in render_race(race.view())
    rec = race.records()[1]
    assert rec.generated_ids == tree.ids


def test_a_tree_lane_refuses_block_verification(tiny_pair):
    with pytest.raises(InvalidInputError, match="tree 2,1.*block"):
        Race(tiny_pair, "x", DecodeSettings(max_new_tokens=4), parse_lanes("model:tree21:block"))


def test_speedup_is_against_the_plain_lane_of_the_race(no_eos):
    race = Race(no_eos, "abcabc", DecodeSettings(max_new_tokens=12), parse_lanes("model:4"))
    list(race)
    plain, spec = race.lanes
    # Planted timings: plain 10 ms per token; the speculative lane took 40 ms for its 12 tokens -> 3x.
    plain.cum_ms = [10.0 * (i + 1) for i in range(12)]
    plain.elapsed_ms = 120.0
    spec.elapsed_ms = 40.0
    assert race.speedup(1) == pytest.approx(3.0)
    assert race.plain_ms_for(6) == (60.0, False)
    assert race.plain_ms_for(24) == (240.0, True)  # beyond the plain lane: its rate so far
    rec = race.records()[0]
    assert rec.baseline_ms_per_token == pytest.approx(10.0) and rec.label == spec.spec.label
    assert rec.generated_ids == spec.ids
    summary = race.summary()
    assert summary["lanes"][1]["speedup"] == pytest.approx(3.0) and summary["texts_identical"]
    assert race.plain_result().ids == plain.ids and race.plain_result().ms_per_token == pytest.approx(10.0)


def test_sampled_race_says_why_texts_differ(no_eos):
    race = Race(no_eos, "abcabc", DecodeSettings(max_new_tokens=24, sampling=SamplingConfig(temperature=1.0), seed=5),
                parse_lanes("model:4, ngram:4"))
    list(race)
    assert not race.texts_identical
    assert "exact sample" in race.note and "random numbers" in race.note


def test_refused_lane_names_the_lane(tiny_pair):
    with pytest.raises(InvalidInputError, match="lane 'n-gram lookup · γ confidence.*confidence"):
        Race(tiny_pair, "abc", DecodeSettings(), parse_lanes("ngram:confidence"))


def test_finished_race_refuses_another_step(no_eos):
    race = Race(no_eos, "ab", DecodeSettings(max_new_tokens=2), parse_lanes("ngram:2"))
    list(race)
    with pytest.raises(InvalidInputError, match="finished"):
        race.step()


# ------------------------------------------------------------------------------------------------ rendering


def test_split_flags_mark_boundaries_only_one_side_has():
    from components.race import _split_flags

    draft, target = ["the", " cat", "s"], ["th", "e", " ca", "ts"]
    assert _split_flags(draft, target) == [False, True, False]  # "the|" is shared, " cat|" is not, the end is
    assert _split_flags(target, draft) == [True, False, True, False]


def test_race_rendering_shows_each_drafter(no_eos):
    from components.race import race_figure, render_race

    prompt = "abcabcabcab"  # repeats, so ngram copies
    lanes = parse_lanes("model:3, ngram:4, early-exit:2, cross:3")
    race = Race(no_eos, prompt, DecodeSettings(max_new_tokens=16), lanes)
    list(race)
    page = render_race(race.view())
    assert page.count('class="race-lane"') == 5 and page.count('data-state="done"') == 5
    assert "Temperature 0" in page and "fastest lane" in page
    assert "1 of 2 layers" in page  # early exit
    assert 'class="rt-match"' in page and 'class="rt-src"' in page  # ngram: matched suffix and copied tokens
    assert "draft tokens" in page and "target tokens" in page  # cross: both tokenizations
    fig = race_figure(race.view())
    assert len(fig.data) == 5 and all(len(t.y) == 17 for t in fig.data)  # 0..16 tokens per lane
    assert "Run race" in render_race(None)
    assert "⚠ bad" in render_race(None, "⚠ bad")


def test_race_rendering_escapes_model_text():
    from components.race import render_race
    from specdec.loop.race import Lane, RaceView

    lane = Lane(0, LaneSpec("plain"), ids=[1, 2], pieces=["<img src=x>", "&"], origins=["target", "target"],
                cum_ms=[1.0, 2.0], elapsed_ms=2.0, target_passes=2, stop_reason="max_new_tokens")
    page = render_race(RaceView(["<script>"], [lane], [1.0], [False], "note", True, 2))
    assert "<img" not in page and "&lt;img src=x&gt;&amp;" in page


def test_race_tab_redraws_its_chart_at_most_once_an_interval(no_eos, monkeypatch):
    """The page rebuilds a Plotly chart on every new figure (ui.playground.CHART_INTERVAL_S): while a race streams,
    its lanes update with every step but its chart only once an interval; the last update always carries it."""
    import ui.race as race_ui

    monkeypatch.setattr(race_ui, "MIN_UPDATE_S", 0.0)  # an update after every step
    args = ("abcabc", False, "model:4", 12, 0, 0)

    def charts(interval: float) -> tuple[list[bool], bool]:
        monkeypatch.setattr(race_ui, "CHART_INTERVAL_S", interval)
        updates = list(race_ui.run_race(lambda: no_eos, *args))[1:]  # past "Setting up the lanes"
        drawn = [not (isinstance(fig, dict) and fig.get("__type__") == "update") for _, fig, _ in updates]
        return drawn[:-1], drawn[-1]

    streaming, last = charts(1e9)
    assert len(streaming) >= 5 and streaming[0] and not any(streaming[1:]) and last
    streaming, last = charts(0.0)
    assert all(streaming) and last
