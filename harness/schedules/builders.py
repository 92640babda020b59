"""The loop-placed built-in schedules, each a small pure builder (N ranks, M microbatches[, V
chunks]) -> Schedule registered with what the harness knows of it (harness/schedules/registry.py):
its requirements, closed-form bubble and in-flight count with their sources, torch's class.

Placement: gpipe, 1f1b and zb_h1 put stage s on rank s; interleaved_1f1b puts stage s of
S = N*V on rank s % N. The V-shaped ones are in v_shape.py.

Each closed form `_idle_*` is the makespan minus one rank's work for per-stage costs F, B (= I + W),
I, W on equal stages and free communication (harness/planning/theory.py turns it into the bubble and says
how the forms were found and checked).
"""

from __future__ import annotations

from collections.abc import Callable

from harness.schedules.ir import Action, Kind, Schedule
from harness.schedules.registry import ScheduleSpec, register


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


def zb_h2(n: int, m: int) -> Schedule:
    """ZB-H2 (Qi et al., "Zero Bubble Pipeline Parallelism", arXiv 2401.10241 sec. 3.1 and its
    Figure 3): ZB-H1 with twice the warm-up and twice the deferral. Stage s on rank s. Rank r
    runs 2(N-1-r) forwards before its first I (ZB-H1: N-1-r), so the extra forwards fill the
    wait for the first backward, then one F one I, W(k - 2r) right after I(k) (ZB-H1: k - r)
    and its last 2r W's at the end, so they fill the drain. Every rank holds up to
    min(M, 2N-1) microbatches from F to W: the paper's memory, (2p-1) M_B."""
    sched: Schedule = {}
    for r in range(n):
        acts = []
        for a in _one_f_one_b_order([Action(r, Kind.F, i) for i in range(m)],
                                    [Action(r, Kind.I, i) for i in range(m)], min(2 * (n - r - 1), m)):
            acts.append(a)
            if a.kind is Kind.I and a.microbatch >= 2 * r:
                acts.append(Action(r, Kind.W, a.microbatch - 2 * r))
        sched[r] = acts + [Action(r, Kind.W, i) for i in range(max(m - 2 * r, 0), m)]
    return sched


def _idle_fill_drain(n: int, m: int, v: int, F: float, B: float, I: float, W: float) -> float:  # noqa: E741
    # fill and drain: N-1 slots of F+B, for any F, B (GPipe, Huang et al. 2019, arXiv
    # 1811.06965 sec. 2.2; 1F1B, Narayanan et al. 2021, arXiv 2104.04473 sec. 2.2.1)
    return (n - 1) * (F + B)


def _idle_interleaved(n: int, m: int, v: int, F: float, B: float, I: float, W: float) -> float:  # noqa: E741
    # Megatron's (N-1)(F+B)/V per chunk-sized F+B (arXiv 2104.04473 sec. 2.2), plus, when
    # M < N, the N-M slots a round of M waits at each of the V-1 chunk turns for its own
    # first microbatch to come round the N ranks, forward and backward (our derivation).
    # The one critical path has as many F's as B's, so the ratio is the same for any F, B.
    return ((n - 1) + (v - 1) * max(0, n - m)) * (F + B)


def _idle_zb_h1(n: int, m: int, v: int, F: float, B: float, I: float, W: float) -> float:  # noqa: E741
    # Qi et al. (arXiv 2401.10241 sec. 3.1) give (N-1)(F+I-W) for M >= N; that is exact only
    # while W <= min(F, I). In general (our longest-path enumeration), with K = min(M, N) - 1,
    # the critical paths exceed one rank's work M(F+I+W) by aF + iI - kW for k = 0..K,
    # a + i = 2(N-1) - K + k and a, i <= N-1: each W a path leaves out of the rank's work
    # buys it one more F or I of the fill and drain. The largest puts N-1 on the larger of
    # F, I and takes every k if min(F, I) > W, else none:
    #   (N-1) max(F,I) + (N-1-K) min(F,I) + K max(0, min(F,I) - W).
    # At F = I = W: N-1 + max(0, N-M). At F=1, I=W=1.5 (B = 3F), N=4, M=8: 4.5, not 3.
    lo, hi, k = min(F, I), max(F, I), min(m, n) - 1
    return (n - 1) * hi + (n - 1 - k) * lo + k * max(0.0, lo - W)


