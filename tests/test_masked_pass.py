"""scripts/masked_pass.py: the tree pattern it times is a real tree, and a run on the tiny pair writes every way."""

from __future__ import annotations

import json

import torch

from tests.conftest import load_script



def _script():
    return load_script("masked_pass")


def test_the_tree_pattern_sees_ancestors_only():
    vis = _script().tree_visible(7, branches=3)  # root 0; chains 1-4, 2-5, 3-6
    assert vis.diagonal().all() and vis[:, 0].all()
    assert vis[4, 1] and not vis[4, 2] and not vis[4, 3] and vis[6, 3] and not vis[6, 5]
    assert not torch.triu(vis, 1).any()  # no node sees a later one


def test_a_run_on_the_tiny_pair_times_every_way(tmp_path):
    out = tmp_path / "m.json"
    assert _script().main(["--pair", "tiny", "--n", "5", "--context", "20", "--repeats", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    (row,) = doc["rows"]
    assert row["n"] == 5 and set(row["pass_ms"]) == {"causal", "causal_mask", "tree"}
    assert all(v > 0 for v in [*row["pass_ms"].values(), *row["sdpa_ms"].values()])
    assert row["tree_over_causal"] == row["pass_ms"]["tree"] / row["pass_ms"]["causal"] and doc["cpu"]
