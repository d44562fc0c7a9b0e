"""The least-squares line of the vTrain diagnostics (research/lines.py)."""

import pytest

from research.lines import least_squares_line


def test_least_squares_line_recovers_a_line_and_handles_flat_inputs():
    a, b, r2 = least_squares_line([1.0, 2.0, 3.0, 4.0], [3.0, 5.0, 7.0, 9.0])
    assert (a, b) == pytest.approx((1.0, 2.0)) and r2 == pytest.approx(1.0)
    # Noisy points: a partial fit.
    assert 0.0 < least_squares_line([0.0, 1.0, 2.0], [0.0, 2.0, 1.0])[2] < 1.0
    # x that do not vary: no slope; y that do not vary: no r2.
    assert least_squares_line([2.0, 2.0], [1.0, 3.0]) == (2.0, 0.0, 0.0)
    assert least_squares_line([1.0, 2.0], [5.0, 5.0]) == (5.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="one y per x"):
        least_squares_line([1.0, 2.0], [1.0])
