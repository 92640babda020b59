"""A zero-bubble schedule built for given costs and an activation-memory limit, in the spirit of
the zero-bubble paper's heuristic (Qi et al., arXiv 2401.10241 sec. 3 and appendix G): one
stage per rank (stage s on rank s), the backward split into I and W.

Memory is counted as the paper counts it (its Table 1), in units of one microbatch's
activations on the stage (M_B): an F adds 1, an I frees all but the share `w` its deferred W
keeps (M_W / M_B: each split linear's input and output gradient; harness's memory theory traces
it per stage, harness/planning/memory_theory.py), the W frees that share. The limit is `memory_limit` x
N, 1F1B's peak on stage 0 (N microbatches held, none deferred): 1.0 is the paper's ZB-1p, 2.0
its ZB-2p. What a deferred W keeps decides what a limit buys: the paper's GPT layers without
flash attention keep 32sbh of 34sbh + 5as^2b (w about 0.4), a layer with flash attention nearly
all of it (w about 0.95).

Each candidate is a greedy list schedule, made by simulating the pipeline on the given
per-stage costs: a stage, when free, does in this order of preference
- the I whose gradient has arrived (the critical path back to stage 0),
- the next F whose input has arrived, if the memory holds one more microbatch,
- a deferred W: to fill an idle moment, to free memory at the limit, and at the tail.
Three binary knobs make the grid the best of which is kept (the paper searches such a grid):
- `extra_warmup`: in the warm-up, start one more F even when the first I would arrive before it
  ends (the paper's "one extra F" in the warm-up);
- `f_first`: in the steady state, the same for every later I;
- `eager_w`: fill any idle moment with a W (else only a gap the W fits in before the next
  known arrival, or memory or the tail require it).
ZB-H1 and ZB-H2, where the memory limit holds them, are candidates too (so the result is never
worse than them). Every candidate is timed by the project's simulator on the same costs
(harness/simulate/engine.py, unequal stages and hops included) and the one with the shortest
period kept (the paper's objective: the longest rank span, first F to last W, which is the time
between steps when ranks overlap consecutive steps; engine.period), the synchronous step
breaking ties. The harness's runtime starts each step at a barrier, where no order removes the
last stage's wait of (N-1) F for its first input: its records give both bubbles
(README, "Zero-bubble schedules").
"""

from __future__ import annotations

import heapq
import itertools
import math
import os
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from harness.config import MAX_TIMEOUT_S
from harness.simulate.gc_pause import paused
from harness.schedules.builders import zb_h1, zb_h2
from harness.schedules.ir import Action, Kind, Schedule
from harness.config import ScheduleConfig
from harness.schedules.registry import COSTS, ScheduleInputs, ScheduleSpec, register
from harness.simulate import engine
from harness.simulate.cost import CostModel

INF = math.inf
# The work generation does: every candidate order made (8 greedy, up to 8 of the paper's, 2
# seeds) and each distinct one simulated, linear in the actions pp x M x 3, whatever pp and M:
# measured ~140-155 us of CPU and ~0.75 KB of peak memory an action (6,000 to 100,000 actions; 2.3 KB
# when every candidate was held at once: pp=64, M=5000 took 2.7 GB). The bound keeps a generation
# within ~15 s of CPU and ~100 MB, and admits the planner's largest documented point (pp=64,
# M=512; README, "Schedules built for your costs and memory").
MAX_AUTO_ACTIONS = 100_000
MAX_COST_S = float(MAX_TIMEOUT_S)  # a week an action or hop: more is no cost a run can take (and 1e308 sums to inf)
LETTER = {Kind.F: "F", Kind.I: "I", Kind.W: "W", Kind.B: "B"}


@dataclass(frozen=True)
class Knobs:
    extra_warmup: bool
    f_first: bool
    eager_w: bool


KNOBS = tuple(Knobs(*k) for k in itertools.product((False, True), repeat=3))


