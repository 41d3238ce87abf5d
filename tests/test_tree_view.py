"""Watching a tree round: the display event (p, q, the residual r and u at every node), its HTML and chart, tree
rounds in traces, the playground's Token tree controls, and the tree view in the real app (browser)."""

from __future__ import annotations

import copy
import html
import json
import re

import numpy as np
import pytest
import torch

from components.tokens import fmt_prob
from components.tree import DETERMINISTIC, render_tree, tree_pq_figure
from specdec.core.errors import TraceError
from specdec.core.sampling import OneHot, SamplingConfig
from specdec.core.settings import DecodeSettings
from specdec.core.tree import TokenTree, verify_tree
from specdec.core.tree_events import BONUS, REPAIR, TREE_ACCEPTED, TREE_REJECTED, TREE_UNTRIED, TreeRoundEvent
from specdec.io.trace import dumps_trace, load_trace, record_to_dict
from specdec.loop.tree import TreeDecoder
from specdec.loop.tree_display import TreeRun, tree_round_event

V = 6


class Pieces:
    """A stand-in tokenizer: token i decodes to "t<i>"."""

    def batch_decode(self, rows):
        return [self.decode(r) for r in rows]

    def decode(self, ids, **_):
        return "".join(f"t{i}" for i in ids)


def _dist(*xs) -> list[float]:
    a = np.array(xs, dtype=np.float64)
    return list(a / a.sum())


# The hand-built tree: three children of the root, then two / one / one grandchildren.
#   node: 0  1  2  3  4  5  6
TOKENS = [1, 2, 3, 0, 4, 1, 2]
PARENTS = [-1, -1, -1, 0, 0, 1, 2]
P_ROWS = np.array([_dist(1, 4, 3, 1, 1, 2)] + [_dist(*(np.arange(V) + k + 1) % 5 + 1) for k in range(7)])
Q_ROOT = _dist(1, 6, 1, 2, 1, 1)  # what the root's children were drawn from (i.i.d., "sampled")
Q_ROWS = np.array([Q_ROOT, Q_ROOT, Q_ROOT] + [_dist(2, 1, 1, 1, 3, 1)] * 2 + [_dist(1, 5, 1, 1, 1, 1)]
                  + [_dist(1, 1, 4, 1, 1, 1)])


def expected_walk(uniforms):
    """The walk recomputed here in float64 from P_ROWS and Q_ROWS: {node: (r(x), keep chance, u, accepted)}."""
    children = {n: [i for i, p in enumerate(PARENTS) if p == n] for n in range(-1, len(PARENTS))}
    out, node, draws = {}, -1, iter(uniforms)
    while True:
        r = P_ROWS[node + 1].copy()
        nxt = None
        for c in children[node]:
            x, q = TOKENS[c], Q_ROWS[c]
            a = min(1.0, r[x] / q[x])
            u = next(draws)
            out[c] = (r[x], a, u, u < a)
            if u < a:
                nxt = c
                break
            r = np.maximum(r - q, 0)
            r = r / r.sum()
        if nxt is None:
            return out, node, r
        node = nxt


def hand_tree(q_one_hot: bool = False) -> TokenTree:
    tokens = torch.tensor(TOKENS)
    q = OneHot(tokens.clone(), V) if q_one_hot else torch.tensor(Q_ROWS, dtype=torch.float32)
    return TokenTree(tokens, list(PARENTS), q)


def nodes_by_fate(doc: str, fate: str) -> list[int]:
    return [int(m) for m in re.findall(rf'class="tn tn-{fate}[^"]*"[^>]*data-node="(\d+)"', doc)]


def title_of(doc: str, node: int) -> str:
    m = re.search(rf'data-node="{node}"[^>]*title="([^"]*)"', doc)
    assert m, node
    return html.unescape(m.group(1))


