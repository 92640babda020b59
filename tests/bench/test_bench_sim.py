"""Benchmark: the simulator on interleaved 1F1B at N=64, M=1024, V=2 (262,144 actions).

`make bench` times it; under the default --benchmark-disable it runs once as a test.
"""

from __future__ import annotations

import pytest

from harness import theory
from harness.metrics import bubble_per_rank
from harness.schedules.registry import build
from harness.simulate.cost import CostModel
from harness.simulate.engine import simulate

N, M, V = 64, 1024, 2


@pytest.mark.bench
def test_simulate_interleaved_64_ranks_1024_microbatches(benchmark):
    schedule = build("interleaved_1f1b", N, M, V)
    cost = CostModel.uniform(N * V)
    trace = benchmark.pedantic(simulate, args=(schedule, cost), rounds=3, iterations=1)
    assert len(trace) == 2 * N * V * M
    got = sum(bubble_per_rank(trace, N)) / N
    assert got == pytest.approx(theory.bubble_fraction("interleaved_1f1b", N, M, V), abs=1e-9)
