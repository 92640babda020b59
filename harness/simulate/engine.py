"""The one simulator: a schedule's timing on a cost model, compiled once per schedule.

Semantics are the runtime's (harness/runtime/native.py with its transports): an action starts
when its rank has finished the action before it and its inputs have arrived (F: the activation
of stage - 1; B and I: its own F and the gradient of stage + 1; W: its own I); sends are posted
without blocking, a receive blocks until its message has arrived, and a message between stages
on one rank is a local hand-off that costs nothing. With data parallelism each stage's gradients
are all-reduced once they are complete: inside its last backward of the step, which the rank
waits for, and only then is that backward's gradient sent on (DDP finishes the sync before
backward returns); after its last W where the schedule splits the backward. After its last
action each rank steps its optimizer. Only a cycle of receive waits deadlocks.

For a fixed per-rank order the start times are a longest path through that dependency graph,
whose shape does not depend on the costs: `compile_schedule` finds a topological order once
(each rank runs its list until it blocks on a missing input; the producer of that input wakes
it) and raises Deadlock, naming every stuck rank and what it waits for, when no rank can go on.
`timing` is then one pass over flat lists per cost model (no objects), `trace` the same pass
with an Event per action (and per gradient sync, receive, send and optimizer step that costs
anything). executor=sim, the bubble's simulation and attribution, theory's simulated ideal, the
planner and the report's gallery all run this.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cached_property

from harness.simulate.gc_pause import paused
from harness.schedules.ir import Action, Kind, Schedule
from harness.simulate.cost import CostModel
from harness.measure.trace import COMM, COMPUTE, WAIT, Event, Trace

F, B, I, W, LASTB = 0, 1, 2, 3, 4  # cost codes (code * stages + stage); LASTB: a stage's last B, I or W  # noqa: E741
KF, KB, KI, KW = Kind.F, Kind.B, Kind.I, Kind.W
LETTERS = "FBIW"


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


@dataclass(frozen=True, eq=False)
class Compiled:
    stages: int
    ranks: tuple[int, ...]  # the schedule's ranks, in order
    owner: tuple[int, ...]  # [stage] rank
    # one row per action in a topological order: (rank predecessor, dep 1, hop code 1, dep 2,
    # hop code 2, cost code); rows are indices, -1 none; hop codes: s the activation of stage s
    # (to s + 1), stages + s the gradient of stage s (to s - 1), -1 none (same rank)
    rows: tuple[tuple[int, int, int, int, int, int], ...]
    actions: tuple[tuple[int, int, int, int], ...]  # [row] (rank, stage, kind code, microbatch)
    by_rank: tuple[tuple[int, ...], ...]  # [i-th rank] its rows in its own order
    lastb_kind: tuple[int, ...]  # [stage] B, I or W: its last gradient-making action
    kind_counts: tuple[dict[tuple[int, int], int], ...]  # [i-th rank] (kind code, stage) -> its actions of them
    lastb: frozenset[int]  # rows that end a stage's gradients (where its gradient sync runs)

    @cached_property
    def receives(self) -> tuple[bool, ...]:
        """[row] its input comes from another rank (F from stage - 1, B/I from stage + 1)."""
        own, last = self.owner, self.stages - 1
        return tuple(k != W and (s > 0 and own[s - 1] != r if k == F else s < last and own[s + 1] != r)
                     for r, s, k, _ in self.actions)

    @cached_property
    def sends(self) -> tuple[bool, ...]:
        """[row] its output goes to another rank (F's to stage + 1, B/I's to stage - 1)."""
        own, last = self.owner, self.stages - 1
        return tuple(k != W and (s < last and own[s + 1] != r if k == F else s > 0 and own[s - 1] != r)
                     for r, s, k, _ in self.actions)


def _waits_for(s: int, k: int, mb: int, stages: int, done_f: bytearray, done_i: bytearray, grad: bytearray,
               n_mb: int) -> str:
    """What a stuck action misses, in words."""
    j = s * n_mb + mb
    if k == F:
        return f"activation of {s - 1}F{mb}"
    if k == W:
        return f"{s}I{mb}"
    missing = [] if done_f[j] else [f"{s}F{mb}"]
    if s < stages - 1 and not grad[j + n_mb]:
        missing.append(f"gradient of {s + 1}B{mb}/{s + 1}I{mb}")
    return ", ".join(missing)


def _code(k: Kind) -> int:
    """A kind's cost code, by identity (an enum's hash is a Python call: this runs per action)."""
    return F if k is KF else B if k is KB else I if k is KI else W


def compile_schedule(schedule: Schedule) -> Compiled:
    """Rows in the order the traversal completes the actions (cost independent: an action
    completes once its inputs exist), every (stage, microbatch) an integer: each rank runs its
    list until it blocks on a missing input, whose producer wakes it. A row is made as its
    action completes (its inputs' rows exist by then). Deadlock if no rank can go on."""
    owner_map: dict[int, int] = {}
    for r, lst in schedule.items():
        for a in lst:
            owner_map.setdefault(a.stage, r)
    S = max(owner_map, default=-1) + 1
    M = 1 + max((a.microbatch for acts in schedule.values() for a in acts), default=0)
    owner = [owner_map[s] for s in range(S)]
    rows, actions, mine = _traverse(schedule, owner, S, M)
    ranks = tuple(sorted(schedule))
    last_rows: dict[int, int] = {}  # stage -> the row of its last B, I or W (its gradients complete)
    for r in ranks:
        for i in mine[r]:
            if actions[i][2] in (B, I, W):
                last_rows[actions[i][1]] = i
    lastb = tuple(actions[last_rows[s]][2] for s in range(S))
    for s, i in last_rows.items():  # its cost code: the sync runs inside it
        rows[i] = (*rows[i][:5], LASTB * S + s)
    counts = tuple(Counter((code, s) for _, s, code, _ in (actions[i] for i in mine[r])) for r in ranks)
    return Compiled(S, ranks, tuple(owner), tuple(rows), tuple(actions), tuple(tuple(mine[r]) for r in ranks),
                    lastb, counts, frozenset(last_rows.values()))


Row = tuple[int, int, int, int, int, int]  # compile_schedule's: see _traverse


def _traverse(schedule: Schedule, owner: list[int], S: int, M: int
              ) -> tuple[list[Row], list[tuple[int, int, int, int]], dict[int, list[int]]]:
    """(rows, actions, each rank's rows in its order): compile_schedule's traversal. A row is
    (previous row of the rank, the F row it needs, its receive's hop code, the gradient row it
    needs, that gradient's hop code, its cost code); Deadlock where ranks are left blocked.
    State, by (stage, microbatch) id s*M + mb: done_f (its F done: the activation exists), done_i
    (I done), grad (stage s's input gradient exists); f_row, bi_row, i_row: the row that made
    each; waiting: event code (kind * n + id) -> the ranks blocked on it."""
    n, last = S * M, S - 1
    done_f, done_i, grad = bytearray(n), bytearray(n), bytearray(n)
    f_row, bi_row, i_row = [-1] * n, [-1] * n, [-1] * n
    waiting: dict[int, list[int]] = {}
    pos, mine = dict.fromkeys(schedule, 0), {r: [] for r in schedule}
    rows: list[Row] = []
    actions: list[tuple[int, int, int, int]] = []
    todo = list(schedule)
    while todo:
        r = todo.pop()
        lst, p, rows_r = schedule[r], pos[r], mine[r]
        prev = rows_r[-1] if rows_r else -1
        while p < len(lst):
            s, k, mb = lst[p]
            j = s * M + mb
            i = len(rows)
            if k is KF:
                if s and not done_f[j - M]:
                    waiting.setdefault(j - M, []).append(r)
                    break
                done_f[j] = 1
                f_row[j] = i
                made: tuple[int, ...] = (j,)
                rows.append((prev, f_row[j - M] if s else -1, s - 1 if s and owner[s - 1] != r else -1, -1, -1, s))
                actions.append((r, s, F, mb))
            elif k is KW:
                if not done_i[j]:
                    waiting.setdefault(n + j, []).append(r)
                    break
                made = ()
                rows.append((prev, i_row[j], -1, -1, -1, W * S + s))
                actions.append((r, s, W, mb))
            else:
                if not done_f[j]:
                    waiting.setdefault(j, []).append(r)
                    break
                if s < last and not grad[j + M]:
                    waiting.setdefault(2 * n + j + M, []).append(r)
                    break
                if k is KI:
                    done_i[j] = grad[j] = 1
                    made, code = (n + j, 2 * n + j), I
                    i_row[j] = i
                else:
                    grad[j] = 1
                    made, code = (2 * n + j,), B
                bi_row[j] = i
                below = s < last  # the gradient comes from the next stage (its own hop if on another rank)
                rows.append((prev, f_row[j], -1, bi_row[j + M] if below else -1,
                             S + s + 1 if below and owner[s + 1] != r else -1, code * S + s))
                actions.append((r, s, code, mb))
            rows_r.append(i)
            prev = i
            for c in made:
                if c in waiting:
                    todo += waiting.pop(c)
            p += 1
        pos[r] = p
    if stuck := [Stuck(r, pos[r], a, _waits_for(a.stage, _code(a.kind), a.microbatch, S, done_f, done_i, grad, M))
                 for r in sorted(schedule) if pos[r] < len(schedule[r]) for a in (schedule[r][pos[r]],)]:
        raise Deadlock(stuck)
    return rows, actions, mine


def _table(c: Compiled, cost: CostModel) -> tuple[list[float], list[float]]:
    """(seconds of each cost code, seconds of each hop code, -1 last): a row's whole span,
    receive + compute + overhead + sync + send."""
    S = c.stages
    o, send, recv = cost.action_overhead_s, cost.send_s, cost.recv_s
    own = c.owner
    up = [s + 1 < S and own[s + 1] != own[s] for s in range(S)]  # F's output goes to another rank
    down = [s > 0 and own[s - 1] != own[s] for s in range(S)]  # B/I's input gradient goes to another rank
    f_io = [o + send * up[s] + recv * down[s] for s in range(S)]  # F receives from s - 1, sends to s + 1
    b_io = [o + send * down[s] + recv * up[s] for s in range(S)]  # B/I receives from s + 1, sends to s - 1
    sync = cost.sync_s or (0.0,) * S
    igrad, wgrad = cost.igrad, cost.wgrad
    table = ([f + x for f, x in zip(cost.fwd_s, f_io)] + [b + x for b, x in zip(cost.bwd_s, b_io)]
             + [g + x for g, x in zip(igrad, b_io)] + [w + o for w in wgrad]
             + [(wgrad[s] + o if c.lastb_kind[s] == W else (igrad[s] if c.lastb_kind[s] == I else cost.bwd_s[s])
                 + b_io[s]) + sync[s] for s in range(S)])
    fwd_hop, bwd_hop = cost.hops(S)
    return table, fwd_hop + bwd_hop + [0.0]


def timing(c: Compiled, cost: CostModel) -> list[float]:
    """Seconds at which each row's action ends, its send posted (the step starts at 0)."""
    table, hops = _table(c, cost)
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
    return end


def rank_ends(c: Compiled, cost: CostModel, end: list[float] | None = None) -> list[float]:
    """[i-th rank] when its last action ends, its optimizer step not included."""
    end = timing(c, cost) if end is None else end
    return [end[rows[-1]] if rows else 0.0 for rows in c.by_rank]


def step_time(c: Compiled, cost: CostModel, end: list[float] | None = None) -> float:
    """The whole step: the last rank's end with its optimizer step, plus the per-step overhead."""
    ends = rank_ends(c, cost, end)
    opt = cost.optimizer_s or (0.0,) * len(ends)
    return max(e + o for e, o in zip(ends, opt)) + cost.step_overhead_s


def spans(c: Compiled, cost: CostModel, end: list[float] | None = None) -> list[tuple[float, float, float]]:
    """[i-th rank] (first compute start, last compute end, compute seconds): a rank's actions
    run in its order, so only its first and last bound it."""
    end = timing(c, cost) if end is None else end
    parts = _Parts(c, cost)
    compute = [[x + cost.action_overhead_s for x in times] for times in parts.compute]
    out = []
    for rows, counts in zip(c.by_rank, c.kind_counts):
        busy = sum(n * compute[k][s] for (k, s), n in counts.items())
        if not rows:
            out.append((0.0, 0.0, busy))
            continue
        first, last = rows[0], rows[-1]
        _, s, k, _ = c.actions[first]
        _, dur, tail = parts.of(first, s, k)
        t0 = end[first] - tail - dur
        _, s, k, _ = c.actions[last]
        out.append((t0, end[last] - parts.of(last, s, k)[2], busy))
    return out


def bubble(c: Compiled, cost: CostModel, end: list[float] | None = None) -> float:
    """Mean over ranks of 1 - compute time / the step window, as harness.measure.metrics.bubble_per_rank
    measures a trace: the window from the first compute action's start to the last one's end."""
    per = spans(c, cost, end)
    ran = [x for x, rows in zip(per, c.by_rank) if rows]
    window = max(x[1] for x in ran) - min(x[0] for x in ran) if ran else 0.0
    return sum(1.0 - x[2] / window for x in per) / len(per) if window > 0 else 0.0


def period(c: Compiled, cost: CostModel, end: list[float] | None = None) -> float:
    """The longest rank span, first compute start to last compute end: the time between steps
    when each rank starts its next step as soon as it ends this one (the zero-bubble paper's
    objective, arXiv 2401.10241 sec. 3: its ranks do not wait at a barrier, its optimizer step
    is validated after the fact)."""
    return max((t1 - t0 for t0, t1, _ in spans(c, cost, end)), default=0.0)


def steady_bubble(c: Compiled, cost: CostModel, end: list[float] | None = None) -> float:
    """Mean over ranks of 1 - compute time / `period`: the bubble of overlapped steps, the
    zero-bubble paper's bubble rate (its ZB-2p's "near zero" is this figure)."""
    per = spans(c, cost, end)
    p = max((t1 - t0 for t0, t1, _ in per), default=0.0)  # an idle rank's span is 0
    return sum(1.0 - busy / p for _, _, busy in per) / len(per) if p > 0 else 0.0


class _Parts:
    """A row's span in its parts: (receive before, compute, sync and send after)."""

    def __init__(self, c: Compiled, cost: CostModel):
        S = c.stages
        self.c, self.recv, self.send, self.o = c, cost.recv_s, cost.send_s, cost.action_overhead_s
        self.compute = [cost.fwd_s, cost.bwd_s, cost.igrad, cost.wgrad]
        self.sync = cost.sync_s or (0.0,) * S
        self.lastb = c.lastb

    def of(self, i: int, s: int, k: int) -> tuple[float, float, float]:
        c = self.c
        lead = self.recv if c.receives[i] else 0.0
        tail = (self.send if c.sends[i] else 0.0) + (self.sync[s] if i in self.lastb else 0.0)
        return lead, self.compute[k][s] + self.o, tail


def trace(c: Compiled, cost: CostModel, step: int = 0, end: list[float] | None = None) -> Trace:
    """The step as events: each rank's actions in its order (rank 0's first), with, where they
    cost anything, a receive wait before an action, the gradient sync (`dp_sync`) and a send
    after it, the optimizer step after the rank's last action, and the per-step overhead."""
    end = timing(c, cost) if end is None else end
    parts = _Parts(c, cost)
    plain = not (cost.recv_s or cost.send_s or any(parts.sync))
    new_event = object.__new__
    out: Trace = []
    append = out.append
    durs = [[x + cost.action_overhead_s for x in times] for times in parts.compute]
    actions = c.actions
    with paused():
        for rows in c.by_rank:
            for i in rows:
                r, s, k, mb = actions[i]
                if plain:  # no receive before, no sync or send after: the action ends its row
                    lead, t1 = 0.0, end[i]
                    t0, tail = t1 - durs[k][s], 0.0
                else:
                    lead, dur, tail = parts.of(i, s, k)
                    t1 = end[i] - tail
                    t0 = t1 - dur
                letter = LETTERS[k]
                if lead:
                    append(Event(r, step, f"recv {s}{letter}{mb}", WAIT, "recv", s, mb, t0 - lead, t0))
                # Event(...) sets its frozen fields one object.__setattr__ at a time, 3x slower than
                # filling the instance dict in field order (same object, same memory; tested)
                e = new_event(Event)
                d = e.__dict__
                d["rank"], d["step"], d["name"], d["cat"], d["kind"] = r, step, f"{s}{letter}{mb}", COMPUTE, letter
                d["stage"], d["microbatch"], d["start"], d["end"] = s, mb, t0, t1
                append(e)
                if plain or not tail:
                    continue
                synced = parts.sync[s] if i in parts.lastb else 0.0
                if synced:
                    append(Event(r, step, f"dp_sync {s}", COMM, "dp_sync", s, -1, t1, t1 + synced))
                if c.sends[i] and cost.send_s:
                    append(Event(r, step, f"send {s}{letter}{mb}", COMM, "send", s, mb, t1 + synced, end[i]))
        ends = rank_ends(c, cost, end)
        opt = cost.optimizer_s or (0.0,) * len(ends)
        for r, e_r, o in zip(c.ranks, ends, opt):
            if o:
                append(Event(r, step, "optim", COMPUTE, "optim", -1, -1, e_r, e_r + o))
        if cost.step_overhead_s:
            r, last = max(zip(c.ranks, (e + o for e, o in zip(ends, opt))), key=lambda x: x[1])
            append(Event(r, step, "step overhead (modeled)", COMPUTE, "overhead", -1, -1, last,
                         last + cost.step_overhead_s))
    return out


def simulate(schedule: Schedule, cost: CostModel, step: int = 0) -> Trace:
    """Every action of `schedule` timed on `cost` (compiled here: a caller that simulates one
    schedule on several cost models compiles once and calls `trace` or `timing`)."""
    return trace(compile_schedule(schedule), cost, step)
