"""Learn-tab sections for the bug zoo (in the exactness lab and the real-model check) and the measured break-even
map: layout and event wiring only. Math in specdec/learn/zoo.py and specdec/learn/breakeven.py, drawing in components/zoo.py
and components/breakeven.py.

ui/learn_tab.py calls `build_zoo_lab`, `build_zoo_real` and `build_breakeven` inside its sections, passing the
components they share (the editor, N, seed, the real-model prefix and warp).
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import gradio as gr

from components import breakeven as be_view
from components import zoo as zoo_view
from components.learn import message_html
from specdec.learn import breakeven
from specdec.learn import lab
from specdec.io import server_metrics
from specdec.learn import zoo
from specdec.core.errors import SpecDecError
from specdec.core.record import RunRecord
from specdec.core.sampling import SamplingConfig
from ui.zerogpu import gpu

from .trace_io import trace_dir

DEFAULT_KEY = "greedy-draft"
_SOURCES: dict[int, Callable] = globals().get("_SOURCES", {})  # get_pair per Learn tab (see learn_tab._PAIR_SOURCES)
_logits_cache: dict[tuple, lab.FirstTokenLogits] = {}
_cache_lock = threading.Lock()


def _whole(value, name: str, lo: int, hi: int) -> int:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise lab.LabInputError(f"{name} must be a whole number, got {value!r}") from None
    if v != int(v) or not lo <= v <= hi:
        raise lab.LabInputError(f"{name} must be a whole number from {lo:,} to {hi:,}, got {value:g}")
    return int(v)


def _editor_rows(n_tokens, cells) -> lab.HundredPoints:
    k = max(lab.MIN_TOKENS, min(lab.MAX_TOKENS, int(n_tokens or lab.MIN_TOKENS)))
    m = lab.MAX_TOKENS
    toks, ps, qs = cells[:m], cells[m: 2 * m], cells[2 * m:]
    return lab.hundred_points(list(ps[:k]), list(qs[:k]), list(toks[:k]))


# ------------------------------------------------------------------------------------------- lab zoo


def run_zoo_lab(key, n, seed, n_tokens, *cells):
    """One zoo entry on the editor's p and q: chart + verdict."""
    try:
        hp = _editor_rows(n_tokens, cells)
        res = zoo.run_zoo_lab(hp, zoo.check_key(key), _whole(n, "N (rounds)", 1, lab.MAX_LAB_ROUNDS),
                              _whole(seed, "seed", 0, 2**31 - 1))
    except SpecDecError as exc:
        return gr.update(), message_html(str(exc), "error")
    return gr.update(value=zoo_view.zoo_figure(res), visible=True), zoo_view.zoo_result_html(res)


def run_zoo_lab_all(n, seed, n_tokens, *cells):
    """Every entry at the same N, as one table."""
    try:
        hp = _editor_rows(n_tokens, cells)
        rounds = _whole(n, "N (rounds)", 1, lab.MAX_LAB_ROUNDS)
        s = _whole(seed, "seed", 0, 2**31 - 1)
        results = [zoo.run_zoo_lab(hp, key, rounds, s) for key in zoo.ENTRIES]
    except SpecDecError as exc:
        return message_html(str(exc), "error")
    return zoo_view.zoo_table_html(results)


