"""The bubble and the in-flight microbatches of every built-in schedule, in the run's own costs.

Bubble, as harness.metrics.bubble_per_rank measures it (mean over ranks of 1 - busy / window)
for equal stages and free communication: per stage a forward F, a backward B, and, for the
zero-bubble split, I = (1 - w) B (input gradient) and W = w B (weight gradient), w the
weight-gradient share. `bubble()` takes F = 1 and `bwd_over_fwd` = B / F: the bubble is a
ratio, so only B / F and w matter.

Every rank does the same work, c M (F + B) with c chunks per rank, so the bubble is
idle / (c M (F + B) + idle), where idle = makespan - c M (F + B): the makespan's excess over
one rank's work. With a fixed action order per rank, the makespan is the longest path through
the schedule's dependency graph (each rank's order, F after the stage before, B/I after its F
and the stage after, W after its I), so it is the maximum of a few linear forms
aF + iI + jW, one per critical path. `_idle` writes those forms out for each schedule. We
found them by longest-path search with symbolic (F, I, W) counts over N <= 9 and read them off
as functions of N and M; each is checked against the simulator on the grid of
tests/test_theory_costs.py (N = 2..8, M = 1..32, B/F in 1, 1.5, 2, 3, w in 0.5, 0.3), and
was checked once further (N <= 16, M <= 64, six random B/F in 0.2..5 and w in 0..1; for
the zero-bubble schedules also w = 0, w = 1, B/F = 0.1 and 10 at N <= 8).

Closed form for every (N, M, costs) the builders accept:
  gpipe, 1f1b        (N-1) / (M+N-1) for any F, B
  interleaved_1f1b   k / (VM + k), k = N-1 + (V-1) max(0, N-M), for any F, B (units of chunks)
  zb_h1              idle = (N-1) max(F, I) + (N-min(M,N)) min(F, I) + (min(M,N)-1) max(0, min(F,I) - W)
  dualpipev          idle = max((N-1) max(F, F+I-W, 2F-B, 2F-2W), (N-1) I - F, (N-1)(2I-W) - F)
  zbv                M <= N or M >= 2N-1: a maximum of four / seven linear forms (see _idle)
Simulated ideal (labelled so) where no closed form is written:
  zbv                N < M < 2N-1 (the builder pads to 2N-1 microbatches and drops the extra
                     ones; the critical paths there change with M - N in ways we did not reduce
                     to a short formula), except at F = I = W: max(N-1, 4N-2-2M) (a fit of the
                     simulator, exact over the tests' grid)
  any CSV schedule that equals no built-in (bubble_of_schedule)
The simulated ideal is the simulator on CostModel.uniform(stages, 1, B, w), measured as
bubble_per_rank does.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.schedules.builders import BUILDERS, build, chunks_per_rank, interleaved_round, requirements
from harness.schedules.ir import Schedule
from harness.simulate.cost import CostModel
from harness.simulate.engine import simulate

CLOSED_FORM = "closed form"
SIMULATED_IDEAL = "simulated ideal (equal stages, free communication)"


@dataclass(frozen=True)
class Theory:
    value: float  # bubble fraction: mean over ranks of 1 - busy / window
    source: str  # CLOSED_FORM or SIMULATED_IDEAL


def _check(schedule: str, n: int, m: int, v: int) -> None:
    if (why := requirements(schedule, n, m, v)) is not None:
        raise ValueError(why)


def _check_costs(bwd_over_fwd: float, weight_grad_share: float) -> None:
    if not bwd_over_fwd > 0:
        raise ValueError(f"bwd_over_fwd={bwd_over_fwd}: needs to be > 0")
    if not 0 <= weight_grad_share <= 1:
        raise ValueError(f"weight_grad_share={weight_grad_share}: needs 0 <= share <= 1")


def _idle(schedule: str, n: int, m: int, v: int, F: float, B: float, I: float, W: float) -> float | None:  # noqa: E741
    """Makespan minus one rank's work, for per-stage costs F, B (= I + W), I, W; None where no
    closed form is written (the caller simulates)."""
    if n == 1:
        return 0.0  # one rank runs everything in its own order: never waits
    if schedule in ("gpipe", "1f1b"):
        # fill and drain: N-1 slots of F+B, for any F, B (GPipe, Huang et al. 2019, arXiv
        # 1811.06965 sec. 2.2; 1F1B, Narayanan et al. 2021, arXiv 2104.04473 sec. 2.2.1)
        return (n - 1) * (F + B)
    if schedule == "interleaved_1f1b":
        # Megatron's (N-1)(F+B)/V per chunk-sized F+B (arXiv 2104.04473 sec. 2.2), plus, when
        # M < N, the N-M slots a round of M waits at each of the V-1 chunk turns for its own
        # first microbatch to come round the N ranks, forward and backward (our derivation).
        # The one critical path has as many F's as B's, so the ratio is the same for any F, B.
        return ((n - 1) + (v - 1) * max(0, n - m)) * (F + B)
    if schedule == "zb_h1":
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
    if schedule == "zbv":
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
        return None
    if schedule == "dualpipev":
        # DualPipe's own (PP/2-1)(F&B + B - 3W) (arXiv 2412.19437 sec. 3.3.2, Table 2) assumes a
        # fused, truly overlapped F&B; here an overlapped pair runs back to back. Our longest-path
        # enumeration, for every M >= 2N: the critical paths' excess over one rank's work
        # 2M(F+B) is the largest of (N-1) F (the last rank starts N-1 forwards late, the old
        # N-1 at F = I = W), (N-1)(F+I-W), (N-1)(2F-B), 2(N-1)(F-W), (N-1) I - F and
        # (N-1)(2I-W) - F.
        return max((n - 1) * max(F, F + I - W, 2 * F - B, 2 * (F - W)),
                   (n - 1) * I - F, (n - 1) * (2 * I - W) - F)
    raise KeyError(f"no closed form for schedule {schedule!r}")


def _costs(bwd_over_fwd: float, weight_grad_share: float) -> tuple[float, float, float, float]:
    B = float(bwd_over_fwd)
    return 1.0, B, (1 - weight_grad_share) * B, weight_grad_share * B


def _measured_bubble(schedule: Schedule, bwd_over_fwd: float, weight_grad_share: float) -> float:
    """The simulator on equal stages and free communication, measured as
    harness.metrics.bubble_per_rank does: mean over ranks of 1 - busy / window, the window
    from the first compute start to the last compute end over all ranks."""
    stages = max((a.stage for acts in schedule.values() for a in acts), default=-1) + 1
    trace = simulate(schedule, CostModel.uniform(stages, 1.0, bwd_over_fwd, weight_grad_share))
    ranks = max(schedule, default=-1) + 1
    busy = [0.0] * ranks
    for e in trace:
        if e.in_window:
            busy[e.rank] += e.end - e.start
    t0 = min(e.start for e in trace if e.in_window)
    t1 = max(e.end for e in trace if e.in_window)
    return sum(1.0 - b / (t1 - t0) for b in busy) / ranks


def bubble(schedule: str, n: int, m: int, v: int = 1, bwd_over_fwd: float = 2.0,
           weight_grad_share: float = 0.5) -> Theory:
    """Bubble of the built-in `schedule` on N ranks, M microbatches (V chunks for
    interleaved_1f1b) with B = bwd_over_fwd x F and a backward split I = (1-w) B, W = w B:
    the closed form where one is written (see the module docstring), else the simulator's
    ideal on equal stages and free communication, labelled as such."""
    _check(schedule, n, m, v)
    _check_costs(bwd_over_fwd, weight_grad_share)
    F, B, I, W = _costs(bwd_over_fwd, weight_grad_share)  # noqa: E741
    idle = _idle(schedule, n, m, v, F, B, I, W)
    if idle is None:
        return Theory(_measured_bubble(build(schedule, n, m, v), bwd_over_fwd, weight_grad_share), SIMULATED_IDEAL)
    return Theory(idle / (chunks_per_rank(schedule, v) * m * (F + B) + idle), CLOSED_FORM)


def bubble_fraction(schedule: str, n: int, m: int, v: int = 1) -> float:
    """Mean idle fraction of the N ranks over the step window at F = 1, B = 2, I = W = 1."""
    return bubble(schedule, n, m, v).value


def matches_builtin(schedule: Schedule, microbatches: int) -> tuple[str, int] | None:
    """(name, v) of the built-in whose builder gives exactly these per-rank lists for the same
    pp (the number of ranks) and M, else None. v is the virtual_stages to pass for it (the
    chunk count for interleaved_1f1b, 1 for the others). Where two builders coincide (M = 1:
    GPipe and 1F1B) the first in BUILDERS is named; their theory is the same."""
    n = max(schedule, default=-1) + 1
    if n < 1 or sorted(schedule) != list(range(n)):
        return None
    stages = max((a.stage for acts in schedule.values() for a in acts), default=-1) + 1
    if stages % n:
        return None
    chunks = stages // n
    for name in BUILDERS:
        v = chunks if name == "interleaved_1f1b" else 1
        if chunks_per_rank(name, v) != chunks or requirements(name, n, microbatches, v) is not None:
            continue
        if build(name, n, microbatches, v) == schedule:
            return name, v
    return None


def bubble_of_schedule(schedule: Schedule, m: int, bwd_over_fwd: float = 2.0,
                       weight_grad_share: float = 0.5) -> Theory:
    """Theory for a schedule given as data (schedule=csv): the built-in's bubble() when it is
    one of them (matches_builtin), else its simulated ideal, labelled as such. Raises the
    simulator's Deadlock for a schedule that cannot run (validate it first)."""
    _check_costs(bwd_over_fwd, weight_grad_share)
    if (match := matches_builtin(schedule, m)) is not None:
        name, v = match
        return bubble(name, max(schedule) + 1, m, v, bwd_over_fwd, weight_grad_share)
    return Theory(_measured_bubble(schedule, bwd_over_fwd, weight_grad_share), SIMULATED_IDEAL)