@dataclass(frozen=True)
class Generated:
    schedule: Schedule
    knobs: Knobs | PaperKnobs | str  # the winner's knobs, or "seed:<name>" where a handcrafted order won
    period_s: float  # the simulator's period (engine.period) on the costs it was built for
    step_s: float  # and its synchronous step
    candidates: int
    seconds: float  # generation time
    limit: float  # microbatches' activations each rank may hold (memory_limit x N)


def size_problem(n: int, m: int, pp_key: str = "pp", m_key: str = "microbatches") -> str | None:
    """Why pp=n x M=m is too large to generate for (one line naming the larger key, its value
    and what is allowed), or None: the bound MAX_AUTO_ACTIONS on pp x M x 3, checked before
    anything is allocated."""
    actions = 3 * n * m
    if actions <= MAX_AUTO_ACTIONS:
        return None
    key, value, other = (m_key, m, n) if m >= n else (pp_key, n, m)
    said = f"{key} {value}" if key.startswith("--") else f"{key}={value}"  # a flag as its CLI writes it
    return (f"{said}: zb_auto generates for pp={n} x {m} microbatches x 3 = {actions:,} actions, more than "
            f"{MAX_AUTO_ACTIONS:,} (allowed: {key} <= {max(1, MAX_AUTO_ACTIONS // (3 * other)):,} here; generation "
            f"simulates ~10 candidate orders, ~150 us and ~1 KB an action)")


def cost_problem(n: int, cost: CostModel) -> str | None:
    """Why `cost` cannot be generated for (a cost that is not a finite number of seconds in
    0..MAX_COST_S: NaN, inf, 1e308 or negative would make every order's times inf or NaN, and
    the simulation report a deadlock that is not there), or None."""
    fwd_hop, bwd_hop = cost.hops(n)
    for name, values in (("F", cost.fwd_s), ("I", cost.igrad), ("W", cost.wgrad), ("forward hop", fwd_hop),
                         ("backward hop", bwd_hop)):
        for s, x in enumerate(values):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0.0 <= x <= MAX_COST_S:
                return (f"{name} cost of stage {s} = {x!r} s: not a possible cost (allowed: a finite number of "
                        f"seconds in 0..{MAX_COST_S:,.0f})")
    return None


def limit_of(memory_limit: float, n: int) -> float:
    """Microbatches' activations a rank may hold: memory_limit x 1F1B's peak (N on stage 0)."""
    if not memory_limit > 0 or not math.isfinite(memory_limit):
        raise ValueError(f"memory_limit={memory_limit!r} (allowed: a number > 0, in units of 1F1B's peak)")
    return memory_limit * n


def peak_memory(actions: list[Action], w: float) -> float:
    """The most a rank's actions hold at once, in microbatches' activations: F +1, B -1,
    I -(1 - w), W -w (w: the share a deferred W keeps)."""
    held = peak = 0.0
    for a in actions:
        held += 1.0 if a.kind is Kind.F else -1.0 if a.kind is Kind.B else -(1.0 - w) if a.kind is Kind.I else -w
        peak = max(peak, held)
    return peak


def greedy(n: int, m: int, cost: CostModel, limit: float, knobs: Knobs, w: tuple[float, ...]) -> Schedule:
    """One candidate: the list schedule the preferences and `knobs` make on `cost`, each stage
    s holding at most `limit` microbatches' activations, a deferred W keeping w[s] of one."""
    g = _ListRun(n, m, cost, limit, knobs, w)
    # each stage's next choice, in a heap by (start, stage); an action changes only its own
    # stage's and its neighbours' choices, so only those are made again (stale entries skipped)
    version = [0] * n
    heap: list[tuple[float, int, int, Kind]] = []
    heappush, choice, take = heapq.heappush, _chooser(g), _taker(g)

    def push(s: int) -> None:
        version[s] += 1
        c = choice(s)
        if c is not None:
            heappush(heap, (c[0], s, version[s], c[1]))

    for s in range(n):
        push(s)
    for _ in range(3 * n * m):
        while heap and heap[0][2] != version[heap[0][1]]:
            heapq.heappop(heap)
        if heap:
            start, s, _, kind = heapq.heappop(heap)
        else:  # every stage waits on an unknown arrival with a W it chose not to run
            s = min((s for s in range(n) if g.pending[s]), key=lambda s: g.free[s])
            start, kind = g.free[s], Kind.W
        take(s, start, kind)
        if s:
            push(s - 1)
        push(s)
        if s + 1 < n:
            push(s + 1)
    return {s: g.acts[s] for s in range(n)}


