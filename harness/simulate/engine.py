"""Discrete-event simulation of a schedule over a cost model -> Trace.

Semantics match the native executor: sends are posted without blocking (isend), a
receive blocks until its message has arrived. So an action starts when its rank is free
and its input has arrived; the only way to deadlock is a cycle of receive waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.schedules.ir import Action, Kind, Schedule, stage_to_rank
from harness.simulate.cost import CostModel
from harness.trace import COMPUTE, Event, Trace


@dataclass(frozen=True)
class Stuck:
    rank: int
    step: int  # index into the rank's action list
    action: Action
    waits_for: str  # what it waits for, in words


class Deadlock(Exception):
    def __init__(self, stuck: list[Stuck]):
        self.stuck = stuck
        super().__init__("; ".join(f"rank {s.rank} {s.action} waits for {s.waits_for}" for s in stuck))


def _needs(a: Action, last_stage: int) -> list[tuple[tuple, str]]:
    """(key, description) of what action `a` waits for. Keys: (stage, "act"|"grad", mb)
    for messages, (stage, kind, mb) for the same stage's earlier action."""
    s, mb = a.stage, a.microbatch
    if a.kind is Kind.F:
        return [((s - 1, "act", mb), f"activation of {s - 1}F{mb}")] if s > 0 else []
    if a.kind is Kind.W:
        return [((s, "I", mb), f"{s}I{mb}")]
    needs = [((s, "F", mb), f"{s}F{mb}")]
    if s < last_stage:
        needs.append(((s + 1, "grad", mb), f"gradient of {s + 1}B{mb}/{s + 1}I{mb}"))
    return needs


def simulate(schedule: Schedule, cost: CostModel, step: int = 0) -> Trace:
    """Earliest-start timing of every action; raises Deadlock when no rank can proceed."""
    owner = stage_to_rank(schedule)
    last_stage = max(owner)
    ready: dict[tuple, float] = {}  # key -> time the thing is available to its consumer
    free = {r: 0.0 for r in schedule}
    pos = {r: 0 for r in schedule}
    trace: Trace = []
    progress = True
    while progress:
        progress = False
        for r, acts in schedule.items():
            while pos[r] < len(acts):
                a = acts[pos[r]]
                start = free[r]
                for key, _ in _needs(a, last_stage):
                    if key not in ready:
                        break
                    start = max(start, ready[key])
                else:
                    end = start + cost.compute(a)
                    trace.append(Event(r, step, str(a), COMPUTE, a.kind.value, a.stage, a.microbatch, start, end))
                    free[r] = end
                    ready[(a.stage, a.kind.value, a.microbatch)] = end
                    if a.kind is Kind.F:  # output goes to stage + 1
                        hop = owner.get(a.stage + 1, r) != r
                        ready[(a.stage, "act", a.microbatch)] = end + (cost.p2p(a.stage) if hop else 0.0)
                    elif a.kind in (Kind.B, Kind.I):  # input gradient goes to stage - 1
                        hop = owner.get(a.stage - 1, r) != r
                        ready[(a.stage, "grad", a.microbatch)] = end + (cost.p2p(a.stage) if hop else 0.0)
                    pos[r] += 1
                    progress = True
                    continue
                break
    stuck = []
    for r, acts in schedule.items():
        if pos[r] < len(acts):
            a = acts[pos[r]]
            missing = [d for key, d in _needs(a, last_stage) if key not in ready]
            stuck.append(Stuck(r, pos[r], a, ", ".join(missing)))
    if stuck:
        raise Deadlock(stuck)
    return trace