def build_zoo_lab(editor: Sequence, lab_n, lab_seed) -> None:
    """The zoo selector under the exactness lab; uses the lab's editor rows, N and seed."""
    gr.Markdown(
        "#### Bug zoo: mistakes real libraries shipped\nEach entry rebuilds one published exactness bug on the p and q "
        "above (read as the models' temperature-1 distributions; some bugs need a warp, which the entry applies) and "
        "runs it through the same `verify_batch`. The chart shows where the wrong mass goes; the verdict says "
        "whether the chi-square test can see it at this N, and if not, which N would.",
        elem_classes=["learn-intro"])
    with gr.Column(elem_id="learn-zoo-section"):
        with gr.Row(equal_height=True):
            key = gr.Dropdown(zoo_view.ZOO_CHOICES, value=DEFAULT_KEY, label="construction", scale=4,
                              elem_id="learn-zoo-key")
            run = gr.Button("Run this one", variant="primary", elem_id="learn-zoo-run", scale=1, min_width=120)
            run_all = gr.Button("Run every entry", elem_id="learn-zoo-all", scale=1, min_width=140)
        plot = gr.Plot(show_label=False, visible=False, elem_id="learn-zoo-plot")
        out = gr.HTML(message_html("Pick a construction and press “Run this one”, or run every entry at once.",
                                   "info"), elem_id="learn-zoo-result")
        table = gr.HTML("", elem_id="learn-zoo-table")
    inputs = [key, lab_n, lab_seed, *editor]
    opts = dict(concurrency_id="learn-lab", show_progress="minimal")
    run.click(run_zoo_lab, inputs, [plot, out], api_name="zoo_lab", **opts)
    key.input(run_zoo_lab, inputs, [plot, out], **opts)
    run_all.click(run_zoo_lab_all, [lab_n, lab_seed, *editor], table, api_name="zoo_lab_all", **opts)


# ------------------------------------------------------------------------------------------ real zoo


def _logits(pair, prefix: str) -> lab.FirstTokenLogits:
    """The raw logits at a prefix, cached per pair and prefix (switching entries reuses them)."""
    k = (id(pair), prefix)
    with _cache_lock:
        hit = _logits_cache.get(k)
    if hit is None:
        hit = lab.first_token_logits(pair, prefix)
        with _cache_lock:
            if len(_logits_cache) > 8:
                _logits_cache.clear()
            _logits_cache[k] = hit
    return hit


def run_zoo_real(get_pair, key, prefix, temperature, top_k, top_p, n, seed):
    pair = get_pair()
    if pair is None:
        return gr.update(), message_html("The models are still loading; try again in a moment.", "warn")
    try:
        cfg = SamplingConfig(float(temperature), _whole(top_k, "top-k", 0, 10**6), float(top_p)).validate()
        logits = _logits(pair, prefix)
        res = zoo.run_zoo_real(logits, zoo.check_key(key), cfg, _whole(n, "N (vectorized rounds)", 1,
                                                                        lab.MAX_LAB_ROUNDS),
                               _whole(seed, "seed", 0, 2**31 - 1), decode=lambda i: pair.tokenizer.decode([i]))
    except SpecDecError as exc:
        return gr.update(), message_html(str(exc), "error")
    head = message_html(f"Real rows at your prefix ({len(logits.prompt_ids)} tokens): the target's and the draft's "
                        "logits from the engine's own code, rebuilt the way this construction builds them.", "info")
    return gr.update(value=zoo_view.zoo_figure(res), visible=True), head + zoo_view.zoo_result_html(res)


@gpu(duration=60)
def run_zoo_real_gpu(source: int, *args):
    return run_zoo_real(_SOURCES[source], *args)


def build_zoo_real(get_pair: Callable, prefix, temp, top_k, top_p, real_n, real_seed) -> None:
    """The zoo selector under the real-model check; uses its prefix, warp, N and seed."""
    source = len(_SOURCES)
    _SOURCES[source] = get_pair
    gr.Markdown("#### Bug zoo on the real models\nThe same constructions on the real first-token rows at your "
                "prefix, with the warp above (an entry that needs a warp you turned off switches it on and says so).",
                elem_classes=["learn-intro"])
    with gr.Column(elem_id="learn-zoo-real-section"):
        with gr.Row(equal_height=True):
            key = gr.Dropdown(zoo_view.ZOO_REAL_CHOICES, value=DEFAULT_KEY, label="construction", scale=4,
                              elem_id="learn-zoo-real-key")
            run = gr.Button("Run on the real rows", variant="primary", elem_id="learn-zoo-real-run", scale=1,
                            min_width=160)
        plot = gr.Plot(show_label=False, visible=False, elem_id="learn-zoo-real-plot")
        out = gr.HTML("", elem_id="learn-zoo-real-result")

    def handler(*args):
        return run_zoo_real_gpu(source, *args)

    inputs = [key, prefix, temp, top_k, top_p, real_n, real_seed]
    run.click(handler, inputs, [plot, out], concurrency_id="learn-real", concurrency_limit=1, api_name="zoo_real")


