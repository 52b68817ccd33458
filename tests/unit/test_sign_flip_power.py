"""sweeps/sign_flip_power.py: its p is compare's exact sign-flip p, its size holds at effect 0,
and its power grows with the effect."""

import numpy as np

from creditlab.analysis.significance import paired_test
from tests.helpers import load_script


def test_its_p_is_the_seed_level_tests_p_and_its_power_behaves():
    script = load_script("sweeps/sign_flip_power.py")
    rng = np.random.default_rng(1)
    d = rng.normal(0.005, 0.01, size=(5, 8))
    ours = script.sign_flip_p(d, script.sign_patterns(8))
    theirs = [paired_test(row, np.zeros(8)).p_value for row in d]
    np.testing.assert_allclose(ours, theirs, atol=1e-12)
    assert script.power(0.0, 0.01, 8, experiments=1000) <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / 1000)
    assert script.power(0.003, 0.01, 8, experiments=1000) < script.power(0.01, 0.01, 8, experiments=1000)
    assert script.power(0.05, 0.01, 8, experiments=200) == 1.0