class _ListRun:
    """greedy's state as it lists actions (its moves: _chooser, _taker): per stage when its
    last action ends, its next F and I (both in microbatch order), the activations it holds
    (F +1, I -(1 - w), W -w), its Is whose W has not run, and when each F's input and each I's
    gradient arrives (INF: not known yet)."""

    __slots__ = ("n", "m", "F", "I", "W", "fwd_hop", "bwd_hop", "w", "room", "knobs", "free", "nf", "ni", "held",
                 "pending", "f_at", "i_at", "acts")

    def __init__(self, n: int, m: int, cost: CostModel, limit: float, knobs: Knobs, w: tuple[float, ...]):
        self.n, self.m, self.knobs, self.w = n, m, knobs, w
        self.F, self.I, self.W = cost.fwd_s, cost.igrad, cost.wgrad
        self.fwd_hop, self.bwd_hop = cost.hops(n)
        self.room = limit + 1e-9  # float sums: 0.1 + 0.2 > 0.3
        self.free = [0.0] * n
        self.nf, self.ni = [0] * n, [0] * n
        self.held = [0.0] * n
        self.pending: list[deque[int]] = [deque() for _ in range(n)]
        self.f_at = [[INF] * m for _ in range(n)]
        self.i_at = [[INF] * m for _ in range(n)]
        self.f_at[0] = [0.0] * m
        self.acts: list[list[Action]] = [[] for _ in range(n)]


def _chooser(g: _ListRun) -> Callable[[int], tuple[float, Kind] | None]:
    """greedy's preferences: choice(s) is (start, kind) of stage s's next action, or None if it
    must wait for an arrival no stage has produced yet. A closure over g's lists (read in place,
    as take changes them): the list schedule asks it three times an action."""
    free, i_at, f_at, ni, nf, held, pending = g.free, g.i_at, g.f_at, g.ni, g.nf, g.held, g.pending
    F, W, m, room = g.F, g.W, g.m, g.room
    extra_warmup, f_first, eager_w = g.knobs.extra_warmup, g.knobs.f_first, g.knobs.eager_w
    KF, KI, KW = Kind.F, Kind.I, Kind.W

    def choice(s: int) -> tuple[float, Kind] | None:
        t = free[s]
        ti = i_at[s][ni[s]] if ni[s] < m else INF
        full = held[s] + 1.0 > room  # one more F would pass the limit
        tf = f_at[s][nf[s]] if nf[s] < m and not full else INF
        has_w = bool(pending[s])
        if ti <= t:
            return t, KI
        if tf <= t:
            if ti < t + F[s] and not (extra_warmup if ni[s] == 0 else f_first):
                # the I comes before the F would end: wait for it, or fill
                return (t, KW) if has_w and t + W[s] <= ti else (ti, KI)
            return t, KF
        nxt = ti if ti < tf else tf
        if has_w and (eager_w or nxt == INF or t + W[s] <= nxt or full or nf[s] == m):
            return t, KW
        if nxt < INF:
            return nxt, (KI if ti <= tf else KF)
        return None

    return choice


