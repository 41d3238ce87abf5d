"""The app's wiring of the ship-it modules, in process on the tiny pair: custom ids checked before any load, trace
replay with no model, the ZeroGPU (detached) Generate path, and one read-only copy of the models for all sessions.
"""

from __future__ import annotations

import ast
import importlib
import pickle
import sys
import threading
from pathlib import Path

import gradio as gr
import pytest
import torch

import ui.gpu_run as gpu_run
import ui.loader as loader_mod
import ui.playground as playground
import ui.session as session_mod
from specdec.core.settings import DecodeSettings
from specdec.loop.decoder import SpeculativeDecoder
from specdec.core.errors import UnsupportedModelError
from specdec.models.hub import ModelCheck
from specdec.core.metrics import StepCosts
from specdec.core.record import RunRecord
from specdec.core.sampling import SamplingConfig
from specdec.io.trace import dumps_trace, load_trace_file
from tests.test_zerogpu import FakeSpaces
from ui.loader import PairLoader, PairRequest
from ui.playground import DETACHED_STEP_MESSAGE, Playground, Session, guarded

ROOT = Path(__file__).resolve().parent.parent
#           prompt        chat  gamma max_new temp  top_k top_p seed pair    target draft
CONTROLS = ["Hello world", False, 4, 24, 0.8, 0, 1.0, 3, "tiny", "", ""]
STATUS, TEXT, RECORDED = 1, 9, 10  # positions in Playground.OUTPUTS


def controls(**kw) -> list:
    names = ["prompt", "chat", "gamma", "max_new", "temperature", "top_k", "top_p", "seed", "pair", "target", "draft"]
    return [kw.get(n, v) for n, v in zip(names, CONTROLS)]


def solo(pair, c: list, probe: bool = True) -> SpeculativeDecoder:
    """The request alone on the engine, as the playground runs it: with plain steps timed beside it (round one a
    plain step); probe=False as the detached (ZeroGPU) worker runs it."""
    s = DecodeSettings(gamma=c[2], max_new_tokens=c[3], sampling=SamplingConfig(c[4], c[5], c[6]), seed=c[7],
                       chat=c[1])
    dec = SpeculativeDecoder(pair, c[0], s, plain_probe=probe)
    list(dec)
    return dec


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(session_mod, "MIN_ROUND_INTERVAL_S", 0.0)


@pytest.fixture
def pg(tiny_pair, fast):
    return Playground(PairLoader(dtype="float32", device="cpu"), PairRequest("tiny"))


def decisions(rounds) -> list[dict]:
    """Rounds without their wall-clock timings, which differ between two runs of the same decoding."""
    timing = {"draft_ms", "verify_ms", "round_ms", "rule_ms", "cache_ms", "display_ms", "totals"}
    return [{k: v for k, v in r.to_dict().items() if k not in timing} for r in rounds]


def last(outputs) -> tuple:
    outputs = list(outputs)
    assert outputs, "the handler yielded nothing"
    return outputs[-1]


# -------------------------------------------------------------------------------------------- custom ids


def test_malformed_custom_id_is_refused_before_anything_loads(pg):
    out = last(guarded(pg.generate)(None, *controls(target="bad id!")))
    assert "sd-status-error" in out[STATUS] and "contains spaces" in out[STATUS]
    out = last(guarded(pg.generate)(None, *controls(draft="org/<script>")))
    assert "contains" in out[STATUS] and "&lt;" in out[STATUS]
    assert pg.loader.peek(PairRequest("tiny", "bad id!", "")) is None  # no load job was even queued
    out = last(guarded(pg.generate)(None, *controls(pair="no-such-pair")))
    assert "unknown model pair" in out[STATUS]


def test_custom_pair_is_validated_before_load_pair(pg, monkeypatch):
    calls, loads = [], []
    real_load = loader_mod.load_pair

    def validate(t, d, max_params, allow_local):
        calls.append((t, d, max_params, allow_local))
        raise UnsupportedModelError(f"target '{t}' is too large for this shared machine")

    def load(name, **kw):
        loads.append((name, kw.get("target"), kw.get("draft")))
        return real_load(name, **kw)

    monkeypatch.setattr(loader_mod, "validate_custom_pair", validate)
    monkeypatch.setattr(loader_mod, "load_pair", load)
    out = last(guarded(pg.generate)(None, *controls(pair="tiny", target="  org/big-model ", draft="org/small")))
    assert calls == [("org/big-model", "org/small", pg.loader.max_params, True)]  # ids stripped
    assert "too large for this shared machine" in out[STATUS]
    # nothing of the refused pair was loaded (the fixture's startup pair may still be loading in the background)
    assert not [x for x in loads if x[1:] != (None, None)], loads


