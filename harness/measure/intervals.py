"""Intervals and comparisons from few samples, torch-free: a job's measured steps, a sweep's repeats.

What a report may say about a handful of steps, and no more:
- `median_interval`: the distribution-free interval of the median from order statistics,
  [x_(k), x_(n+1-k)] of the sorted samples, whose coverage is exact for any continuous
  distribution (the binomial: each sample falls below the median with probability 1/2). The
  widest k that reaches `level` is taken; below 6 samples none does, and the interval is the
  whole range with its own coverage stated (3 steps: 75%, 5 steps: 93.8%). No assumption of
  normality, which a step time with its occasional slow step (a collection, a preemption) lacks.
- `compare`: the two-sided permutation test of the difference of the means of two sets of
  samples (every split of the pooled samples enumerated up to EXACT_SPLITS, else a seeded
  sample of them), exact for exchangeable samples with no distribution assumed. Its smallest
  p-value is fixed by the counts alone: 3 vs 3 can never go below 2/20 = 0.1, so two runs of 3
  steps are never called different at 5%; 4 vs 4 can reach 0.029, 5 vs 5 0.008. (scipy's
  Welch test would assume normal step times; scipy is no dependency here.)
- `interval`: a percentile bootstrap (kept for the figures' bands over repeats); it under-covers
  at a few samples, which its `describe` says.
A sample is a step of one run, or a repeat's median step: steps say whether these runs differ,
repeats (run.repeats) whether the configs would on another run.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations

LEVEL = 0.95
RESAMPLES = 2000
EXACT_SPLITS = 20_000  # splits enumerated by `compare` (10 vs 10 steps is 184,756: sampled instead)
ORDER_STATISTICS = "order statistics of the median"  # `median_interval`'s method, as records name it
BOOTSTRAP = "bootstrap of the median over the measured steps"  # records before order statistics
SIMULATED = "simulated: every step alike"  # executor=sim's: no noise, a point


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


def median_coverage(n: int, k: int) -> float:
    """The probability that [x_(k), x_(n+1-k)] of n samples holds their distribution's median."""
    return max(0.0, 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0 ** n)


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(lo, hi, coverage) of the median by order statistics: the narrowest symmetric pair that
    covers it with at least `level`, or the range (its coverage under `level`) with too few."""
    if not values:
        raise ValueError("no values")
    xs, n = sorted(values), len(values)
    k = 1
    while k < (n + 1) // 2 and median_coverage(n, k + 1) >= level:
        k += 1
    return float(xs[k - 1]), float(xs[n - k]), median_coverage(n, k)


def describe(method: str, level: float, n: int, unit: str = "steps") -> str:
    """'93.8% interval, order statistics of the median, n=5 steps': what an interval rests on."""
    if method == SIMULATED:
        return f"{method}: a point, n={n} {unit}"
    if method == BOOTSTRAP:  # an older record's: the bootstrap's nominal level, which few samples miss
        return f"nominal {level:.0%} interval, {method} (under-covers at few), n={n} {unit}"
    return f"{level:.1%} interval, {method}, n={n} {unit}" if n > 1 else f"a single value, no interval (n=1 {unit[:-1]})"


def steps_note(intervals: Iterable[tuple[str, float, int] | None]) -> str:
    """A figure's error bars in words, from its runs' (method, level, steps): '93.8% interval,
    order statistics of the median, n=5 steps' (or each such, ';'-joined, where runs differ)."""
    said = sorted({describe(*i) for i in intervals if i is not None})
    return "; ".join(said) if said else "no intervals recorded (older records: the interquartile range)"


def tag(method: str, level: float, n: int) -> str:
    """The short form beside a figure in a table: '93.8%, n=5' ('nominal 95%, n=5' for an older
    record's bootstrap, 'simulated' where every step is alike)."""
    if method == SIMULATED:
        return "simulated"
    return f"{'nominal ' if method == BOOTSTRAP else ''}{level:.1%}, n={n}"


@dataclass(frozen=True)
class Comparison:
    """Two sets of samples against each other (`compare`)."""
    p: float  # two-sided p-value of the difference of means
    smallest_p: float  # the least p these counts can give: at or above 1 - level, never distinguishable
    n_a: int
    n_b: int
    level: float
    exact: bool  # every split enumerated (else sampled)

    @property
    def distinguishable(self) -> bool:
        return self.p < 1.0 - self.level

    def phrase(self, unit: str = "steps") -> str:
        """'p=0.008, n=5 vs 5 steps' or, where the counts cannot tell, why."""
        counts = f"n={self.n_a} vs {self.n_b} {unit}"
        if self.smallest_p >= 1.0 - self.level:
            return f"{counts}: no difference is significant at so few (p >= {self.smallest_p:.2g} always)"
        return f"p={self.p:.2g}, {counts}, permutation test"


def compare(a: Sequence[float], b: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES * 10,
            seed: int = 0) -> Comparison:
    """The two-sided permutation test of mean(a) - mean(b): the share of the splits of the pooled
    samples into groups of len(a) and len(b) whose difference is at least the observed one."""
    if not a or not b:
        raise ValueError("no values")
    pooled, na = [float(v) for v in (*a, *b)], len(a)
    n, total = len(pooled), math.fsum(pooled)
    splits = math.comb(n, na)

    def diff(sum_a: float) -> float:  # the difference of means follows from the sum of the first group
        return abs(sum_a / na - (total - sum_a) / (n - na))

    observed = diff(math.fsum(pooled[:na]))
    tie = 1e-12 * max(abs(v) for v in pooled)  # equal differences reached by other sums' rounding
    if splits <= EXACT_SPLITS:
        at_least = sum(diff(math.fsum(c)) >= observed - tie for c in combinations(pooled, na))
        p = at_least / splits
    else:  # a seeded sample of splits, the observed one counted in (never p = 0)
        rng = random.Random(seed)
        at_least = sum(diff(math.fsum(rng.sample(pooled, na))) >= observed - tie for _ in range(resamples))
        p = (at_least + 1) / (resamples + 1)
    smallest = (2 if na == n - na else 1) / splits
    return Comparison(min(p, 1.0), smallest, na, n - na, level, splits <= EXACT_SPLITS)


def overlap(a: Sequence[float], b: Sequence[float]) -> bool:
    """Two [lo, hi] intervals share a point."""
    return a[0] <= b[1] and b[0] <= a[1]
