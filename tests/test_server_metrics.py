"""The vLLM-shaped metrics export: the documented shape, consistency with RunRecord.metrics, and drafts counted
as vLLM counts them (a round that drafts nothing is not a draft)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

from specdec.io import server_metrics as sm
from specdec.loop.decoder import SpeculativeDecoder
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings

DOC = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"
TYPES = {"int": int, "float": float, "list": list}


def _run(pair, drafter: str, gamma: int = 4, n: int = 40, seed: int = 0):
    s = DecodeSettings(gamma=gamma, max_new_tokens=n, sampling=SamplingConfig(1.0), drafter=drafter, seed=seed)
    dec = SpeculativeDecoder(pair, "def fibonacci(n):\n    return fibonacci(n - 1)", s)
    for _ in dec:
        pass
    return dec.record()


@pytest.fixture(scope="module")
def records(tiny_pair):
    return {"model": _run(tiny_pair, "model"), "ngram": _run(tiny_pair, "ngram")}


def _doc_fields() -> dict[str, str]:
    text = DOC.read_text()
    table = text.split("<!-- fields:", 1)[1]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(\w+)` \| (\w+) \|", table, re.M)}


def test_doc_table_is_the_exported_shape():
    assert _doc_fields() == {k: t.__name__ for k, (t, _) in sm.FIELDS.items()}


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_export_has_the_documented_keys_and_types(records, drafter):
    out = sm.export(records[drafter])
    assert set(out) == {"format", "source", "per_request", "vllm", "prometheus", "log_line"}
    assert set(out["vllm"]) == set(sm.FIELDS)
    for key, (typ, _) in sm.FIELDS.items():
        assert isinstance(out["vllm"][key], typ), key
    v = out["vllm"]
    assert len(v["num_accepted_tokens_per_pos"]) == len(v["per_position_acceptance_rate"]) == v["num_spec_tokens"]


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_export_agrees_with_run_metrics(records, drafter):
    rec = records[drafter]
    m, v = rec.metrics, sm.export(rec)["vllm"]
    assert v["num_draft_tokens"] == m.drafted
    assert v["num_accepted_tokens"] == m.kept
    assert v["draft_acceptance_rate"] == pytest.approx(m.kept_rate)
    assert v["num_drafts"] == sum(1 for r in rec.rounds if r.gamma > 0)
    assert v["mean_acceptance_length"] == pytest.approx(1 + m.kept / v["num_drafts"])
    # Accepted guesses form a prefix: the per-position counts sum to the total and never increase.
    per = v["num_accepted_tokens_per_pos"]
    assert sum(per) == v["num_accepted_tokens"]
    assert all(a >= b for a, b in zip(per, per[1:]))
    assert v["per_position_acceptance_rate"] == pytest.approx([n / v["num_drafts"] for n in per])


def test_rounds_without_a_draft_are_not_drafts(records):
    rec = records["ngram"]
    out = sm.export(rec)
    empty = sum(1 for r in rec.rounds if r.gamma == 0)
    assert empty > 0, "the ngram run should have rounds where nothing was found to copy"
    assert out["source"]["rounds_without_draft"] == empty
    assert out["vllm"]["num_drafts"] == len(rec.rounds) - empty
    # The mean acceptance length averages over drafting rounds only (our tokens-per-round averages over all).
    m = rec.metrics
    assert out["vllm"]["mean_acceptance_length"] == pytest.approx(1 + m.kept / (len(rec.rounds) - empty))


def test_prometheus_names_and_text(records):
    out = sm.export(records["model"])
    prom = out["prometheus"]
    v = out["vllm"]
    assert prom["vllm:spec_decode_num_drafts_total"] == v["num_drafts"]
    assert prom["vllm:spec_decode_num_draft_tokens_total"] == v["num_draft_tokens"]
    assert prom["vllm:spec_decode_num_accepted_tokens_total"] == v["num_accepted_tokens"]
    for i, n in enumerate(v["num_accepted_tokens_per_pos"]):
        assert prom[f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{position="{i}"}}'] == n
    text = sm.prometheus_text(out)
    samples = [ln for ln in text.splitlines() if not ln.startswith("#")]
    assert len(samples) == len(prom)
    assert all(re.fullmatch(r'vllm:spec_decode_\w+(\{position="\d+"\})? \d+\.\d+', ln) for ln in samples)
    assert text.count("# TYPE") == 4
    assert out["log_line"].startswith("SpecDecoding metrics: Mean acceptance length: ")


def test_json_round_trip_and_a_run_with_no_drafts(records, tiny_pair):
    data = json.loads(sm.dumps(records["model"]))
    assert data["vllm"]["num_drafts"] > 0 and data["format"] == sm.FORMAT
    # A record with only gamma-0 rounds: no drafts, mean acceptance length 1 (vLLM's convention), rate null.
    rec = records["ngram"]
    from dataclasses import replace

    plain = replace(rec, rounds=[r for r in rec.rounds if r.gamma == 0])
    data = json.loads(sm.dumps(plain))
    assert data["vllm"]["num_drafts"] == 0 and data["vllm"]["mean_acceptance_length"] == 1.0
    assert data["vllm"]["draft_acceptance_rate"] is None
    assert math.isnan(sm.export(plain)["vllm"]["draft_acceptance_rate"])


def test_download_file(records, tmp_path):
    from ui.learn_extras import server_metrics_file

    path = sm.write_file(records["model"], tmp_path)
    assert json.loads(path.read_text()) == json.loads(sm.dumps(records["model"]))
    assert server_metrics_file([]) is None
    assert json.loads(Path(server_metrics_file([records["ngram"]])).read_text())["source"]["drafter"] == "ngram"


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_per_request_shape_agrees_with_the_counters(records, drafter):
    """The per-request record (acceptance histograms, per-step arrays) sums to the vLLM counters of the same run."""
    out = sm.export(records[drafter])
    pr, v = out["per_request"], out["vllm"]
    assert pr["num_spec_steps"] == v["num_drafts"] == sum(pr["acceptance_histogram"].values())
    assert pr["num_accepted_draft_tokens"] == v["num_accepted_tokens"]
    assert sum(int(k) * n for k, n in pr["acceptance_histogram"].items()) == v["num_accepted_tokens"]
    by_len = pr["acceptance_histogram_by_draft_length"]
    assert sum(n for row in by_len.values() for n in row.values()) == pr["num_spec_steps"]
    assert all(int(k) <= int(g) for g, row in by_len.items() for k in row)
    assert pr["per_step"]["num_draft_tokens"] == [r.gamma for r in records[drafter].rounds if r.gamma > 0]
    assert pr["mean_acceptance_length"] == pytest.approx(v["mean_acceptance_length"])
