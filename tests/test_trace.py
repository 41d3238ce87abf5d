"""Trace export and replay: a round trip on the tiny pair, every malformed-input case, and a fuzz of the loader."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.core.errors import TraceError
from specdec.core.events import Round
from specdec.core.sampling import SamplingConfig
from specdec.core.metrics import StepCosts
from specdec.core.record import PairInfo, RunRecord
from specdec.io.trace import MAX_TRACE_BYTES, SCHEMA, VERSION, dumps_trace, load_trace, load_trace_file, record_to_dict

PROMPT = "hello world"
SETTINGS = DecodeSettings(gamma=4, max_new_tokens=40, sampling=SamplingConfig(0.8, 0, 0.95), seed=3)


@pytest.fixture(scope="module")
def run(tiny_pair):
    dec = SpeculativeDecoder(tiny_pair, PROMPT, SETTINGS)
    list(dec)
    return dec


@pytest.fixture(scope="module")
def trace_dict(run) -> dict:
    return record_to_dict(run.record(StepCosts(80.0, 20.0)))


@pytest.fixture
def doc(trace_dict) -> dict:
    """A fresh deep copy of a valid trace for a test to break."""
    return copy.deepcopy(trace_dict)


def _bonus_and_rejection(rounds) -> tuple[int, int]:
    return next(i for i, r in enumerate(rounds) if r.is_bonus), next(i for i, r in enumerate(rounds) if not r.is_bonus)


# ---------------------------------------------------------------------------------------------- round trip


def test_round_trip_restores_every_round(run, trace_dict):
    text = dumps_trace(trace_dict)
    tr = load_trace(text)
    assert isinstance(tr, RunRecord)
    assert tr.rounds == run.rounds
    assert all(isinstance(r, Round) for r in tr.rounds)
    assert tr.text == run.text and tr.prompt == PROMPT and tr.prompt_ids == run.prompt_ids
    assert tr.generated_ids == run.generated_ids
    assert tr.pair == run.pair.info()
    assert tr.settings == SETTINGS and tr.costs == StepCosts(80.0, 20.0)
    assert json.loads(text)["version"] == VERSION and json.loads(text)["schema"] == SCHEMA
    assert dumps_trace(tr) == text  # a loaded trace exports to the same bytes
    assert load_trace(text.encode("utf-8")).rounds == run.rounds


def test_the_run_exercises_both_round_kinds(run):
    # The consistency checks below break bonus and rejection rounds; make sure this run has both.
    _bonus_and_rejection(run.rounds)
    assert run.stop_reason is not None


def test_metrics_summarize_the_run(run, trace_dict):
    m = load_trace(dumps_trace(trace_dict)).metrics
    assert m.rounds == len(run.rounds) and m.generated == len(run.generated_ids)
    assert m.baseline_tok_s == 12.5  # 1000 / 80 ms per plain target token
    assert trace_dict["metrics"]["stop_reason"] == run.stop_reason
    assert trace_dict["metrics"]["alpha"] == m.alpha  # the file's summary is what import recomputes


def test_the_plain_baseline_and_its_step_count_round_trip(run, doc):
    doc["baseline_ms_per_token"], doc["baseline_steps"] = 75.0, 9
    back = load_trace(json.dumps(doc))
    assert (back.baseline_ms_per_token, back.baseline_steps) == (75.0, 9)
    assert record_to_dict(back)["baseline_steps"] == 9
    for bad in (-1, 2.5, "9", True):
        doc["baseline_steps"] = bad
        with pytest.raises(TraceError, match="baseline_steps"):
            load_trace(json.dumps(doc))
    del doc["baseline_steps"]  # written before the field existed
    assert load_trace(json.dumps(doc)).baseline_steps == 0


def test_a_probed_runs_opening_plain_step_round_trips_and_asked_zero_needs_zero_guesses(tiny_pair):
    s = DecodeSettings(max_new_tokens=10, gamma=3, sampling=SamplingConfig(temperature=1.0), seed=2)
    dec = SpeculativeDecoder(tiny_pair, "hello world", s, plain_probe=True)
    for _ in dec:
        pass
    doc = record_to_dict(dec.record())
    assert doc["rounds"][0]["asked"] == 0 and doc["rounds"][0]["gamma"] == 0
    back = load_trace(json.dumps(doc))
    assert back.rounds[0].asked_nothing and back.gamma_schedule[0] == 0
    guessed = next(i for i, r in enumerate(doc["rounds"]) if r["gamma"] > 0)
    doc["rounds"][guessed]["asked"] = 0
    with pytest.raises(TraceError, match="asked"):
        load_trace(json.dumps(doc))


def test_non_finite_metric_values_are_written_as_null(run, monkeypatch):
    from specdec.io import trace as trace_mod

    rec = run.record()
    m = rec.metrics
    m.tok_s = float("nan")
    monkeypatch.setattr(RunRecord, "metrics", property(lambda self: m))
    assert trace_mod.record_to_dict(rec)["metrics"]["tok_s"] is None


def test_replaying_the_settings_reproduces_the_run(tiny_pair, trace_dict):
    tr = load_trace(dumps_trace(trace_dict))
    again = SpeculativeDecoder(tiny_pair, tr.prompt, tr.settings)
    assert [r.committed_ids for r in again] == [r.committed_ids for r in tr.rounds]


def test_chat_prompt_is_recorded_as_messages(tiny_pair):
    messages = [{"role": "user", "content": "hi there"}]
    dec = SpeculativeDecoder(tiny_pair, messages, DecodeSettings(gamma=3, max_new_tokens=6, chat=True))
    dec.step()
    tr = load_trace(dumps_trace(dec.record()))
    assert tr.prompt == messages and tr.settings.chat is True
    assert len(tr.rounds) == 1


def test_trace_file_round_trip(tmp_path, trace_dict, run):
    path = tmp_path / "run.specdec.json"
    path.write_text(dumps_trace(trace_dict), encoding="utf-8")
    assert load_trace_file(path).rounds == run.rounds


def test_missing_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="could not be read"):
        load_trace_file(tmp_path / "nope.json")


def test_oversized_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "big.json"
    with open(path, "wb") as fh:
        fh.truncate(MAX_TRACE_BYTES + 1)  # sparse: no 20 MB written
    with pytest.raises(TraceError, match="MB; the limit is 20 MB"):
        load_trace_file(path)


def test_export_refuses_a_trace_over_the_cap(trace_dict):
    big = dict(trace_dict, text="x" * (MAX_TRACE_BYTES + 1))
    with pytest.raises(TraceError, match="over the 20 MB limit"):
        dumps_trace(big)


def test_optional_metrics_and_newer_round_fields(doc):
    del doc["metrics"]
    for r in doc["rounds"]:
        del r["round_ms"], r["totals"], r["stop_reason"]  # fields a trace may lack
        r["future_field"] = 1  # additive fields from a later minor change are ignored
    doc["unknown_top_level"] = {"ok": True}
    tr = load_trace(json.dumps(doc))
    assert tr.metrics.rounds == len(doc["rounds"]) and tr.rounds[0].round_ms == 0.0  # recomputed from the rounds


# ---------------------------------------------------------------------------------------- malformed input


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{not json", "not valid JSON"),
        ("", "not valid JSON"),
        (b"\xff\xfe\x00garbage", "not UTF-8"),
        ("[1, 2, 3]", "must be a JSON object"),
        ("null", "must be a JSON object"),
        ('"specdec.trace"', "must be a JSON object"),
        ("[" * 100_000, "nested too deeply|not valid JSON"),
        (12, "JSON text or bytes"),
        ('{"version": 1}', "no 'schema' field"),
        ('{"schema": "other.trace", "version": 1}', "not a specdec trace"),
        ('{"schema": "specdec.trace", "version": 4}', "newer specdec"),
        ('{"schema": "specdec.trace", "version": 0}', "unknown trace version"),
        ('{"schema": "specdec.trace", "version": "1"}', "whole number"),
        ('{"schema": "specdec.trace", "version": true}', "whole number"),
        ('{"schema": "specdec.trace"}', "whole number"),
    ],
)
def test_not_a_trace(raw, message):
    with pytest.raises(TraceError, match=message):
        load_trace(raw)


def test_oversized_text_is_refused_before_parsing():
    with pytest.raises(TraceError, match="limit is 20 MB"):
        load_trace(" " * (MAX_TRACE_BYTES + 1))
    with pytest.raises(TraceError, match="limit is 20 MB"):
        load_trace(b" " * (MAX_TRACE_BYTES + 1))
    with pytest.raises(TraceError, match="limit is 20 MB"):
        load_trace("é" * (MAX_TRACE_BYTES // 2 + 1))  # few characters, but more bytes than the cap


@pytest.mark.parametrize("key", ["created", "settings", "models", "prompt", "prompt_ids", "text", "rounds"])
def test_missing_top_level_key(doc, key):
    del doc[key]
    with pytest.raises(TraceError, match=f"missing '{key}'"):
        load_trace(json.dumps(doc))


def _set(path: str, value):
    """A mutation that sets doc[path] (dotted, with integer list indices) to value."""

    def mutate(doc):
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = doc
        for p in parents:
            node = node[p]
        node[last] = value

    return mutate


def _delete(path: str):
    def mutate(doc):
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node = doc
        for p in parents:
            node = node[p]
        del node[last]

    return mutate


WRONG_TYPES = [
    ("created", _set("created", 20250101), "ISO 8601"),
    ("created not a date", _set("created", "yesterday"), "not an ISO 8601 time"),
    ("settings list", _set("settings", [4, 64]), "'settings' must be a JSON object"),
    ("settings no gamma", _delete("settings.gamma"), "'settings' is missing 'gamma'"),
    ("settings gamma 0", _set("settings.gamma", 0), "gamma"),
    ("settings gamma float", _set("settings.gamma", 4.5), "gamma"),
    ("sampling not object", _set("settings.sampling", "greedy"), "settings.sampling' must be a JSON object"),
    ("sampling no top_p", _delete("settings.sampling.top_p"), "missing 'top_p'"),
    ("temperature string", _set("settings.sampling.temperature", "hot"), "temperature"),
    ("temperature bool", _set("settings.sampling.temperature", True), "temperature"),
    ("top_p out of range", _set("settings.sampling.top_p", 1.5), "top_p"),
    ("chat string", _set("settings.chat", "yes"), "settings.chat"),
    ("policy unknown", _set("settings.gamma_policy", "random"), "gamma_policy"),
    ("threshold string", _set("settings.confidence_threshold", "0.4"), "confidence_threshold"),
    ("models list", _set("models", []), "'models' must be a JSON object"),
    ("models no target", _delete("models.target"), "'models' is missing 'target'"),
    ("models draft int", _set("models.draft", 5), "models.draft' must be a string"),
    ("models vocab negative", _set("models.vocab_size", -1), "vocab_size"),
    ("prompt int", _set("prompt", 7), "'prompt' must be a string or a list"),
    ("prompt bad message", _set("prompt", [{"role": "user"}]), r"prompt\[0\]"),
    ("prompt_ids empty", _set("prompt_ids", []), "prompt_ids must be a non-empty list"),
    ("prompt_ids string", _set("prompt_ids.0", "a"), r"prompt_ids\[0\] must be a token id"),
    ("prompt_ids bool", _set("prompt_ids.0", True), r"prompt_ids\[0\] must be a token id"),
    ("prompt_ids past vocab", _set("prompt_ids.0", 10**6), "below the vocabulary size"),
    ("text int", _set("text", 3), "text must be a string"),
    ("metrics list", _set("metrics", [1]), "'metrics' must be a JSON object"),
    ("rounds object", _set("rounds", {}), "'rounds' must be a list"),
    ("round not object", _set("rounds.0", [1, 2]), r"rounds\[0\] must be a JSON object"),
    ("round missing key", _delete("rounds.0.q_draft"), r"rounds\[0\] is missing 'q_draft'"),
]


@pytest.mark.parametrize("name, mutate, message", WRONG_TYPES, ids=[c[0] for c in WRONG_TYPES])
def test_wrong_types(doc, name, mutate, message):
    mutate(doc)
    with pytest.raises(TraceError, match=message):
        load_trace(json.dumps(doc))


def _change_first_committed(r: int):
    def mutate(doc):
        rnd = doc["rounds"][r]
        rnd["committed_ids"][0] = (rnd["committed_ids"][0] + 1) % doc["models"]["vocab_size"]

    return mutate


def _commit_one_more(r: int):
    def mutate(doc):
        rnd = doc["rounds"][r]
        rnd["committed_ids"].append(rnd["emitted_id"])
        rnd["committed_pieces"].append(rnd["emitted_piece"])

    return mutate


def _round_cases(doc) -> dict:
    """Mutations of one bonus round (b) and one rejection round (r) of the recorded run, by name."""
    rounds = doc["rounds"]
    b = next(i for i, r in enumerate(rounds) if r["is_bonus"])
    r = next(i for i, x in enumerate(rounds) if not x["is_bonus"] and x["n_accepted"] > 0)
    g = rounds[r]["gamma"]
    return {
        "n_accepted > gamma": (_set(f"rounds.{r}.n_accepted", g + 1), "more than the .* tokens drafted"),
        "gamma too large": (_set(f"rounds.{r}.gamma", 99), "gamma must be a whole number from 0 to 32"),
        "q_draft short": (lambda d: d["rounds"][r]["q_draft"].pop(), "q_draft must be a list of .* probabilities"),
        "draft_ids long": (lambda d: d["rounds"][r]["draft_ids"].append(5), "draft_ids must be a list of"),
        "draft_pieces long": (lambda d: d["rounds"][r]["draft_pieces"].append("x"), "draft_pieces must be a list"),
        "p_top short": (lambda d: d["rounds"][r]["p_top"].pop(), "p_top must be a list of .* candidate lists"),
        "q_top long": (lambda d: d["rounds"][r]["q_top"].append([]), "q_top must be a list of"),
        "NaN probability": (_set(f"rounds.{r}.p_draft.0", float("nan")), "NaN"),
        "infinite probability": (_set(f"rounds.{r}.q_draft.0", float("inf")), "Infinity"),
        "probability above 1": (_set(f"rounds.{r}.accept_probs.0", 1.5), r"accept_probs\[0\] must be a finite"),
        "negative probability": (_set(f"rounds.{r}.emitted_p", -0.1), "emitted_p must be a finite probability"),
        "string probability": (_set(f"rounds.{r}.uniforms.0", "0.5"), r"uniforms\[0\]"),
        "uniforms contradict n_accepted": (_set(f"rounds.{r}.uniforms.0", 1.0), "keep the first 0 draft tokens"),
        "rejected_at wrong": (_set(f"rounds.{r}.rejected_at", 0), "rejected_at is 0"),
        "rejected_at null on rejection": (_set(f"rounds.{r}.rejected_at", None), "rejected_at is null"),
        "rejected_at on bonus": (_set(f"rounds.{b}.rejected_at", 0), "must be null"),
        "is_bonus wrong": (_set(f"rounds.{r}.is_bonus", True), "is_bonus is true"),
        "is_bonus not bool": (_set(f"rounds.{b}.is_bonus", 1), "is_bonus must be true or false"),
        "residual on bonus": (_set(f"rounds.{b}.residual_top", []), "residual_top must be null for a bonus"),
        "no residual on rejection": (_set(f"rounds.{r}.residual_top", None), "residual_top is null"),
        "candidate extra key": (_set(f"rounds.{r}.p_top.0.0.logit", 3.0), "exactly 'id', 'piece' and 'prob'"),
        "candidate id negative": (_set(f"rounds.{r}.q_top.0.0.id", -1), r"q_top\[0\]\[0\].id must be a token id"),
        "candidate prob NaN": (_set(f"rounds.{r}.residual_top.0.prob", float("nan")), "NaN"),
        "emitted id past vocab": (_set(f"rounds.{r}.emitted_id", 10**9), "emitted_id must be a token id"),
        "committed wrong token": (_change_first_committed(r), "is not a prefix of the accepted draft tokens"),
        "committed too long": (_commit_one_more(r), "is not a prefix of the accepted draft tokens"),
        "committed empty": (_set(f"rounds.{r}.committed_ids", []), "committed_ids must be a non-empty list"),
        "committed pieces mismatch": (lambda d: d["rounds"][r]["committed_pieces"].append("z"), "committed_pieces"),
        "negative time": (_set(f"rounds.{r}.draft_ms", -1.0), "draft_ms must be a finite number of milliseconds"),
        "totals unknown field": (_set(f"rounds.{r}.totals.speed", 1), "unknown fields"),
        "totals negative": (_set(f"rounds.{r}.totals.kept", -2), "totals.kept must be a whole number"),
        "stop reason unknown": (_set(f"rounds.{r}.stop_reason", "tired"), "stop_reason must be null"),
        "stop before the end": (_set("rounds.0.stop_reason", "eos"), r"rounds\[0\] stops the run"),
        "index out of order": (_set(f"rounds.{r}.index", r + 5), "rounds must be numbered"),
        "position mismatch": (_set(f"rounds.{r}.position", 999), "position is 999"),
        "too many tokens": (_set("settings.max_new_tokens", 1), "more than settings.max_new_tokens"),
    }


ROUND_CASE_NAMES = [
    "n_accepted > gamma", "gamma too large", "q_draft short", "draft_ids long", "draft_pieces long", "p_top short",
    "q_top long", "NaN probability", "infinite probability", "probability above 1", "negative probability",
    "string probability", "uniforms contradict n_accepted", "rejected_at wrong", "rejected_at null on rejection",
    "rejected_at on bonus", "is_bonus wrong", "is_bonus not bool", "residual on bonus", "no residual on rejection",
    "candidate extra key", "candidate id negative", "candidate prob NaN", "emitted id past vocab",
    "committed wrong token", "committed too long", "committed empty", "committed pieces mismatch", "negative time",
    "totals unknown field", "totals negative", "stop reason unknown", "stop before the end", "index out of order",
    "position mismatch", "too many tokens",
]


def test_round_case_list_is_complete(doc):
    assert sorted(ROUND_CASE_NAMES) == sorted(_round_cases(doc))


@pytest.mark.parametrize("case", ROUND_CASE_NAMES)
def test_malformed_round(doc, case):
    mutate, message = _round_cases(doc)[case]
    mutate(doc)
    with pytest.raises(TraceError, match=message):
        load_trace(json.dumps(doc))  # json.dumps writes NaN / Infinity, as a careless exporter would


def test_unmodified_document_loads(doc):
    # The malformed cases above start from this document; it must itself be valid for them to mean anything.
    assert len(load_trace(json.dumps(doc)).rounds) == len(doc["rounds"])


# --------------------------------------------------------------------------------------------------- fuzz

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5),
    max_leaves=25,
)


def _paths(node, prefix=()):
    """Every (container path, key) in a JSON document, so a fuzz case can replace or delete any one value."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else []
    for k, v in items:
        yield prefix, k
        yield from _paths(v, prefix + (k,))