def _taker(g: _ListRun) -> Callable[[int, float, Kind], None]:
    """take(s, start, kind): stage s runs `kind` from `start`; what it holds, and when its
    neighbours' inputs arrive (a closure over g's lists, as _chooser)."""
    free, i_at, f_at, ni, nf, held, pending, acts = g.free, g.i_at, g.f_at, g.ni, g.nf, g.held, g.pending, g.acts
    F, I, W, fwd_hop, bwd_hop, w, n = g.F, g.I, g.W, g.fwd_hop, g.bwd_hop, g.w, g.n  # noqa: E741
    KF, KI = Kind.F, Kind.I

    def take(s: int, start: float, kind: Kind) -> None:
        if kind is KF:
            mb = nf[s]
            nf[s] += 1
            held[s] += 1.0
            end = start + F[s]
            if s + 1 < n:
                f_at[s + 1][mb] = end + fwd_hop[s]
            else:
                i_at[s][mb] = end  # the last stage's own loss
        elif kind is KI:
            mb = ni[s]
            ni[s] += 1
            end = start + I[s]
            pending[s].append(mb)
            held[s] -= 1.0 - w[s]
            if s > 0:
                i_at[s - 1][mb] = end + bwd_hop[s]
        else:
            mb = pending[s].popleft()
            held[s] -= w[s]
            end = start + W[s]
        acts[s].append(Action(s, kind, mb))
        free[s] = end

    return take


@dataclass(frozen=True)
class PaperKnobs:
    """The zero-bubble paper's heuristic's three binary hyperparameters (its code's names)."""
    allow_bubble_before_first_b: bool
    prioritize_b: bool
    no_bubble_greedy: bool


PAPER_KNOBS = tuple(PaperKnobs(*k) for k in itertools.product((True, False), repeat=3))


def paper_order(n: int, m: int, cost: CostModel, limit: float, knobs: PaperKnobs, w: tuple[float, ...]
                ) -> Schedule | None:
    """The zero-bubble paper's own heuristic (arXiv 2401.10241 sec. 3.2 and appendix G; the
    authors' `manual_order` in sail-sg/zero-bubble-pipeline-parallelism, re-expressed here),
    or None where it cannot keep within `limit`. Microbatch by microbatch: in the first, F on
    every stage, then on each stage as many warm-up Fs as fill its wait for the first gradient
    within the memory (each stage fewer than the one before), then the Is from the last stage
    back; in every later one, an F on each stage (skipped where `prioritize_b` finds the next
    stage far enough behind and the wait affordable), then the I of that microbatch from the
    last stage back; before an F or an I, Ws to free memory and to fill the wait for its input
    (a wait no longer than the largest bubble so far is left idle unless `no_bubble_greedy`);
    the Ws left at the end."""
    p = _PaperRun(n, m, cost, limit, knobs, w)
    if not _paper_first(p):
        return None
    for mb in range(1, m):
        if not _paper_next(p, mb, _paper_wanted(p)):
            return None
    for s in range(n):
        while p.nw[s] < m:
            p.put(s, Kind.W)
    if any(p.nf[s] < m or p.ni[s] < m for s in range(n)):
        return None
    return {s: p.acts[s] for s in range(n)}


