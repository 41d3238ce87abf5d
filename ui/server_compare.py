"""The playground's "Compare with a vLLM server" box: a pasted /metrics scrape beside the run on screen."""

from __future__ import annotations

import gradio as gr

from components.charts import server_comparison_figure
from components.style import empty_figure
from specdec.core.errors import InvalidInputError
from specdec.io import server_metrics

PLACEHOLDER = ("# paste the output of: curl http://<vllm-host>:8000/metrics\n"
               "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"...\"} 1200.0\n...")


def compare_scrape(text, records) -> tuple:
    """(figure, message) for the pasted scrape and the Learn state's run on screen (records[0])."""
    try:
        server = server_metrics.parse_scrape(text)
    except InvalidInputError as exc:
        return empty_figure(str(exc)), f"⚠️ {exc}"
    run = server_metrics.export(records[0])["vllm"] if records else None
    rates = run["per_position_acceptance_rate"] if run else []
    fig = server_comparison_figure(server, rates)
    mine = f"; this run: {run['mean_acceptance_length']:.2f}" if run else "; no run on screen yet (Generate first)"
    rate = server.draft_acceptance_rate
    msg = (f"server: mean acceptance length {server.mean_acceptance_length:.2f} over {server.num_drafts:,.0f} drafts"
           f", {100 * rate:.1f} % of draft tokens accepted" if rate is not None else "") + mine
    if server.label_sets > 1:
        msg += f" (summed over {server.label_sets} engine/model series)"
    return fig, msg


def build_server_compare(recorded: gr.State) -> None:
    with gr.Accordion("Compare with a vLLM server (paste its /metrics)", open=False, elem_id="sd-server-compare"):
        scrape = gr.Textbox(label="Prometheus text from a vLLM server's /metrics", lines=5, max_lines=12,
                            placeholder=PLACEHOLDER, elem_id="sd-scrape")
        with gr.Row():
            go = gr.Button("Compare", elem_id="sd-scrape-go", min_width=100, scale=0)
            note = gr.Markdown("", elem_id="sd-scrape-note")
        plot = gr.Plot(empty_figure("paste a scrape and press Compare"), show_label=False, elem_id="sd-scrape-plot")
        go.click(compare_scrape, [scrape, recorded], [plot, note], api_visibility="private", show_progress="hidden")
