"""The simulator's timing (harness/simulate/engine.py), compiled once per schedule and then
evaluated per cost vector: only times, no Event objects, and every message priced by the link
it crosses in its own direction.

Semantics are the engine's: an action starts when its rank has finished the action before it
and its inputs have arrived (F: the activation of stage - 1; B and I: its own F and the
gradient of stage + 1; W: its own I); a message between stages on one rank is a local hand-off
and costs nothing. For a fixed per-rank order the start times are a longest path through that
dependency graph, whose shape does not depend on the costs: `compile_schedule` finds a
topological order once (the engine's own traversal), and `makespan` is then one pass over flat
lists. tests/test_advise.py checks it equals the engine on every schedule.

Beyond the engine (each optional, each zero by default):
- a hop per stage boundary and direction (`fwd_hop[s]`: the activation s -> s + 1,
  `bwd_hop[s]`: the gradient s -> s - 1), where the engine's CostModel has one cost per
  sending stage for both directions;
- `last_bwd_extra[s]`: seconds added to stage s's last backward of the step (the
  data-parallel all-reduce DDP runs inside it, which the rank waits for);
- `action_overhead_s`: seconds added to every compute action (what an executor adds).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from harness.schedules.registry import build
from harness.schedules.ir import Kind, Schedule, stage_to_rank

F, B, I, W, LASTB = 0, 1, 2, 3, 4  # cost codes: kind * stages + stage; LASTB: a stage's last B (or I)
KINDS = {Kind.F: F, Kind.B: B, Kind.I: I, Kind.W: W}


@dataclass(frozen=True)
class Compiled:
    stages: int
    ranks: int
    owner: tuple[int, ...]  # [stage] rank
    # one row per action in a topological order: (rank predecessor, dep 1, hop code 1, dep 2,
    # hop code 2, cost code); indices into the rows, -1 = none (a sentinel 0.0 at the end)
    rows: tuple[tuple[int, int, int, int, int, int], ...]
    last_of_rank: tuple[int, ...]  # [rank] row of its last action
    actions: int
    lastb_kind: tuple[int, ...]  # [stage] B or I: what its last backward is (zero-bubble schedules split B)


def compile_schedule(schedule: Schedule) -> Compiled:
    """Rows in the order the engine's traversal completes the actions (cost independent: an
    action completes once its inputs exist), every (stage, microbatch) an integer."""
    owner_map = stage_to_rank(schedule)
    S = max(owner_map) + 1
    ranks = max(schedule) + 1
    M = 1 + max(a.microbatch for acts in schedule.values() for a in acts)
    n = S * M
    acts = {r: [(a.stage, KINDS[a.kind], a.microbatch) for a in lst] for r, lst in schedule.items()}
    # the traversal: done_f[s*M + mb] (F done: its activation exists), done_i (I done), grad (the
    # gradient of stage s exists); waiting: event code (kind * n + id) -> ranks blocked on it
    done_f, done_i, grad = bytearray(n), bytearray(n), bytearray(n)
    waiting: dict[int, list[int]] = {}
    pos = dict.fromkeys(schedule, 0)
    order: list[tuple[int, int]] = []
    todo = list(schedule)
    last = S - 1
    while todo:
        r = todo.pop()
        lst, p = acts[r], pos[r]
        while p < len(lst):
            s, k, mb = lst[p]
            j = s * M + mb
            need = -1
            if k == F:
                if s and not done_f[j - M]:
                    need = j - M
            elif k == W:
                if not done_i[j]:
                    need = n + j
            elif not done_f[j]:
                need = j
            elif s < last and not grad[j + M]:
                need = 2 * n + j + M
            if need >= 0:
                waiting.setdefault(need, []).append(r)
                break
            if k == F:
                done_f[j] = 1
                made: tuple[int, ...] = (j,)
            elif k == I:
                done_i[j] = grad[j] = 1
                made = (n + j, 2 * n + j)
            elif k == B:
                grad[j] = 1
                made = (2 * n + j,)
            else:
                made = ()
            for code in made:
                if code in waiting:
                    todo += waiting.pop(code)
            order.append((r, p))
            p += 1
        pos[r] = p
    stuck = [r for r in schedule if pos[r] < len(acts[r])]
    if stuck:
        raise ValueError(f"schedule deadlocks: ranks {stuck} cannot finish")
    index = {r: [0] * len(lst) for r, lst in acts.items()}
    f_row, bi_row, i_row = [-1] * n, [-1] * n, [-1] * n
    for i, (r, p) in enumerate(order):
        index[r][p] = i
        s, k, mb = acts[r][p]
        if k == F:
            f_row[s * M + mb] = i
        elif k != W:
            bi_row[s * M + mb] = i
            if k == I:
                i_row[s * M + mb] = i
    last_bwd: dict[int, tuple[int, int]] = {}  # stage -> (rank, position) of its last B/I in rank order
    for r, lst in acts.items():
        for p, (s, k, _) in enumerate(lst):
            if k in (B, I):
                last_bwd[s] = (r, p)
    last_rows = {index[r][p] for r, p in last_bwd.values()}
    # hop codes: 0..S-1 forward hop of stage s's activation (to s + 1), S..2S-1 backward hop of
    # stage s's gradient (to s - 1), -1 none
    rows = []
    for i, (r, p) in enumerate(order):
        s, k, mb = acts[r][p]
        j = s * M + mb
        prev = index[r][p - 1] if p else -1
        d1 = h1 = d2 = h2 = -1
        if k == F:
            if s:
                d1, h1 = f_row[j - M], (s - 1 if owner_map[s - 1] != r else -1)
        elif k == W:
            d1 = i_row[j]
        else:
            d1 = f_row[j]
            if s < last:
                d2, h2 = bi_row[j + M], (S + s + 1 if owner_map[s + 1] != r else -1)
        rows.append((prev, d1, h1, d2, h2, (LASTB if i in last_rows else k) * S + s))
    last_of_rank = tuple(index[r][len(acts[r]) - 1] for r in range(ranks))
    lastb = tuple(acts[r][p][1] for r, p in (last_bwd[s] for s in range(S)))
    return Compiled(S, ranks, tuple(owner_map[s] for s in range(S)), tuple(rows), last_of_rank, len(rows), lastb)


@lru_cache(maxsize=8)
def built(name: str, pp: int, m: int, v: int) -> Schedule:
    """The built-in schedule (cached: the search visits one schedule's points together)."""
    return build(name, pp, m, v)


@lru_cache(maxsize=64)
def compiled(name: str, pp: int, m: int, v: int) -> Compiled:
    """The built-in schedule, compiled (cached: many points share one)."""
    return compile_schedule(built(name, pp, m, v))


def rank_ends(c: Compiled, fwd: list[float], bwd: list[float], igrad: list[float], wgrad: list[float],
              fwd_hop: list[float] | None = None, bwd_hop: list[float] | None = None,
              last_bwd_extra: list[float] | None = None, action_overhead_s: float = 0.0, send_s: float = 0.0,
              recv_s: float = 0.0) -> list[float]:
    """Seconds at which each rank finishes its last action (the step starts at 0). An action
    that receives its input from another rank costs recv_s more, one that sends its output to
    another rank send_s more (posting it: the message leaves after)."""
    S = c.stages
    o = action_overhead_s
    extra = last_bwd_extra or [0.0] * S
    own = c.owner
    up = [s + 1 < S and own[s + 1] != own[s] for s in range(S)]  # F's output goes to another rank
    down = [s > 0 and own[s - 1] != own[s] for s in range(S)]  # B/I's input gradient goes to another rank
    f_io = [o + send_s * up[s] + recv_s * down[s] for s in range(S)]  # F receives from s - 1, sends to s + 1
    b_io = [o + send_s * down[s] + recv_s * up[s] for s in range(S)]  # B/I receives from s + 1, sends to s - 1
    table = ([f + x for f, x in zip(fwd, f_io)] + [b + x for b, x in zip(bwd, b_io)]
             + [g + x for g, x in zip(igrad, b_io)] + [w + o for w in wgrad]
             + [(igrad[s] if c.lastb_kind[s] == I else bwd[s]) + b_io[s] + extra[s] for s in range(S)])
    hops = list(fwd_hop or [0.0] * S) + list(bwd_hop or [0.0] * S) + [0.0]  # index -1: no hop
    end: list[float] = []
    append = end.append
    for prev, d1, h1, d2, h2, code in c.rows:
        t = end[prev] if prev >= 0 else 0.0
        if d1 >= 0:
            x = end[d1] + hops[h1]
            if x > t:
                t = x
            if d2 >= 0:
                x = end[d2] + hops[h2]
                if x > t:
                    t = x
        append(t + table[code])
    return [end[i] for i in c.last_of_rank]


def makespan(c: Compiled, *args, **kwargs) -> float:
    return max(rank_ends(c, *args, **kwargs))