def test_typed_id_next_to_a_builtin_model_is_size_checked(pg, monkeypatch):
    seen = []

    def inspect(model_id, role, allow_local):
        seen.append((model_id, role))
        return ModelCheck(model_id, role, model_id, None, parameters=9_000_000_000, exact=True)

    monkeypatch.setattr(loader_mod, "inspect_model", inspect)
    out = last(guarded(pg.generate)(None, *controls(target="org/huge")))  # draft stays tiny:draft
    assert seen == [("org/huge", "target")]
    assert "~9B parameters, cap 4B" in out[STATUS]


def test_public_mode_refuses_local_folders(tiny_pair, fast, tmp_path):
    public = Playground(PairLoader(dtype="float32", device="cpu", allow_local=False), PairRequest("tiny"),
                        allow_local=False)
    out = last(guarded(public.generate)(None, *controls(target=str(tmp_path))))
    assert "is not a hub id" in out[STATUS]


# ------------------------------------------------------------------------------------------------ traces


def test_import_replays_without_loading_any_model(pg, tiny_pair, monkeypatch, tmp_path):
    pg.startup_job.measured.wait(60)
    dec = solo(tiny_pair, CONTROLS)
    path = tmp_path / "t.json"
    path.write_text(dumps_trace(dec.record(StepCosts(25.0, 12.5))))

    def no_loading(*a, **k):
        raise AssertionError("a trace replay must not load models")

    monkeypatch.setattr(loader_mod, "load_pair", no_loading)
    monkeypatch.setattr(pg.loader, "request", no_loading)
    monkeypatch.setattr(playground, "SpeculativeDecoder", no_loading)
    out = guarded(pg.import_trace)(None, str(path))
    session = out[0]
    assert "Replaying a trace: " in out[STATUS] and "tiny:target" in out[STATUS]
    assert out[TEXT] == dec.text and session.decoder is None and session.rounds == dec.rounds
    (rec,) = out[RECORDED]  # the Learn tab's state: the replayed run as a RunRecord, rounds and all
    assert isinstance(rec, RunRecord) and rec.rounds == dec.rounds and rec is session.record
    assert rec.costs == StepCosts(25.0, 12.5)  # the replay shows the speedup the trace's costs give
    assert rec.metrics.speedup == pytest.approx(dec.record(StepCosts(25.0, 12.5)).metrics.speedup)
    # the replay exports back byte for byte
    assert Path(pg.export_trace(session)).read_text() == path.read_text()


def test_export_of_a_live_run_records_prompt_settings_and_costs(pg, tiny_pair):
    c = controls(chat=True, prompt="Explain a hash map")
    out = last(guarded(pg.generate)(None, *c))
    session = out[0]
    tr = load_trace_file(pg.export_trace(session))
    assert tr.prompt == "Explain a hash map" and tr.settings.chat is True  # what was typed, and how it was sent
    assert tr.rounds == session.decoder.rounds and tr.text == out[TEXT] == solo(tiny_pair, c).text
    assert tr.costs == session.job.costs and tr.costs.target_ms > 0
    assert tr.metrics.speedup == pytest.approx(out[RECORDED][0].metrics.speedup)
    assert pg.export_trace(Session()) is None


# ------------------------------------------------------------------------------------ ZeroGPU (detached)


def test_detached_generate_matches_the_engine_and_records_a_log(tiny_pair, fast, monkeypatch):
    events = []
    real = gpu_run.decode_rounds

    def spy(*args):
        pickle.dumps(args)  # ZeroGPU pickles the arguments into the worker...
        for ev in real(*args):
            pickle.dumps(ev)  # ...and every event back
            events.append(ev[0])
            yield ev

    monkeypatch.setattr(gpu_run, "decode_rounds", spy)
    pg = Playground(PairLoader(dtype="float32", device="cpu", measure=False), PairRequest("tiny"), detached=True)
    out = last(guarded(pg.generate)(None, *CONTROLS))
    session = out[0]
    want = solo(tiny_pair, CONTROLS, probe=False)  # the GPU worker times no plain steps beside its run
    assert "Done:" in out[STATUS] and out[TEXT] == want.text
    assert session.decoder is None and decisions(session.record.rounds) == decisions(want.rounds)
    assert events[0] == "costs" and events.count("round") == len(want.rounds)  # costs measured in the GPU call
    assert session.record.costs.target_ms > 0 and out[RECORDED][0].metrics.speedup is not None
    assert session.record.text == want.text and session.record.stop_reason == want.stop_reason
    assert load_trace_file(pg.export_trace(session)).rounds == session.record.rounds
    # step mode needs a decoder that outlives a GPU call: refused with the reason
    for handler in (pg.step, pg.run_to_end):
        assert DETACHED_STEP_MESSAGE.split(":")[0] in last(guarded(handler)(session, *CONTROLS))[STATUS]


