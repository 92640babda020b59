"""V-shape builders: 2 chunks per rank, stage s of S = 2N on rank s for s < N, else rank 2N-1-s.

Rank r holds stages r (chunk 0, going down) and 2N-1-r (chunk 1, coming back up), so the
first and the last stage share rank 0 and the turn N-1 -> N stays on rank N-1 (no message).
Both register themselves (harness/schedules/registry.py) with their closed forms.
"""

from __future__ import annotations

from collections import Counter

from harness.schedules.ir import Action, Kind, Schedule
from harness.schedules.registry import V_SHAPE, ScheduleSpec, register

F, B, I, W = Kind.F, Kind.B, Kind.I, Kind.W  # noqa: E741

Step = tuple[int | None, Kind]  # (stage, kind); (None, W): the oldest pending W of any stage


class _Rank:
    """One rank's action list, built step by step. F, B and I take each stage's next
    microbatch in turn (B and I share the count); each I leaves its W pending, and a W step
    emits the oldest pending W of its stage (of any stage for None), or nothing."""

    def __init__(self) -> None:
        self.acts: list[Action] = []
        self.count: Counter[tuple[int, Kind]] = Counter()
        self.pending: list[Action] = []

    def add(self, stage: int | None, kind: Kind) -> None:
        if kind is W:
            i = next((i for i, a in enumerate(self.pending) if stage in (None, a.stage)), None)
            if i is not None:
                self.acts.append(self.pending.pop(i))
            return
        assert stage is not None
        key = (stage, I if kind is B else kind)
        a = Action(stage, kind, self.count[key])
        self.count[key] += 1
        self.acts.append(a)
        if kind is I:
            self.pending.append(Action(stage, W, a.microbatch))

    def repeat(self, times: int, *steps: Step) -> None:
        for _ in range(times):
            for stage, kind in steps:
                self.add(stage, kind)


def zbv(n: int, m: int) -> Schedule:
    """ZB-V (Qi et al., arXiv 2401.10241 sec. 6), in the order of torch.distributed.pipelining's
    ScheduleZBVZeroBubble. Rank r (chunks c0 = r, c1 = 2N-1-r): 2(N-r)-1 F0; r (F1, F0);
    N-r (F1, I1, W1); then (F0, I0, W0, F1, I1, W1) until the forwards are done (F0 while
    any is left); r (I0, I1); N-r (I0, W0); the deferred W1's, then W0's. Built for
    max(M, 2N-1) microbatches and the ones >= M dropped, as torch pads."""
    big = max(m, 2 * n - 1)
    sched: Schedule = {}
    for r in range(n):
        c0, c1 = r, 2 * n - 1 - r
        e = _Rank()
        e.repeat(2 * (n - r) - 1, (c0, F))
        e.repeat(r, (c1, F), (c0, F))
        e.repeat(n - r, (c1, F), (c1, I), (c1, W))
        while e.count[(c1, F)] < e.count[(c0, F)] or e.count[(c0, F)] < big:
            if e.count[(c0, F)] < big:
                e.add(c0, F)
            e.repeat(1, (c0, I), (c0, W), (c1, F), (c1, I), (c1, W))
        e.repeat(r, (c0, I), (c1, I))
        e.repeat(n - r, (c0, I), (c0, W))
        e.repeat(len(e.pending), (c1, W))
        e.repeat(len(e.pending), (c0, W))
        sched[r] = [a for a in e.acts if a.microbatch < m]
    return sched


def dualpipev(n: int, m: int) -> Schedule:
    """DualPipeV (DeepSeek's DualPipe, arXiv 2412.19437, cut in half as in deepseek-ai/DualPipe
    dualpipev.py), in the order of torch.distributed.pipelining's ScheduleDualPipeV; needs
    M >= 2N. Rank r (chunks c0 = r, c1 = 2N-1-r): 2(N-r-1) F0; r+1 (F0, F1); N-r-1 (I1, W, F1);
    M-2N+r+1 overlapped pairs (F0, B1), (F1, B0); N-r-1 (B1, F1, B0); r+1 (B1, B0), each an
    I from the middle pair on; N-r-1 (W, B0 or I0); r+1 W. An overlapped pair is its two
    actions back to back (the IR has no fused action); W's go oldest first."""
    sched: Schedule = {}
    for r in range(n):
        c0, c1 = r, 2 * n - 1 - r
        e = _Rank()
        e.repeat(2 * (n - r - 1), (c0, F))
        e.repeat(r + 1, (c0, F), (c1, F))
        e.repeat(n - r - 1, (c1, I), (None, W), (c1, F))
        e.repeat(m - 2 * n + r + 1, (c0, F), (c1, B), (c1, F), (c0, B))
        e.repeat(n - r - 1, (c1, B), (c1, F), (c0, B))
        split = False  # torch: odd ranks split from the middle pair's B1 on, even ranks from its B0
        for i in range(r + 1):
            split |= i == (r + 1) // 2 and r % 2 == 1
            e.add(c1, I if split else B)
            split |= i == (r + 1) // 2 and r % 2 == 0
            e.add(c0, I if split else B)
        e.repeat(n - r - 1, (None, W), (c0, I if split else B))
        e.repeat(r + 1, (None, W))
        sched[r] = e.acts
    return sched


