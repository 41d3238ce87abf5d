"""specdec playground: watch speculative decoding happen round by round.

Run `python app.py` and open http://localhost:7860. The server comes up at once and loads the model pair in a
background thread (the page shows its progress). Environment:

- GRADIO_SERVER_PORT (default 7860), GRADIO_SERVER_NAME (default 0.0.0.0)
- SPECDEC_PAIR: the preset loaded at startup and kept loaded (default: "default-int4" on a CPU with native bf16
  matmuls (AVX512-BF16 or AMX), the embedded Qwen2.5-Coder 1.5B target with its 0.5B draft in int4; "default",
  the same with an unquantized draft, on a GPU and on other CPUs, where it runs in float32; "tiny" is the
  random-weight test pair)
- SPECDEC_DTYPE / SPECDEC_DEVICE: passed to load_pair (default "auto")
- SPECDEC_CONCURRENCY: decoding events that may run at once across all sessions (default 2); every other event
  runs without a limit (they are cheap), the Learn tab's real-model check one at a time
- SPECDEC_PUBLIC=1: a public deployment: custom model ids must be hub ids (no local folders)
- SPECDEC_MAX_PARAMS: parameter cap per custom model, checked before download (default 4e9)
- SPECDEC_DETACHED=1: decode Generate runs the ZeroGPU way (set automatically on a ZeroGPU Space; see README)

API (gradio_client): /generate streams one update per round, /step runs one round, /run_to_end continues the
current run, /stop and /reset; all take the playground controls in the order of `control_inputs` below.
/import_trace takes a trace file and replays it, /export_trace returns the session's run as a trace file, /lab
runs the Learn tab's exactness lab.

This file is layout and wiring only: the engine lives in specdec/, rendering in components/, handlers in ui/.
"""

from __future__ import annotations

# First: on a ZeroGPU Space `spaces` must be imported before anything initializes CUDA.
from ui.zerogpu import zerogpu_active  # isort: skip  # noqa: F401

# Run as the app: start loading the startup pair now, so its weights load while the UI's imports run.
from ui.loader import detached_mode, env_loader, env_request  # isort: skip
LOADER = env_loader() if __name__ == "__main__" else None

import json
import os
from pathlib import Path

import gradio as gr

from components import empty_figure, render_legend, render_phases, render_stats, render_status
from specdec.models.pair import PAIRS
from specdec.prompts import GROUNDED
from specdec.core.settings import MAX_GAMMA
from specdec.io.trace import MAX_TRACE_BYTES
from ui.controls import (DRAFTER_INFO, POLICY_INFO, TREE_INFO, TREE_MODE_INFO, TREE_WIDTHS_DEFAULT, TREE_WIDTHS_INFO,
                         Number, Slider, drafter_choices, policy_choices, tree_mode_choices,
                         VERIFY_INFO, verify_choices)
from ui.learn_extras import server_metrics_file
from ui.server_compare import build_server_compare
from ui.batch_tab import build_batch_tab
from ui.learn_tab import build_learn_tab
from ui.race import build_race_tab
from ui.playground import Playground, guarded

ROOT = Path(__file__).resolve().parent
ASSETS = ROOT / "assets"
DEFAULTS = {"gamma": 4, "max_new_tokens": 64, "temperature": 0.7, "top_k": 0, "top_p": 1.0, "seed": 0}

# Clicking a token (in the token view or the round anatomy) points the p-vs-q chart at it; the clicks are numbered
# so the last one wins (see Playground.token_clicked).
TOKEN_CLICK_JS = """
element.addEventListener('click', (e) => {
  const chip = e.target.closest('.tok[data-r]');
  if (!chip) return;
  document.querySelectorAll('.tok.sel').forEach((t) => t.classList.remove('sel'));
  chip.classList.add('sel');
  window.__sdClicks = (window.__sdClicks || 0) + 1;
  trigger('click', {round: Number(chip.dataset.r), pos: Number(chip.dataset.p), seq: window.__sdClicks});
});
"""

HEADER = """
<div class="sd-title">
  <h1>specdec <span>playground</span></h1>
  <p>A small <b>draft</b> model guesses γ tokens; the large <b>target</b> model checks them all in one forward pass,
  keeps each guess with probability min(1, p/q), repairs the first rejection from max(0, p − q), and adds a bonus
  token when every guess passes. The output follows the target's distribution exactly.</p>
</div>
"""