def test_event_and_view_carry_the_rules_numbers_at_every_node():
    uniforms = [0.97, 0.01, 0.96]  # node 0 refused, node 1 accepted, its child node 5 refused: a repair
    tree, p = hand_tree(), torch.tensor(P_ROWS, dtype=torch.float32)
    verdict = verify_tree(tree, p, torch.Generator().manual_seed(0), uniforms=uniforms)
    want, end, residual = expected_walk(uniforms)
    assert end == 1 and [c for c, v in want.items() if v[3]] == [1], "the uniforms were meant to force this walk"
    event = tree_round_event(tree, p, verdict, Pieces(), "sampled", [3, 1])

    assert event.path == [1] and event.steps == [0, 1, 5] and event.emitted_kind == REPAIR
    assert [n.fate for n in event.nodes] == [TREE_REJECTED, TREE_ACCEPTED, TREE_UNTRIED, TREE_UNTRIED,
                                              TREE_UNTRIED, TREE_REJECTED, TREE_UNTRIED]
    for n in event.nodes:
        assert n.p == pytest.approx(P_ROWS[n.parent + 1][n.token_id], rel=1e-5)
        assert n.q == pytest.approx(Q_ROWS[n.node][n.token_id], rel=1e-5)
        if n.node in want:
            r, a, u, _ = want[n.node]
            assert (n.r, n.accept_prob, n.uniform) == (pytest.approx(r, rel=1e-5), pytest.approx(a, rel=1e-5),
                                                      pytest.approx(u))
        else:
            assert n.r is None and n.uniform is None
    # the node tried after a refused sibling saw the residual, not p
    assert event.nodes[1].r != pytest.approx(event.nodes[1].p)
    assert event.emitted_r == pytest.approx(residual[event.emitted_id], rel=1e-5)
    assert event.emitted_p == pytest.approx(P_ROWS[2][event.emitted_id], rel=1e-5)

    doc = render_tree(event, 4, "t2")
    assert nodes_by_fate(doc, TREE_ACCEPTED) == [1]
    assert sorted(nodes_by_fate(doc, TREE_REJECTED)) == [0, 5]
    assert sorted(nodes_by_fate(doc, TREE_UNTRIED)) == [2, 3, 4, 6]
    assert doc.count('class="tn tn-emit tn-repair') == 1 and 'class="tn tn-emit tn-bonus' not in doc
    assert "text-decoration" not in doc  # the marks are classes, styled in assets/tree.css
    for node in want:
        tip = title_of(doc, node)
        n = event.nodes[node]
        for value in (n.p, n.q, n.r, n.accept_prob, n.uniform):
            assert fmt_prob(float(value)) in tip, (node, value, tip)
    untried = title_of(doc, 3)
    assert "never tried" in untried and fmt_prob(event.nodes[3].p) in untried
    # the accepted path's connectors are lit: node 1's branch and the emitted token's carry tn-on-path
    assert doc.count("tn-branch tn-on-path") == 3  # the root, node 1, the repair

    fig = tree_pq_figure(event, 4)
    bars = {t.name: list(t.y) for t in fig.data}
    assert bars["p (target, after the parent)"] == pytest.approx([n.p for n in event.nodes])
    assert bars["r (residual when tried)"][1] == pytest.approx(want[1][0], rel=1e-5)
    assert bars["r (residual when tried)"][2] is None  # untried


def test_one_hot_q_reads_chosen_deterministically_and_a_leaf_ends_in_a_bonus():
    tree = hand_tree(q_one_hot=True)
    p = torch.tensor(P_ROWS, dtype=torch.float32)
    verdict = verify_tree(tree, p, torch.Generator().manual_seed(0), uniforms=[0.0, 0.0])  # node 0, then node 3
    event = tree_round_event(tree, p, verdict, Pieces(), "top-k", [3, 2])
    assert event.path == [0, 3] and event.emitted_kind == BONUS and event.one_hot
    # with q one-hot on x, the keep chance is r(x) itself
    assert event.nodes[3].accept_prob == pytest.approx(event.nodes[3].r)
    doc = render_tree(event, 0, "t1t0t5")
    assert DETERMINISTIC in title_of(doc, 0) and 'class="tn tn-emit tn-bonus' in doc
    assert nodes_by_fate(doc, TREE_ACCEPTED) == [0, 3]
    assert "<script" not in render_tree(TreeRoundEvent.from_dict(
        {**event.to_dict(), "emitted_piece": "<script>alert(1)</script>"}), 0)


