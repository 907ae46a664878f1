"""The paired bootstrap interval the simulator-against-e2e comparison reports (``sim.paired``)."""

from __future__ import annotations

import pytest

from eloquent_plugins.core.errors import InvalidArgument
from eloquent_plugins.sim.paired import paired_ratio_interval


def test_the_same_values_give_a_ratio_of_one_and_doubled_ones_two() -> None:
    sim = [0.0, 0.1, 0.0, 0.9, 0.3]
    assert paired_ratio_interval(sim, sim) == (1.0, 1.0)
    assert paired_ratio_interval([2 * x for x in sim], sim) == pytest.approx((2.0, 2.0))


def test_a_heavy_tailed_row_gets_a_wide_interval_around_its_ratio() -> None:
    """Thirty streams, most at 0, a few at one outage's stall: the interval holds the ratio of the means and is
    wide; the same lists and seed give the same interval."""
    sim = [0.0] * 24 + [0.9, 0.5, 0.2, 0.4, 0.1, 0.05]
    e2e = [0.0] * 24 + [0.95, 0.3, 0.25, 0.6, 0.1, 0.0]
    low, high = paired_ratio_interval(e2e, sim)
    ratio = sum(e2e) / sum(sim)
    assert low < ratio < high
    assert high - low > 0.3
    assert paired_ratio_interval(e2e, sim) == (low, high)
    assert paired_ratio_interval(e2e, sim, seed=2) != (low, high)


def test_pairing_narrows_the_interval_when_both_share_the_bad_streams() -> None:
    """Both benches meet the same outages: resampled together, the shared swings cancel in the ratio."""
    sim = [0.0] * 20 + [0.9] * 5 + [0.3] * 5
    e2e = [x * 1.1 for x in sim]
    low, high = paired_ratio_interval(e2e, sim)
    assert low == pytest.approx(1.1) and high == pytest.approx(1.1)


def test_bad_input_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="pair up"):
        paired_ratio_interval([0.1, 0.2], [0.1])
    with pytest.raises(InvalidArgument, match="no streams"):
        paired_ratio_interval([], [])
    with pytest.raises(InvalidArgument, match="level"):
        paired_ratio_interval([0.1], [0.1], level=1.0)
    with pytest.raises(InvalidArgument, match="draws"):
        paired_ratio_interval([0.1], [0.1], draws=0)
    assert paired_ratio_interval([0.0, 0.0], [0.0, 0.0]) == (1.0, 1.0)
    assert paired_ratio_interval([0.1, 0.1], [0.0, 0.0]) == (float("inf"), float("inf"))