def test_detached_stream_stops_at_a_round_boundary(tiny_pair, fast):
    pg = Playground(PairLoader(dtype="float32", device="cpu", measure=False), PairRequest("tiny"), detached=True)
    stream = guarded(pg.generate)(None, *controls(max_new=200, temperature=0.0, prompt="abc"))
    session = None
    for out in stream:
        session = out[0]
        if session.rounds:
            pg.stop(session)
            break
    rest = list(stream)
    assert rest and "Stopped after" in rest[-1][STATUS]
    assert len(session.rounds) <= 2 and session.record.stop_reason is None


def test_gpu_decorated_functions_with_spaces_present(monkeypatch):
    fake = FakeSpaces()
    monkeypatch.setitem(sys.modules, "spaces", fake)
    try:
        gr_mod = importlib.reload(gpu_run)
        import ui.learn_extras as learn_extras
        import ui.learn_tab as learn_tab

        importlib.reload(learn_extras)  # registers its GPU call again, whichever test imported it first
        lt = importlib.reload(learn_tab)
        assert getattr(gr_mod.decode_rounds, "zerogpu", False)
        assert getattr(lt.run_real_gpu, "zerogpu", False)
        # Generate, the real-model check and the bug zoo on real rows are GPU calls (ui/learn_extras registers the last
        # when learn_tab is reloaded)
        assert {c["task"].__name__: c["duration"] for c in fake.calls} == {"decode_rounds": 120, "run_real_gpu": 120,
                                                                            "run_zoo_real_gpu": 60}
    finally:
        monkeypatch.delitem(sys.modules, "spaces")
        importlib.reload(gpu_run)
        importlib.reload(sys.modules["ui.learn_tab"])
    assert not hasattr(gpu_run.decode_rounds, "zerogpu")  # off ZeroGPU: the plain function


def test_app_imports_spaces_support_before_gradio_and_torch():
    tree = ast.parse((ROOT / "app.py").read_text())
    imports = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    first = next(n for n in imports if not (isinstance(n, ast.ImportFrom) and n.module == "__future__"))
    assert isinstance(first, ast.ImportFrom) and first.module == "ui.zerogpu"


# ----------------------------------------------------------------------------------------------- sharing


