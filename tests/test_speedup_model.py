"""One speedup model (specdec.core.speedup): the playground's prediction, the break-even map, the batch schedule
and the batch bench are all its one formula, and no other module writes it out."""

from __future__ import annotations

import pathlib
import re

import pytest

from specdec.core import speedup as sp

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_the_textbook_case_is_leviathans_closed_form():
    for a, g, c in ((0.6, 4, 0.1), (0.9, 2, 0.5), (0.0, 3, 0.2), (1.0, 5, 0.05)):
        e = g + 1 if a == 1 else (1 - a ** (g + 1)) / (1 - a)
        assert sp.leviathan_speedup(a, g, c) == pytest.approx(e / (g * c + 1))
    assert sp.run_predicted_speedup(0.6, 4, 0.1, 0.9) == sp.leviathan_speedup(0.6, 4, 0.1)  # c_loop first
    assert sp.run_predicted_speedup(0.6, 4, None, 0.9) == sp.leviathan_speedup(0.6, 4, 0.9)
    assert sp.run_predicted_speedup(0.6, 4, None, None) is None and sp.run_predicted_speedup(0.6, 0, 0.1, 0.1) is None
    assert sp.speedup_from_costs(3.0, 2, 0.0, 0.0, 1.0) == float("inf")


def test_tokens_per_row_of_both_batched_loops():
    for a in (0.3, 0.8):
        assert sp.lockstep_tokens_per_row(a, 4, 1) == pytest.approx(sp.expected_tokens_per_round(a, 4))
        assert sp.tokens_per_row(a, 4, 8, "ragged") == sp.expected_tokens_per_round(a, 4)
        assert sp.tokens_per_row(a, 4, 8, "lockstep") == sp.lockstep_tokens_per_row(a, 4, 8)
    with pytest.raises(ValueError, match="ragged"):
        sp.tokens_per_row(0.5, 2, 2, "zigzag")


def test_break_even_solver():
    a = sp.leviathan_break_even(4, 0.3)
    assert sp.leviathan_speedup(a, 4, 0.3) == pytest.approx(1.0, abs=1e-9)
    assert sp.leviathan_break_even(2, 1.2) is None and sp.leviathan_break_even(0, 0.1) is None
    assert sp.solve_break_even(lambda x: 2.0) == 0.0 and sp.solve_break_even(lambda x: 0.5) is None


def test_every_caller_is_the_one_formula():
    from specdec.bench.batch import predict
    from specdec.learn import breakeven as be
    from specdec.loop import schedule as sch

    # The schedule at one row with flat costs (a verify pass costs one plain step) is the textbook model.
    flat = sch.BatchCosts.from_points([(n, 10.0) for n in (1, 2, 4, 8)], [(1, 2.0), (2, 2.0)])
    assert sch.batch_speedup(1, 0.7, 3, flat) == pytest.approx(sp.leviathan_speedup(0.7, 3, 0.2))
    # The break-even map with a flat verify curve likewise.
    costs = be.Costs("p", "cpu", 10, [10.0] * 16, {"model": 2.0}, 1, 0.0)
    assert be.measured_curve_speedup(costs, "model", 0.7, 3) == pytest.approx(sp.leviathan_speedup(0.7, 3, 0.2))
    # The batch bench's prediction: fitted lines in, the lockstep loop's tokens per row.
    fits = {"draft": (3.0, 0.0), "verify": (20.0, 0.0), "plain": (10.0, 0.0)}
    p = predict(0.8, 4, 2, fits)
    assert p["speedup"] == pytest.approx(sp.speedup_from_costs(sp.lockstep_tokens_per_row(0.8, 4, 2), 4, 3.0, 20.0,
                                                               10.0))
    assert p["spec_tok_s"] / p["plain_tok_s"] == pytest.approx(p["speedup"])


def test_no_other_module_writes_a_speedup_formula():
    """The expectation α^(γ+1) / α^(kB) and the γc + 1 denominator appear in specdec.core.speedup only."""
    pattern = re.compile(r"\balpha\s*\*\*|\ba\s*\*\*\s*\(|\*\*\s*\((gamma|g|k \*)|\* c \+ 1\)")
    found = []
    for folder in ("specdec", "components", "ui"):
        for path in (ROOT / folder).rglob("*.py"):
            if path.relative_to(ROOT).as_posix() == "specdec/core/speedup.py":
                continue
            found += [f"{path.relative_to(ROOT)}:{i}" for i, line in enumerate(path.read_text().splitlines(), 1)
                      if pattern.search(line.split("#", 1)[0])]
    assert not found, found