# ------------------------------------------------------------------------------------------ break-even


def _runs(costs, records) -> list[breakeven.PlacedRun]:
    return breakeven.place_runs(costs, list(records or [])) if costs is not None else []


def render_breakeven(costs, drafter, records):
    if costs is None:
        return be_view.breakeven_figure(None, drafter or "model"), ""
    runs = _runs(costs, records)
    d = drafter if drafter in costs.draft_ms else next(iter(costs.draft_ms), "model")
    return be_view.breakeven_figure(costs, d, runs), be_view.costs_html(costs) + be_view.advice_html(costs, d, runs)


def measure(get_pair, drafter, records, progress=gr.Progress()):
    pair = get_pair()
    if pair is None:
        return (None, gr.update(), gr.update(),
                message_html("The models are still loading; try again in a moment.", "warn"))
    try:
        costs = breakeven.measure_costs(pair, records, progress=lambda f, m: progress(f, desc=m))
    except SpecDecError as exc:
        return None, gr.update(), gr.update(), message_html(str(exc), "error")
    choices = be_view.drafter_choices(costs)
    d = drafter if drafter in costs.draft_ms else choices[0][1]
    fig, text = render_breakeven(costs, d, records)
    return costs, gr.update(choices=choices, value=d), fig, text


def build_breakeven(recorded: gr.State, get_pair: Callable) -> None:
    """Section: measure the loaded pair's costs on demand, draw the map, place the user's runs."""
    gr.Markdown(
        "### 6. Break-even on this machine\nTimes the loaded pair here: one target pass over k = 1…16 new tokens "
        "with a KV cache of your last run's text (or a built-in code snippet), and each drafter's cost per guess. "
        "From those numbers alone it predicts the speedup for every acceptance rate α and draft length γ; the "
        "dashed line is break-even, left of it speculation is slower than plain decoding. Your runs land on it "
        "with their own α and mean γ.")
    costs = gr.State(None)
    with gr.Column(elem_id="learn-be-section"):
        with gr.Row(equal_height=True):
            measure_btn = gr.Button("Measure this machine", variant="primary", elem_id="learn-be-measure",
                                    scale=1, min_width=180)
            drafter = gr.Dropdown(be_view.drafter_choices(None), value="model", label="drafter on the map",
                                  elem_id="learn-be-drafter", scale=2)
            place = gr.Button("Place my runs", elem_id="learn-be-place", scale=1, min_width=140)
        plot = gr.Plot(be_view.breakeven_figure(None, "model"), show_label=False, elem_id="learn-be-plot")
        out = gr.HTML("", elem_id="learn-be-result")

    def on_measure(d, records, progress=gr.Progress()):
        return measure(get_pair, d, records, progress)

    measure_btn.click(on_measure, [drafter, recorded], [costs, drafter, plot, out], concurrency_id="learn-be",
                      concurrency_limit=1, api_name="breakeven")
    place.click(render_breakeven, [costs, drafter, recorded], [plot, out], show_progress="hidden")
    drafter.input(render_breakeven, [costs, drafter, recorded], [plot, out], show_progress="hidden")
    recorded.change(render_breakeven, [costs, drafter, recorded], [plot, out], show_progress="hidden")


def zoo_css() -> str:
    return f"<style>{zoo_view.ZOO_CSS}</style>"


__all__ = ["build_breakeven", "build_zoo_lab", "build_zoo_real", "server_metrics_file", "zoo_css"]


def server_metrics_file(records: Sequence[RunRecord] | None) -> str | None:
    """The run on screen (the first record) as a vLLM-shaped metrics file for the download button; None without one
    (docs/metrics.md, "Server metrics")."""
    if not records or not records[0].rounds:
        return None
    return str(server_metrics.write_file(records[0], trace_dir()))
