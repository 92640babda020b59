"""Discrete-event simulation of a schedule over a cost model -> Trace.

Semantics match the native executor: sends are posted without blocking (isend), a
receive blocks until its message has arrived. So an action starts when its rank is free
and its inputs have arrived; the only way to deadlock is a cycle of receive waits. A
message between two stages on the same rank (V placement's turn, or a rank's own chunks)
is a local hand-off and costs nothing.

Each rank runs its list in order until it blocks on a missing input; the producer of that
input wakes it. Every action is visited once or twice, so 262k actions take well under a
second (tests/bench/test_bench_sim.py).
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from harness.schedules.ir import Action, Kind, Schedule, stage_to_rank
from harness.simulate.cost import CostModel
from harness.trace import COMPUTE, Event, Trace

# What a (stage, microbatch) makes available, as slots of the key 4 * (mb * S + stage) + slot.
_DONE_F, _ACT, _GRAD, _DONE_I = 0, 1, 2, 3


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


def _needs(a: Action, stages: int) -> list[tuple[int, str]]:
    """(key, description) of each input of `a`: the activation from stage - 1 (F), its own
    F and the gradient from stage + 1 (B, I), its own I (W)."""
    s, mb = a.stage, a.microbatch
    base = 4 * (mb * stages + s)
    if a.kind is Kind.F:
        return [(base - 4 + _ACT, f"activation of {s - 1}F{mb}")] if s > 0 else []
    if a.kind is Kind.W:
        return [(base + _DONE_I, f"{s}I{mb}")]
    needs = [(base + _DONE_F, f"{s}F{mb}")]
    if s < stages - 1:
        needs.append((base + 4 + _GRAD, f"gradient of {s + 1}B{mb}/{s + 1}I{mb}"))
    return needs


def simulate(schedule: Schedule, cost: CostModel, step: int = 0) -> Trace:
    """Earliest-start timing of every action; raises Deadlock when no rank can proceed.
    The trace lists rank 0's actions in order, then rank 1's, and so on.

    Cyclic GC is paused meanwhile: the trace's events all live until the return, so a
    collection pass over them finds nothing and costs about a quarter of the run."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _simulate(schedule, cost, step)
    finally:
        if enabled:
            gc.enable()


def _simulate(schedule: Schedule, cost: CostModel, step: int) -> Trace:
    owner = stage_to_rank(schedule)
    stages = max(owner, default=-1) + 1
    # seconds until stage s's F output reaches s + 1 / its B or I output reaches s - 1
    fwd_hop = [cost.p2p(s) if owner.get(s + 1, owner.get(s)) != owner.get(s) else 0.0 for s in range(stages)]
    bwd_hop = [cost.p2p(s) if owner.get(s - 1, owner.get(s)) != owner.get(s) else 0.0 for s in range(stages)]
    F, W, I = Kind.F, Kind.W, Kind.I  # noqa: E741
    new_event = object.__new__
    dur_f, dur_b, dur_i, dur_w = ([cost.compute(Action(s, k, 0)) for s in range(stages)] for k in Kind)
    last = stages - 1
    ready: dict[int, float] = {}  # key -> seconds when it is available to its consumer
    waiting: dict[int, list[int]] = {}  # key -> the ranks blocked on it (one, if the schedule is valid)
    events: dict[int, Trace] = {r: [] for r in schedule}  # a rank's events so far: its position
    todo = list(schedule)
    while todo:
        r = todo.pop()
        acts, out = schedule[r], events[r]
        p, t = len(out), (out[-1].end if out else 0.0)
        while p < len(acts):
            a = acts[p]
            s, k, mb = a.stage, a.kind, a.microbatch
            base = 4 * (mb * stages + s)
            try:  # a missing input ends this rank's turn; its producer wakes it (`waiting`)
                if k is F:
                    if s:
                        key = base - 4 + _ACT
                        x = ready[key]
                        t = x if x > t else t
                    end, letter = t + dur_f[s], "F"
                    ready[base + _DONE_F] = end
                    made, ready[base + _ACT] = base + _ACT, end + fwd_hop[s]
                elif k is W:
                    key = base + _DONE_I
                    x = ready[key]
                    t = x if x > t else t
                    end, letter, made = t + dur_w[s], "W", -1
                else:  # B or I
                    key = base + _DONE_F
                    x = ready[key]
                    t = x if x > t else t
                    if s < last:
                        key = base + 4 + _GRAD
                        x = ready[key]
                        t = x if x > t else t
                    if k is I:
                        end, letter = t + dur_i[s], "I"
                        ready[base + _DONE_I] = end
                    else:
                        end, letter = t + dur_b[s], "B"
                    made, ready[base + _GRAD] = base + _GRAD, end + bwd_hop[s]
            except KeyError:
                waiting.setdefault(key, []).append(r)
                break
            if made in waiting:
                todo += waiting.pop(made)
            # Event(...) sets its frozen fields one object.__setattr__ at a time, 3x slower than
            # filling the instance dict in field order (same object, same memory; tested)
            e = new_event(Event)
            d = e.__dict__
            d["rank"], d["step"], d["name"], d["cat"], d["kind"] = r, step, f"{s}{letter}{mb}", COMPUTE, letter
            d["stage"], d["microbatch"], d["start"], d["end"] = s, mb, t, end
            out.append(e)
            t = end
            p += 1
    stuck = []
    for r, acts in sorted(schedule.items()):
        if (p := len(events[r])) < len(acts):
            missing = ", ".join(what for key, what in _needs(acts[p], stages) if key not in ready)
            stuck.append(Stuck(r, p, acts[p], missing))
    if stuck:
        raise Deadlock(stuck)
    return [e for r in sorted(schedule) for e in events[r]]
