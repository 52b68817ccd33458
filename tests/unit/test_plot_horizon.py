"""sweeps/plot_horizon.py on a hand-made sweep: its tables and plots (docs/methods/horizon.md)."""

from __future__ import annotations

import sys

import pytest

from tests.helpers import load_script
from tests.unit.test_compare import EVALS, make_run
from tests.unit.test_paired_problems import _greedy, write_problems


def _plot_horizon():
    return load_script("sweeps/plot_horizon.py")


def test_five_seeds_give_both_tests_and_three_plots(tmp_path, monkeypatch, capsys):
    """Five seeds x 40 problems at H = 8, as in test_compare_reports_the_per_problem_test: the
    method solves 5 more problems than GRPO in every seed at the last evaluation, with equal
    trained tokens, so the difference is +0.125 and every seed's sign agrees (sign-flip p = 2/32)."""
    sweep = tmp_path / "horizon"
    for seed in range(5):
        base = make_run(sweep / "h8", f"grpo-seed{seed}", "grpo", seed, evals={0: 0.5, 2: 0.5, 4: 0.5},
                        cfg={"task.max_steps": 8})
        meth = make_run(sweep / "h8", f"oracle-seed{seed}", "oracle", seed, evals={0: 0.5, 2: 0.55, 4: 0.625},
                        cfg={"task.max_steps": 8})
        write_problems(base, {s: (_greedy(range(20)), [2] * 40) for s in EVALS})
        write_problems(meth, {s: (_greedy(set(range(20)) | {20 + (seed + j) % 20 for j in range(5)}), [3] * 40)
                              for s in EVALS})
    prefix = tmp_path / "img" / "h"  # a folder that does not exist yet
    monkeypatch.setattr(sys, "argv", ["plot_horizon.py", str(sweep), "--out", str(prefix)])
    _plot_horizon().main()
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| 8 | oracle | 5 × 40 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[3]) == pytest.approx(0.125)
    assert float(cells[-1]) == pytest.approx(2 / 32, abs=1e-3)  # exact sign-flip over the 5 seed means
    assert float(cells[-2]) == pytest.approx(0.0052, abs=1e-4)  # crossed t, by hand in test_paired_problems.py
    for name in ("curves", "gaps", "localization"):
        assert (tmp_path / "img" / f"h_{name}.png").stat().st_size > 0
