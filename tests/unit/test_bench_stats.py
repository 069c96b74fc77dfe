"""The benchmarks' statistics (``benchmarks/stats.py``) against independent references:
scipy's own Welch test and Holm's procedure worked by hand."""

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as scipy_stats

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from stats import bootstrap_diff_of_diffs, holm, welch  # noqa: E402


def test_welch_matches_scipy_and_its_interval_covers_the_difference_at_p():
    a = [2480.0, 3010.0, 1990.0, 2750.0, 3300.0, 950.0, 2600.0, 2890.0]
    b = [1500.0, 2100.0, 400.0, 1800.0, 2600.0, 1200.0, 900.0, 2300.0]
    ours = welch(a, b)
    ref = scipy_stats.ttest_ind(a, b, equal_var=False)
    assert ours["t"] == pytest.approx(ref.statistic)
    assert ours["p"] == pytest.approx(ref.pvalue)
    assert ours["diff"] == pytest.approx(np.mean(a) - np.mean(b))
    # the interval at level 1 - p just touches zero: the test and the interval agree
    edge = welch(a, b, level=1 - ours["p"])
    assert min(abs(edge["ci95"][0]), abs(edge["ci95"][1])) == pytest.approx(0.0, abs=1e-6)
    lo, hi = ours["ci95"]
    assert lo < ours["diff"] < hi and lo > 0  # p < 0.05 here: the 95% interval excludes 0


def test_welch_without_spread_is_a_point_not_a_division_by_zero():
    # every run at CartPole's cap on both sides: no difference, and nothing to test
    same = welch([500.0] * 5, [500.0] * 5)
    assert same["diff"] == 0 and same["ci95"] == [0, 0] and same["p"] == 1.0
    # no spread but different: the difference is certain (a point interval)
    apart = welch([500.0] * 3, [400.0] * 3)
    assert apart["diff"] == 100 and apart["ci95"] == [100, 100] and apart["p"] == 0.0


def test_holm_by_hand():
    # sorted: 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04 -> monotone 0.06)
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert holm([0.2]) == pytest.approx([0.2])


def test_difference_of_drops_and_its_interval():
    # side a drops by 5, side b by 10: a's drop minus b's is -5, with no noise a point
    d, lo, hi = bootstrap_diff_of_diffs([10, 10], [5, 5], [12, 12], [2, 2])
    assert (d, lo, hi) == pytest.approx((-5.0, -5.0, -5.0))
    d, lo, hi = bootstrap_diff_of_diffs([9, 10, 11], [4, 5, 6], [11, 12, 13], [1, 2, 3])
    assert d == pytest.approx(-5.0) and lo < -5.0 < hi