class _PaperRun:
    """paper_order's state as it places actions: per stage its next F, I and W, its last end,
    the activations it holds, its idle time after its first F, each action's end; `top`: the
    largest idle of any stage so far (idle only grows)."""

    def __init__(self, n: int, m: int, cost: CostModel, limit: float, knobs: PaperKnobs, w: tuple[float, ...]):
        self.n, self.m, self.limit, self.knobs, self.w = n, m, limit, knobs, w
        self.Fc, self.Ic, self.Wc = cost.fwd_s, cost.igrad, cost.wgrad
        self.fwd_hop, self.bwd_hop = cost.hops(n)
        self.nf, self.ni, self.nw = [0] * n, [0] * n, [0] * n  # next F, I, W per stage
        self.end = [0.0] * n  # each stage's last end
        self.mem = [0.0] * n
        self.idle = [0.0] * n  # each stage's idle time after its first F
        self.f_end = [[0.0] * m for _ in range(n)]
        self.i_end = [[0.0] * m for _ in range(n)]
        self.acts: list[list[Action]] = [[] for _ in range(n)]
        self.top = 0.0

    def put(self, s: int, kind: Kind) -> None:
        """Stage s's next action of `kind`, at its end or when its input arrives."""
        t = self.end[s]
        if kind is Kind.W:
            mb = self.nw[s]
            self.nw[s], self.mem[s], self.end[s] = mb + 1, self.mem[s] - self.w[s], t + self.Wc[s]
            self.acts[s].append(Action(s, kind, mb))
            return
        if kind is Kind.F:
            mb = self.nf[s]
            ready = self.f_end[s - 1][mb] + self.fwd_hop[s - 1] if s > 0 else 0.0
            start = t if t > ready else ready
            self.f_end[s][mb] = self.end[s] = start + self.Fc[s]
            self.nf[s], self.mem[s] = mb + 1, self.mem[s] + 1.0
            waited = start - t if mb else 0.0  # before the first F: not idle, the stage has not begun
        else:
            mb = self.ni[s]
            ready = self.i_end[s + 1][mb] + self.bwd_hop[s + 1] if s + 1 < self.n else self.f_end[s][mb]
            start = t if t > ready else ready
            self.i_end[s][mb] = self.end[s] = start + self.Ic[s]
            self.ni[s], self.mem[s] = mb + 1, self.mem[s] - (1.0 - self.w[s])
            waited = start - t
        if waited:
            self.idle[s] += waited
            if self.idle[s] > self.top:
                self.top = self.idle[s]
        self.acts[s].append(Action(s, kind, mb))

    def free_for(self, s: int, need: float) -> bool:
        """Ws until `need` more fits; False if it cannot."""
        while self.mem[s] + need > self.limit + 1e-9:
            if self.nw[s] >= self.ni[s]:
                return False
            self.put(s, Kind.W)
        return True

    def fill(self, s: int, ready: float) -> None:
        """Ws into the wait for an input that arrives at `ready`."""
        while self.nw[s] < self.ni[s] and self.end[s] + self.Wc[s] <= ready:
            self.put(s, Kind.W)
        if self.nw[s] < self.ni[s] and self.end[s] < ready:
            if ready - self.end[s] > self.top - self.idle[s] or self.knobs.no_bubble_greedy:
                self.put(s, Kind.W)


def _paper_first(p: _PaperRun) -> bool:
    """The first microbatch: F on every stage, each stage's warm-up Fs (as many as fill its
    wait for the first gradient within the memory, each stage fewer than the one before), then
    the Is from the last stage back; False where the memory does not allow it."""
    n, m, Fc, Ic, bwd_hop = p.n, p.m, p.Fc, p.Ic, p.bwd_hop
    for s in range(n):
        if not p.free_for(s, 1.0):
            return False
        p.put(s, Kind.F)
    extra = [0] * n  # warm-up Fs beyond the first
    last_t = p.f_end[n - 1][0] + Ic[n - 1]
    for s in range(n - 2, -1, -1):
        held, t = p.mem[s], p.end[s]
        arrive = last_t + bwd_hop[s + 1]
        while p.nf[s] + extra[s] < m and held + 1.0 <= p.limit + 1e-9:
            if (t + Fc[s] > arrive) if p.knobs.allow_bubble_before_first_b else (t >= arrive):
                break
            held, t, extra[s] = held + 1.0, t + Fc[s], extra[s] + 1
        last_t = max(t, arrive) + Ic[s]
    for s in range(1, n):
        while extra[s] > 0 and extra[s] >= extra[s - 1] and p.nf[s] + extra[s] < m:
            extra[s] -= 1
    for s in range(n):
        for _ in range(extra[s]):
            p.put(s, Kind.F)
    for s in range(n - 1, -1, -1):
        p.put(s, Kind.I)
    return True


def _paper_wanted(p: _PaperRun) -> list[int]:
    """Which stages take an F in the next microbatch: each with Fs left, but where
    `prioritize_b` finds the next stage far enough behind and the wait affordable; never a
    stage whose next one does not."""
    n, m, Fc, Ic, Wc, bwd_hop, mem, end = p.n, p.m, p.Fc, p.Ic, p.Wc, p.bwd_hop, p.mem, p.end
    want = [0] * n
    for s in range(n):
        if p.nf[s] >= m:
            continue
        if p.knobs.prioritize_b and s + 1 < n and p.nf[s] >= p.nf[s + 1] + 2:
            nxt = end[s + 1] + Fc[s + 1] + Ic[s + 1] + bwd_hop[s + 1]
            if end[s] >= nxt:
                continue
            over = mem[s] + 1.0 - p.limit  # Ws that must run before the F
            w_cost, k = 0.0, 0
            while over > 1e-9 and p.nw[s] + k < p.ni[s]:
                over, w_cost, k = over - p.w[s], w_cost + Wc[s], k + 1
            if end[s] + Fc[s] + w_cost <= nxt:
                want[s] = 1
                continue
            if nxt - end[s] <= p.top - p.idle[s]:
                continue
        want[s] = 1
    for s in range(n - 2, -1, -1):
        want[s] = min(want[s], want[s + 1])
    return want


