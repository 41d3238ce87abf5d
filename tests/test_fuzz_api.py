"""Fuzz the app's API through gradio_client: every endpoint, with random, huge, NaN, negative, control-character and
markup inputs, and uploaded trace files from valid to garbage.

Every call must end in a valid result or a clear error (our status message, or Gradio's own message for values
its components refuse), never a traceback, an "Unexpected error", a hang or a dead server; and no HTML the app
returns may carry markup from the input (no <script>, no on* attributes, no <img>/<svg>/<iframe>). Calls made,
outcomes by kind and crashes go to test-artifacts/fuzz.json.
"""

from __future__ import annotations

import copy
import json
import os
import re
import time
import urllib.error
import urllib.request
from collections import Counter
from concurrent.futures import TimeoutError as FutureTimeout
from html.parser import HTMLParser
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import ARTIFACTS, start_app, stop_app

pytestmark = pytest.mark.app
CALL_TIMEOUT_S = 90.0
EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "60"))  # random calls after the fixed edge cases
N_CLIENTS = 3  # calls share sessions, so Step after an import, Stop during nothing, etc. all happen
PLAYGROUND = ("/generate", "/step", "/run_to_end")
PAYLOADS = [
    "<script>alert(1)</script>",
    "<img src=x onerror=alert(1)>",
    '"><svg onload=alert(1)>',
    "</textarea><script>alert(document.cookie)</script>",
    "<iframe src=javascript:alert(1)>",
    "javascript:alert(1)",
    "${alert(1)}{{7*7}}",
]
FORBIDDEN_TAGS = {"script", "img", "svg", "iframe", "object", "embed", "link", "meta", "form", "base", "style"}


# ----------------------------------------------------------------------------------------------- checking


