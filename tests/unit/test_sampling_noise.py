"""creditlab.analysis.stats.sampling_noise: a sampled accuracy's variance split into problems and
sampling, by hand and on simulated problems whose true success rates are known; and the line
`creditlab eval` prints from it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from creditlab.analysis.stats import sampling_noise
from creditlab.run.evaluate import noise_line


def test_by_hand():
    # 3 problems x 4 samples, 0, 2 and 4 right. within = (0 + 2*2 + 0) / (4 * 3 * 3) = 1/9; the rates
    # 0, 0.5, 1 have variance 0.25, so between = 0.25 - (1/9) / 4 = 2/9
    noise = sampling_noise([0, 2, 4], 4)
    assert noise.within == pytest.approx(1 / 9) and noise.between == pytest.approx(2 / 9)
    # at the measured size the standard error is the usual one of the per-problem means, sd / sqrt(n)
    assert noise.se(3, 4) == pytest.approx(math.sqrt(0.25 / 3))
    assert noise.se(3, 8) == pytest.approx(math.sqrt(2 / 27 + 1 / 216))
    assert sampling_noise([1, 1], 1) is None and sampling_noise([3], 4) is None
    assert sampling_noise([2, 2, 2], 4).between == 0.0  # spread below what sampling alone gives: 0


def test_recovers_known_variances_on_simulated_problems():
    rng = np.random.default_rng(0)
    p = rng.beta(0.5, 4.0, size=20_000)  # skewed low, like the real model's rates
    k = 4
    noise = sampling_noise(rng.binomial(k, p).tolist(), k)
    assert noise.within == pytest.approx(float(np.mean(p * (1 - p))), rel=0.03)
    assert noise.between == pytest.approx(float(np.var(p)), rel=0.05)


def test_the_printed_line():
    line = noise_line({"noise": {"between": 0.04, "within": 0.09}, "sampled": {"problems": 100, "samples": 4}})
    # se = sqrt(0.04/100 + 0.09/400) = 0.025; problems sqrt(0.0004) = 0.02, sampling sqrt(0.000225) = 0.015
    assert line == ("noise: standard error 0.0250 (problems 0.0200, sampling 0.0150, in quadrature); with 8 samples "
                    "0.0226, with 200 problems 0.0177")