def _expect_trace_or_trace_error(raw):
    try:
        tr = load_trace(raw)
    except TraceError as exc:
        assert str(exc)  # a message for people, never empty
        return None
    assert isinstance(tr, RunRecord) and all(isinstance(r, Round) for r in tr.rounds)
    return tr


FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(raw=st.binary(max_size=200) | st.text(max_size=200))
def test_fuzz_garbage(raw):
    _expect_trace_or_trace_error(raw)


@FUZZ
@given(value=json_values)
def test_fuzz_random_json(value):
    _expect_trace_or_trace_error(json.dumps(value))
    if isinstance(value, dict):  # a plausible header in front of random content
        _expect_trace_or_trace_error(json.dumps({**value, "schema": SCHEMA, "version": 1}))


@FUZZ
@given(data=st.data())
def test_fuzz_mutated_trace(trace_dict, data):
    doc = copy.deepcopy(trace_dict)
    paths = list(_paths(doc))
    for _ in range(data.draw(st.integers(1, 3))):
        parent_path, key = data.draw(st.sampled_from(paths))
        node = doc
        try:
            for p in parent_path:
                node = node[p]
            if data.draw(st.booleans()):
                node[key] = data.draw(json_values)
            else:
                del node[key]
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation already removed or replaced this part
    _expect_trace_or_trace_error(json.dumps(doc))


