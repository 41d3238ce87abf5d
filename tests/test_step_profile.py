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

    out = tmp_path / "s.json"
    assert _script().main(["--pair", "tiny", "--context", "16", "--repeats", "3", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    parts = doc["parts_ms"]
    assert parts["matmul"] > 0 and parts["head"] > 0 and parts["attention"] > 0 and parts["norm"] > 0
    assert abs(doc["parts_sum_ms"] - doc["hooked_step_ms"]) < 0.5 * doc["hooked_step_ms"] + 1
    assert doc["weight_bytes"]["body"] > 0 and doc["floor_ms"] > 0 and doc["cpu"]
    pair = load_pair("tiny")  # the pair the script profiled (the pair cache's copy): its hooks are gone
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in pair.target.modules())
