"""Unit: theory in the run's own costs (B / F and the I/W split) against the simulator, the
labelled simulated ideal where no closed form is written, and CSV schedules matched to the
built-ins."""

from __future__ import annotations

import statistics

import pytest

from harness.planning import theory
from harness.measure.metrics import bubble_per_rank
from harness.schedules.registry import built_in, build, requirements
from harness.schedules.csv_io import from_csv, to_csv
from harness.schedules.ir import Action, Kind
from harness.simulate.cost import CostModel
from harness.simulate.engine import simulate

BWD_OVER_FWD = (1.0, 1.5, 2.0, 3.0)
SHARES = (0.5, 0.3)  # weight-gradient share w: I = (1-w) B, W = w B


def simulated(schedule, n: int, bwd_over_fwd: float, share: float) -> float:
    """The bubble measured on the simulated trace of `schedule` (rank -> actions) on equal
    stages and free communication, as a run's metrics measure it."""
    stages = 1 + max(a.stage for acts in schedule.values() for a in acts)
    trace = simulate(schedule, CostModel.uniform(stages, 1.0, bwd_over_fwd, share))
    return statistics.fmean(bubble_per_rank(trace, n))


def _cases(name: str, ms):
    for v in ((2, 3) if name == "interleaved_1f1b" else (1,)):
        for n in range(2, 9):
            for m in ms:
                if requirements(name, n, m, v) is None:
                    yield n, m, v


@pytest.mark.grid
@pytest.mark.parametrize("name", sorted(built_in()))
def test_theory_equals_the_simulator_in_the_runs_costs(name, grid_microbatches):
    """pp 2..8, M 1..32 (make test: its edges, tests/conftest.py GRID_MICROBATCHES; V 2, 3 for interleaved), B/F 1, 1.5, 2, 3, w 0.5 and 0.3: theory is the
    simulator's bubble to 1e-9. Closed form everywhere but ZB-V's N < M < 2N-1 at F, I, W not
    all equal and ZB-H2 outside M >= 2N-1, 2W <= min(F, I), which are the labelled simulated
    ideal. Schedules without I/W actions (GPipe,
    1F1B, interleaved) do not see the split: they run w = 0.5 only."""
    shares = SHARES if name in ("zb_h1", "zb_h2", "zbv", "dualpipev") else SHARES[:1]
    simulated_ideal = 0
    for n, m, v in _cases(name, grid_microbatches):
        sched = build(name, n, m, v)  # once for the 4 x 2 cost points
        for bwd in BWD_OVER_FWD:
            for share in shares:
                got = theory.bubble(name, n, m, v, bwd, share)
                where = (n, m, v, bwd, share, got)
                assert abs(got.value - simulated(sched, n, bwd, share)) < 1e-9, where
                window = name == "zbv" and n < m < 2 * n - 1 and not (bwd == 2.0 and share == 0.5)
                if name == "zb_h2":  # the paper's closed form where it holds in a step (builders._idle_zb_h2)
                    window = not (m >= 2 * n - 1 and 2 * share * bwd <= min(1.0, (1 - share) * bwd))
                assert got.source == (theory.SIMULATED_IDEAL if window else theory.CLOSED_FORM), where
                simulated_ideal += window
    if name != "zb_h2":
        assert simulated_ideal == (21 * 7 if name == "zbv" else 0)  # 21 (N, M) in the window, 7 cost points


def test_regression_b_three_times_f():
    """The tracker's figures at B = 3F, pp=4, M=8 (an independent reference agrees): theory used
    to say 0.1111 / 0.0588 / 0.0588, the B = 2F values, whatever the costs."""
    got = {name: theory.bubble(name, 4, 8, bwd_over_fwd=3.0) for name in ("zb_h1", "zbv", "dualpipev")}
    assert {k: round(t.value, 4) for k, t in got.items()} == {"zb_h1": 0.1233, "zbv": 0.0657, "dualpipev": 0.0519}
    assert {t.source for t in got.values()} == {theory.CLOSED_FORM}
    # exactly: idle 4.5, 4.5 and 3.5 forward-units over 32, 64 and 64 of work
    assert got["zb_h1"].value == pytest.approx(4.5 / 36.5)
    assert got["zbv"].value == pytest.approx(4.5 / 68.5)
    assert got["dualpipev"].value == pytest.approx(3.5 / 67.5)
    for name, t in got.items():
        assert t.value == pytest.approx(simulated(build(name, 4, 8), 4, 3.0, 0.5), abs=1e-12)


def test_defaults_are_todays_figures():
    """bubble_fraction is bubble(...).value at B = 2F, I = W = F: the figures it gave before."""
    assert theory.bubble_fraction("zb_h1", 4, 8) == pytest.approx(3 / 27)
    assert theory.bubble_fraction("zbv", 4, 8) == theory.bubble_fraction("dualpipev", 4, 8) == pytest.approx(3 / 51)
    assert theory.bubble_fraction("zbv", 4, 5) == pytest.approx(4 / 34)  # the window, at equal F, I, W
    assert theory.bubble("zbv", 4, 5).source == theory.CLOSED_FORM
    for name in built_in():
        v = 2 if name == "interleaved_1f1b" else 1
        assert theory.bubble_fraction(name, 4, 8, v) == theory.bubble(name, 4, 8, v, 2.0, 0.5).value


def test_gpipe_and_1f1b_do_not_depend_on_the_costs():
    for bwd in BWD_OVER_FWD:
        for name in ("gpipe", "1f1b"):
            assert theory.bubble(name, 4, 8, bwd_over_fwd=bwd).value == pytest.approx(3 / 11)
        assert theory.bubble("interleaved_1f1b", 4, 8, 2, bwd).value == pytest.approx(3 / 19)


