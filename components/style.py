"""The one palette and the one figure layout for every chart in the app (playground and Learn tab alike).

The token chips and cards take the same colours from CSS variables in assets/style.css (--sd-p, --sd-q, ...);
keep the two in step. Mid-tone colours, so they read on both the light and the dark theme.
"""

from __future__ import annotations

import plotly.graph_objects as go

COLORS = {
    "p": "#8b5cf6",  # the target's distribution p (purple)
    "q": "#3b82f6",  # the draft's distribution q (blue)
    "kept": "#16a34a",  # kept guesses, min(p, q), output that matches p
    "residual": "#f59e0b",  # the repair distribution max(0, p - q)
    "bonus": "#d946ef",
    "wrong": "#dc2626",  # a wrong repair, rejections
    "engine": "#f97316",  # real decoder rounds, your runs on the speedup chart, predictions
    "measured": "#0ea5e9",
    "predicted": "#f97316",
    "grid": "rgba(128,128,128,0.22)",
    "text": "#8a8f99",
}
# Distinct colours for the tokens of a hand-made distribution (the 100-point picture).
TOKEN_COLORS = ["#3b82f6", "#f97316", "#16a34a", "#8b5cf6", "#dc2626", "#14b8a6"]


def axis(**extra) -> dict:
    return {"gridcolor": COLORS["grid"], "zerolinecolor": COLORS["grid"], "linecolor": COLORS["grid"], **extra}


def layout(title: str = "", height: int = 380, **extra) -> dict:
    """The shared layout: transparent background, theme-neutral text, legend below the plot."""
    base = {
        "title": {"text": title, "font": {"size": 13}, "x": 0, "xanchor": "left"},
        "height": height,
        "margin": {"l": 52, "r": 12, "t": 56 if title else 30, "b": 96},
        "paper_bgcolor": "rgba(0,0,0,0)",
        "plot_bgcolor": "rgba(0,0,0,0)",
        "font": {"color": COLORS["text"], "size": 12},
        # Below the plot: above it, the legend collides with two-line titles on narrow screens.
        "legend": {"orientation": "h", "y": -0.2, "yanchor": "top", "x": 0, "font": {"size": 11}},
        "hoverlabel": {"font": {"size": 12}},
        "xaxis": axis(),
        "yaxis": axis(),
    }
    for key in ("xaxis", "yaxis"):
        if key in extra:
            base[key] = {**base[key], **extra.pop(key)}
    base.update(extra)
    return base


def figure(traces: list[dict], title: str = "", height: int = 380, **extra) -> go.Figure:
    """One validated Figure from plain dicts: ~10x faster than add_trace/update_layout calls, which matters per round."""
    return go.Figure({"data": traces, "layout": layout(title, height, **extra)})


def empty_figure(message: str, height: int = 340) -> go.Figure:
    note = {"text": message, "showarrow": False, "x": 0.5, "y": 0.5, "xref": "paper", "yref": "paper",
            "font": {"size": 13, "color": COLORS["text"]}}
    return figure([], "", height, annotations=[note], xaxis={"visible": False}, yaxis={"visible": False})
