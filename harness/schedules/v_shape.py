"""V-shape builders: 2 chunks per rank, stage s of S = 2N on rank s for s < N, else rank 2N-1-s.

Rank r holds stages r (chunk 0, going down) and 2N-1-r (chunk 1, coming back up), so the
first and the last stage share rank 0 and the turn N-1 -> N stays on rank N-1 (no message).
"""

from __future__ import annotations

from collections import Counter

from harness.schedules.ir import Action, Kind, Schedule

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
