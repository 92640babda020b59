"""One small pure builder per schedule: (N ranks, M microbatches[, V chunks]) -> Schedule,
and the registry: build, chunks_per_rank, requirements.

Placement: gpipe, 1f1b and zb_h1 put stage s on rank s; interleaved_1f1b puts stage s of
S = N*V on rank s % N; zbv and dualpipev (v_shape.py) put stage s of S = 2N on rank s for
s < N, else on rank 2N-1-s.
"""

from __future__ import annotations

from collections.abc import Callable

from harness.schedules.ir import Action, Kind, Schedule
from harness.schedules.v_shape import dualpipev, zbv


def _one_f_one_b_order(fwd: list[Action], bwd: list[Action], warmup: int) -> list[Action]:
    """`warmup` forwards, then one forward and one backward in turn, then the other backwards."""
    acts = fwd[:warmup]
    for f, b in zip(fwd[warmup:], bwd):
        acts += (f, b)
    return acts + bwd[len(fwd) - warmup:]


def gpipe(n: int, m: int) -> Schedule:
    """GPipe (Huang et al., arXiv 1811.06965): every forward, then every backward.
    Each rank holds activations of all M microbatches at the turn."""
    return {r: [Action(r, Kind.F, i) for i in range(m)] + [Action(r, Kind.B, i) for i in range(m)]
            for r in range(n)}


def one_f_one_b(n: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush, Narayanan et al., arXiv 2006.09503): rank r runs
    min(N - r - 1, M) warm-up forwards, then alternates one forward and one backward,
    then drains the remaining backwards. At most min(M, N - r) microbatches are in flight."""
    return {r: _one_f_one_b_order([Action(r, Kind.F, i) for i in range(m)],
                                  [Action(r, Kind.B, i) for i in range(m)], min(n - r - 1, m))
            for r in range(n)}


def interleaved_round(n: int, m: int) -> int:
    """Microbatches per round of interleaved_1f1b: torch runs max(1, M // N) rounds of equal
    size (Megatron's rounds are N microbatches and need M % N == 0; torch relaxes that)."""
    return m // max(1, m // n)


def interleaved_1f1b(n: int, m: int, v: int) -> Schedule:
    """Interleaved 1F1B (Megatron's virtual pipeline, Narayanan et al. 2021, arXiv 2104.04473
    sec. 2.2), in the order of torch.distributed.pipelining's ScheduleInterleaved1F1B.

    S = N*V stages, stage s on rank s % N (its chunk s // N). With P = interleaved_round(N, M)
    (N when N divides M), a rank's k-th forward is chunk (k // P) % V, microbatch
    (k // PV) * P + k % P, and its k-th backward the same walking the chunks in reverse.
    Rank r runs min((V-1) P + 2 (N-1-r), MV) warm-up forwards, then 1F1B, then the rest of
    the backwards. Accepts M < N, or M a multiple of its M // N rounds (requirements())."""
    per_round = interleaved_round(n, m)

    def action(r: int, kind: Kind, k: int, chunk: int) -> Action:
        return Action(chunk * n + r, kind, k // (per_round * v) * per_round + k % per_round)

    return {r: _one_f_one_b_order([action(r, Kind.F, k, k // per_round % v) for k in range(m * v)],
                                  [action(r, Kind.B, k, v - 1 - k // per_round % v) for k in range(m * v)],
                                  min((v - 1) * per_round + 2 * (n - 1 - r), m * v))
            for r in range(n)}


def zb_h1(n: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241 sec. 3.1), in
    the order of torch.distributed.pipelining's ScheduleInterleavedZeroBubble with one stage
    per rank. Stage s on rank s. The 1F1B order with B split into I (input gradient, the
    critical path) and W (weight gradient); rank r defers its W's by r, W(k - r) right after
    I(k) and its last r W's at the end, so they fill the drain's bubbles. Every rank holds up
    to min(M, N) microbatches from F to W: the peak over ranks equals 1F1B's (the paper's
    memory bound), though ranks r > 0 hold more than 1F1B's N - r."""
    sched: Schedule = {}
    for r in range(n):
        acts = []
        for a in _one_f_one_b_order([Action(r, Kind.F, i) for i in range(m)],
                                    [Action(r, Kind.I, i) for i in range(m)], min(n - r - 1, m)):
            acts.append(a)
            if a.kind is Kind.I and a.microbatch >= r:
                acts.append(Action(r, Kind.W, a.microbatch - r))
        sched[r] = acts + [Action(r, Kind.W, i) for i in range(max(m - r, 0), m)]
    return sched


# name -> builder(n, m, v); only interleaved_1f1b reads v
BUILDERS: dict[str, Callable[[int, int, int], Schedule]] = {
    "gpipe": lambda n, m, v: gpipe(n, m),
    "1f1b": lambda n, m, v: one_f_one_b(n, m),
    "interleaved_1f1b": interleaved_1f1b,
    "zb_h1": lambda n, m, v: zb_h1(n, m),
    "zbv": lambda n, m, v: zbv(n, m),
    "dualpipev": lambda n, m, v: dualpipev(n, m),
}
_V_SHAPE = ("zbv", "dualpipev")


def chunks_per_rank(name: str, v: int = 1) -> int:
    """Stages each rank holds: S = N * chunks_per_rank(name, v)."""
    return v if name == "interleaved_1f1b" else 2 if name in _V_SHAPE else 1


def requirements(name: str, n: int, m: int, v: int = 1) -> str | None:
    """None when `name` builds for (n ranks, m microbatches, v virtual stages), else one line
    naming the key, its value and what is allowed. zbv and dualpipev always place 2 chunks
    per rank: virtual_stages may stay 1 or say 2."""
    if name not in BUILDERS:
        return f"schedule={name}: no builder (have: {', '.join(BUILDERS)})"
    for key, value in (("pp", n), ("microbatches", m), ("virtual_stages", v)):
        if value < 1:
            return f"{key}={value}: needs at least 1"
    if name in _V_SHAPE and v not in (1, 2):
        return f"virtual_stages={v}: {name} places exactly 2 chunks per rank (allowed: 1 or 2, both mean 2)"
    if name not in _V_SHAPE and name != "interleaved_1f1b" and v != 1:
        return f"virtual_stages={v}: {name} has no chunks (allowed: 1)"
    if name == "interleaved_1f1b" and m > n and m % (m // n):
        ok = [k for k in range(n, 2 * m + n) if k % (k // n) == 0]
        below, above = max(k for k in ok if k < m), min(k for k in ok if k > m)
        return (f"microbatches={m}: interleaved_1f1b needs M < pp={n} or a multiple of its M // pp = {m // n}"
                f" rounds (nearest allowed: {below}, {above})")
    if name == "dualpipev" and m < 2 * n:
        return f"microbatches={m}: dualpipev needs at least 2 * pp = {2 * n}"
    return None


def build(name: str, n: int, m: int, v: int = 1) -> Schedule:
    """The schedule `name` for (n, m, v); requirements()'s line as a ValueError if it does not
    build (KeyError for an unknown name)."""
    if (why := requirements(name, n, m, v)) is not None:
        raise KeyError(why) if name not in BUILDERS else ValueError(why)
    return BUILDERS[name](n, m, v)