def _idle_zb_h2(n: int, m: int, v: int, F: float, B: float, I: float, W: float) -> float | None:  # noqa: E741
    # Qi et al. (arXiv 2401.10241, Table 2): (N-1)(F+I-2W). In a step that starts at a barrier
    # (the harness's) it holds for M >= 2N-1 while 2W <= min(F, I) (checked against the
    # simulator over N <= 8, M up to 4N+1, random F, I and W in that range); elsewhere the
    # critical paths change (the last stage's wait of (N-1) F for its first input is a floor no
    # order removes in such a step): the simulated ideal.
    if m >= 2 * n - 1 and 2 * W <= min(F, I):
        return (n - 1) * (F + I - 2 * W)
    return None


def _no_chunks(name: str) -> Callable[[int, int, int], str | None]:
    def check(n: int, m: int, v: int) -> str | None:
        return None if v == 1 else f"virtual_stages={v}: {name} has no chunks (allowed: 1)"

    return check


def _interleaved_requirements(n: int, m: int, v: int) -> str | None:
    if m > n and m % (m // n):
        ok = [k for k in range(n, 2 * m + n) if k % (k // n) == 0]
        below, above = max(k for k in ok if k < m), min(k for k in ok if k > m)
        return (f"microbatches={m}: interleaved_1f1b needs M < pp={n} or a multiple of its M // pp = {m // n}"
                f" rounds (nearest allowed: {below}, {above})")
    return None


def _interleaved_inflight(n: int, m: int, rank: int, v: int) -> int:
    # torch's warm-up, (V-1) P + 2(N-1-r) forwards, then one more before each backward
    return min(m * v, (v - 1) * interleaved_round(n, m) + 2 * (n - 1 - rank) + 1)


FILL_DRAIN = "closed form (N-1)(F+B) of idle: GPipe arXiv 1811.06965 sec. 2.2, 1F1B arXiv 2104.04473 sec. 2.2.1"

register(ScheduleSpec(
    "gpipe", "GPipe (Huang et al., arXiv 1811.06965): every forward, then every backward",
    lambda n, m, v: gpipe(n, m), requirements=_no_chunks("gpipe"), idle=_idle_fill_drain, theory_source=FILL_DRAIN,
    inflight=lambda n, m, rank, v: m,  # every forward before any backward
    torch_class="ScheduleGPipe", color="#1f77b4"))
register(ScheduleSpec(
    "1f1b", "1F1B (PipeDream-Flush, Narayanan et al., arXiv 2006.09503): warm-up, one forward one backward, drain",
    lambda n, m, v: one_f_one_b(n, m), requirements=_no_chunks("1f1b"), idle=_idle_fill_drain,
    theory_source=FILL_DRAIN,
    inflight=lambda n, m, rank, v: min(m, n - rank),  # N-r-1 warm-up forwards, then one more before each backward
    torch_class="Schedule1F1B", color="#ff7f0e"))
register(ScheduleSpec(
    "interleaved_1f1b", "Interleaved 1F1B (Megatron's virtual pipeline, arXiv 2104.04473 sec. 2.2), torch's order",
    interleaved_1f1b, chunks=lambda v: v, requirements=_interleaved_requirements, idle=_idle_interleaved,
    theory_source="closed form: Megatron's (N-1)(F+B)/V (arXiv 2104.04473 sec. 2.2) plus (V-1) max(0, N-M) "
                  "chunk slots at M < N (our derivation)",
    inflight=_interleaved_inflight, torch_class="ScheduleInterleaved1F1B", color="#2ca02c"))
register(ScheduleSpec(
    "zb_h1", "ZB-H1 (Qi et al., arXiv 2401.10241 sec. 3.1): 1F1B with B split into I and deferred W",
    lambda n, m, v: zb_h1(n, m), split_backward=True, requirements=_no_chunks("zb_h1"), idle=_idle_zb_h1,
    theory_source="closed form: our longest-path enumeration, (N-1)(F+I-W) of arXiv 2401.10241 sec. 3.1 "
                  "where W <= min(F, I)",
    # N-r-1 warm-up forwards, one more, and r forwards whose W is deferred: N
    inflight=lambda n, m, rank, v: min(m, n),
    torch_class="ScheduleInterleavedZeroBubble", color="#d62728"))
register(ScheduleSpec(
    "zb_h2", "ZB-H2 (Qi et al., arXiv 2401.10241 sec. 3.1): ZB-H1 with twice the warm-up and W deferral, memory 2N-1",
    lambda n, m, v: zb_h2(n, m), split_backward=True, requirements=_no_chunks("zb_h2"), idle=_idle_zb_h2,
    theory_source="closed form: (N-1)(F+I-2W) of arXiv 2401.10241 Table 2 where M >= 2N-1 and 2W <= min(F, I); "
                  "else the simulated ideal",
    # 2(N-1-r) warm-up forwards, one more, and 2r forwards whose W is deferred: 2N-1
    inflight=lambda n, m, rank, v: min(m, 2 * n - 1), color="#e377c2"))
