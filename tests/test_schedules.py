"""Unit: builders and the validator (pure, fast)."""

from __future__ import annotations

import pytest

from harness.planning import theory
from harness.schedules.registry import built_in, build, chunks_per_rank, requirements
from harness.schedules.ir import Action, Kind
from harness.schedules.validate import ScheduleError, validate


def grid(name: str, ns=range(1, 9), ms=range(1, 33), vs=(1, 2, 3)):
    """Every (n, m, v) of the ranges that `name` accepts."""
    return [(n, m, v) for n in ns for m in ms for v in vs if requirements(name, n, m, v) is None]


@pytest.mark.grid
@pytest.mark.parametrize("name", sorted(built_in()))
def test_every_builder_is_valid_over_the_grid(name):
    cases = grid(name)
    assert len(cases) >= 100
    for n, m, v in cases:
        validate(build(name, n, m, v), n * chunks_per_rank(name, v), m)


@pytest.mark.grid
@pytest.mark.parametrize("name", sorted(built_in()))
def test_in_flight_microbatches_match_theory(name):
    """Count, on each rank, (stage, microbatch) pairs past F and not yet past B (or W) at its peak."""
    for n, m, v in grid(name, range(1, 7), range(1, 17)):
        for rank, acts in build(name, n, m, v).items():
            live = peak = 0
            for a in acts:
                live += {Kind.F: 1, Kind.I: 0}.get(a.kind, -1)
                peak = max(peak, live)
            assert peak == theory.peak_inflight_microbatches(name, n, m, rank, v), (name, n, m, v, rank)


def test_action_string_form_round_trips():
    for text in ("2F0", "0B3", "1I2", "1W2", "12F107"):
        assert str(Action.parse(text)) == text
    with pytest.raises(ValueError):
        Action.parse("F0")


def A(text: str) -> Action:
    return Action.parse(text)


@pytest.mark.parametrize("schedule,message,marked", [
    ({0: [A("0B0"), A("0F0")]}, "0B0 comes before its 0F0", "[0B0]"),
    ({0: [A("0F0"), A("0F0"), A("0B0")]}, "0F0 appears twice", "[0F0]"),
    ({0: [A("0F0")]}, "backward of stage 0 microbatch 0 is missing", None),
    ({0: [A("0F0"), A("0B0"), A("0F1")]}, "backward of stage 0 microbatch 1 is missing", None),
    ({0: [A("0F0"), A("0B0")]}, "0F1 is missing", None),
    ({0: [A("0F0"), A("0B0"), A("0F5"), A("0B5")]}, "outside", "[0F5]"),
    # rank 1 waits for a gradient rank 0 can only send after rank 1's forward: a cycle
    ({0: [A("0F0"), A("0B0")], 1: [A("1B0"), A("1F0")]}, "1B0 comes before its 1F0", "[1B0]"),
    ({0: [A("0F0"), A("1F0"), A("1B0"), A("0B0")], 1: []}, "", None),  # two stages on one rank: fine
])
def test_validator_rejects_bad_schedules_with_the_grid(schedule, message, marked):
    stages = 1 + max(a.stage for acts in schedule.values() for a in acts)
    mbs = 2 if "microbatch 1" in message or "0F1" in message else 1
    if message == "":
        validate(schedule, stages, mbs)
        return
    with pytest.raises(ScheduleError) as err:
        validate(schedule, stages, mbs)
    text = str(err.value)
    assert message in text
    assert "rank 0:" in text  # the whole grid is shown
    if marked:
        assert marked in text


def test_deadlock_marks_every_waiting_rank():
    # each rank receives before it sends: 1 waits on 0's F1, which waits on 1's gradient of mb 0
    sched = {0: [A("0F0"), A("0B0"), A("0F1"), A("0B1")], 1: [A("1F1"), A("1F0"), A("1B0"), A("1B1")]}
    with pytest.raises(ScheduleError) as err:
        validate(sched, 2, 2)
    text = str(err.value)
    assert "deadlock" in text and "[0B0]" in text and "[1F1]" in text


def test_stage_on_two_ranks_is_rejected():
    with pytest.raises(ScheduleError, match="stage 0 runs on ranks 0 and 1"):
        validate({0: [A("0F0")], 1: [A("0B0")]}, 1, 1)
