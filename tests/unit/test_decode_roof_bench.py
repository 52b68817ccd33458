"""benchmarks/decode_roof.py's live roof: each decoding step is charged the matmuls of the rows
still decoding, so rows that end early lower the roof instead of the ratio."""

from __future__ import annotations

import pytest

from tests.helpers import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/decode_roof.py")


def test_live_roof_charges_each_step_its_live_rows(bench):
    # rows of 3, 1 and 2 tokens: step 0 runs 3 rows, step 1 runs 2, step 2 runs 1
    assert bench.live_roof_seconds([3, 1, 2], lambda rows: 10.0 * rows) == 30 + 20 + 10
    assert bench.live_roof_seconds([], lambda rows: 1.0) == 0


def test_interpolation_between_timed_row_counts(bench):
    at = bench.interpolated({1: 2.0, 4: 5.0, 8: 13.0})
    assert [at(1), at(2), at(4), at(6), at(8)] == [2.0, 3.0, 5.0, 9.0, 13.0]
    assert at(16) == 26.0  # past the last count: proportional to the rows
    assert bench.interpolated({4: 8.0})(2) == 4.0  # below the first: proportional too
