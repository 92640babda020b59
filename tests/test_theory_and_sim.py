"""Unit: closed forms, and the simulator against them."""

from __future__ import annotations

import statistics

import pytest

from harness.planning import theory
from harness.measure.metrics import bubble_per_rank
from harness.schedules.registry import built_in, build, chunks_per_rank, requirements
from harness.schedules.ir import Action
from harness.simulate.cost import CostModel
from harness.simulate.engine import Deadlock, simulate
from harness.measure.trace import COMPUTE, Event


def test_headline_figures():
    assert theory.bubble_fraction("gpipe", 4, 8) == pytest.approx(3 / 11)  # 27%
    assert round(theory.bubble_fraction("1f1b", 4, 64), 3) == 0.045


@pytest.mark.grid
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_simulated_bubble_equals_closed_form(name, grid_microbatches):
    for n in range(1, 9):
        for m in grid_microbatches:
            for fwd, bwd in ((1.0, 2.0), (1.0, 1.0), (0.3, 0.9)):
                trace = simulate(build(name, n, m), CostModel.uniform(n, fwd, bwd))
                got = statistics.fmean(bubble_per_rank(trace, n))
                assert abs(got - theory.bubble_fraction(name, n, m)) < 1e-9, (n, m, fwd, bwd)


@pytest.mark.grid
@pytest.mark.parametrize("name", sorted(built_in()))
def test_simulated_bubble_equals_closed_form_at_uniform_costs(name, grid_microbatches):
    """F=1, B=2, I=W=1 per stage, free communication: exact over everything the builder accepts
    (make test: the M edges, tests/conftest.py GRID_MICROBATCHES)."""
    cases = 0
    for n in range(1, 9):
        for m in grid_microbatches:
            for v in (1, 2, 3):
                if requirements(name, n, m, v) is None:
                    stages = n * chunks_per_rank(name, v)
                    trace = simulate(build(name, n, m, v), CostModel.uniform(stages))
                    got = statistics.fmean(bubble_per_rank(trace, n))
                    assert abs(got - theory.bubble_fraction(name, n, m, v)) < 1e-9, (n, m, v)
                    cases += 1
    assert cases >= 100


def test_closed_forms_refuse_what_the_builder_refuses():
    with pytest.raises(ValueError, match="microbatches=7: dualpipev needs at least 2 \\* pp = 8"):
        theory.bubble_fraction("dualpipev", 4, 7)
    with pytest.raises(ValueError, match="virtual_stages=2: 1f1b has no chunks"):
        theory.peak_inflight_microbatches("1f1b", 4, 8, 0, v=2)


def test_split_backward_and_chunks_shrink_the_bubble():
    """At N=4, M=8: 1F1B 27%, interleaved V=2 16%, ZB-H1 11%, ZB-V and DualPipeV 6%."""
    b = {name: theory.bubble_fraction(name, 4, 8, 2 if name == "interleaved_1f1b" else 1) for name in built_in()}
    assert b["1f1b"] == pytest.approx(3 / 11)
    assert b["interleaved_1f1b"] == pytest.approx(9 / 57)
    assert b["zb_h1"] == pytest.approx(3 / 27)
    assert b["zbv"] == b["dualpipev"] == pytest.approx(3 / 51)


def test_events_are_plain_trace_events():
    """simulate() fills Event instances directly (for speed): they must equal Event(...)."""
    trace = simulate(build("zbv", 2, 3), CostModel.uniform(4))
    first = trace[0]
    assert type(first) is Event and vars(first) == vars(Event(0, 0, "0F0", COMPUTE, "F", 0, 0, 0.0, 1.0))
    assert first == Event(0, 0, "0F0", COMPUTE, "F", 0, 0, 0.0, 1.0) and hash(first)
    assert [e.name for e in trace if e.rank == 1][:3] == ["1F0", "2F0", "1F1"]
    assert len(trace) == sum(len(a) for a in build("zbv", 2, 3).values())


def test_same_rank_hand_off_is_free():
    """V placement: stage N-1 -> N stays on rank N-1, so only the other hops pay the latency."""
    n, m = 2, 4
    cost = CostModel(fwd_s=(1.0,) * 4, bwd_s=(2.0,) * 4, p2p_latency_s=0.5)
    trace = {e.name: e for e in simulate(build("zbv", n, m), cost)}
    assert trace["1F0"].start == trace["0F0"].end + 0.5  # rank 0 -> rank 1
    assert trace["2F0"].start == trace["1F0"].end  # rank 1 -> rank 1: local
    assert trace["3F0"].start == trace["2F0"].end + 0.5  # rank 1 -> rank 0


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


def test_simulator_reports_every_stuck_rank_and_step():
    """V placement, rank 1 runs 2F0 before its own 1F0 feeds it; rank 0 then waits on rank 1."""
    a = [Action.parse(x) for x in "0F0 3F0 3B0 0B0".split()]
    b = [Action.parse(x) for x in "2F0 1F0 2B0 1B0".split()]
    with pytest.raises(Deadlock) as err:
        simulate({0: a, 1: b}, CostModel.uniform(4))
    assert [(s.rank, s.step, str(s.action)) for s in err.value.stuck] == [(0, 1, "3F0"), (1, 0, "2F0")]
    assert "rank 1 2F0 waits for activation of 1F0" in str(err.value)
