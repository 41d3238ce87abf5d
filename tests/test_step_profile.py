"""scripts/step_profile.py: exclusive times nest correctly, modules map to their parts, and a run on the tiny pair
books every part of a step, the hooks removed afterwards."""

from __future__ import annotations

import json
import time

from torch import nn

from tests.conftest import load_script


def _script():
    return load_script("step_profile")


def test_nested_spans_book_exclusive_time():
    sp = _script()
    timer = sp.PartTimer()
    with timer.span("layer glue"):
        time.sleep(0.02)
        with timer.span("matmul"):
            time.sleep(0.03)
    assert 0.025 <= timer.totals["matmul"] < 0.05 and 0.015 <= timer.totals["layer glue"] < 0.03


def test_modules_map_to_parts():
    sp = _script()
    assert sp.part_of(nn.Linear(2, 2)) == "matmul" and sp.part_of(nn.SiLU()) == "mlp glue"
    assert sp.part_of(nn.Embedding(3, 2)) == "body glue" and sp.part_of(nn.Sequential()) is None


def test_a_run_on_the_tiny_pair_books_every_part(tmp_path):
    from specdec.models.pair import load_pair

    def hooks(model):  # transformers installs hooks of its own once hidden states are asked for (test_drafters)
        return [(id(m), tuple(m._forward_hooks), tuple(m._forward_pre_hooks)) for m in model.modules()]

    before = hooks(load_pair("tiny").target)
    out = tmp_path / "s.json"
    assert _script().main(["--pair", "tiny", "--context", "16", "--repeats", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    parts = doc["parts_ms"]
    assert parts["matmul"] > 0 and parts["head"] > 0 and parts["attention"] > 0 and parts["norm"] > 0
    # the parts are means over the hooked steps: they must add up to those steps' mean (a missed part falls short)
    assert abs(doc["parts_sum_ms"] - doc["hooked_mean_ms"]) < 0.5 * doc["hooked_mean_ms"] + 1
    assert doc["weight_bytes"]["body"] > 0 and doc["floor_ms"] > 0 and doc["cpu"]
    pair = load_pair("tiny")  # the pair the script profiled (the pair cache's copy): its hooks are gone
    assert hooks(pair.target) == before


def test_the_draft_step_is_profiled_on_the_draft_model(tmp_path):
    """--model draft steps the draft model (the pair cache's copy, the one the script loads), not the target."""
    from specdec.models.pair import load_pair

    pair = load_pair("tiny")
    calls = {"target": 0, "draft": 0}
    hooks = [getattr(pair, m).base_model.register_forward_pre_hook(lambda *a, m=m: calls.__setitem__(m, calls[m] + 1))
             for m in calls]
    try:
        out = tmp_path / "draft.json"
        assert _script().main(["--pair", "tiny", "--model", "draft", "--context", "8", "--repeats", "2",
                               "--out", str(out)]) == 0
    finally:
        for h in hooks:
            h.remove()
    doc = json.loads(out.read_text())
    assert doc["model"] == "draft" and doc["parts_ms"]["matmul"] > 0
    assert calls["draft"] >= 2 and calls["target"] == 0
