"""The Batch tab: latency vs throughput of batched speculative decoding. Layout and handlers only; the loop is in
specdec/loop/batched.py, the measurement in specdec/bench/batch.py, drawing in components/batch.py.

app.py calls `build_batch_tab(get_pair=...)` inside `with gr.Tab("Batch"):`. `get_pair` returns the loaded
ModelPair, None while it is still loading, or raises if loading failed. `allow_run=False` (e.g. on ZeroGPU, where a
multi-minute benchmark does not fit one GPU call) leaves only loading a bench JSON.
"""

from __future__ import annotations

import html
import json
import tempfile
from typing import Callable

import gradio as gr

from components import batch as view
from specdec.bench.batch import DEFAULT_BATCHES, MODES, format_table, load_result, parse_loops, run_batches
from specdec.core.errors import InvalidInputError, SpecDecError, whole_number
from specdec.models.pair import pair_lease

INTRO = """
**Speculative decoding buys latency with compute.** At batch size 1 the target model mostly waits for its weights
to arrive from memory, so scoring γ+1 tokens costs about one step and the draft's guesses are nearly free. With B
requests in a batch the machine becomes compute-bound: the verification pass scores B×(γ+1) tokens and pays for
every one, and the batch moves at the pace of its least-accepted row. This tab measures both loops — plain batched
decoding and the batched speculative loop, same prompts, same padding — for several batch sizes on this machine,
and draws the prediction from the measured pass costs beside the measurement. The **ragged** loop runs the same
batch the way servers do: every row commits its own accepted guesses plus its own repair or bonus token, so no row
waits for the slowest; with a **scheduled γ** it picks the draft length per batch size from the measured pass
costs and turns speculation off where it stops paying.
"""

RUN_NOTE = ("On a 2-core CPU the default pair takes minutes for the full sweep; a few batch sizes with 16 tokens "
            "take about a minute. `python -m specdec bench --batch 1,2,4,8,16` writes the same JSON from the "
            "command line.")


def _status(msg: str, kind: str = "info") -> str:
    colors = {"info": "var(--sd-draft-bd, #60a5fa)", "ok": "var(--sd-acc-bd, #16a34a)",
              "warn": "var(--sd-rep-bd, #f59e0b)", "error": "var(--sd-rej-bd, #dc2626)"}
    return (f"<div class='sdb-status' data-kind='{kind}' style='border-left: 4px solid {colors[kind]}; "
            f"padding: 6px 10px'>{html.escape(msg)}</div>")


def views(result: dict) -> tuple:
    """Everything the tab draws from one benchmark result."""
    ex = result.get("example") or {}
    return (view.batch_figure(result), view.crossover_reading(result), view.cost_figure(result),
            view.render_both_views(ex), format_table(result))


def loop_views(result: dict) -> tuple:
    """The loops side by side: throughput and p90 latency per loop, and each request's pace in lockstep and ragged."""
    return view.loop_figure(result), view.pace_figure(result.get("example"))


def _example_caption(result: dict) -> str:
    ex = result.get("example") or {}
    if not ex:
        return ""
    return (f"Batch view: the speculative run at B = {ex['batch']} ({view.MODE_LABEL.get(ex['mode'], ex['mode'])}, "
            f"γ = {ex['gamma']}), round by round.")


def _save(result: dict) -> str:
    with tempfile.NamedTemporaryFile("w", suffix="-batch.json", delete=False) as fh:
        json.dump(result, fh, indent=2)
    return fh.name


def check_inputs(batches, modes, gamma, max_new) -> tuple[list[int], list[str], int, int]:
    """The tab's controls as the benchmark takes them; a clear message for anything it cannot run."""
    if not isinstance(batches or [], (list, tuple)) or not isinstance(modes or [], (list, tuple)):
        raise InvalidInputError("batch sizes and sampling modes must be lists, e.g. ['1', '4'] and ['greedy']")
    try:
        bs = sorted({int(b) for b in (batches or [])})
    except (TypeError, ValueError):
        raise InvalidInputError("batch sizes must be whole numbers") from None
    if not bs:
        raise InvalidInputError("choose at least one batch size")
    if any(not 1 <= b <= max(DEFAULT_BATCHES) for b in bs):
        raise InvalidInputError(f"batch sizes must be from 1 to {max(DEFAULT_BATCHES)}")
    ms = [m for m in (modes or []) if m in MODES]
    if not ms:
        raise InvalidInputError("choose greedy, T = 0.7 sampling, or both")
    g = whole_number(gamma, "γ", 1, 8, integral_floats=True)
    n = whole_number(max_new, "new tokens per request", 2, 128, integral_floats=True)
    return bs, ms, g, n


DEFAULT_LOOPS = ["lockstep", "ragged"]


