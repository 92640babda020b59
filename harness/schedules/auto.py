"""A zero-bubble schedule built for given costs and an activation-memory limit, in the spirit of
the zero-bubble paper's heuristic (Qi et al., arXiv 2401.10241 sec. 3 and appendix G): one
stage per rank (stage s on rank s), the backward split into I and W.

Each candidate is a greedy list schedule, made by simulating the pipeline on the given
per-stage costs: a stage, when free, does in this order of preference
- the I whose gradient has arrived (the critical path back to stage 0),
- the next F whose input has arrived, if it holds fewer than `limit` microbatches (from F to
  W: what a deferred W keeps alive),
- a deferred W: to fill an idle moment, to free memory at the limit, and at the tail.
Three binary knobs make the grid the best of which is kept (the paper searches such a grid):
- `extra_warmup`: in the warm-up, start one more F even when the first I would arrive before it
  ends (the paper's "one extra F" in the warm-up);
- `f_first`: in the steady state, the same for every later I;
- `eager_w`: fill any idle moment with a W (else only a gap the W fits in before the next
  known arrival, or memory or the tail require it).
ZB-H1 and ZB-H2, where the memory limit holds them, are candidates too (so the result is never
worse than them). Every candidate is timed by the project's simulator on the same costs
(harness/simulate/engine.py, unequal stages and hops included) and the fastest kept. The memory limit is in
units of 1F1B's peak on stage 0 (N microbatches): 1.0 is the paper's ZB-1p, 2.0 its ZB-2p.

In a step that starts at a barrier (the harness's, see the README) no order removes the last
stage's wait of (N-1) F for its first input; what this generator removes is the rest.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from harness.schedules.builders import zb_h1, zb_h2
from harness.schedules.ir import Action, Kind, Schedule, replay_inflight
from harness.schedules.registry import ScheduleSpec, register
from harness.simulate import engine
from harness.simulate.cost import CostModel

INF = math.inf


@dataclass(frozen=True)
class Knobs:
    extra_warmup: bool
    f_first: bool
    eager_w: bool


KNOBS = tuple(Knobs(*k) for k in itertools.product((False, True), repeat=3))


@dataclass(frozen=True)
class Generated:
    schedule: Schedule
    knobs: Knobs | str  # the greedy's knobs, or "seed:<name>" where a handcrafted order won
    step_s: float  # the simulator's step on the costs it was built for
    candidates: int
    seconds: float  # generation time
    limit: int  # microbatches each rank may hold from F to W


def limit_of(memory_limit: float, n: int) -> int:
    """Microbatches a rank may hold: memory_limit x 1F1B's peak (N on stage 0), at least 1."""
    if not memory_limit > 0 or not math.isfinite(memory_limit):
        raise ValueError(f"memory_limit={memory_limit!r} (allowed: a number > 0, in units of 1F1B's peak)")
    return max(1, math.floor(memory_limit * n + 1e-9))


def greedy(n: int, m: int, cost: CostModel, limit: int, knobs: Knobs) -> Schedule:
    """One candidate: the list schedule the preferences and `knobs` make on `cost`."""
    F, I, W = cost.fwd_s, cost.igrad, cost.wgrad  # noqa: E741
    fwd_hop, bwd_hop = cost.hops(n)
    free = [0.0] * n  # when each stage's last action ends
    nf, ni = [0] * n, [0] * n  # its next F and next I (both in microbatch order)
    held = [0] * n  # F done, W not yet
    pending: list[deque[int]] = [deque() for _ in range(n)]  # I done, W not yet
    f_at = [[INF] * m for _ in range(n)]  # when F(s, mb)'s input is there (INF: not known yet)
    i_at = [[INF] * m for _ in range(n)]  # when I(s, mb)'s gradient is there
    f_at[0] = [0.0] * m
    acts: list[list[Action]] = [[] for _ in range(n)]
    left = 3 * n * m

    def choice(s: int) -> tuple[float, Kind] | None:
        """(start, kind) of stage s's next action by the preferences, or None if it must wait
        for an arrival no stage has produced yet."""
        t = free[s]
        ti = i_at[s][ni[s]] if ni[s] < m else INF
        tf = f_at[s][nf[s]] if nf[s] < m and held[s] < limit else INF
        w = bool(pending[s])
        if ti <= t:
            return t, Kind.I
        if tf <= t:
            lets_f = knobs.extra_warmup if ni[s] == 0 else knobs.f_first
            if ti < t + F[s] and not lets_f:  # the I comes before the F would end: wait for it, or fill
                return (t, Kind.W) if w and t + W[s] <= ti else (ti, Kind.I)
            return t, Kind.F
        nxt = min(ti, tf)
        if w and (knobs.eager_w or nxt == INF or t + W[s] <= nxt or held[s] >= limit or nf[s] == m):
            return t, Kind.W
        if nxt < INF:
            return nxt, (Kind.I if ti <= tf else Kind.F)
        return None

    # each stage's next choice, in a heap by (start, stage); an action changes only its own
    # stage's and its neighbours' choices, so only those are made again (stale entries skipped)
    version = [0] * n
    heap: list[tuple[float, int, int, Kind]] = []

    def push(s: int) -> None:
        version[s] += 1
        c = choice(s)
        if c is not None:
            heapq.heappush(heap, (c[0], s, version[s], c[1]))

    for s in range(n):
        push(s)
    while left:
        while heap and heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        if heap:
            start, s, _, kind = heapq.heappop(heap)
        else:  # every stage waits on an unknown arrival with a W it chose not to run
            s = min((s for s in range(n) if pending[s]), key=lambda s: free[s])
            start, kind = free[s], Kind.W
        if kind is Kind.F:
            mb = nf[s]
            nf[s] += 1
            held[s] += 1
            end = start + F[s]
            if s + 1 < n:
                f_at[s + 1][mb] = end + fwd_hop[s]
            else:
                i_at[s][mb] = end  # the last stage's own loss
        elif kind is Kind.I:
            mb = ni[s]
            ni[s] += 1
            end = start + I[s]
            pending[s].append(mb)
            if s > 0:
                i_at[s - 1][mb] = end + bwd_hop[s]
        else:
            mb = pending[s].popleft()
            held[s] -= 1
            end = start + W[s]
        acts[s].append(Action(s, kind, mb))
        free[s] = end
        left -= 1
        for x in (s - 1, s, s + 1):
            if 0 <= x < n:
                push(x)
    return {s: acts[s] for s in range(n)}