@FUZZ
@given(data=st.data())
def test_fuzz_truncated_and_flipped_bytes(trace_dict, data):
    raw = bytearray(dumps_trace(trace_dict).encode("utf-8"))
    cut = data.draw(st.integers(0, len(raw)))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(raw) - 1), st.integers(0, 255)), max_size=4))
    for i, b in flips:
        raw[i] = b
    _expect_trace_or_trace_error(bytes(raw[:cut] if data.draw(st.booleans()) else raw))


# ------------------------------------------------------------------------- edge cases of import and old versions


def test_overflowing_numbers_in_unchecked_fields_are_refused_at_import(trace_dict):
    # A literal 1e400 once parsed to inf in 'metrics' or an extra settings/models key, and the replay then could
    # not be exported ("Out of range float values").
    for where in ("metrics", "settings", "models"):
        text = dumps_trace(trace_dict).replace(f'"{where}":{{', f'"{where}":{{"extra":1e400,', 1)
        with pytest.raises(TraceError, match="overflows"):
            load_trace(text)


def test_version_1_traces_still_load(doc):
    doc["version"] = 1
    for r in doc["rounds"]:
        del r["top_k"], r["note"]
        r["totals"].pop("tested")
    assert load_trace(json.dumps(doc)).rounds[0].top_k == 8