KEYS_HINT = ('<div class="sd-keys">Keys (outside text fields): <kbd>S</kbd> step · <kbd>R</kbd> run to end · '
             "<kbd>Esc</kbd> stop</div>")


EXAMPLE_DEFAULTS = {"drafter": "model", "gamma": DEFAULTS["gamma"], "temperature": DEFAULTS["temperature"],
                    "prediction": ""}
EXAMPLES_NOTE = (
    "The grounded examples come first because they win here: the answer copies the prompt, so prompt lookup "
    "(the n-gram drafter: no draft model, drafting costs nothing) keeps long runs of guesses. The short story is "
    "the losing case on a CPU: free prose is hard to guess, and the 0.5B draft costs about 0.4 of a 1.5B target "
    "step, so at T = 0.7 it runs slower than plain decoding. The Race tab runs both side by side."
)


def load_examples() -> list[dict]:
    """The playground's examples: the grounded tasks (specdec.prompts, with the settings they are shown with)
    first, then assets/examples.json; each fills the prompt, chat mode, drafter, γ and temperature."""
    rows = GROUNDED + json.loads((ASSETS / "examples.json").read_text())
    return [{**EXAMPLE_DEFAULTS, **e} for e in rows]


def build_demo(pg: Playground) -> gr.Blocks:
    examples = load_examples()
    first = examples[0]
    # delete_cache: uploaded and exported traces (up to 20 MB each) are removed after a day, hourly checked
    with gr.Blocks(title="specdec · speculative decoding playground", delete_cache=(3600, 86400)) as demo:
        session = gr.State(None)  # this browser tab's Session (decoder + rendered rounds), created on first use
        recorded = gr.State([])  # the Learn tab's runs: a list of RunRecords, the run on screen first
        timer = gr.Timer(1.0, active=True)

        with gr.Row(elem_id="sd-header", equal_height=True):
            gr.HTML(HEADER, js_on_load=None, scale=3, min_width=320)
            model = gr.HTML(pg.model_badge(None), elem_id="sd-model-badge", js_on_load=None, scale=2, min_width=280)

        with gr.Tabs():
            with gr.Tab("Playground", id="playground"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=4, min_width=300, elem_id="sd-controls"):
                        prompt = gr.Textbox(first["prompt"], label="Prompt", lines=4, max_lines=14,
                                            elem_id="sd-prompt")
                        chat = gr.Checkbox(first["chat"], label="Chat mode (wrap the prompt in the chat template)",
                                           elem_id="sd-chat")
                        # Shown when the predicted drafter is chosen: the text the output is expected to be.
                        prediction = gr.Textbox(first["prediction"], label="Predicted output (the text you expect; "
                                                "it drafts)", lines=4, max_lines=14,
                                                visible=first["drafter"] == "predicted", elem_id="sd-prediction")
                        example_rows = [[e["prompt"], e["chat"], e["drafter"], e["gamma"], e["temperature"],
                                         e["prediction"]] for e in examples]
                        with gr.Row(elem_classes=["sd-buttons"]):
                            gen_btn = gr.Button("Generate", variant="primary", elem_id="sd-generate", min_width=90)
                            stop_btn = gr.Button("Stop", variant="stop", elem_id="sd-stop", min_width=90)
                        with gr.Row(elem_classes=["sd-buttons"]):
                            step_btn = gr.Button("Step", elem_id="sd-step", min_width=70)
                            run_btn = gr.Button("Run to end", elem_id="sd-run", min_width=90)
                            reset_btn = gr.Button("Reset", elem_id="sd-reset", min_width=70)
                        gr.HTML(KEYS_HINT, js_on_load=None)
                        with gr.Accordion("Decoding settings", open=True):
                            gamma = Slider(1, MAX_GAMMA, first["gamma"], step=1, precision=0,
                                           label="γ — draft tokens per round", elem_id="sd-gamma")
                            max_new = Slider(1, 512, DEFAULTS["max_new_tokens"], step=1, precision=0,
                                             label="Max new tokens", elem_id="sd-max-new")
                            temperature = Slider(0, 2, first["temperature"], step=0.05,
                                                 label="Temperature (0 = greedy)", elem_id="sd-temperature")
                            with gr.Row():
                                top_k = Number(DEFAULTS["top_k"], label="Top-k (0 = off)", precision=0, minimum=0,
                                               elem_id="sd-top-k", min_width=100)
                                seed = Number(DEFAULTS["seed"], label="Seed", precision=0, minimum=0,
                                              elem_id="sd-seed", min_width=100)
                            top_p = Slider(0.05, 1.0, DEFAULTS["top_p"], step=0.05, label="Top-p (1 = off)",
                                           elem_id="sd-top-p")
                            with gr.Row():
                                # "model" is the API default (callers that send the first eleven controls); the page
                                # switches to the first example's drafter when it loads (demo.load below)
                                drafter = gr.Dropdown(drafter_choices(), value="model", label="Drafter",
                                                      info=DRAFTER_INFO, elem_id="sd-drafter", min_width=140)
                                policy = gr.Dropdown(policy_choices(), value="fixed", label="γ policy",
                                                     info=POLICY_INFO, elem_id="sd-policy", min_width=140)
                            verify = gr.Dropdown(verify_choices(), value="pq", label="Verification", info=VERIFY_INFO,
                                                 elem_id="sd-verify")
                        with gr.Accordion("Token tree", open=False, elem_id="sd-tree-group"):
                            tree_on = gr.Checkbox(False, label="Draft a token tree each round", info=TREE_INFO,
                                                  elem_id="sd-tree-on")
                            with gr.Row():
                                tree_widths = gr.Textbox(TREE_WIDTHS_DEFAULT, label="Tree widths", max_lines=1,
                                                         info=TREE_WIDTHS_INFO, elem_id="sd-tree-widths",
                                                         min_width=140)
                                tree_mode = gr.Dropdown(tree_mode_choices(), value="top-k", label="Tree mode",
                                                        info=TREE_MODE_INFO, elem_id="sd-tree-mode", min_width=140)
                        gr.Examples(example_rows, inputs=[prompt, chat, drafter, gamma, temperature, prediction],
                                    example_labels=[e["label"] for e in examples], label="Example prompts")
                        gr.Markdown(EXAMPLES_NOTE, elem_id="sd-examples-note")
                        with gr.Accordion("Models", open=False):
                            pair = gr.Dropdown(list(PAIRS), label="Model pair (target + draft)",
                                               value=pg.startup.name if pg.startup.name in PAIRS else "default",
                                               info="tiny = random weights, for tests; hub pairs need internet access",
                                               elem_id="sd-pair")
                            target = gr.Textbox(label="Custom target (hub id or local folder)", elem_id="sd-target",
                                                placeholder="leave empty to use the pair's target")
                            draft = gr.Textbox(label="Custom draft (hub id or local folder)", elem_id="sd-draft",
                                               placeholder="leave empty to use the pair's draft")

                    with gr.Column(scale=8, min_width=300, elem_id="sd-main"):
                        status = gr.HTML(render_status("info", "Press Generate to stream a run, or Step (S) to go one "
                                                               "round at a time."),
                                         elem_id="sd-status", js_on_load=None)
                        gr.HTML(render_legend(), elem_id="sd-legend", js_on_load=None)
                        # The wrapper lives in the template so the value only grows as rounds arrive, and Gradio
                        # streams just the appended round instead of the whole view.
                        tokens = gr.HTML("", html_template='<div class="sd-tokens">${value}</div>',
                                         js_on_load=TOKEN_CLICK_JS, elem_id="sd-tokens", max_height=420,
                                         autoscroll=True)
                        # A tree run's latest round (or the one picked in the Round dropdown), drawn by depth.
                        tree_view = gr.HTML("", visible=False, elem_id="sd-tree-view", js_on_load=None)
                        tree_plot = gr.Plot(visible=False, show_label=False, elem_id="sd-tree-pq")
                        phases = gr.HTML(render_phases(None), js_on_load=TOKEN_CLICK_JS, elem_id="sd-phases")
                        stats = gr.HTML(render_stats(None), elem_id="sd-stats", js_on_load=None)
                        with gr.Row(equal_height=False):
                            with gr.Column(min_width=300):
                                with gr.Row():
                                    round_dd = gr.Dropdown([], label="Round", interactive=False, elem_id="sd-round",
                                                           min_width=140)
                                    pos_dd = gr.Dropdown([], label="Position", interactive=False, elem_id="sd-pos",
                                                         min_width=140)
                                pq_plot = gr.Plot(empty_figure("p vs q appears after the first round"),
                                                  show_label=False, elem_id="sd-pq")
                            with gr.Column(min_width=300):
                                speed_plot = gr.Plot(empty_figure("speedup appears after the first round"),
                                                     show_label=False, elem_id="sd-speed")
                        with gr.Row(equal_height=False):
                            with gr.Column(min_width=300, scale=3):
                                time_plot = gr.Plot(empty_figure("the time breakdown appears after the first round"),
                                                    show_label=False, elem_id="sd-time")
                            with gr.Column(min_width=260, scale=2):
                                hist_plot = gr.Plot(empty_figure("the acceptance histogram appears after the first round"),
                                                    show_label=False, elem_id="sd-hist")
                        text = gr.Textbox(label="Generated text", lines=3, max_lines=12, interactive=False,
                                          elem_id="sd-text")
                        with gr.Row(equal_height=False, elem_id="sd-trace"):
                            export_btn = gr.DownloadButton("Download trace (JSON)", value=None, interactive=False,
                                                           elem_id="sd-export", scale=1, min_width=200)
                            metrics_btn = gr.DownloadButton("Server metrics (JSON, vLLM shape)", value=None,
                                                            interactive=False, elem_id="sd-server-metrics", scale=1,
                                                            min_width=200)
                            trace_file = gr.File(label="Replay a trace (JSON) — no model needed",
                                                 file_types=[".json"], file_count="single", type="filepath",
                                                 height=130, elem_id="sd-import", scale=2, min_width=260)
                        build_server_compare(recorded)

            with gr.Tab("Learn", id="learn"):
                build_learn_tab(recorded, get_pair=pg.current_pair)
            with gr.Tab("Race", id="race"):
                build_race_tab(get_pair=pg.current_pair)
            with gr.Tab("Batch", id="batch"):
                build_batch_tab(get_pair=pg.current_pair, allow_run=not pg.detached)

        # ------------------------------------------------------------------------------------------ wiring
        # drafter, γ policy, prediction and the token tree last: gradio_client fills in their defaults for callers
        # that send the first eleven (raw HTTP calls send all eighteen)
        control_inputs = [prompt, chat, gamma, max_new, temperature, top_k, top_p, seed, pair, target, draft,
                          drafter, policy, prediction, tree_on, tree_widths, tree_mode, verify]
        drafter.change(lambda d: gr.update(visible=d == "predicted"), drafter, prediction, queue=False,
                       show_progress="hidden")
        outputs = [session, status, tokens, phases, stats, pq_plot, speed_plot, round_dd, pos_dd, text, recorded,
                   model, tree_view, tree_plot, time_plot, hist_plot]
        assert len(outputs) == len(Playground.OUTPUTS)
        decode = dict(outputs=outputs, show_progress="hidden", concurrency_id="decode",
                      concurrency_limit=int(os.environ.get("SPECDEC_CONCURRENCY", "2")))
        light = dict(show_progress="hidden", concurrency_limit=None)

        # Stopping is cooperative, not Gradio's `cancels`: every action bumps Session.run_id and a running stream
        # ends at its next round boundary, rendering Stop/Reset itself (see Playground.interrupted). Cancelling
        # the task instead left the in-flight round running anyway and marked the outputs as errored.
        gen_btn.click(guarded(pg.generate), [session, *control_inputs], api_name="generate", **decode)
        run_btn.click(guarded(pg.run_to_end), [session, *control_inputs], api_name="run_to_end", **decode)
        # "always_last": a press while a Step runs queues one more Step, which starts when that one's updates have
        # landed. Overlapping Steps ("multiple") raced in the browser: Gradio re-sends a generator's last output
        # when it ends and applies two events' updates concurrently, so an earlier Step's view could land after a
        # later one's and take the page back a round.
        step_btn.click(guarded(pg.step), [session, *control_inputs], api_name="step", trigger_mode="always_last",
                       **decode)
        stop_btn.click(guarded(pg.stop), [session], outputs, api_name="stop", **light)
        reset_btn.click(guarded(pg.reset), [session], outputs, api_name="reset", **light)

        # Traces: every run, step, stop or replay that ends updates `recorded`, and the browser then asks for the
        # session's trace file, so the download button always holds the run on screen. API callers (no browser,
        # so no change events) call /export_trace themselves.
        trace_limit = dict(show_progress="hidden", concurrency_id="trace", concurrency_limit=2)
        # After each upload the drop zone empties again (the status says what was loaded), ready for the next file.
        trace_file.upload(guarded(pg.import_trace), [session, trace_file], outputs, api_name="import_trace",
                          **trace_limit).then(lambda: None, None, [trace_file], api_visibility="private", **light)
        recorded.change(guarded(pg.export_trace, 1), [session], [export_btn], api_name="export_trace",
                        **trace_limit).then(lambda path: gr.DownloadButton(interactive=path is not None), [export_btn],
                                            [export_btn], api_visibility="private", **light)
        # The same run's acceptance counters as vLLM reports them (docs/metrics.md, "Server metrics").
        recorded.change(server_metrics_file, [recorded], [metrics_btn], api_visibility="private",
                        **trace_limit).then(lambda path: gr.DownloadButton(interactive=path is not None),
                                            [metrics_btn], [metrics_btn], api_visibility="private", **light)

        chart = [round_dd, pos_dd, pq_plot]
        clicks = dict(api_visibility="private", trigger_mode="multiple", **light)  # the last click wins
        tokens.click(guarded(pg.token_clicked, 3), [session], chart, **clicks)
        phases.click(guarded(pg.token_clicked, 3), [session], chart, **clicks)
        round_dd.input(guarded(pg.select_round, 3), [session, round_dd], chart, api_visibility="private", **light)
        pos_dd.input(guarded(pg.select, 3), [session, round_dd, pos_dd], chart, api_visibility="private", **light)
        round_dd.input(guarded(pg.select_tree, 2), [session, round_dd], [tree_view, tree_plot],
                       api_visibility="private", **light)
        # The switch shows the tree panel (its placeholder until the first tree round) or hides it.
        tree_on.change(lambda on: (gr.update(visible=bool(on)), gr.update(visible=bool(on))), tree_on,
                       [tree_view, tree_plot], queue=False, show_progress="hidden", api_visibility="private")

        timer.tick(pg.model_tick, [pair, target, draft], [model, timer], api_visibility="private", **light)
        demo.load(pg.model_tick, [pair, target, draft], [model, timer], api_visibility="private", **light)
        demo.load(lambda: first["drafter"], None, [drafter], api_visibility="private", **light)
        pair.input(pg.preload, [pair], [model, timer], api_visibility="private", **light)
    return demo