def run_handler(get_pair: Callable) -> Callable:
    def run(batches, modes, gamma, max_new, loops=None, progress=gr.Progress()):
        skip = (gr.skip(),) * 8
        try:
            bs, ms, g, n = check_inputs(batches, modes, gamma, max_new)
            lp = parse_loops(loops if loops is not None else DEFAULT_LOOPS)
            pair = get_pair()
            if pair is None:
                return (_status("The models are still loading; press Run again once they are ready.", "warn"),
                        *skip)
            with pair_lease(pair):
                result = run_batches(pair, bs, ms, g, n, repeats=1, log=lambda m: None,
                                     progress=lambda f, d: progress(f, desc=d), loops=lp)
        except SpecDecError as exc:
            return (_status(str(exc), "error"), *skip)
        fig, reading, cost, batch_html, table = views(result)
        return (_status(f"Measured in {result['seconds']:.0f} s on {result['device']}. " + _example_caption(result),
                        "ok"), fig, reading, cost, batch_html, table, _save(result), *loop_views(result))

    return run


def load_handler(path):
    skip = (gr.skip(),) * 8
    if not path:
        return (gr.skip(), *skip)
    try:
        result = load_result(path)
        fig, reading, cost, batch_html, table = views(result)
    except SpecDecError as exc:
        return (_status(str(exc), "error"), *skip)
    except (KeyError, TypeError, ValueError) as exc:  # a file that parses but lacks fields
        return (_status(f"this batch benchmark file is incomplete or from another version ({exc})", "error"), *skip)
    return (_status("Loaded. " + _example_caption(result), "ok"), fig, reading, cost, batch_html, table, gr.skip(),
            *loop_views(result))


def build_batch_tab(get_pair: Callable, allow_run: bool = True) -> dict:
    """Lay out the tab inside the caller's `gr.Tab` and wire it; returns the components by name (for tests)."""
    gr.Markdown(INTRO, elem_id="sdb-intro")
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=260):
            batches = gr.CheckboxGroup([str(b) for b in DEFAULT_BATCHES], value=["1", "2", "4", "8"],
                                       label="Batch sizes B", elem_id="sdb-batches")
            modes = gr.CheckboxGroup([("greedy", "greedy"), ("T = 0.7", "sampled")], value=["greedy"],
                                     label="Sampling", elem_id="sdb-modes")
            gamma = gr.Slider(1, 8, 4, step=1, label="γ — draft tokens per round", elem_id="sdb-gamma")
            max_new = gr.Slider(2, 128, 16, step=1, label="New tokens per request", elem_id="sdb-max-new")
            loops = gr.CheckboxGroup([("lockstep", "lockstep"), ("ragged", "ragged"),
                                      ("ragged, γ scheduled by B", "scheduled")], value=DEFAULT_LOOPS,
                                     label="Speculative loops (beside plain)", elem_id="sdb-loops")
            run_btn = gr.Button("Run on this machine", variant="primary", elem_id="sdb-run", visible=allow_run)
            gr.Markdown(RUN_NOTE if allow_run else "Runs are off here; load a JSON from `python -m specdec bench "
                        "--batch 1,2,4,8,16`.", elem_id="sdb-note")
            upload = gr.File(label="…or load a bench JSON", file_types=[".json"], type="filepath", height=110,
                             elem_id="sdb-upload")
            download = gr.File(label="This run as JSON", interactive=False, height=90, elem_id="sdb-download")
        with gr.Column(scale=3, min_width=320):
            status = gr.HTML(_status("Run the measurement, or load a bench JSON."), elem_id="sdb-status")
            fig = gr.Plot(view.batch_figure(None), show_label=False, elem_id="sdb-figure")
            reading = gr.HTML(view.crossover_reading(None), css_template=view.BATCH_CSS, elem_id="sdb-reading")
            batch_html = gr.HTML(view.render_batch_view(None), css_template=view.BATCH_CSS, elem_id="sdb-view")
            loop_fig = gr.Plot(view.loop_figure(None), show_label=False, elem_id="sdb-loop-figure")
            pace = gr.Plot(view.pace_figure(None), show_label=False, elem_id="sdb-pace")
            cost = gr.Plot(view.cost_figure(None), show_label=False, elem_id="sdb-cost")
            with gr.Accordion("Table", open=False):
                table = gr.Code("", language=None, elem_id="sdb-table", show_label=False)
    outputs = [status, fig, reading, cost, batch_html, table, download, loop_fig, pace]
    run_btn.click(run_handler(get_pair), [batches, modes, gamma, max_new, loops], outputs, api_name="batch_bench",
                  concurrency_id="batch", concurrency_limit=1, show_progress="full")
    upload.upload(load_handler, [upload], outputs, api_name="batch_load", show_progress="hidden")
    return {"status": status, "figure": fig, "reading": reading, "cost": cost, "view": batch_html, "table": table,
            "run": run_btn, "upload": upload, "download": download, "batches": batches, "modes": modes,
            "gamma": gamma, "max_new": max_new, "loops": loops, "loop_figure": loop_fig, "pace": pace}