class TagCollector(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.bad: list[str] = []

    def handle_starttag(self, tag, attrs):
        if tag in FORBIDDEN_TAGS:
            self.bad.append(f"<{tag}>")
        for name, value in attrs:
            if name.lower().startswith("on"):
                self.bad.append(f"{tag}[{name}]")
            if value and value.strip().lower().startswith("javascript:"):
                self.bad.append(f"{tag}[{name}=javascript:]")


def markup_problems(value) -> list[str]:
    """Injected markup in an API output: HTML strings are parsed, Plotly figures scanned as JSON text."""
    if isinstance(value, str):
        parser = TagCollector()
        parser.feed(value)
        parser.close()
        return parser.bad
    if isinstance(value, dict) and "plot" in value:
        text = str(value["plot"]).lower()
        return [tag for tag in ("<script", "<img", "<svg", "<iframe") if tag in text]
    return []


class Recorder:
    def __init__(self):
        self.calls = 0
        self.by_endpoint: Counter = Counter()
        self.outcomes: Counter = Counter()
        self.crashes: list[dict] = []
        self.injections: list[dict] = []
        self.messages: dict[str, list[str]] = {}  # distinct messages per outcome kind (a sample)

    def note(self, kind: str, msg: str) -> None:
        self.outcomes[kind] += 1
        text = re.sub(r"<[^>]+>", "", msg).strip()[:160]
        seen = self.messages.setdefault(kind, [])
        if text and text not in seen and len(seen) < 25:
            seen.append(text)

    def crash(self, endpoint, args, why):
        self.outcomes["crash"] += 1
        self.crashes.append({"endpoint": endpoint, "args": short(args), "error": why[:500]})

    def summary(self) -> dict:
        return {"calls": self.calls, "by_endpoint": dict(self.by_endpoint), "outcomes": dict(self.outcomes),
                "crashes": self.crashes, "injections": self.injections, "example_messages": self.messages}


def short(args, limit: int = 300) -> str:
    text = repr([a if not isinstance(a, str) or len(a) < 120 else f"<str len={len(a)}: {a[:40]!r}…>" for a in args])
    return text if len(text) <= limit else text[:limit] + "…"


def status_kind(html_status: str) -> tuple[str, str]:
    if "Traceback" in html_status or "Unexpected error" in html_status:
        return "crash", html_status
    if "sd-status-error" in html_status or "learn-msg-error" in html_status:
        return "handled_error", html_status
    return "ok", ""


def call(rec: Recorder, client, endpoint: str, args: tuple) -> None:
    from gradio_client.exceptions import AppError

    rec.calls += 1
    rec.by_endpoint[endpoint] += 1
    try:
        job = client.submit(*args, api_name=endpoint)
        job.result(timeout=CALL_TIMEOUT_S)
        outputs = job.outputs()
    except (FutureTimeout, TimeoutError):
        rec.crash(endpoint, args, f"no answer within {CALL_TIMEOUT_S:.0f} s")
        return
    except AppError as exc:
        msg = str(exc)
        if not msg or "Traceback" in msg or "verbose error reporting" in msg or msg == "Error raised.":
            rec.crash(endpoint, args, f"AppError without a message: {msg!r}")
        else:
            rec.note("refused_by_gradio", msg)
        return
    except ValueError as exc:
        if "not JSON compliant" not in str(exc):
            rec.crash(endpoint, args, f"{type(exc).__name__}: {exc}")
            return
        # gradio_client will not encode NaN or infinities; raw_call sends them to the server instead
        rec.note("refused_by_client", str(exc))
        raw_args = json.dumps(list(args), allow_nan=True, default=str)
        rec.calls += 1
        kind, msg = raw_call(client.src, endpoint, raw_args)
        if kind == "crash":
            rec.crash(endpoint, args, "raw HTTP: " + msg)
        else:
            rec.note(kind, msg)
        return
    except Exception as exc:  # noqa: BLE001 - anything else is a failure to answer
        rec.crash(endpoint, args, f"{type(exc).__name__}: {exc}")
        return

    kind, msg = "ok", ""
    for out in outputs:
        values = out if isinstance(out, (tuple, list)) else (out,)
        for v in values:
            bad = markup_problems(v)
            if bad:
                rec.injections.append({"endpoint": endpoint, "args": short(args), "found": bad[:5]})
    final = outputs[-1] if outputs else None
    if endpoint in PLAYGROUND + ("/stop", "/reset", "/import_trace"):
        kind, msg = status_kind(final[0])
    elif endpoint == "/lab":
        kind, msg = status_kind(final[1])
    elif endpoint == "/export_trace" and final is not None:
        from specdec.io.trace import load_trace_file

        load_trace_file(final)  # whatever the app exports must load back
    if kind == "crash":
        rec.crash(endpoint, args, msg)
    else:
        rec.note(kind, msg)


def raw_call(url: str, endpoint: str, data_json: str) -> tuple[str, str]:
    """POST a JSON array (which may hold NaN / Infinity, as JavaScript-ish clients send) to Gradio's HTTP API and
    read the event stream; ("refused_by_gradio" | "handled_error" | "ok" | "crash", message)."""
    base = url.rstrip("/") + "/gradio_api/call" + endpoint
    req = urllib.request.Request(base, data=('{"data": ' + data_json + "}").encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            event_id = json.loads(r.read())["event_id"]
    except urllib.error.HTTPError as exc:  # the request itself refused (e.g. unparsable JSON): a clear 4xx
        return ("refused_by_gradio", f"HTTP {exc.code}") if 400 <= exc.code < 500 else ("crash", f"HTTP {exc.code}")
    event, data = None, None
    with urllib.request.urlopen(f"{base}/{event_id}", timeout=CALL_TIMEOUT_S) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:"):
                data = line.split(":", 1)[1].strip()
    if event == "error":
        msg = json.loads(data) if data and data != "null" else None
        return ("refused_by_gradio", str(msg)) if msg else ("crash", "error event without a message")
    if event == "complete":
        out = json.loads(data)
        return status_kind(out[0] if isinstance(out[0], str) else out[1])
    return "crash", f"stream ended with {event!r}"


def gradio_tracebacks(log_text: str) -> list[str]:
    """The last line of every traceback in the app log that is not Gradio refusing an input with gr.Error."""
    lasts = []
    for block in log_text.split("Traceback (most recent call last):")[1:]:
        lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith((" ", "\t"))]
        last = lines[0] if lines else "?"
        if not last.startswith("gradio.exceptions.Error"):
            lasts.append(last[:200])
    return lasts


# ---------------------------------------------------------------------------------------------- strategies

safe_text = st.text(st.characters(exclude_categories=("Cs",)), max_size=60)  # lone surrogates are not UTF-8
control_text = st.text(st.characters(min_codepoint=0, max_codepoint=31), min_size=1, max_size=20)
texts = st.one_of(
    safe_text,
    control_text,
    st.sampled_from(PAYLOADS),
    st.builds(lambda a, b: a + " " + b, st.sampled_from(PAYLOADS), safe_text),
    st.sampled_from(["Hello world", "def f(x):", "x" * 200_000, "<b>" * 30_000]),
)
huge_ints = st.integers(min_value=-(10**40), max_value=10**40)
numbers = st.one_of(
    st.integers(-5, 600),
    huge_ints,
    st.floats(allow_nan=True, allow_infinity=True),
    st.none(),
    st.sampled_from([0, 1, 4, 512, -1, 0.5, 1e308, -1e-308]),
)
anything = st.one_of(numbers, texts, st.booleans())
valid = st.fixed_dictionaries({
    "prompt": st.sampled_from(["Hello world", "def f(x):"] + PAYLOADS),
    "chat": st.booleans(),
    "gamma": st.integers(1, 12),
    "max_new": st.integers(1, 48),
    "temperature": st.sampled_from([0.0, 0.7, 1.0, 2.0]),
    "top_k": st.sampled_from([0, 1, 5]),
    "top_p": st.sampled_from([0.05, 0.5, 1.0]),
    "seed": st.integers(0, 2**31),
})
pairs = st.one_of(st.just("tiny"), st.sampled_from(["no-such-pair", PAYLOADS[0], "qwen2.5-0.5b-1.5b"]),
                  st.text(min_size=1, max_size=20).filter(lambda s: s.strip() not in ("", "default")))
model_ids = st.one_of(st.just(""), st.just(""), safe_text,
                      st.sampled_from(["no-org/no-model", "../../etc", "/tmp", ".", "a" * 300, PAYLOADS[1],
                                       "Qwen/Qwen2.5-0.5B-Instruct"]))


@st.composite
def playground_args(draw):
    v = draw(valid)
    # drafter, gamma policy and prediction: the n-gram and predicted drafters refuse the confidence policy, and the
    # predicted drafter needs a prediction (handled errors)
    args = [v["prompt"], v["chat"], v["gamma"], v["max_new"], v["temperature"], v["top_k"], v["top_p"], v["seed"],
            "tiny", "", "", draw(st.sampled_from(["model", "model", "ngram", "predicted"])),
            draw(st.sampled_from(["fixed", "heuristic", "confidence", "expected"])),
            draw(st.sampled_from(["", "Hello world, hello", PAYLOADS[1]])),
            # the token tree: off, or a shape (some refused: bad widths, too many nodes) and a mode
            draw(st.sampled_from([False, False, True])), draw(st.sampled_from(["3,2,1", "2,2", "1", "9", "8,8", ""])),
            draw(st.sampled_from(["top-k", "sampled", "distinct"])),
            # the verification rule: block is refused on a tree (a message)
            draw(st.sampled_from(["pq", "strict", "block"]))]
    # break some fields (none, one or several): the rest stays valid so the handlers, not just Gradio, get fuzzed
    for i in draw(st.lists(st.integers(0, 17), max_size=3, unique=True)):
        if i == 0:
            args[i] = draw(texts)
        elif i == 1:
            args[i] = draw(st.one_of(st.booleans(), st.none(), st.integers(), safe_text))
        elif i == 8:
            args[i] = draw(pairs)
        elif i in (9, 10):
            args[i] = draw(model_ids)
        else:
            args[i] = draw(anything)
    return tuple(args)


@st.composite
def lab_args(draw):
    n = draw(st.one_of(st.integers(1, 5000), numbers))
    seed = draw(st.one_of(st.integers(0, 100), numbers))
    repair = draw(st.one_of(st.sampled_from(["correct", "fresh-p", "from-q"]), safe_text))
    n_tok = draw(st.one_of(st.integers(3, 6), numbers))
    toks = [draw(st.one_of(st.sampled_from(["cat", "dog", "owl", "fox", "bee", "elk"]), texts)) for _ in range(6)]
    ps = [draw(st.one_of(st.floats(0, 100), numbers, safe_text)) for _ in range(6)]
    qs = [draw(st.one_of(st.floats(0, 100), numbers, safe_text)) for _ in range(6)]
    return (n, seed, repair, n_tok, *toks, *ps, *qs)


# ------------------------------------------------------------------------------------------------ traces


def _paths(node, prefix=()):
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        yield prefix, k
        yield from _paths(v, prefix + (k,))


@st.composite
def trace_files(draw, base: dict):
    """Bytes for an uploaded file: a valid trace (maybe with markup in every piece), a mutated one, or garbage."""
    kind = draw(st.sampled_from(["valid", "markup", "mutated", "garbage", "json", "truncated"]))
    doc = copy.deepcopy(base)
    if kind == "valid":
        return kind, json.dumps(doc).encode()
    if kind == "markup":  # still a valid trace: pieces and prompt are free text
        payload = draw(st.sampled_from(PAYLOADS))
        doc["prompt"] = payload + doc["prompt"]
        for r in doc["rounds"]:
            r["draft_pieces"] = [payload for _ in r["draft_pieces"]]
            r["committed_pieces"] = [payload for _ in r["committed_pieces"]]
            r["emitted_piece"] = payload
            for row in r["p_top"] + r["q_top"] + [r["residual_top"] or []]:
                for c in row:
                    c["piece"] = payload
        doc["models"]["target"] = payload
        return kind, json.dumps(doc).encode()
    if kind == "mutated":
        paths = list(_paths(doc))
        for _ in range(draw(st.integers(1, 3))):
            parent, key = draw(st.sampled_from(paths))
            node = doc
            try:
                for p in parent:
                    node = node[p]
                node[key] = draw(st.one_of(numbers, texts, st.lists(st.integers(), max_size=3), st.just({})))
            except (KeyError, IndexError, TypeError):
                continue
        return kind, json.dumps(doc).encode()
    if kind == "garbage":
        return kind, draw(st.binary(max_size=300))
    if kind == "json":
        return kind, json.dumps(draw(st.one_of(numbers, texts, st.lists(numbers, max_size=4)))).encode()
    raw = json.dumps(doc).encode()
    return kind, raw[: draw(st.integers(0, len(raw) - 1))]


# ------------------------------------------------------------------------------------------------- tests


@pytest.fixture(scope="module")
def fuzz_app():
    # no display pacing: the fuzz wants many calls, not watchable streams
    env = {"SPECDEC_PAIR": "tiny", "SPECDEC_DTYPE": "float32", "SPECDEC_DEVICE": "cpu", "SPECDEC_MIN_ROUND_S": "0"}
    log = ARTIFACTS / "app-fuzz.log"
    proc, url = start_app(env, log)
    yield proc, url, log
    stop_app(proc)


@pytest.fixture(scope="module")
def base_trace(tiny_pair) -> dict:
    from specdec.core.settings import DecodeSettings
    from specdec.loop.decoder import SpeculativeDecoder
    from specdec.core.sampling import SamplingConfig
    from specdec.core.metrics import StepCosts
    from specdec.io.trace import record_to_dict

    dec = SpeculativeDecoder(tiny_pair, "Hello world", DecodeSettings(gamma=4, max_new_tokens=24, seed=1,
                                                                        sampling=SamplingConfig(0.9, 0, 1.0)))
    list(dec)
    return record_to_dict(dec.record(StepCosts(20.0, 10.0)))


def test_fuzz_every_endpoint(fuzz_app, base_trace, tmp_path):
    from gradio_client import Client, handle_file

    proc, url, log = fuzz_app
    clients = [Client(url, verbose=False) for _ in range(N_CLIENTS)]
    rec = Recorder()
    t0 = time.perf_counter()
    counter = iter(range(10**6))

    def upload(data: bytes, suffix: str = ".json"):
        path = tmp_path / f"upload-{next(counter)}{suffix}"
        path.write_bytes(data)
        return handle_file(str(path))

    # Fixed edge cases first: each is one call that must be answered with a message.
    # all eighteen controls: a raw HTTP call (the fallback when gradio_client refuses NaN) must send every input
    valid_args = ("Hello world", False, 4, 16, 0.7, 0, 1.0, 0, "tiny", "", "", "model", "fixed", "", False, "3,2,1",
                  "top-k", "pq")
    fixed = [
        ("/generate", ("x" * 200_000,) + valid_args[1:]),
        ("/generate", ("Hello",) + valid_args[1:4] + (float("nan"),) + valid_args[5:]),
        ("/step", valid_args[:2] + (-3,) + valid_args[3:]),
        ("/step", valid_args[:7] + (10**40,) + valid_args[8:]),
        ("/generate", valid_args[:8] + ("tiny", "bad id with spaces", "") + valid_args[11:]),
        ("/generate", valid_args[:11] + ("ngram", "confidence", "")),  # a refused combination: a message
        ("/generate", valid_args[:11] + ("predicted", "fixed", "")),  # the predicted drafter without a prediction
        ("/generate", (PAYLOADS[1],) + valid_args[1:]),
        ("/generate", valid_args[:14] + (True, "3,x," + PAYLOADS[0], "top-k", "pq")),  # a bad tree shape: a message
        ("/step", valid_args[:14] + (True, "2,1", "sampled", "strict")),  # a strict tree round
        ("/generate", valid_args[:17] + ("lenient",)),  # an unknown verification rule: a message
        ("/step", valid_args[:14] + (True, "2,1", "top-k", "block")),  # block on a tree: a message
        ("/step", valid_args[:17] + ("block",)),  # a block-verified round
        ("/import_trace", (upload(json.dumps(base_trace).encode()),)),
        ("/export_trace", ()),
        ("/import_trace", (upload(b"\x00" * (21 * 2**20)),)),  # over the 20 MB trace limit
        ("/import_trace", (upload(b"{}", ".exe"),)),
        ("/lab", (float("nan"), 0, "correct", 3, "cat", "dog", "owl", "", "", "", 50, 30, 20, 0, 0, 0, 60, 10, 30,
                  0, 0, 0)),
    ]
    for i, (endpoint, args) in enumerate(fixed):
        call(rec, clients[i % N_CLIENTS], endpoint, args)

    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(data=st.data())
    def one_call(data):
        client = clients[data.draw(st.integers(0, N_CLIENTS - 1), label="client")]
        endpoint = data.draw(st.sampled_from(PLAYGROUND + ("/stop", "/reset", "/import_trace", "/export_trace",
                                                             "/lab")), label="endpoint")
        if endpoint in PLAYGROUND:
            args = data.draw(playground_args(), label="args")
        elif endpoint == "/import_trace":
            kind, raw = data.draw(trace_files(base_trace), label="file")
            args = (upload(raw),)
        elif endpoint == "/lab":
            args = data.draw(lab_args(), label="args")
        else:
            args = ()
        call(rec, client, endpoint, args)

    one_call()
    elapsed = time.perf_counter() - t0

    alive = proc.poll() is None
    page_ok = False
    if alive:
        with urllib.request.urlopen(url, timeout=10) as r:
            page_ok = r.status == 200
    after = Client(url, verbose=False).predict(*valid_args, api_name="/step")[0] if alive else ""
    app_log = Path(log).read_text(errors="replace")
    unexpected = gradio_tracebacks(app_log)
    summary = rec.summary() | {"seconds": round(elapsed, 1), "server_alive": alive, "page_answers": page_ok,
                               "tracebacks_in_app_log": app_log.count("Traceback"),
                               "unexpected_tracebacks": unexpected}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "fuzz.json").write_text(json.dumps(summary, indent=2))
    print("\nfuzz:", json.dumps({k: v for k, v in summary.items() if k != "example_messages"}, indent=1))

    assert alive and page_ok, "the server died or stopped answering"
    assert "Stepped round 1:" in after, f"a normal Step after the fuzz failed: {after}"
    assert not rec.crashes, f"{len(rec.crashes)} calls crashed: {rec.crashes[:3]}"
    assert not rec.injections, f"markup from the input reached the page: {rec.injections[:3]}"
    # Gradio logs its own input refusals (gr.Error) with a traceback; anything else is a crash
    assert not unexpected, f"unexpected tracebacks in test-artifacts/app-fuzz.log: {unexpected[:3]}"
    # the fuzz reached the handlers, not only Gradio's input checks
    assert rec.outcomes["ok"] >= 5 and rec.outcomes["handled_error"] >= 5, rec.outcomes
