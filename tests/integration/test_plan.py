"""``creditlab train --plan`` for real (issue 54): a calibration runs the job for a few steps in a
child process, measures its steps and evaluations, and the prediction follows from them."""

import pytest

from creditlab.run.cost_plan import evaluations, plan
from tests.integration.conftest import SMALL

pytestmark = pytest.mark.slow


def test_a_calibrated_plan_of_a_small_sweep(tmp_path):
    overrides = [*SMALL, "trainer.max_steps=10", "eval.every=5", "seed=0,1", f"hydra.sweep.dir={tmp_path}"]
    result = plan(overrides, multirun=True, steps=2)
    assert len(result.jobs) == 2 and len(result.calibrations) == 1  # two seeds, one calibration
    (job, cal), = result.calibrations.values()
    assert cal.steps == 2 and cal.first_s > 0 and cal.step_s > 0 and cal.eval_s > 0
    assert cal.wall_s > cal.first_s + cal.step_s + 2 * cal.eval_s  # the child's start-up and model load
    expected = cal.setup_s + cal.first_s + 9 * cal.step_s + evaluations(10, 5) * cal.eval_s  # the formula, used
    assert result.seconds == pytest.approx([expected, expected])
    assert result.total_s == pytest.approx(result.import_s + 2 * expected)
    assert [j.folder for j in result.jobs] == [tmp_path / "0", tmp_path / "1"]
    assert not any(j.folder.exists() for j in result.jobs)  # nothing written where the sweep will run