def theme() -> gr.Theme:
    # System fonts only: the app must work offline, and Google-hosted theme fonts would stall on every load.
    return gr.themes.Soft(
        primary_hue="indigo",
        neutral_hue="slate",
        font=["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"],
        font_mono=["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"],
    )


def main() -> None:
    # On ZeroGPU each Generate run is decoded inside one GPU call (ui/gpu_run.py); the main process only loads.
    loader = LOADER or env_loader()  # the startup pair is loading in the background already
    pg = Playground(loader, env_request(), detached=detached_mode(), allow_local=loader.allow_local)
    demo = build_demo(pg)
    demo.queue(default_concurrency_limit=int(os.environ.get("SPECDEC_CONCURRENCY", "2")))
    demo.launch(
        prevent_thread_lock=True,
        server_name=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        # uploads are trace files: refuse anything far past the trace limit before it is stored
        max_file_size=MAX_TRACE_BYTES + 5 * 2**20,
        theme=theme(),
        css_paths=[ASSETS / "style.css", ASSETS / "tree.css"],
        head=f"<script>{(ASSETS / 'app.js').read_text()}</script>",
        # Gradio's run history copies every streamed update into the browser's localStorage (read, parse,
        # re-serialize the last 100 runs, twice a second): a playground run streams ~570 KB, so that work grew with
        # each run (42 ms of setItem in the first run, 572 ms in the fifth) on cores the decoding shares. A run's
        # record is the trace export (Save trace), not the browser's storage.
        run_history=False,
    )
    loader.quiet.set()
    demo.block_thread()


if __name__ == "__main__":
    main()