def test_untrusted_pieces_are_escaped():
    tree, p = hand_tree(), torch.tensor(P_ROWS, dtype=torch.float32)
    verdict = verify_tree(tree, p, torch.Generator().manual_seed(0), uniforms=[0.97, 0.01, 0.96])

    class Evil(Pieces):
        def decode(self, ids, **_):
            return '<img src=x onerror=alert(1)>"'

    doc = render_tree(tree_round_event(tree, p, verdict, Evil()), 0)
    assert "<img" not in doc and "&lt;img" in doc


# ------------------------------------------------------------------------------------------------ engine + trace


@pytest.fixture(scope="module", params=[((3, 2, 1), "sampled"), ((3, 3, 3), "dynamic")], ids=["sampled", "dynamic"])
def tree_run(tiny_pair, request):
    s = DecodeSettings(max_new_tokens=20, sampling=SamplingConfig(0.9, 0, 1.0), seed=2)
    run = TreeRun(TreeDecoder(tiny_pair, "Hello world", s, *request.param))
    list(run)
    return run


def test_tree_decoder_attaches_an_event_that_matches_its_verdict(tree_run):
    for tr in tree_run.tree.rounds:
        ev, v = tr.event, tr.verdict
        assert tr.round.tree is ev and ev.path == v.path and ev.steps == [s.node for s in v.steps]
        assert [n.token_id for n in ev.nodes] == tr.tree.tokens.tolist()
        for s in v.steps:
            n = ev.nodes[s.node]
            assert n.uniform == s.uniform and n.accept_prob == s.accept_prob
            assert s.accept_prob == pytest.approx(min(1.0, n.r / n.q) if n.q > 0 else float(n.r > 0), rel=1e-4)
        assert tr.round.committed_ids == tr.committed and tr.round.n_accepted == len(v.path)


def test_a_tree_run_round_trips_through_a_trace(tree_run):
    rec = tree_run.record()
    back = load_trace(dumps_trace(rec))
    assert [r.tree for r in back.rounds] == [r.tree for r in rec.rounds]
    assert back.generated_ids == rec.generated_ids and back.text == rec.text
    assert json.loads(dumps_trace(back)) == json.loads(dumps_trace(rec))
    # a chain trace without any `tree` keys still loads
    chain = record_to_dict(rec)
    for r in chain["rounds"]:
        r.pop("tree")
    assert all(r.tree is None for r in load_trace(json.dumps(chain)).rounds)