def test_all_sessions_share_one_read_only_pair(tiny_pair, fast):
    """Two loaders and two sessions get the same pair object; decoding at once in threads changes no weight."""
    a, b = PairLoader(dtype="float32", device="cpu"), PairLoader(dtype="float32", device="cpu")
    ja, jb = a.request(PairRequest("tiny")), b.request(PairRequest("tiny"))
    assert ja.wait(60) and jb.wait(60)
    assert ja.pair is jb.pair is tiny_pair and a.request(PairRequest("tiny")) is ja
    before = {k: v.clone() for k, v in tiny_pair.target.state_dict().items()}
    pg = Playground(a, PairRequest("tiny"))
    results = {}

    def run(seed):
        out = last(guarded(pg.generate)(None, *controls(seed=seed)))
        results[seed] = (out[0], out[TEXT])

    threads = [threading.Thread(target=run, args=(s,)) for s in (1, 2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    for seed, (session, text) in results.items():
        assert session.decoder.pair is tiny_pair
        assert text == solo(tiny_pair, controls(seed=seed)).text
    after = tiny_pair.target.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_custom_draft_next_to_the_tiny_target_fails_with_a_message(tiny_pair, fast):
    loader = PairLoader(dtype="float32", device="cpu")
    job = loader.request(PairRequest("tiny", "", "no-org/no-model"))  # offline here: the hub cannot be asked
    assert job.wait(60) and job.state == "error"
    assert "no-org/no-model" in job.error and "Traceback" not in job.error


# ---------------------------------------------------------------------------------- drafter and γ policy


def test_drafter_and_policy_controls_reach_the_decoder(pg, tiny_pair):
    c = controls() + ["ngram", "heuristic"]
    out = last(guarded(pg.generate)(None, *c))
    session = out[0]
    assert "Done:" in out[STATUS]
    assert session.decoder.settings.drafter == "ngram" and session.decoder.settings.gamma_policy == "heuristic"
    assert all(r.drafter == "ngram" for r in session.rounds)
    assert out[RECORDED][0].settings.drafter == "ngram"
    # API callers that send only the first eleven controls get the draft model at a fixed γ
    assert last(guarded(pg.generate)(None, *controls()))[0].decoder.settings.drafter == "model"


def test_bad_drafter_choices_are_refused_with_a_message(pg):
    out = last(guarded(pg.generate)(None, *controls(), "oracle", "fixed"))
    assert "sd-status-error" in out[STATUS] and "drafter must be one of" in out[STATUS]
    out = last(guarded(pg.generate)(None, *controls(), "ngram", "confidence"))
    assert "sd-status-error" in out[STATUS] and "ngram drafter with the confidence gamma policy" in out[STATUS]


def test_an_unavailable_drafter_shows_the_engines_message(pg, monkeypatch):
    from specdec.core.errors import InvalidInputError

    def unavailable(*a, **k):
        raise InvalidInputError("the 'cross' drafter is not available yet")

    monkeypatch.setattr("specdec.loop.decoder.make_drafter", unavailable)
    out = last(guarded(pg.generate)(None, *controls(), "cross", "fixed"))
    assert "sd-status-error" in out[STATUS] and "not available yet" in out[STATUS]


# ------------------------------------------------------------------------------------------ Learn tab state


def test_learn_tab_consumers_take_the_playgrounds_records(pg):
    from ui.learn_tab import c_from_run, render_walkthrough, round_choices, update_speedup

    out = last(guarded(pg.generate)(None, *controls(max_new=40)))
    records = out[RECORDED]
    rec = records[0]
    keys = [v for _, v in round_choices(records)]
    assert keys[:3] == ["builtin:reject", "builtin:bonus", "builtin:tree"]
    assert keys[3:] == [f"run:{r.index}" for r in rec.rounds]
    assert f"Round {len(rec.rounds)}, after" in render_walkthrough(f"run:{len(rec.rounds) - 1}", 0, records)
    assert "gone" in render_walkthrough("run:999", 0, records)
    m = rec.metrics
    assert c_from_run(0.1, records) == round(min(1.0, m.c_plain), 2)  # the pair's timed c_plain wins
    fig, summary = update_speedup(0.2, records)
    assert "your last run" in summary and f"α = {m.alpha:.3f}" in summary
    assert any(t.name and "measured" in t.name for t in fig.data)
    assert c_from_run(0.1, []) == 0.1 and "No playground run" in update_speedup(0.2, [])[1]


def test_api_defaults_stay_the_documented_ones_while_the_page_opens_on_the_first_example():
    import app

    demo = app.build_demo(playground.Playground(loader_mod.PairLoader(dtype="float32", device="cpu"),
                                                loader_mod.PairRequest("tiny")))
    by_id = {b.elem_id: b for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    # gradio_client fills unsent inputs with the component's value: callers sending eleven controls get "model"
    assert by_id["sd-drafter"].value == "model" and by_id["sd-policy"].value == "fixed"
    first = app.load_examples()[0]
    assert first["drafter"] == "ngram" and by_id["sd-prompt"].value == first["prompt"]
    assert by_id["sd-gamma"].value == first["gamma"] and by_id["sd-temperature"].value == first["temperature"]


class Click:
    """What Gradio hands token_clicked: the page's trigger('click', {...}) payload as `_data`."""

    def __init__(self, **data):
        self._data = data


def test_token_clicks_overlap_and_the_newest_one_wins(pg):
    import app

    demo = app.build_demo(pg)
    by_id = {b.elem_id: b._id for b in demo.blocks.values() if getattr(b, "elem_id", None)}
    modes = {(b, ev): fn.trigger_mode for fn in demo.fns.values() for b, ev in fn.targets}
    # "once" would drop a click made while the previous click is answered: the chip lights, the chart stays put
    assert modes[(by_id["sd-tokens"], "click")] == modes[(by_id["sd-phases"], "click")] == "multiple"
    assert modes[(by_id["sd-step"], "click")] == "always_last"  # overlapping Steps could land out of order

    session = last(guarded(pg.generate)(None, *controls(max_new=40)))[0]
    assert len(session.rounds) >= 3 and session.rounds[1].gamma >= 1  # round one is a plain step, round two guesses
    title = lambda out: out[2].layout.title.text  # noqa: E731
    assert title(pg.token_clicked(session, Click(round=2, pos=0, seq=2))).startswith("Round 3, position 0")
    # an older click answered after the newer one changes nothing
    assert pg.token_clicked(session, Click(round=1, pos=1, seq=1)) == (gr.skip(),) * 3
    assert title(pg.token_clicked(session, Click(round=1, pos=1, seq=3))).startswith("Round 2, position 1")
    # API-style payloads without a number are answered as before
    assert title(pg.token_clicked(session, Click(round=0, pos=0))).startswith("Round 1, position 0")
