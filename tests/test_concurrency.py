"""Eight gradio_client sessions streaming /generate at once from `python app.py` on the tiny pair.

Every session must get exactly the text the same request gives when run alone through the engine (no cross-talk,
no shared decoder state), every stream must finish (none starved behind the others in the queue), and the app's
memory must stay bounded (one shared copy of the models, not one per session). Time to the first streamed round
(p50/p95, queue wait included) and the app's peak memory go to test-artifacts/concurrency.json.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import ARTIFACTS, start_app, stop_app

pytestmark = pytest.mark.app
N_SESSIONS = 8
CONCURRENCY = 2  # the app's default SPECDEC_CONCURRENCY: six of the eight sessions wait in the queue at first
MAX_NEW = 48
TIMEOUT_S = 240.0
TEXT, TOKENS, STATUS = 8, 1, 0  # API output positions (gr.State outputs are not part of the API)
# (prompt, chat, gamma, temperature, top_k, top_p, seed): different prompts, seeds and warps per session
REQUESTS = [
    ("Hello world", False, 4, 0.7, 0, 1.0, 0),
    ("def fibonacci(n):", False, 3, 0.0, 0, 1.0, 1),
    ("The quick brown fox", False, 5, 1.0, 20, 1.0, 2),
    ("Explain a hash map", True, 4, 0.8, 0, 0.9, 3),
    ("SELECT * FROM", False, 2, 0.5, 0, 1.0, 4),
    ("<b>markup</b> stays text", False, 6, 0.9, 0, 0.95, 5),
    ("Once upon a time", True, 4, 1.2, 10, 1.0, 6),
    ("import numpy as np", False, 4, 0.7, 0, 1.0, 7),
]


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak since start) of a process, in KiB."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(rest.split()[0])
    return out


def controls(req) -> tuple:
    prompt, chat, gamma, temperature, top_k, top_p, seed = req
    return (prompt, chat, gamma, MAX_NEW, temperature, top_k, top_p, seed, "tiny", "", "")


def solo_text(pair, req) -> str:
    from specdec.core.settings import DecodeSettings
    from specdec.loop.decoder import SpeculativeDecoder
    from specdec.core.sampling import SamplingConfig

    prompt, chat, gamma, temperature, top_k, top_p, seed = req
    settings = DecodeSettings(gamma=gamma, max_new_tokens=MAX_NEW, seed=seed, chat=chat,
                              sampling=SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p))
    dec = SpeculativeDecoder(pair, prompt, settings, plain_probe=True)  # as the app runs it (round one a plain step)
    for _ in dec:
        pass
    return dec.text


@pytest.fixture(scope="module")
def app_proc():
    # float32 on CPU, as the in-process reference (auto picks bf16 on CPUs with native bf16, and bf16 rounds
    # batched and one-token matmuls differently, so the comparison would test numerics, not sessions).
    env = {"SPECDEC_PAIR": "tiny", "SPECDEC_DTYPE": "float32", "SPECDEC_DEVICE": "cpu",
           "SPECDEC_CONCURRENCY": str(CONCURRENCY)}
    proc, url = start_app(env, ARTIFACTS / "app-concurrency.log")
    yield proc, url
    stop_app(proc)


class Stream(threading.Thread):
    """One session: submit /generate, watch its outputs, note when the first round arrives and what it ends with."""

    def __init__(self, url: str, req, start: threading.Event):
        super().__init__(daemon=True)
        self.url, self.req, self.start_evt = url, req, start
        self.first_round_s: float | None = None
        self.updates: list[tuple] = []
        self.error: BaseException | None = None
        self.elapsed_s: float | None = None

    def run(self):
        from gradio_client import Client

        try:
            client = Client(self.url, verbose=False)
            self.start_evt.wait()
            t0 = time.perf_counter()
            job = client.submit(*controls(self.req), api_name="/generate")
            seen = 0
            while True:
                done = job.done()
                outs = job.outputs()
                for out in outs[seen:]:
                    if self.first_round_s is None and 'class="rnd"' in out[TOKENS]:
                        self.first_round_s = time.perf_counter() - t0
                seen = len(outs)
                if done:
                    break
                time.sleep(0.01)
            job.result()  # raises if the call failed
            self.updates = list(job.outputs())
            self.elapsed_s = time.perf_counter() - t0
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc


def test_eight_sessions_stream_at_once_without_cross_talk(app_proc, tiny_pair):
    from components import render_prompt

    proc, url = app_proc
    expected = [solo_text(tiny_pair, r) for r in REQUESTS]
    assert len(set(expected)) == N_SESSIONS, "the requests must give different texts, or cross-talk would hide"

    # Warm up: the first request waits for the tiny pair to load and be timed; that is startup, not concurrency.
    from gradio_client import Client

    warm = Client(url, verbose=False).predict(*controls(REQUESTS[0]), api_name="/generate")
    assert warm[TEXT] == expected[0], "a single session already differs from the engine run alone"
    before = rss_kib(proc.pid)

    go = threading.Event()
    streams = [Stream(url, r, go) for r in REQUESTS]
    for s in streams:
        s.start()
    time.sleep(1.0)  # all clients connected before the clock starts
    t0 = time.perf_counter()
    go.set()
    for s in streams:
        s.join(timeout=max(1.0, TIMEOUT_S - (time.perf_counter() - t0)))
    wall_s = time.perf_counter() - t0
    after = rss_kib(proc.pid)

    starved = [i for i, s in enumerate(streams) if s.is_alive()]
    assert not starved, f"sessions {starved} did not finish within {TIMEOUT_S:.0f} s"
    failed = {i: repr(s.error) for i, s in enumerate(streams) if s.error}
    assert not failed, f"sessions failed: {failed}"
    assert proc.poll() is None, "the app died"

    firsts = sorted(s.first_round_s for s in streams)
    peak_mib = after["VmHWM"] / 1024
    growth_mib = (after["VmHWM"] - before["VmRSS"]) / 1024
    result = {
        "sessions": N_SESSIONS,
        "concurrency_limit": CONCURRENCY,
        "max_new_tokens": MAX_NEW,
        "all_correct": None,
        "time_to_first_round_s": {"p50": round(statistics.median(firsts), 3),
                                  "p95": round(firsts[min(len(firsts) - 1, round(0.95 * (len(firsts) - 1)))], 3),
                                  "max": round(firsts[-1], 3), "all": [round(x, 3) for x in firsts]},
        "session_wall_s": [round(s.elapsed_s, 2) for s in streams],
        "total_wall_s": round(wall_s, 2),
        "app_rss_before_mib": round(before["VmRSS"] / 1024, 1),
        "app_peak_rss_mib": round(peak_mib, 1),
        "peak_growth_during_sessions_mib": round(growth_mib, 1),
    }

    mismatches = {}
    for i, (s, want, req) in enumerate(zip(streams, expected, REQUESTS)):
        final = s.updates[-1]
        assert "Done:" in final[STATUS], f"session {i} did not finish cleanly: {final[STATUS]}"
        if final[TEXT] != want:
            mismatches[i] = {"got": final[TEXT], "want": want}
        # every streamed update shows this session's own prompt, and its text only ever grows
        own_prompt = render_prompt(req[0])
        texts = [u[TEXT] for u in s.updates if u[TEXT]]
        assert all(u[TOKENS].startswith(own_prompt) for u in s.updates if u[TOKENS]), f"session {i} saw another prompt"
        assert all(b.startswith(a) for a, b in zip(texts, texts[1:])), f"session {i}'s text did not only grow"
        assert sum('class="rnd"' in u[TOKENS] for u in s.updates) >= 2, f"session {i} did not stream rounds"
    result["all_correct"] = not mismatches
    result["mismatches"] = mismatches
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "concurrency.json").write_text(json.dumps(result, indent=2))
    print("\nconcurrency:", json.dumps({k: v for k, v in result.items() if k != "mismatches"}, indent=1))

    assert not mismatches, f"texts differ from the same request run alone: {mismatches}"
    # One shared copy of the models: eight live decoders add KV caches and rendered rounds, not models. The tiny
    # pair's weights are ~1 MB, so this bounds per-session overhead (Gradio, sessions, figures), not weights.
    assert growth_mib < 300, f"memory grew by {growth_mib:.0f} MiB during the 8 sessions"
    assert peak_mib < 2048, f"the app peaked at {peak_mib:.0f} MiB"
    # the server still answers after the burst
    with urllib.request.urlopen(url, timeout=10) as r:
        assert r.status == 200