def test_the_cli_writes_a_tree_trace(tmp_path, capsys):
    from specdec.cli import main
    from specdec.io.trace import load_trace_file

    path = tmp_path / "tree.json"
    assert main(["generate", "--pair", "tiny", "--dtype", "float32", "--prompt", "def add(a, b):",
                 "--max-new-tokens", "10", "--tree", "2,2", "--temperature", "0.8", "--trace", str(path),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    rec = load_trace_file(path)
    assert len(rec.rounds) == out["target_passes"] and all(r.tree is not None for r in rec.rounds)
    assert rec.text == out["text"] and all(r.tree.widths == [2, 2] for r in rec.rounds[:1])


@pytest.mark.parametrize("edit,message", [
    (lambda t: t["nodes"][1].update(parent=5), "nodes[1].parent must be -1"),
    (lambda t: t["nodes"][0].update(depth=3), "nodes[0].depth"),
    (lambda t: t["nodes"][t["steps"][0]].update(uniform=1.0, fate="accepted"), "accepted iff u < accept_prob"),
    (lambda t: t["nodes"][t["steps"][0]].update(accept_prob=0.0), "min(1, r / q)"),
    (lambda t: t.update(steps=t["steps"][1:]), "must list exactly the nodes"),
    (lambda t: t.update(q_kind="psychic"), "q_kind must be one of"),
    (lambda t: t.update(emitted_kind="bonus" if t["emitted_kind"] == "repair" else "repair"), "emitted_kind"),
    (lambda t: t.pop("nodes"), "missing 'nodes'"),
    (lambda t: t["nodes"][-1].update(fate="lost"), "fate must be one of"),
])
def test_a_broken_tree_in_a_trace_is_named(tree_run, edit, message):
    doc = record_to_dict(tree_run.record())
    bad = copy.deepcopy(doc)
    edit(bad["rounds"][0]["tree"])
    with pytest.raises(TraceError, match=re.escape(message)) as info:
        load_trace(json.dumps(bad))
    assert "rounds[0].tree" in str(info.value)


# ------------------------------------------------------------------------------------------------ playground


@pytest.fixture
def pg(tiny_pair, monkeypatch):
    from ui import session as session_mod
    from ui.loader import PairLoader, PairRequest
    from ui.playground import Playground

    monkeypatch.setattr(session_mod, "MIN_ROUND_INTERVAL_S", 0.0)
    return Playground(PairLoader(dtype="float32", device="cpu"), PairRequest("tiny"))


CONTROLS = ["Hello world", False, 4, 12, 0.8, 0, 1.0, 3, "tiny", "", "", "model", "fixed", ""]


@pytest.mark.parametrize("widths,mode,message", [
    ("3,x,1", "top-k", "whole numbers separated by commas"),
    ("", "top-k", "tree widths are empty"),
    ("9,1", "top-k", "a tree width must be a whole number from 1 to 8"),
    ("8,8", "top-k", "the limit is 64"),
    ("2,1", "nope", "tree mode must be one of"),
])
def test_a_bad_tree_shape_is_a_message_in_the_status(pg, widths, mode, message):
    from ui.playground import guarded

    out = list(guarded(pg.generate)(None, *CONTROLS, True, widths, mode))[-1]
    status = out[1]
    assert "sd-status-error" in status and message in html.unescape(status) and "Traceback" not in status


def test_the_tree_switch_runs_tree_rounds_and_off_keeps_the_chain(pg):
    from ui.playground import Playground, guarded

    tree_at = Playground.OUTPUTS.index("tree")
    out = list(guarded(pg.generate)(None, *CONTROLS, True, "3,2,1", "top-k"))[-1]
    session = out[0]
    assert session.rounds and all(r.tree is not None for r in session.rounds)
    view = out[tree_at]
    assert view.visible is True and 'class="sd-tree"' in view.value and "tn-accepted" in view.value
    assert "Done" in out[1]
    chain = list(guarded(pg.generate)(None, *CONTROLS))[-1]
    assert all(r.tree is None for r in chain[0].rounds) and chain[tree_at].visible is False
    # the Round dropdown points the tree view at an earlier round
    tree_html, _ = pg.select_tree(session, 0)
    assert 'data-r="0"' in tree_html.value


# ------------------------------------------------------------------------------------------------ browser


@pytest.mark.browser
@pytest.mark.app
def test_a_tree_round_in_the_real_app(page, app_url):
    from tests.conftest import ARTIFACTS
    from tests.test_browser import open_app, set_controls, wait_status

    open_app(page, app_url)
    set_controls(page, "Hello world", max_new=40, seed=1)
    page.click("#sd-tree-group button, #sd-tree-group .label-wrap")
    page.locator("#sd-tree-on input[type=checkbox]").check()
    page.fill("#sd-tree-widths textarea, #sd-tree-widths input", "3,2,1")
    page.click("#sd-step")
    wait_status(page, "Stepped round 1")
    page.wait_for_selector("#sd-tree-view .sd-tree .tn-emit", timeout=15_000)
    nodes = page.locator("#sd-tree-view .tn[data-node]").count()
    assert nodes == 3 + 6 + 6  # widths 3,2,1 (top-k: every node has its children)
    assert page.locator("#sd-tree-view .tn-rejected, #sd-tree-view .tn-accepted").count() >= 1
    assert page.locator("#sd-tree-view .tn-untried").count() >= 1
    page.wait_for_selector("#sd-tree-pq .js-plotly-plot", timeout=15_000)
    page.locator("#sd-tree-pq").screenshot(path=str(ARTIFACTS / "tree-pq-tiny.png"))
    assert page.locator("#sd-tokens .rnd").count() == 1
    # a bad shape is a message, not a traceback
    page.fill("#sd-tree-widths textarea, #sd-tree-widths input", "3,x")
    page.click("#sd-generate")
    assert "whole numbers separated by commas" in wait_status(page, "the tree widths")
    page.locator("#sd-tree-view").screenshot(path=str(ARTIFACTS / "tree-view-tiny.png"))
