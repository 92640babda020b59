"""One small pure builder per schedule: (N ranks, M microbatches) -> Schedule.

Stage s lives on rank s (no virtual stages here).
"""

from __future__ import annotations

from harness.schedules.ir import Action, Kind, Schedule


def gpipe(n: int, m: int) -> Schedule:
    """GPipe (Huang et al., arXiv 1811.06965): every forward, then every backward.
    Each rank holds activations of all M microbatches at the turn."""
    return {
        r: [Action(r, Kind.F, i) for i in range(m)] + [Action(r, Kind.B, i) for i in range(m)]
        for r in range(n)
    }


def one_f_one_b(n: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush, Narayanan et al., arXiv 2006.09503): rank r runs
    min(N - r - 1, M) warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards. At most min(M, N - r) microbatches are in flight."""
    sched: Schedule = {}
    for r in range(n):
        warmup = min(n - r - 1, m)
        acts = [Action(r, Kind.F, i) for i in range(warmup)]
        f, b = warmup, 0
        while f < m:
            acts.append(Action(r, Kind.F, f))
            f += 1
            acts.append(Action(r, Kind.B, b))
            b += 1
        acts += [Action(r, Kind.B, i) for i in range(b, m)]
        sched[r] = acts
    return sched


BUILDERS = {"gpipe": gpipe, "1f1b": one_f_one_b}


def build(name: str, n: int, m: int) -> Schedule:
    if name not in BUILDERS:
        raise KeyError(f"schedule={name}: no builder (have: {', '.join(BUILDERS)})")
    return BUILDERS[name](n, m)