def _paper_next(p: _PaperRun, mb: int, want: list[int]) -> bool:
    """A later microbatch: the wanted stages' F, then microbatch mb's I from the last stage
    back, each after Ws that free memory and fill the wait for its input; False where the
    heuristic cannot go on."""
    n = p.n
    for s in range(n):
        if want[s]:
            if not p.free_for(s, 1.0):
                return False
            if s > 0:
                p.fill(s, p.f_end[s - 1][p.nf[s]] + p.fwd_hop[s - 1])
            p.put(s, Kind.F)
    for s in range(n - 1, -1, -1):
        if p.ni[s] != mb:  # this stage's F of the microbatch is not done: the heuristic cannot go on
            return False
        if not p.free_for(s, -(1.0 - p.w[s])):
            return False
        if s + 1 < n:
            p.fill(s, p.i_end[s + 1][mb] + p.bwd_hop[s + 1])
        if s == 0 and p.nf[0] == p.m:
            while p.nw[0] < p.ni[0]:
                p.put(0, Kind.W)
        p.put(s, Kind.I)
    return True


def generate(n: int, m: int, cost: CostModel, memory_limit: float = 1.0, w: float | tuple[float, ...] = 1.0
             ) -> Generated:
    """The candidate of the knob grid with the shortest period on `cost` (one stage per rank);
    `w`: per stage (or one for all), the share of a microbatch's activations its deferred W
    keeps. ValueError where the limit cannot hold one microbatch."""
    if (too_big := size_problem(n, m)) is not None:
        raise ValueError(too_big)
    if len(cost.fwd_s) != n:
        raise ValueError(f"costs for {len(cost.fwd_s)} stages, pp={n} (zb_auto: one stage per rank)")
    if (impossible := cost_problem(n, cost)) is not None:
        raise ValueError(impossible)
    ws = (float(w),) * n if isinstance(w, (int, float)) else tuple(w)
    if len(ws) != n or not all(0.0 <= x <= 1.0 for x in ws):
        raise ValueError(f"w={w!r}: a share in [0, 1] per stage ({n} stages)")
    t0 = time.perf_counter()
    limit = limit_of(memory_limit, n)
    if limit < 1.0 - 1e-9:
        raise ValueError(f"memory_limit={memory_limit:g}: {limit:g} microbatches per rank (allowed: >= 1/pp = "
                         f"{1 / n:.3g}, one microbatch)")
    # the handcrafted orders within the limit are candidates too: the search is never worse
    # than ZB-H1 at 1.0 (it holds N), nor than ZB-H2 where the limit holds it
    with paused():  # ~0.5M actions live at once: the collector's passes would find nothing
        return _best(n, m, cost, limit, ws, t0)


