"""sweeps/crossed_coverage.py, fast: the per-problem test's 95% interval covers the true mean about
95% of the time at 5 seeds when seed effects dominate, where the crossed bootstrap it replaced
falls short (docs/comparing.md has the full table)."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest

_PATH = Path(__file__).resolve().parents[2] / "sweeps" / "crossed_coverage.py"


@pytest.fixture(scope="module")
def coverage_sim():
    spec = importlib.util.spec_from_file_location("crossed_coverage", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["crossed_coverage"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    yield module
    sys.modules.pop("crossed_coverage", None)


def test_coverage_is_near_nominal_and_above_the_old_bootstrap(coverage_sim):
    """800 arrays of 5 seeds x 200 problems, seed effects 87% of the mean's variance; both tests on
    the same arrays. Simulation standard error sqrt(0.95 * 0.05 / 800) = 0.0077: the crossed
    t-test lands within 2 of them of 0.95 (0.9475), the bootstrap (500 draws each) 0.905."""
    cell = coverage_sim.coverage("seed", 5, 200, reps=800, old_reps=800, resamples=500, seed=1)
    se = math.sqrt(0.95 * 0.05 / 800)
    assert abs(cell.new - 0.95) < 2 * se
    assert cell.old < cell.new - 0.03
    assert (cell.new, cell.old) == pytest.approx((0.9475, 0.905))  # the seeded draws, as documented
    # Problem effects dominant (the seed component often estimated 0) and 0/1 outcomes at 8 seeds:
    # near nominal too.
    assert coverage_sim.coverage("problem", 5, 200, reps=800, old_reps=0, seed=1).new > 0.95 - 2 * se
    assert coverage_sim.coverage("binary", 8, 200, reps=800, old_reps=0, seed=1).new > 0.95 - 2 * se


def test_the_old_bootstrap_has_the_crossed_variance(coverage_sim):
    """The reference bootstrap as it was: for d = a_s + b_p its draws are mean(a*) + mean(b*), of
    variance var(a)/S + var(b)/P (population variances), so its 95% interval is about 2 * 1.96 of
    that standard deviation wide."""
    a = np.array([0.3, -0.1, 0.2, 0.0, 0.1])
    b = np.tile([0.3, -0.3, 0.1, -0.1], 50)
    low, high = coverage_sim.crossed_bootstrap(a[:, None] + b[None, :], 20000, np.random.default_rng(1))
    assert high - low == pytest.approx(2 * 1.96 * math.sqrt(a.var() / 5 + b.var() / 200), rel=0.1)


def test_scenarios_and_the_table(coverage_sim):
    rng = np.random.default_rng(0)
    d, truth = coverage_sim.draw("binary", 3, 7, rng)
    assert d.shape == (3, 7) and truth == 0.0 and set(np.unique(d)) <= {-1.0, 0.0, 1.0}
    d, truth = coverage_sim.draw("noise", 4, 5, rng)
    assert d.shape == (4, 5) and truth == coverage_sim.MU
    cells = [coverage_sim.Cell("seed", 5, 200, 0.95, 10, 0.9, 10), coverage_sim.Cell("seed", 5, 500, 0.96, 10, None, 0)]
    assert coverage_sim.table(cells).splitlines()[2] == "| seed | 5 | 0.950 | 0.900 | 0.960 | — |"


def test_null_experiments_share_one_baseline(coverage_sim):
    """``--null``: 6 null arms against one baseline. Each contrast subtracts the same baseline, so
    two contrasts correlate at 1/2 (equal variances); a contrast has the scenario's sd; common
    random numbers (one uniform per seed and problem for every arm) make two arms disagree far
    less often than independent draws do."""
    rng = np.random.default_rng(0)
    assert coverage_sim.null_draw("mixed", 5, 40, 6, rng).shape == (6, 5, 40)
    noise = coverage_sim.null_draw("noise", 2, 20000, 2, rng)
    assert np.corrcoef(noise[0].ravel(), noise[1].ravel())[0, 1] == pytest.approx(0.5, abs=0.03)
    assert noise[0].std() == pytest.approx(0.5, rel=0.03)
    crn, independent = (coverage_sim.null_draw(s, 5, 2000, 1, rng) for s in ("binary_crn", "binary"))
    assert set(np.unique(crn)) <= {-1.0, 0.0, 1.0}
    assert (crn != 0).mean() < 0.5 * (independent != 0).mean()


def test_null_rates_and_their_table(coverage_sim):
    """A small null cell: rates per level are shares of all contrasts, the family-wise error a
    share of experiments; the per-problem test stays under 0.05 + 3 standard errors here."""
    cell = coverage_sim.null_rates("binary", 5, 100, reps=150, seed=3)
    assert cell.reps == 150 and 0 <= cell.clipped <= 1 and len(cell.rates) == 3
    assert cell.rates[0] >= cell.rates[1] >= cell.rates[2]
    assert cell.rates[0] <= 0.05 + 3 * math.sqrt(0.05 * 0.95 / 900)
    assert 0 <= cell.fwer_holm <= 1
    row = coverage_sim.null_table([coverage_sim.NullCell("noise", 5, 500, (0.04, 0.008, 0.001), 0.03, 0.5, 10)])
    assert row.splitlines()[2] == "| noise | 5 | 500 | 0.500 | 0.0400 | 0.0080 | 0.0010 | 0.030 |"
