"""Schedule validation: counts, order, placement, and freedom from deadlock.

A valid schedule has, for every stage s < S and microbatch i < M, exactly one F and either
one B or one I and one W, all on the rank that owns s, with F before B/I and I before W,
and runs to the end under the executor's P2P semantics (isend, blocking recv). Every
error shows the whole per-rank grid with the failing step in brackets.
"""

from __future__ import annotations

from collections import Counter

from harness.schedules.ir import Action, Kind, Schedule, format_grid
from harness.simulate.cost import CostModel
from harness.simulate.engine import Deadlock, simulate


class ScheduleError(ValueError):
    pass


def _fail(schedule: Schedule, why: str, mark: dict[int, int]) -> ScheduleError:
    return ScheduleError(f"invalid schedule: {why}\n{format_grid(schedule, mark)}")


def validate(schedule: Schedule, stages: int, microbatches: int) -> None:
    """Raise ScheduleError unless `schedule` is a valid schedule of `stages` x `microbatches`."""
    owner: dict[int, int] = {}
    seen: Counter[Action] = Counter()
    for rank in sorted(schedule):
        done: set[tuple[int, Kind, int]] = set()
        for i, a in enumerate(schedule[rank]):
            key = (a.stage, a.kind, a.microbatch)
            if not (0 <= a.stage < stages and 0 <= a.microbatch < microbatches):
                return_err = f"{a} is outside stages 0..{stages - 1}, microbatches 0..{microbatches - 1}"
                raise _fail(schedule, return_err, {rank: i})
            if owner.setdefault(a.stage, rank) != rank:
                raise _fail(schedule, f"stage {a.stage} runs on ranks {owner[a.stage]} and {rank}", {rank: i})
            seen[a] += 1
            if seen[a] > 1:
                raise _fail(schedule, f"{a} appears twice", {rank: i})
            before = {Kind.B: Kind.F, Kind.I: Kind.F, Kind.W: Kind.I}.get(a.kind)
            if before is not None and (a.stage, before, a.microbatch) not in done:
                raise _fail(schedule, f"{a} comes before its {a.stage}{before.value}{a.microbatch}", {rank: i})
            done.add(key)
    for s in range(stages):
        for mb in range(microbatches):
            has = {k: seen[Action(s, k, mb)] for k in Kind}
            split = has[Kind.I] or has[Kind.W]
            if not has[Kind.F]:
                raise _fail(schedule, f"{s}F{mb} is missing", {})
            if has[Kind.B] and split:
                raise _fail(schedule, f"{s}{'B'}{mb} and {s}I{mb}/{s}W{mb} both present", {})
            if not has[Kind.B] and not (has[Kind.I] and has[Kind.W]):
                raise _fail(schedule, f"backward of stage {s} microbatch {mb} is missing (need B, or I and W)", {})
    try:
        simulate(schedule, CostModel.uniform(stages))
    except Deadlock as d:
        mark = {s.rank: s.step for s in d.stuck}
        raise _fail(schedule, f"deadlock: {d}", mark) from None