def _best(n: int, m: int, cost: CostModel, limit: float, ws: tuple[float, ...], t0: float) -> Generated:
    def seed(name: str, zb: Any) -> Schedule | None:
        x = zb(n, m)
        return x if all(peak_memory(x[s], ws[s]) <= limit + 1e-9 for s in range(n)) else None

    # each candidate made, timed and dropped in turn (a generator): one held at a time, not ~18
    made = itertools.chain(
        ((knobs, greedy(n, m, cost, limit, knobs, ws)) for knobs in KNOBS),
        ((k, paper_order(n, m, cost, limit, k, ws)) for k in PAPER_KNOBS),
        ((f"seed:{name}", seed(name, zb)) for name, zb in (("zb_h1", zb_h1), ("zb_h2", zb_h2))))
    best: tuple[float, float, Schedule, Knobs | PaperKnobs | str] | None = None
    seen: set[tuple] = set()
    for how, sched in made:
        if sched is None:
            continue
        # F, I and W each run in microbatch order here, so a rank's kinds in order are its list
        key = tuple("".join([LETTER[a.kind] for a in acts]) for acts in sched.values())
        if key in seen:
            continue
        seen.add(key)
        c = engine.compile_schedule(sched)
        end = engine.timing(c, cost)
        per, step = engine.period(c, cost, end), engine.step_time(c, cost, end)
        if best is None or per < best[0] - 1e-12 or (per <= best[0] + 1e-12 and step < best[1] - 1e-12):
            best = (per, step, sched, how)
    assert best is not None
    return Generated(best[2], best[3], best[0], best[1], len(seen), time.perf_counter() - t0, limit)


# -- the registry entry: schedule=zb_auto, made from the run's priced costs ------------------------
@dataclass
class AutoScheduleConfig(ScheduleConfig):
    """schedule=zb_auto: a zero-bubble order generated for the run's own costs."""

    name: str = "zb_auto"
    memory_limit: float = 1.0  # microbatches a rank may hold from F to W, in units of 1F1B's peak (N): 1.0 ZB-1p
    costs: str = "model"  # model: the plan's priced costs (emulated or a profile, and its links) | a run dir: its measured

    def problem(self, c: Any) -> str | None:
        m = self.memory_limit
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m < 1 / c.pp:
            return (f"schedule.memory_limit={m!r}: in units of 1F1B's peak, pp={c.pp} microbatches "
                    f"(allowed: a number >= 1/pp = {1 / c.pp:.3g}, one microbatch per rank)")
        if self.costs != "model" and not os.path.isfile(os.path.join(self.costs, "result.json")):
            return (f"schedule.costs={self.costs}: no result.json there (allowed: model, or a "
                    "prior run's directory: its measured per-stage F, I, W and hop)")
        return None


def make(x: ScheduleInputs) -> Schedule:
    """The order generated for the plan's priced costs (or a prior run's measured ones,
    schedule.costs) and what each stage's deferred W keeps; its note says how it was made."""
    s = x.section
    cost = x.costs() if s.costs == "model" else x.measured_costs(s.costs)
    w = x.deferred_share()
    g = generate(x.pp, x.microbatches, cost, s.memory_limit, w)
    how = g.knobs if isinstance(g.knobs, str) else ", ".join(f"{k}={v}" for k, v in vars(g.knobs).items())
    on = "the plan's priced costs" if s.costs == "model" else f"{s.costs}'s measured costs"
    x.note(f"memory_limit={s.memory_limit:g} ({g.limit:g} microbatches' activations per rank, a deferred W keeping "
           f"{min(w):.2f}-{max(w):.2f} of one): the shortest period of {g.candidates} candidates ({how}) on {on}, "
           f"period {g.period_s:.4g} s, step {g.step_s:.4g} s; generated in {g.seconds:.3f} s")
    return g.schedule


def _check(c: Any) -> str | None:
    if c.virtual_stages != 1:
        return f"virtual_stages={c.virtual_stages}: zb_auto has one stage per rank (allowed: 1)"
    return size_problem(c.pp, c.microbatches)


def _inputs(section: Any) -> dict[str, str]:
    """The prior run's record its costs come from (schedule.costs)."""
    costs = getattr(section, "costs", None)
    return {"schedule.costs": str(Path(costs) / "result.json")} if costs and costs != "model" else {}


register(ScheduleSpec(
    "zb_auto", "zero-bubble order generated for the run's costs and schedule.memory_limit (arXiv 2401.10241 sec. 3)",
    None, split_backward=True, check=_check, color="#17becf", needs=COSTS, make=make, config=AutoScheduleConfig,
    inputs=_inputs, label=lambda s: f"zb_auto mem={s.get('memory_limit', 1.0):g}", limit_key="memory_limit",
    plan_cost=10.0))
