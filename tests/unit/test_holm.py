"""Holm's step-down adjustment (creditlab.analysis.significance.holm), by hand."""

import pytest
from creditlab.analysis.significance import holm


def test_the_brief_example_by_hand():
    """Sorted 0.01, 0.03, 0.04 with m = 3: 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; 1 x 0.04 = 0.04, raised
    to 0.06 (adjusted p never fall along the order). Returned in the input order."""
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])


def test_monotone_capped_and_trivial_cases():
    p = [0.2, 0.001, 0.04, 0.5, 0.012]
    adjusted = holm(p)
    # sorted 0.001 x 5 = 0.005; 0.012 x 4 = 0.048; 0.04 x 3 = 0.12; 0.2 x 2 = 0.4; 0.5 x 1 -> max(0.5, 0.4)
    assert adjusted == pytest.approx([0.4, 0.005, 0.12, 0.5, 0.048])
    order = sorted(range(5), key=lambda i: p[i])
    assert all(adjusted[a] <= adjusted[b] for a, b in zip(order, order[1:]))
    assert all(a >= q for a, q in zip(adjusted, p))
    assert holm([0.3, 0.6, 0.9]) == pytest.approx([0.9, 1.0, 1.0]) and max(holm([0.3, 0.6, 0.9])) == 1.0  # capped at 1
    assert holm([0.04]) == [0.04] and holm([]) == []
    assert holm([0.02, 0.02]) == [0.04, 0.04]  # ties


def test_p_values_outside_zero_one_are_refused():
    with pytest.raises(ValueError, match=r"p-values must lie in \[0, 1\]"):
        holm([0.5, 1.2])
