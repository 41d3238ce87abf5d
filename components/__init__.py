"""Pure renderers from Rounds, RunRecords and RunMetrics to HTML strings and Plotly figures; no Gradio in here.

style: the palette and figure layout; tokens: token chips; phases: round anatomy; charts: p vs q and speedup;
stats: stats panel and status lines; labels: words about rounds and runs; learn: the Learn tab's panels.

The app wires these to components; tests call them directly on recorded or hand-built rounds.
"""

from .charts import pq_candidates, pq_figure, speedup_curves_figure, speedup_figure, speedup_series
from .phases import render_phases
from .stats import render_model_status, render_stats, render_status
from .style import empty_figure
from .tokens import render_legend, render_prompt, render_round, render_tokens, round_chips, visible_piece

__all__ = [
    "empty_figure",
    "pq_candidates",
    "pq_figure",
    "render_legend",
    "render_model_status",
    "render_phases",
    "render_prompt",
    "render_round",
    "render_stats",
    "render_status",
    "render_tokens",
    "round_chips",
    "speedup_curves_figure",
    "speedup_figure",
    "speedup_series",
    "visible_piece",
]
