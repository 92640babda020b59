"""A Trace as columns: one list per Event field, the times also as numpy arrays. The trace
writer and the metrics read every event of a step; taking each field once and working on whole
columns (numpy, or C-level map/zip) costs a fraction of a Python call per event (issue #39: a
65,536-action simulated job under 10 us an action)."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from harness.measure.trace import Trace

# |seconds| at or above this are not turned into int64 nanoseconds here (2**62 ns, ~146 years):
# a caller formats such an event one at a time, as it would a non-finite one
_NS_LIMIT_S = 2.0**62 / 1e9


@dataclass(frozen=True)
class Columns:
    rank: list[int]
    step: list[int]
    name: list[str]
    cat: list[str]
    kind: list[str]
    stage: list[int]
    microbatch: list[int]
    start: np.ndarray  # float64 seconds
    end: np.ndarray

    @classmethod
    def of(cls, trace: Trace) -> "Columns":
        n = len(trace)
        lists = {f: list(map(attrgetter(f), trace)) for f in ("rank", "step", "name", "cat", "kind", "stage",
                                                             "microbatch")}
        times = {f: np.fromiter(map(attrgetter(f), trace), float, n) for f in ("start", "end")}
        return cls(**lists, **times)

    def __len__(self) -> int:
        return len(self.rank)


def whole_ns(seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(round(t * 1e9) as int64, where that holds: finite and under _NS_LIMIT_S): the same
    integers as Python's round of each (both round half to even on the same float product);
    0 where it does not hold."""
    ok = np.isfinite(seconds) & (np.abs(seconds) < _NS_LIMIT_S)
    return np.rint(np.where(ok, seconds, 0.0) * 1e9).astype(np.int64), ok