def _idle_zbv(n: int, m: int, v: int, F: float, B: float, I: float, W: float) -> float | None:  # noqa: E741
    # ZB-V (Qi et al., arXiv 2401.10241 sec. 6) is N-1 at F = I = W for M >= 2N-1. In
    # general (our longest-path enumeration) the critical paths' excess over one rank's work
    # 2M(F+I+W) is the largest of, for M >= 2N-1:
    #   max(F, I) + (N-2) W,  (N-1) I,  2(N-1)(I - W),  (2N-3) F - (N-2) I,
    #   (2N-3) F + I - 2(N-1) W,  (2N-2) F - (N-1) I - W,  (2N-2) F - (2N-1) W
    # and for M <= N (k = M-1, L = 2N-2):
    #   (L-2k) F + L I,  (L-k)(F+I),  L F + (L-3k) I - k W,  L F + (L-2k) I - 2k W
    # (at F = I = W both give the old max(N-1, 4N-2-2M)).
    L = 2 * n - 2
    if m >= 2 * n - 1:
        return max(max(F, I) + (n - 2) * W, (n - 1) * I, L * (I - W),
                   (L - 1) * F - (n - 2) * I, (L - 1) * F + I - L * W,
                   L * F - (n - 1) * I - W, L * F - (L + 1) * W)
    if m <= n:
        k = m - 1
        return max((L - 2 * k) * F + L * I, (L - k) * (F + I),
                   L * F + (L - 3 * k) * I - k * W, L * F + (L - 2 * k) * I - 2 * k * W)
    if F == I == W:
        # N < M < 2N-1 at equal F, I, W: our fit of the simulator, exact over the tests' grid
        return max(n - 1, 4 * n - 2 - 2 * m) * F
    return None  # N < M < 2N-1: the builder pads to 2N-1 microbatches; the simulated ideal


def _idle_dualpipev(n: int, m: int, v: int, F: float, B: float, I: float, W: float) -> float:  # noqa: E741
    # DualPipe's own (PP/2-1)(F&B + B - 3W) (arXiv 2412.19437 sec. 3.3.2, Table 2) assumes a
    # fused, truly overlapped F&B; here an overlapped pair runs back to back. Our longest-path
    # enumeration, for every M >= 2N: the critical paths' excess over one rank's work
    # 2M(F+B) is the largest of (N-1) F (the last rank starts N-1 forwards late, the old
    # N-1 at F = I = W), (N-1)(F+I-W), (N-1)(2F-B), 2(N-1)(F-W), (N-1) I - F and
    # (N-1)(2I-W) - F.
    return max((n - 1) * max(F, F + I - W, 2 * F - B, 2 * (F - W)),
               (n - 1) * I - F, (n - 1) * (2 * I - W) - F)


def _two_chunks(name: str, m: int, v: int) -> str | None:
    if v not in (1, 2):
        return f"virtual_stages={v}: {name} places exactly 2 chunks per rank (allowed: 1 or 2, both mean 2)"
    return None


def _dualpipev_requirements(n: int, m: int, v: int) -> str | None:
    if (why := _two_chunks("dualpipev", m, v)) is not None:
        return why
    return f"microbatches={m}: dualpipev needs at least 2 * pp = {2 * n}" if m < 2 * n else None


register(ScheduleSpec(
    "zbv", "ZB-V (Qi et al., arXiv 2401.10241 sec. 6): two chunks per rank in a V, B split into I and W",
    lambda n, m, v: zbv(n, m), chunks=lambda v: 2, placement=V_SHAPE, split_backward=True,
    requirements=lambda n, m, v: _two_chunks("zbv", m, v), idle=_idle_zbv,
    theory_source="closed form: our longest-path enumeration (N-1 at F = I = W, arXiv 2401.10241 sec. 6); "
                  "the simulated ideal at N < M < 2N-1",
    # at rank r's first W, its warm-up has run min(M, 2N-r-1) chunk-0 and min(M, r+1) chunk-1
    # forwards; from then on each F is paid back by a W
    inflight=lambda n, m, rank, v: min(m, 2 * n - rank - 1) + min(m, rank + 1),
    torch_class="ScheduleZBVZeroBubble", color="#9467bd"))
register(ScheduleSpec(
    "dualpipev", "DualPipeV (DeepSeek's DualPipe cut in half, arXiv 2412.19437): V placement, overlapped F and B pairs",
    lambda n, m, v: dualpipev(n, m), chunks=lambda v: 2, placement=V_SHAPE, split_backward=True,
    requirements=_dualpipev_requirements, idle=_idle_dualpipev,
    theory_source="closed form: our longest-path enumeration (DualPipe's own, arXiv 2412.19437 Table 2, "
                  "assumes a fused F&B)",
    # 2N warm-up forwards (each W of a zero-bubble (I, W, F) triple is paid back by its F),
    # then the first overlapped pair's F before its B
    inflight=lambda n, m, rank, v: 2 * n + 1,
    torch_class="ScheduleDualPipeV", color="#8c564b"))
