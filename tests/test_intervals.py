"""Confidence intervals (harness/measure/intervals.py): reproducible, containing the statistic, a point
for one sample, narrower with more samples, and the overlap rule the report says noise with."""

from __future__ import annotations

import random
import statistics

from harness.measure.intervals import interval, overlap


def test_an_interval_holds_the_median_is_reproducible_and_narrows_with_samples():
    rng = random.Random(1)
    few, many = [rng.gauss(10, 1) for _ in range(5)], [rng.gauss(10, 1) for _ in range(200)]
    lo, hi = interval(few)
    assert lo <= statistics.median(few) <= hi and interval(few) == (lo, hi)
    lo2, hi2 = interval(many)
    assert lo2 <= 10 <= hi2 and hi2 - lo2 < hi - lo
    assert interval([3.0]) == (3.0, 3.0) and interval([2.0, 2.0]) == (2.0, 2.0)
    mean_lo, mean_hi = interval(many, statistics.fmean)
    assert mean_lo <= statistics.fmean(many) <= mean_hi


def test_overlap_is_within_the_noise():
    assert overlap([1, 2], [1.5, 3]) and overlap([1, 2], [2, 3]) and not overlap([1, 2], [2.1, 3])
