"""A Trace as columns: one list per Event field, the times also as numpy arrays. The trace
writer and the metrics read every event of a step; taking each field once and working on whole
columns (numpy, or C-level map/zip) costs a fraction of a Python call per event (issue #39: a
65,536-action simulated job under 10 us an action)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from itertools import compress, repeat
from operator import attrgetter, eq

import numpy as np

from harness.measure.trace import COMPUTE, PIPELINE_KINDS, TP, ActionKey, Trace

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

    def take(self, rows: np.ndarray) -> "Columns":
        """The rows where `rows` (a bool per row) holds, in order (itself where all do)."""
        if rows.all():
            return self
        lists = {f: list(compress(getattr(self, f), rows.tolist())) for f in ("rank", "step", "name", "cat", "kind",
                                                                            "stage", "microbatch")}
        return Columns(**lists, start=self.start[rows], end=self.end[rows])

    # Event's properties, a column each (cached: the metrics read them several times)

    @cached_property
    def dur(self) -> np.ndarray:
        with np.errstate(invalid="ignore"):  # inf - inf: NaN, as Python's float gives it, unremarked
            return self.end - self.start

    @cached_property
    def in_window(self) -> np.ndarray:
        """Event.in_window of each row."""
        n = len(self)
        return (np.fromiter(map(eq, self.cat, repeat(COMPUTE)), bool, n)
                & np.fromiter(map(PIPELINE_KINDS.__contains__, self.kind), bool, n))

    @cached_property
    def tp_inside(self) -> dict[ActionKey, float]:
        """trace.tp_inside of these rows."""
        inside: dict[ActionKey, float] = {}
        dur = self.dur
        for i in np.flatnonzero(np.fromiter(map(eq, self.cat, repeat(TP)), bool, len(self))).tolist():
            key = (self.rank[i], self.step[i], self.stage[i], self.microbatch[i], self.kind[i][3:])
            inside[key] = inside.get(key, 0.0) + float(dur[i])
        return inside

    @cached_property
    def compute_s(self) -> np.ndarray:
        """trace.compute_s of each row: its span less the TP collectives traced inside it."""
        inside = self.tp_inside
        if not inside:
            return self.dur
        return np.array([d - inside.get(k, 0.0) for d, k in zip(
            self.dur.tolist(), zip(self.rank, self.step, self.stage, self.microbatch, self.kind))], dtype=float)

    @cached_property
    def rank_array(self) -> np.ndarray:
        return np.array(self.rank, dtype=np.int64)


def whole_ns(seconds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(round(t * 1e9) as int64, where that holds: finite and under _NS_LIMIT_S): the same
    integers as Python's round of each (both round half to even on the same float product);
    0 where it does not hold."""
    ok = np.isfinite(seconds) & (np.abs(seconds) < _NS_LIMIT_S)
    return np.rint(np.where(ok, seconds, 0.0) * 1e9).astype(np.int64), ok
