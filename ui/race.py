"""The Race tab: layout, wiring and its handler. The engine is specdec/loop/race.py, the drawing components/race.py.

app.py calls `build_race_tab(get_pair=...)` inside `with gr.Tab("Race")`; `get_pair` returns the loaded ModelPair,
None while it is still loading, or raises if loading failed. The Run race button is also the API endpoint /race:
(prompt, chat, lanes, max_new_tokens, temperature, seed) -> a stream of (lanes HTML, chart, JSON summary).
"""

from __future__ import annotations

import math
import os
import sys
import time
import traceback
from typing import Callable

import gradio as gr

from components.race import race_figure, render_race
from specdec.core.settings import DecodeSettings
from specdec.prompts import GROUNDED
from specdec.core.errors import InvalidInputError, SpecDecError, whole_number
from specdec.loop.race import Race, parse_lanes
from specdec.core.sampling import SamplingConfig

from .playground import CHART_INTERVAL_S

DEFAULT_LANES = "model:4, ngram:32"
LANE_PRESETS = {
    "draft model vs prompt lookup": "model:4, ngram:32",
    "every drafter": "model:4, ngram:32, early-exit:3, cross:4",
    "prompt lookup: γ 8 vs 32 vs adaptive": "ngram:8, ngram:32, ngram:expected",
    "draft model: γ policies": "model:4, model:heuristic, model:confidence, model:expected",
    "chains vs token trees": "model:4, model:tree321, ngram:32, ngram:tree4111",
}
EXAMPLES = GROUNDED + [
    {"label": "Code · Python function", "chat": False,
     "prompt": "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number, computed iteratively.\"\"\"\n"},
    {"label": "Prose · continue a sentence (little to copy)", "chat": False,
     "prompt": "The old lighthouse keeper climbed the spiral stairs one last time. At the top, he"},
]
MIN_UPDATE_S = 0.15  # at most ~7 screen updates a second; the final state is always sent
LOAD_TIMEOUT_S = 600.0


def _whole(value, name: str, lo: int, hi: int) -> int:
    return whole_number(value, name, lo, hi, integral_floats=True)


def race_settings(chat, max_new_tokens, temperature, seed) -> DecodeSettings:
    """Checked settings from the tab's (or an API caller's) raw values."""
    if not isinstance(temperature, (int, float)) or isinstance(temperature, bool) or not math.isfinite(temperature):
        raise InvalidInputError(f"temperature must be a number from 0 to 2, got {temperature!r}")
    return DecodeSettings(max_new_tokens=_whole(max_new_tokens, "max new tokens", 1, 512),
                          sampling=SamplingConfig(temperature=float(temperature)),
                          seed=_whole(seed, "seed", 0, 2**63 - 1), chat=bool(chat)).validate()


def run_race(get_pair: Callable, prompt, chat, lanes, max_new_tokens, temperature, seed):
    """Stream the race: (HTML, figure, summary) after each step, throttled; errors become a message."""
    try:
        settings = race_settings(chat, max_new_tokens, temperature, seed)
        specs = parse_lanes(lanes)
        if not isinstance(prompt, str) or not prompt.strip():
            raise InvalidInputError("the prompt is empty; type some text or pick an example")
        pair, deadline = None, time.time() + LOAD_TIMEOUT_S
        while pair is None:
            pair = get_pair()
            if pair is None:
                if time.time() > deadline:
                    raise InvalidInputError("the model pair is still loading; try again in a minute")
                yield render_race(None, "Loading the model pair…"), gr.skip(), gr.skip()
                time.sleep(1.0)
        setting_up = "Setting up the lanes (the first cross lane loads its draft model)…"
        yield render_race(None, setting_up), gr.skip(), gr.skip()
        race = Race(pair, prompt, settings, specs)
        last, last_chart = 0.0, -math.inf
        for _ in race:
            now = time.perf_counter()
            if now - last >= MIN_UPDATE_S and not race.done:
                last = now
                view = race.view()
                chart = gr.skip()  # the page rebuilds a chart from scratch: redrawn as seldom as the playground's
                if now - last_chart >= CHART_INTERVAL_S:
                    last_chart, chart = now, race_figure(view)
                yield render_race(view), chart, race.summary()
        view = race.view()
        yield render_race(view), race_figure(view), race.summary()
    except Exception as exc:  # noqa: BLE001 - a message, never a traceback (logged when it is not ours)
        if not isinstance(exc, SpecDecError):
            traceback.print_exc(file=sys.stderr)
        message = str(exc) if isinstance(exc, SpecDecError) else f"Unexpected error ({type(exc).__name__}): {exc}"
        yield render_race(None, f"⚠ {message}"), gr.skip(), {"error": message}


def build_race_tab(get_pair: Callable) -> None:
    first = EXAMPLES[0]
    gr.HTML("<p style='margin:4px 0 8px'>Plain target decoding and speculative lanes on the same prompt, settings "
            "and seed, taking turns one step each in this process, so every lane sees the same load. Each lane's "
            "speedup is against the plain lane of this race.</p>", js_on_load=None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=4, min_width=300):
            prompt = gr.Textbox(first["prompt"], label="Prompt", lines=6, max_lines=16, elem_id="race-prompt")
            chat = gr.Checkbox(first["chat"], label="Chat mode (wrap the prompt in the chat template)",
                               elem_id="race-chat")
            gr.Examples([[e["prompt"], e["chat"]] for e in EXAMPLES], inputs=[prompt, chat],
                        example_labels=[e["label"] for e in EXAMPLES], label="Example prompts")
            lanes = gr.Textbox(DEFAULT_LANES, label="Speculative lanes (the plain lane is always in)",
                               info="drafter[:γ][:policy][:rule], comma-separated; drafters: model, ngram, "
                                    "early-exit, cross, auto, suffix; policies: fixed, heuristic, confidence, "
                                    "expected; rules: pq, strict, block; a token tree: model:tree321 (children per "
                                    "node at each depth; model, ngram or suffix)",
                               elem_id="race-lanes")
            preset = gr.Dropdown(list(LANE_PRESETS), value=None, label="Lane presets", elem_id="race-presets")
            max_new = gr.Slider(8, 256, 64, step=1, label="Max new tokens", elem_id="race-max-new")
            temperature = gr.Slider(0, 2, 0, step=0.05, label="Temperature (0 = greedy)", elem_id="race-temperature")
            seed = gr.Number(0, label="Seed", precision=0, minimum=0, elem_id="race-seed")
            run = gr.Button("Run race", variant="primary", elem_id="race-run")
        with gr.Column(scale=8, min_width=300):
            view = gr.HTML(render_race(None), elem_id="race-view", js_on_load=None)
            plot = gr.Plot(race_figure(None), show_label=False, elem_id="race-plot")
            with gr.Accordion("Results (JSON)", open=False):
                summary = gr.JSON(label="Race summary", elem_id="race-summary")

    preset.input(lambda name: LANE_PRESETS.get(name, DEFAULT_LANES), [preset], [lanes], api_visibility="private",
                 show_progress="hidden", concurrency_limit=None)

    def handler(prompt_, chat_, lanes_, max_new_, temperature_, seed_):
        yield from run_race(get_pair, prompt_, chat_, lanes_, max_new_, temperature_, seed_)

    run.click(handler, [prompt, chat, lanes, max_new, temperature, seed], [view, plot, summary], api_name="race",
              show_progress="hidden", concurrency_id="decode",
              concurrency_limit=int(os.environ.get("SPECDEC_CONCURRENCY", "2")))
