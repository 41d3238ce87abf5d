"""Many visitors on the embedded pair: `python app.py` as it starts for a user (the default pair), four
gradio_client sessions decoding at once (greedy, two drafters, 48 tokens each) each get exactly the text the same
request gets alone, none errors, the app's memory stays bounded over 40 sessions, and a visitor who walks away
mid-run (cancels the stream) frees the decoding slot within a round."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.conftest import ARTIFACTS, start_app, stop_app
from tests.test_concurrency import rss_kib

pytestmark = [pytest.mark.slow, pytest.mark.app]

TEXT, TOKENS, STATUS = 8, 1, 0  # /generate's API outputs (gr.State outputs are not part of the API)
MAX_NEW = 48
PROMPTS = ["def is_prime(n):", "Explain what a hash map is in two sentences.", "import numpy as np\n",
           "Write a haiku about the sea."]
DRAFTERS = ["model", "ngram"]


def controls(prompt: str, drafter: str, max_new: int = MAX_NEW, pair: str = "") -> tuple:
    chat = not prompt.startswith(("def ", "import "))
    return (prompt, chat, 4 if drafter == "model" else 8, max_new, 0.0, 0, 1.0, 0, pair, "", "", drafter)


@pytest.fixture(scope="module")
def app_default():
    proc, url = start_app({"SPECDEC_CONCURRENCY": "2"}, ARTIFACTS / "app-default-pair.log", timeout=900.0)
    from gradio_client import Client

    # The first request waits for the default pair to load (and, on a fresh machine, to be converted).
    log = ARTIFACTS / "app-default-pair.log"
    deadline = time.time() + 1800
    while "models ready" not in log.read_text(errors="replace"):
        assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
        time.sleep(1.0)
    pair = next(line.split("loading model pair ", 1)[1].split()[0]
                for line in log.read_text().splitlines() if "loading model pair " in line)
    yield proc, url, Client, pair
    stop_app(proc)


def run(client_cls, url, args) -> tuple:
    return client_cls(url, verbose=False).predict(*args, api_name="/generate")


def _record(**figures) -> None:
    """Keep what the tests measured in test-artifacts/sessions-real.json (for the notes; asserted on above)."""
    path = ARTIFACTS / "sessions-real.json"
    doc = json.loads(path.read_text()) if path.is_file() else {}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**doc, **figures}, indent=1))


def test_four_sessions_at_once_match_their_solo_runs_and_memory_stays_bounded(app_default):
    proc, url, Client, pair = app_default
    requests = [controls(p, DRAFTERS[i % 2], pair=pair) for i, p in enumerate(PROMPTS)]
    solo = [run(Client, url, r) for r in requests]
    assert all("Done:" in s[STATUS] for s in solo), [s[STATUS] for s in solo]
    assert len({s[TEXT] for s in solo}) == len(PROMPTS)
    before = rss_kib(proc.pid)

    results: dict[int, tuple | BaseException] = {}

    def one(i):
        try:
            results[i] = run(Client, url, requests[i])
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not [i for i, t in enumerate(threads) if t.is_alive()], "a session did not finish"
    errors = {i: r for i, r in results.items() if isinstance(r, BaseException)}
    assert not errors, errors
    for i, r in results.items():
        assert "Done:" in r[STATUS], r[STATUS]
        assert r[TEXT] == solo[i][TEXT], f"session {i} differs from its solo run"

    # 40 sessions in all (short ones, four at a time): one shared pair, so memory does not grow with sessions.
    short = [controls(PROMPTS[i % 4], DRAFTERS[i % 2], max_new=8, pair=pair) for i in range(32)]
    for k in range(0, len(short), 4):
        ts = [threading.Thread(target=run, args=(Client, url, r)) for r in short[k:k + 4]]
        for t in ts:
            t.start()
        for t in ts:
            t.join(600)
    after = rss_kib(proc.pid)
    growth = (after["VmRSS"] - before["VmRSS"]) / 1024
    assert proc.poll() is None
    _record(rss_before_mib=round(before["VmRSS"] / 1024), rss_after_40_mib=round(after["VmRSS"] / 1024),
            growth_mib=round(growth))
    assert growth < 600, f"RSS grew by {growth:.0f} MiB over 40 sessions"


def test_a_visitor_who_walks_away_frees_the_slot_within_a_round(app_default):
    proc, url, Client, pair = app_default
    long_run = controls("Write a long story about a lighthouse keeper.", "model", max_new=256, pair=pair)
    quick = controls("def is_prime(n):", "ngram", pair=pair)
    t = time.perf_counter()
    run(Client, url, quick)
    quick_alone = time.perf_counter() - t
    # Two visitors leave mid-run: both decoding slots are taken until the app notices.
    leavers = []
    for _ in range(2):
        job = Client(url, verbose=False).submit(*long_run, api_name="/generate")
        leavers.append(job)
    deadline = time.time() + 300
    for job in leavers:  # wait until each has streamed a round, then walk away
        while 'class="rnd"' not in (job.outputs()[-1][TOKENS] if job.outputs() else ""):
            assert time.time() < deadline, "the long runs never streamed a round"
            time.sleep(0.05)
    round_s = max(0.5, quick_alone / 4)  # a generous bound on one round of the long run
    for job in leavers:
        job.cancel()
    t = time.perf_counter()
    out = run(Client, url, quick)
    waited = time.perf_counter() - t
    assert "Done:" in out[STATUS]
    _record(quick_alone_s=round(quick_alone, 2), quick_after_walkaway_s=round(waited, 2))
    # the abandoned runs would take minutes more; a freed slot means the quick run waits about one round
    assert waited < quick_alone + 4 * round_s + 5.0, (waited, quick_alone)