def test_zb_h1_is_the_papers_formula_only_while_w_is_the_shortest():
    """Qi et al.'s (N-1)(F+I-W) holds when W <= min(F, I); past that the W's no longer fill."""
    n, m = 4, 8

    def idle(bwd, share):
        b = theory.bubble("zb_h1", n, m, bwd_over_fwd=bwd, weight_grad_share=share).value
        return b * m * (1 + bwd) / (1 - b)  # b = idle / (M (F + B) + idle), F = 1

    F, B = 1.0, 2.0
    I, W = 0.7 * B, 0.3 * B  # noqa: E741
    assert idle(B, 0.3) == pytest.approx((n - 1) * (F + I - W))
    I, W = 0.3 * B, 0.7 * B  # noqa: E741  W > min(F, I): the paper's formula would say 3 x 0.2
    assert idle(B, 0.7) == pytest.approx((n - 1) * max(F, I))
    assert idle(3.0, 0.5) == pytest.approx(4.5)  # I = W = 1.5 > F: (N-1) I, not (N-1) F


def test_the_split_changes_the_zero_bubble_schedules_only():
    for name in ("zb_h1", "zbv", "dualpipev"):
        assert theory.bubble(name, 4, 8, weight_grad_share=0.3).value != theory.bubble(name, 4, 8).value
    for name in ("gpipe", "1f1b"):
        assert theory.bubble(name, 4, 8, weight_grad_share=0.3).value == theory.bubble(name, 4, 8).value


def test_costs_are_checked():
    with pytest.raises(ValueError, match="bwd_over_fwd=0"):
        theory.bubble("1f1b", 4, 8, bwd_over_fwd=0)
    with pytest.raises(ValueError, match="weight_grad_share=1.5"):
        theory.bubble("zb_h1", 4, 8, weight_grad_share=1.5)
    with pytest.raises(ValueError, match="microbatches=7: dualpipev needs at least 2 \\* pp = 8"):
        theory.bubble("dualpipev", 4, 7)


def test_uniform_cost_model_splits_the_backward():
    half = CostModel.uniform(2, 1.0, 3.0)
    assert half.compute(Action(0, Kind.I, 0)) == half.compute(Action(0, Kind.W, 0)) == 1.5
    assert CostModel(fwd_s=(1.0,), bwd_s=(3.0,)).compute(Action(0, Kind.I, 0)) == 1.5  # fields unchanged
    split = CostModel.uniform(2, 1.0, 3.0, weight_grad_share=0.3)
    assert split.input_grad_s == (pytest.approx(2.1),) * 2 and split.weight_grad_s == (pytest.approx(0.9),) * 2
    assert split.compute(Action(1, Kind.B, 0)) == 3.0
    with pytest.raises(ValueError, match="weight_grad_share=-0.1"):
        CostModel.uniform(2, weight_grad_share=-0.1)


# -- schedules as data ------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(built_in()))
def test_csv_round_trip_matches_its_builtin(name):
    """pp=4, M=8 (no two built-ins coincide there) names the schedule itself. On a small grid
    it is named too unless another built-in builds the very same lists (M = 1, pp = 1, or
    interleaved V=1 at M <= 2 equal 1F1B), and then one of those is named."""
    v = 2 if name == "interleaved_1f1b" else 1
    assert theory.matches_builtin(from_csv(to_csv(build(name, 4, 8, v))), 8) == (name, v)
    for n in (1, 2, 3, 5):
        for m in (1, 2, 3, 6, 10, 12):
            for v in ((1, 2, 3) if name == "interleaved_1f1b" else (1,)):
                if requirements(name, n, m, v) is None:
                    s = from_csv(to_csv(build(name, n, m, v)))
                    same = {(o, ov) for o in built_in() for ov in (1, 2, 3)
                            if requirements(o, n, m, ov) is None and build(o, n, m, ov) == s}
                    got = theory.matches_builtin(s, m)
                    assert got in same, (n, m, v, got, same)
                    if {o for o, _ in same} == {name}:
                        assert got == (name, v if name == "interleaved_1f1b" else 1), (n, m, v, got)


def test_permuted_or_resized_schedule_matches_nothing():
    s = build("1f1b", 4, 8)
    swapped = {r: list(acts) for r, acts in s.items()}
    swapped[3][1], swapped[3][2] = swapped[3][2], swapped[3][1]
    assert theory.matches_builtin(swapped, 8) is None
    assert theory.matches_builtin(s, 7) is None  # the same file read with another M
    assert theory.matches_builtin({1: s[1]}, 8) is None  # ranks not 0..N-1


def test_bubble_of_schedule():
    """A built-in read back from CSV gets the built-in's theory in the given costs; any other
    schedule its simulated ideal, labelled."""
    for name, v in (("zb_h1", 1), ("zbv", 1), ("dualpipev", 1), ("interleaved_1f1b", 2)):
        s = from_csv(to_csv(build(name, 4, 8, v)))
        assert theory.bubble_of_schedule(s, 8, 3.0, 0.3) == theory.bubble(name, 4, 8, v, 3.0, 0.3)
    # GPipe with its backwards in reverse order: valid, and no built-in
    s = {r: acts[:8] + acts[8:][::-1] for r, acts in build("gpipe", 4, 8).items()}
    assert theory.matches_builtin(s, 8) is None
    got = theory.bubble_of_schedule(s, 8, 3.0)
    assert got.source == theory.SIMULATED_IDEAL
    assert got.value == pytest.approx(simulated(s, 4, 3.0, 0.5), abs=1e-12)
