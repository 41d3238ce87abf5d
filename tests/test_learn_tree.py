"""The Learn walkthrough steps through a token-tree round: the built-in tree example and a tree round the
playground recorded, one step per child the rule tried."""

from __future__ import annotations

import re

import pytest

from components import learn as view
from specdec.core.settings import DecodeSettings
from specdec.learn.examples import example_rounds
from specdec.loop.tree import TreeDecoder
from specdec.loop.tree_display import TreeRun


def fates(page: str) -> list[str]:
    """Each node's fate on the page, in node order (the page nests them by branch)."""
    found = dict(re.findall(r'data-node="(\d+)" data-fate="(\w+)"', page))
    return [found[k] for k in sorted(found, key=int)]


def test_the_builtin_tree_round_is_decided_by_the_tree_rule():
    rnd = example_rounds()["builtin:tree"].round
    event = rnd.tree
    assert event is not None and event.one_hot and event.widths == [2, 1]
    assert [n.piece for n in event.nodes] == [" cat", " dog", " sat", " ran"]
    assert event.steps == [0, 1, 3] and event.path == [1, 3]  # " cat" refused, " dog" then " ran" kept
    assert abs(event.nodes[1].r - 0.5 / 0.7) < 1e-6  # r after " cat" left: p with " cat" removed, renormalized
    assert event.bonus and rnd.committed_pieces == [" dog", " ran", " away"]


def test_each_step_decides_one_more_child():
    rnd = example_rounds()["builtin:tree"].round
    assert view.walk_steps(rnd) == 7
    pages = [view.tree_walkthrough_html(rnd, s, "The") for s in range(7)]
    assert fates(pages[0]) == fates(pages[1]) == ["untried"] * 4
    assert "learn-tree-scored" not in pages[0] and "learn-tree-scored" in pages[1]
    assert fates(pages[2]) == ["rejected", "untried", "untried", "untried"]
    assert fates(pages[3]) == ["rejected", "accepted", "untried", "untried"]
    assert fates(pages[4]) == ["rejected", "accepted", "untried", "accepted"]
    assert all("data-kind=" not in p for p in pages[:5]) and all('data-kind="bonus"' in p for p in pages[5:])
    assert "refused" in pages[2] and "accepted" in pages[3] and "Bonus token" in pages[5]
    assert "committed this round" in pages[6] and "3 tokens from one target pass" in pages[6]
    assert "Step 7 of 7" in view.tree_walkthrough_html(rnd, 99)  # clamped


def test_a_chain_round_keeps_the_chain_walkthrough():
    rnd = example_rounds()["builtin:reject"].round
    assert rnd.tree is None and view.walk_steps(rnd) == view.N_STEPS


@pytest.mark.parametrize("widths,mode", [((2, 2), "top-k"), ((3, 3, 3), "dynamic")])
def test_the_learn_tab_walks_a_recorded_tree_round(no_eos, widths, mode):
    from ui import learn_tab  # imported here, not at collection: another test reloads it under a fake `spaces`

    run = TreeRun(TreeDecoder(no_eos, "def add(a, b):", DecodeSettings(max_new_tokens=8), widths, mode))
    list(run)
    records = [run.record()]
    choice = learn_tab.round_choices(records)[-1][1]
    rnd = learn_tab.round_for(choice, records)[0]
    assert rnd.tree is not None
    last = view.walk_steps(rnd) - 1
    page = learn_tab.render_walkthrough(choice, last, records)
    assert "learn-tree-walk" in page and f"Step {last + 1} of {last + 1}" in page
    assert ("builtin:tree" in dict((k, v) for v, k in learn_tab.round_choices(None)))