def test_a_round_that_drafted_nothing_round_trips(tiny_pair):
    from specdec.drafters import no_draft

    class Silent:  # a drafter with nothing to propose: every round is a plain target step
        def propose(self, committed, gamma, cfg, gen):
            return no_draft(tiny_pair.vocab_size, tiny_pair.device)

        def feedback(self, committed, n_accepted, n_drafted):
            pass

    dec = SpeculativeDecoder(tiny_pair, PROMPT, DecodeSettings(max_new_tokens=5), drafter=Silent())
    list(dec)
    assert [r.gamma for r in dec.rounds] == [0] * 5 and all(r.is_bonus for r in dec.rounds)
    assert load_trace(dumps_trace(dec.record())).rounds == dec.rounds


def test_a_run_without_candidate_lists_round_trips(tiny_pair):
    dec = SpeculativeDecoder(tiny_pair, PROMPT, SETTINGS, top_k=0)
    list(dec)
    assert all(r.top_k == 0 and r.p_top == [[]] * (r.gamma + 1) for r in dec.rounds)
    with_lists = SpeculativeDecoder(tiny_pair, PROMPT, SETTINGS)
    list(with_lists)
    assert dec.generated_ids == with_lists.generated_ids  # display work never touches the sampling
    assert load_trace(dumps_trace(dec.record())).rounds == dec.rounds


