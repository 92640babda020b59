"""Unit: closed forms, and the simulator against them."""

from __future__ import annotations

import statistics

import pytest

from harness import theory
from harness.metrics import bubble_per_rank
from harness.schedules.builders import build
from harness.schedules.ir import Action
from harness.simulate.cost import CostModel
from harness.simulate.engine import Deadlock, simulate


def test_headline_figures():
    assert theory.bubble_fraction("gpipe", 4, 8) == pytest.approx(3 / 11)  # 27%
    assert round(theory.bubble_fraction("1f1b", 4, 64), 3) == 0.045


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_simulated_bubble_equals_closed_form(name):
    for n in range(1, 9):
        for m in range(1, 33):
            for fwd, bwd in ((1.0, 2.0), (1.0, 1.0), (0.3, 0.9)):
                trace = simulate(build(name, n, m), CostModel.uniform(n, fwd, bwd))
                got = statistics.fmean(bubble_per_rank(trace, n))
                assert abs(got - theory.bubble_fraction(name, n, m)) < 1e-9, (n, m, fwd, bwd)


def test_communication_cost_grows_the_bubble():
    sched = build("1f1b", 4, 8)
    free = statistics.fmean(bubble_per_rank(simulate(sched, CostModel.uniform(4)), 4))
    cost = CostModel(fwd_s=(1.0,) * 4, bwd_s=(2.0,) * 4, p2p_latency_s=0.1, p2p_bandwidth_Bps=1e3,
                     message_bytes=(100,) * 4)  # 0.2 s per hop
    slow = statistics.fmean(bubble_per_rank(simulate(sched, cost), 4))
    assert slow > free + 0.01


def test_slow_stage_sets_the_pace():
    """One stage twice as slow: every rank waits on it; the step is ~M x the slow stage."""
    n, m = 4, 16
    cost = CostModel(fwd_s=(1, 1, 2, 1), bwd_s=(2, 2, 4, 2))
    trace = simulate(build("1f1b", n, m), cost)
    assert max(e.end for e in trace) >= m * 6


def test_simulator_reports_deadlock():
    sched = {0: [Action.parse("0B0"), Action.parse("0F0")], 1: [Action.parse("1F0"), Action.parse("1B0")]}
    with pytest.raises(Deadlock, match="rank 1 1F0 waits for activation of 0F0"):
        simulate(sched, CostModel.uniform(2))
