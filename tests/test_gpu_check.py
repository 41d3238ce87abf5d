"""scripts/gpu_check.py runs in CI on the CPU (--short), so the prepared GPU check cannot rot between device runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.app  # each test runs scripts/gpu_check.py in a fresh interpreter

ROOT = Path(__file__).resolve().parent.parent


def test_gpu_check_short_on_cpu(tmp_path):
    out = tmp_path / "gpu-check.json"
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--short", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["ok"] and set(report["exactness"]) == {"float32", "bfloat16"}
    for r in report["exactness"].values():
        assert r["greedy"]["equal"] == r["greedy"]["of"] > 0
        assert r["first_token"]["outside_support"] == 0 and r["first_token"]["p_value"] >= 1e-3
        assert all(v["ok"] for v in r["rollback"].values())
    t = report["timings"]
    assert list(t["passes"]["target_ms_by_k"]) == ["1", "2", "3", "4", "5"]
    assert t["passes"]["c_pass"] > 0
    for name in ("overhead_random_qwen", "overhead_tiny"):
        assert t[name]["rounds"] > 0 and t[name]["model_ms"] > 0
    probe = t["host_sync_probe_tiny"]
    assert len(probe["round_ms"]) == len(probe["round_ms_sync_before_reads"]) >= 1
    assert "greedy spec == plain" in proc.stdout and "overhead_tiny" in proc.stdout
    e = report["engines"]
    assert e["ok"] and all(e["greedy_equal"].values())
    for engine in ("eager", "compiled"):
        assert e[engine]["passes"]["target_ms_k1"] > 0 and e[engine]["passes"]["c_pass"] > 0
        assert all(e[engine]["runs"][n]["tok_s"] > 0 for n in ("plain", "model", "ngram"))
        assert e[engine]["runs"]["host_syncs_per_round"] is None  # counted on CUDA only
    assert "compiled greedy ids == eager" in proc.stdout


def test_gpu_check_refuses_cuda_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        return
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cuda"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
