"""The break-even map: the cost model reduces to Leviathan's formula when verification costs one step, the
measurement runs on the tiny pair, runs are placed with their own metrics, and the figure marks the 1x line."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
import pytest

from components import breakeven as view
from specdec.learn import breakeven as be
from specdec.loop.decoder import SpeculativeDecoder
from specdec.core.errors import InvalidInputError
from specdec.core.speedup import leviathan_speedup as leviathan
from specdec.core.sampling import SamplingConfig
from specdec.core.settings import DecodeSettings


def _costs(verify, draft) -> be.Costs:
    return be.Costs("test", "cpu", 100, list(verify), dict(draft), 3, 0.1)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.7, 0.95])
@pytest.mark.parametrize("gamma", [1, 4, 9])
def test_flat_verify_cost_gives_leviathans_formula(alpha, gamma):
    """With every verify pass costing one target step (10 ms) and a 2 ms draft, c = 0.2 in the classic formula."""
    c = _costs([10.0] * 16, {"model": 2.0})
    assert be.measured_curve_speedup(c, "model", alpha, gamma) == pytest.approx(leviathan(alpha, gamma, 0.2))
    assert be.delay_ms(c, "model", alpha, gamma) * be.measured_curve_speedup(c, "model", alpha, gamma) == pytest.approx(10)


def test_a_rising_verify_cost_lowers_the_speedup_and_moves_break_even():
    flat = _costs([10.0] * 16, {"model": 2.0})
    rising = _costs([10.0 + 3 * k for k in range(16)], {"model": 2.0})
    assert be.measured_curve_speedup(rising, "model", 0.8, 6) < be.measured_curve_speedup(flat, "model", 0.8, 6)
    a_flat, a_rise = be.measured_break_even(flat, "model", 4), be.measured_break_even(rising, "model", 4)
    assert a_rise > a_flat
    for c, a in ((flat, a_flat), (rising, a_rise)):
        assert be.measured_curve_speedup(c, "model", a, 4) >= 1 > be.measured_curve_speedup(c, "model", a - 0.002, 4)
    # A draft that costs as much as the target never pays off.
    assert be.measured_break_even(_costs([10.0] * 16, {"model": 10.0}), "model", 4) is None


def test_best_gamma_is_the_argmax():
    c = _costs([10.0 + 0.5 * k for k in range(16)], {"model": 1.0})
    for a in (0.3, 0.6, 0.9):
        g, s = be.best_gamma(c, "model", a)
        assert s == max(be.measured_curve_speedup(c, "model", a, k) for k in range(1, 16))
        assert s == be.measured_curve_speedup(c, "model", a, g)
    assert be.best_gamma(c, "model", 0.9)[0] > be.best_gamma(c, "model", 0.3)[0]  # better guesses, longer drafts


def test_grid_and_bad_gamma():
    c = _costs([10.0] * 16, {"ngram": 0.0})
    grid = be.speedup_grid(c, "ngram", [0.0, 0.5])
    assert grid.shape == (15, 2)
    assert np.allclose(grid[:, 0], 1.0)  # alpha 0 with a free drafter: one token per round at plain cost
    with pytest.raises(InvalidInputError):
        be.round_ms(c, "ngram", 16)


@pytest.fixture(scope="module")
def measured(tiny_pair):
    return be.measure_costs(tiny_pair, drafters=("model", "ngram", "early-exit", "cross"), k_max=6, repeats=2,
                            budget_s=20)


def test_measure_costs_on_the_tiny_pair(measured):
    assert len(measured.verify_ms) == 6 and all(ms > 0 for ms in measured.verify_ms)
    assert set(measured.draft_ms) <= {"model", "ngram", "early-exit", "cross"}
    assert {"model", "ngram"} <= set(measured.draft_ms)
    assert all(ms >= 0 for ms in measured.draft_ms.values())
    assert measured.prefix_tokens >= 16 and 1 <= measured.repeats <= 2


def test_runs_are_placed_with_their_own_metrics(tiny_pair, measured):
    s = DecodeSettings(gamma=3, max_new_tokens=30, sampling=SamplingConfig(1.0), seed=2)
    dec = SpeculativeDecoder(tiny_pair, "def fibonacci(n):", s)
    for _ in dec:
        pass
    rec = dec.record()
    placed = be.place_runs(measured, [rec])
    assert len(placed) == 1
    m = rec.metrics
    assert placed[0].alpha == m.alpha and placed[0].mean_gamma == m.mean_gamma and placed[0].drafter == "model"
    assert placed[0].best_gamma == be.best_gamma(measured, "model", m.alpha)[0]
    fig = view.breakeven_figure(measured, "model", placed)
    kinds = [type(t).__name__ for t in fig.data]
    assert "Heatmap" in kinds and "Contour" in kinds
    contour = next(t for t in fig.data if isinstance(t, go.Contour))
    assert contour.contours.start == contour.contours.end == 1.0
    assert any(t.name == "your runs (measured speedup)" for t in fig.data)
    html_ = view.advice_html(measured, "model", placed)
    assert 'id="be-advice"' in html_ and f"{m.alpha:.3f}" in html_


def test_figure_without_costs_or_runs():
    assert view.breakeven_figure(None, "model").layout.annotations
    c = _costs([10.0] * 16, {"model": 2.0})
    fig = view.breakeven_figure(c, "model", [])
    assert sum(1 for t in fig.data if t.name and t.name.startswith("delay at")) == 3
    assert "No recorded run" in view.advice_html(c, "model", [])