def peak_inflight_microbatches(schedule: str, n: int, m: int, rank: int, v: int = 1) -> int:
    """Peak count of (stage, microbatch) pairs on `rank` whose F has run and whose B (or W,
    for a split backward) has not: the activations it holds, in chunk-sized units."""
    _check(schedule, n, m, v)
    if schedule == "gpipe":
        return m  # every forward before any backward
    if schedule == "1f1b":
        return min(m, n - rank)  # N-r-1 warm-up forwards, then one more before each backward
    if schedule == "interleaved_1f1b":
        # torch's warm-up, (V-1) P + 2(N-1-r) forwards, then one more before each backward
        return min(m * v, (v - 1) * interleaved_round(n, m) + 2 * (n - 1 - rank) + 1)
    if schedule == "zb_h1":
        # N-r-1 warm-up forwards, one more, and r forwards whose W is deferred: N
        return min(m, n)
    if schedule == "zbv":
        # at rank r's first W, its warm-up has run min(M, 2N-r-1) chunk-0 and min(M, r+1)
        # chunk-1 forwards; from then on each F is paid back by a W
        return min(m, 2 * n - rank - 1) + min(m, rank + 1)
    if schedule == "dualpipev":
        # 2N warm-up forwards (each W of a zero-bubble (I, W, F) triple is paid back by its F),
        # then the first overlapped pair's F before its B
        return 2 * n + 1
    raise KeyError(f"no closed form for schedule {schedule!r}")