def generate(n: int, m: int, cost: CostModel, memory_limit: float = 1.0) -> Generated:
    """The fastest of the knob grid's candidates on `cost` (one stage per rank)."""
    if len(cost.fwd_s) != n:
        raise ValueError(f"costs for {len(cost.fwd_s)} stages, pp={n} (zb_auto: one stage per rank)")
    t0 = time.perf_counter()
    limit = limit_of(memory_limit, n)
    # the handcrafted orders within the limit are candidates too: the search is never worse
    # than ZB-H1 (N microbatches) at 1.0, nor than ZB-H2 (2N-1) where the limit holds it
    seeds = [(f"seed:{name}", zb(n, m)) for name, zb in (("zb_h1", zb_h1), ("zb_h2", zb_h2))]
    made = [(knobs, greedy(n, m, cost, limit, knobs)) for knobs in KNOBS]
    best: tuple[float, Schedule, Knobs | str] | None = None
    seen: set[tuple] = set()
    for how, sched in made + [(name, x) for name, x in seeds if max(map(replay_inflight, x.values())) <= limit]:
        key = tuple(" ".join(map(str, acts)) for acts in sched.values())
        if key in seen:
            continue
        seen.add(key)
        step = engine.step_time(engine.compile_schedule(sched), cost)
        if best is None or step < best[0] - 1e-12:
            best = (step, sched, how)
    assert best is not None
    return Generated(best[1], best[2], best[0], len(seen), time.perf_counter() - t0, limit)


def _check(c: Any) -> str | None:
    if c.virtual_stages != 1:
        return f"virtual_stages={c.virtual_stages}: zb_auto has one stage per rank (allowed: 1)"
    return None


register(ScheduleSpec(
    "zb_auto", "zero-bubble order generated for the run's costs and schedule.memory_limit (arXiv 2401.10241 sec. 3)",
    None, split_backward=True, check=_check, color="#17becf"))


def main(argv: list[str] | None = None) -> int:
    """`python -m harness.schedules.auto --pp 4 --microbatches 16 --memory-limit 2 -o auto.csv`:
    generate on equal stages of the given costs, print how it compares, write torch's CSV (run it
    with `python -m harness schedule=csv schedule.csv_path=auto.csv pp=4 microbatches=16`)."""
    import argparse
    import sys

    from harness.schedules.csv_io import write_csv

    ap = argparse.ArgumentParser(prog="python -m harness.schedules.auto", description=main.__doc__)
    ap.add_argument("--pp", type=int, required=True)
    ap.add_argument("--microbatches", type=int, required=True)
    ap.add_argument("--memory-limit", type=float, default=1.0, help="in units of 1F1B's peak (N microbatches)")
    ap.add_argument("--fwd", type=float, default=1.0, help="F seconds per stage")
    ap.add_argument("--igrad", type=float, default=1.0, help="I seconds per stage")
    ap.add_argument("--wgrad", type=float, default=0.5, help="W seconds per stage")
    ap.add_argument("--hop", type=float, default=0.03, help="seconds a message takes between ranks")
    ap.add_argument("-o", "--out", default=None, help="torch's compute_only CSV")
    args = ap.parse_args(argv)
    n, m = args.pp, args.microbatches
    try:
        if n < 1 or m < 1:
            raise ValueError(f"pp={n}, microbatches={m} (allowed: >= 1)")
        if min(args.fwd, args.igrad, args.wgrad, args.hop) < 0:
            raise ValueError("--fwd, --igrad, --wgrad, --hop: seconds >= 0")
        cost = CostModel((args.fwd,) * n, (args.igrad + args.wgrad,) * n, (args.igrad,) * n, (args.wgrad,) * n,
                         fwd_hop_s=(args.hop,) * n, bwd_hop_s=(args.hop,) * n)
        g = generate(n, m, cost, args.memory_limit)
        if args.out:
            write_csv(args.out, g.schedule)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    bubble = engine.bubble(engine.compile_schedule(g.schedule), cost)
    print(f"zb_auto pp={n} M={m} memory_limit={args.memory_limit:g} ({g.limit} microbatches per rank): step "
          f"{g.step_s:.4g} s, bubble {bubble:.2%}, best of {g.candidates} candidates ({g.knobs}) in {g.seconds:.2f} s"
          + (f"; wrote {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
