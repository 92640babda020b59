"""Closed forms for the bubble and the in-flight microbatches of every built-in schedule.

Bubble, as harness.metrics.bubble_per_rank measures it (mean over ranks of 1 - busy /
window) for uniform stage costs CostModel.uniform(S) (F = 1, B = 2, I = W = 1 per stage)
and free communication. Every rank does the same work, c*3M with c chunks per rank, so
the bubble is idle / (3cM + idle) where idle = window - 3cM, the makespan's excess over one
rank's work, in units of one stage's forward. Each `_idle` case below is exact on the whole
domain requirements() accepts (tests/test_schedules_more.py checks it against the simulator
for N <= 8, M <= 32, V <= 3). For GPipe and 1F1B the ratio holds for any F, B:
(N - 1) / (M + N - 1), 27% at N=4, M=8; 4.5% at N=4, M=64.
"""

from __future__ import annotations

from harness.schedules.builders import chunks_per_rank, interleaved_round, requirements


def _check(schedule: str, n: int, m: int, v: int) -> None:
    if (why := requirements(schedule, n, m, v)) is not None:
        raise ValueError(why)


def _idle(schedule: str, n: int, m: int, v: int) -> int:
    """Makespan minus one rank's work, in forward units (F=1, B=2, I=W=1)."""
    if schedule in ("gpipe", "1f1b"):
        # fill and drain: N-1 slots of F+B (GPipe, Huang et al. 2019, arXiv 1811.06965 sec. 2.2;
        # 1F1B, Narayanan et al. 2021, arXiv 2104.04473 sec. 2.2.1)
        return 3 * (n - 1)
    if schedule == "interleaved_1f1b":
        # Megatron's (N-1)(F+B)/V per chunk-sized F+B = 3(N-1) (arXiv 2104.04473 sec. 2.2), plus,
        # when M < N, the N-M slots a round of M waits at each of the V-1 chunk turns for its own
        # first microbatch to come round the N ranks, forward and backward (our derivation)
        return 3 * (n - 1) + 3 * (v - 1) * max(0, n - m)
    if schedule == "zb_h1":
        # (N-1)(F+I-W) = N-1 (Qi et al., arXiv 2401.10241 sec. 3.1) for M >= N; for M < N rank 0's
        # first I starts at 2N-1 (N forwards down, N-1 I's back), then M (I, W) pairs follow at
        # the I chain's pace: 2N - 1 + 2M = 3M + (N-1) + (N-M) (our derivation)
        return n - 1 + max(0, n - m)
    if schedule == "zbv":
        # M >= 2N-1: N-1, the last rank's first forward comes N-1 slots late and the W's fill
        # every later gap (ZB-V, arXiv 2401.10241 sec. 6). Fewer: one microbatch down the 2N
        # stages and back with I's (4N), plus rank N-1's W1 between its two I's and rank 0's
        # final W (2), plus 4 per further microbatch: makespan 4M + 4N - 2 (our fit of the
        # simulator, exact over the tests' grid)
        return max(n - 1, 4 * n - 2 - 2 * m)
    if schedule == "dualpipev":
        # the last rank starts N-1 slots late; no other gap with its F/B pairs run back to back
        # (our fit of the simulator, exact over the tests' grid; DualPipe's own formula,
        # arXiv 2412.19437 sec. 3.3.2, assumes F and B truly overlapped)
        return n - 1
    raise KeyError(f"no closed form for schedule {schedule!r}")


def bubble_fraction(schedule: str, n: int, m: int, v: int = 1) -> float:
    """Mean idle fraction of the N ranks over the step window (see the module docstring)."""
    _check(schedule, n, m, v)
    idle = _idle(schedule, n, m, v)
    return idle / (3 * chunks_per_rank(schedule, v) * m + idle)


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
