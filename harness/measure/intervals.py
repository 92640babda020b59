"""Confidence intervals from few samples, torch-free: a job's measured steps, a sweep's repeats.

A percentile bootstrap of the median (for a job's steps: one slow step, a collection or a
preemption, moves the mean and not the median) or of the mean (for repeats), with a fixed
seed so a record's interval is reproducible from its samples. With one sample there is no
spread to resample: the interval is that value, and `n` says so. Few samples give wide,
honest intervals; 2-3 steps give little more than their range.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence

LEVEL = 0.95
RESAMPLES = 2000


def interval(values: Sequence[float], stat: Callable[[Sequence[float]], float] = statistics.median,
             level: float = LEVEL, resamples: int = RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """[lo, hi] of `stat` at `level` by percentile bootstrap; (v, v) for a single value."""
    if not values:
        raise ValueError("no values")
    if len(values) == 1 or min(values) == max(values):
        return float(values[0]), float(values[0])
    rng = random.Random(seed)
    n = len(values)
    draws = sorted(stat([values[rng.randrange(n)] for _ in range(n)]) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return draws[int(tail * (resamples - 1))], draws[int((1.0 - tail) * (resamples - 1))]


def overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Two [lo, hi] intervals share a point: their difference is within the noise."""
    return a[0] <= b[1] and b[0] <= a[1]
