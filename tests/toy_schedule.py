"""Schedules from outside the package, one file: what a contributor writes.

- `TOY` (made from its counts): every forward, then every backward in reverse microbatch order
  (the last microbatch's gradient first, as a stack would). No closed form and no torch class:
  theory is the simulator's labelled ideal, executor=pytorch runs it through torch's CSV loader.
- `COSTED` (made from the run's priced costs): 1F1B's shape with each rank's warm-up chosen
  greedily from the costs: as many forwards as fill its wait for its first gradient (the
  forward and backward chain through the later stages, hops included), never fewer than the
  rank after it (so no rank waits on a forward its neighbour has not sent), within 1..M. Cheap
  backwards or slow links change the order; equal costs at B = 2F give rank r 1 + 3 (N-1-r).
Registered by the tests that use them (tests/test_schedule_registry.py), unregistered after."""

from __future__ import annotations

import math

from harness.schedules.ir import Action, Kind, Schedule
from harness.schedules.registry import COSTS, ScheduleInputs, ScheduleSpec


def reverse_gpipe(n: int, m: int, v: int) -> Schedule:
    return {r: [Action(r, Kind.F, i) for i in range(m)] + [Action(r, Kind.B, i) for i in reversed(range(m))]
            for r in range(n)}


TOY = ScheduleSpec("reverse_gpipe", "every forward, then the backwards last microbatch first (a test's schedule)",
                   reverse_gpipe)


def warmups(n: int, m: int, fwd: tuple[float, ...], bwd: tuple[float, ...], fwd_hop: list[float],
            bwd_hop: list[float]) -> list[int]:
    """Each rank's forwards before its first backward (stage r on rank r)."""
    out = [1] * n
    for r in reversed(range(n)):
        chain = sum(fwd_hop[s] for s in range(r, n - 1)) + sum(fwd[s] + bwd[s] + bwd_hop[s] for s in range(r + 1, n))
        fill = 1 + (math.ceil(chain / fwd[r] - 1e-9) if fwd[r] > 0 else m)
        out[r] = min(m, max(fill, out[r + 1] if r + 1 < n else 1))
    return out


def greedy_warmup(x: ScheduleInputs) -> Schedule:
    cost = x.costs()
    n, m = x.pp, x.microbatches
    fwd_hop, bwd_hop = cost.hops(n)
    warm = warmups(n, m, cost.fwd_s, cost.bwd_s, fwd_hop, bwd_hop)
    out: Schedule = {}
    for r, w in enumerate(warm):
        acts = [Action(r, Kind.F, i) for i in range(w)]
        for j in range(m):
            acts.append(Action(r, Kind.B, j))
            if w + j < m:
                acts.append(Action(r, Kind.F, w + j))
        out[r] = acts
    x.note(f"warm-up forwards per rank {warm}, from the priced costs")
    return out


COSTED = ScheduleSpec("greedy_warmup", "1F1B with each rank's warm-up filled greedily from the run's costs (a test's)",
                      None, needs=COSTS, make=greedy_warmup)