def test_version_2_and_1_traces_still_load(tiny_pair):
    """Older traces: v2 calls totals.kept "accepted" and has no `asked`; v1 also lacks top_k, note, totals.tested,
    the drafter settings, label, costs and baseline_ms_per_token."""
    dec = SpeculativeDecoder(tiny_pair, "hello", DecodeSettings(max_new_tokens=12, sampling=SamplingConfig(1.0), seed=3))
    list(dec)
    doc = json.loads(dumps_trace(dec.record()))
    assert doc["version"] == VERSION == 3 and all("kept" in r["totals"] and "asked" in r for r in doc["rounds"])
    v2 = json.loads(json.dumps(doc))
    v2["version"] = 2
    for r in v2["rounds"]:
        r.pop("asked")
        r["totals"]["accepted"] = r["totals"].pop("kept")
    rec = load_trace(json.dumps(v2))
    assert [r.totals.kept for r in rec.rounds] == [r.totals.kept for r in dec.rounds]
    assert rec.gamma_schedule == [r.gamma for r in dec.rounds] and rec.text == dec.text
    v1 = json.loads(json.dumps(v2))
    v1["version"] = 1
    for key in ("label", "costs", "baseline_ms_per_token"):
        v1.pop(key, None)
    for key in ("drafter", "ngram_max", "ngram_min", "exit_layer", "prediction"):
        v1["settings"].pop(key, None)
    for r in v1["rounds"]:
        for key in ("top_k", "note"):
            r.pop(key, None)
        r["totals"].pop("tested")
    rec1 = load_trace(json.dumps(v1))
    assert rec1.generated_ids == dec.generated_ids and rec1.settings.drafter == "model"
    assert rec1.metrics.kept == dec.record().metrics.kept
    both = json.loads(json.dumps(doc))
    both["rounds"][0]["totals"]["accepted"] = 1
    with pytest.raises(TraceError, match="unknown fields: 'accepted'"):
        load_trace(json.dumps(both))
