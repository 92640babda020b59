"""The bubble and the in-flight microbatches of every built-in schedule, in the run's own costs.

Bubble, as harness.measure.metrics.bubble_per_rank measures it (mean over ranks of 1 - busy / window)
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

Each schedule's closed form lives with its builder, in its registry entry (`ScheduleSpec.idle`,
harness/schedules/builders.py and v_shape.py), with its source:
  gpipe, 1f1b        (N-1) / (M+N-1) for any F, B
  interleaved_1f1b   k / (VM + k), k = N-1 + (V-1) max(0, N-M), for any F, B (units of chunks)
  zb_h1              idle = (N-1) max(F, I) + (N-min(M,N)) min(F, I) + (min(M,N)-1) max(0, min(F,I) - W)
  zb_h2              idle = (N-1)(F+I-2W) for M >= 2N-1 and 2W <= min(F, I) (the paper's Table 2)
  dualpipev          idle = max((N-1) max(F, F+I-W, 2F-B, 2F-2W), (N-1) I - F, (N-1)(2I-W) - F)
  zbv                M <= N or M >= 2N-1: a maximum of four / seven linear forms
Simulated ideal (labelled so) where no closed form is written:
  zb_h2              outside that range
  zbv                N < M < 2N-1 (the builder pads to 2N-1 microbatches and drops the extra
                     ones; the critical paths there change with M - N in ways we did not reduce
                     to a short formula), except at F = I = W: max(N-1, 4N-2-2M) (a fit of the
                     simulator, exact over the tests' grid)
  any registered schedule without `idle`, and any CSV schedule that equals no built-in
The simulated ideal is the simulator on CostModel.uniform(stages, 1, B, w), measured as
bubble_per_rank does.
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.schedules.ir import Schedule, replay_inflight
from harness.schedules.registry import SCHEDULES, build, built_in, chunks_per_rank, requirements, spec
from harness.simulate import engine
from harness.simulate.cost import CostModel
from harness.simulate.engine import Compiled

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


def _costs(bwd_over_fwd: float, weight_grad_share: float) -> tuple[float, float, float, float]:
    B = float(bwd_over_fwd)
    return 1.0, B, (1 - weight_grad_share) * B, weight_grad_share * B


def simulated_ideal(compiled: Compiled, bwd_over_fwd: float, weight_grad_share: float) -> float:
    """The simulator on equal stages and free communication, measured as
    harness.measure.metrics.bubble_per_rank does: mean over ranks of 1 - busy / window, the window
    from the first compute start to the last compute end over all ranks."""
    return engine.bubble(compiled, CostModel.uniform(compiled.stages, 1.0, bwd_over_fwd, weight_grad_share))


def bubble(schedule: str, n: int, m: int, v: int = 1, bwd_over_fwd: float = 2.0,
           weight_grad_share: float = 0.5, compiled: Compiled | None = None) -> Theory:
    """Bubble of the built-in `schedule` on N ranks, M microbatches (V chunks for
    interleaved_1f1b) with B = bwd_over_fwd x F and a backward split I = (1-w) B, W = w B:
    the closed form where one is written (see the module docstring), else the simulator's
    ideal on equal stages and free communication, labelled as such (on `compiled`, the
    schedule compiled already, when the caller has it)."""
    _check(schedule, n, m, v)
    _check_costs(bwd_over_fwd, weight_grad_share)
    F, B, I, W = _costs(bwd_over_fwd, weight_grad_share)  # noqa: E741
    form = spec(schedule).idle
    idle = 0.0 if n == 1 else form(n, m, v, F, B, I, W) if form is not None else None  # one rank never waits
    if idle is None:
        compiled = compiled or engine.compile_schedule(build(schedule, n, m, v))
        return Theory(simulated_ideal(compiled, bwd_over_fwd, weight_grad_share), SIMULATED_IDEAL)
    return Theory(idle / (chunks_per_rank(schedule, v) * m * (F + B) + idle), CLOSED_FORM)


def bubble_fraction(schedule: str, n: int, m: int, v: int = 1) -> float:
    """Mean idle fraction of the N ranks over the step window at F = 1, B = 2, I = W = 1."""
    return bubble(schedule, n, m, v).value


def matches_builtin(schedule: Schedule, microbatches: int) -> tuple[str, int] | None:
    """(name, v) of the built-in whose builder gives exactly these per-rank lists for the same
    pp (the number of ranks) and M, else None. v is the virtual_stages to pass for it (the
    chunk count for interleaved_1f1b, 1 for the others). Where two builders coincide (M = 1:
    GPipe and 1F1B) the first registered is named; their theory is the same."""
    n = max(schedule, default=-1) + 1
    if n < 1 or sorted(schedule) != list(range(n)):
        return None
    stages = max((a.stage for acts in schedule.values() for a in acts), default=-1) + 1
    if stages % n:
        return None
    chunks = stages // n
    for name in built_in():
        v = chunks if SCHEDULES[name].reads_virtual_stages else 1
        if chunks_per_rank(name, v) != chunks or requirements(name, n, microbatches, v) is not None:
            continue
        if build(name, n, microbatches, v) == schedule:
            return name, v
    return None


def bubble_of_schedule(schedule: Schedule, m: int, bwd_over_fwd: float = 2.0,
                       weight_grad_share: float = 0.5, compiled: Compiled | None = None) -> Theory:
    """Theory for a schedule given as data (schedule=csv): the built-in's bubble() when it is
    one of them (matches_builtin), else its simulated ideal, labelled as such. Raises the
    simulator's Deadlock for a schedule that cannot run (validate it first)."""
    _check_costs(bwd_over_fwd, weight_grad_share)
    if (match := matches_builtin(schedule, m)) is not None:
        name, v = match
        return bubble(name, max(schedule) + 1, m, v, bwd_over_fwd, weight_grad_share)
    compiled = compiled or engine.compile_schedule(schedule)
    return Theory(simulated_ideal(compiled, bwd_over_fwd, weight_grad_share), SIMULATED_IDEAL)


def peak_inflight_microbatches(schedule: str, n: int, m: int, rank: int, v: int = 1) -> int:
    """Peak count of (stage, microbatch) pairs on `rank` whose F has run and whose B (or W,
    for a split backward) has not: the activations it holds, in chunk-sized units. The
    schedule's closed form where its registry entry has one, else replayed from its actions."""
    _check(schedule, n, m, v)
    form = spec(schedule).inflight
    return form(n, m, rank, v) if form is not None else replay_inflight(build(schedule, n, m, v)[rank])
