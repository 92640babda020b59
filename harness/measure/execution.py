"""What an executor hands to the metrics: an Execution (every rank's timed events on one
timeline, the losses, the ranks' reports), from worker processes or from the simulator; and a
RankReport, what one rank measured. Torch-free: the metrics, the records and the simulator read
these without the runtime.

One timeline: each rank times its events on its own clock, and measures that clock against
rank 0's at the start of the job (harness/runtime/clock.py). `from_reports`, which every
executor with processes goes through (forked ranks, a pool's, torchrun's, SLURM's), adds each
rank's offset to its events and memory samples; `clock_record` says how well the clocks were
known, and flags the bubble where that uncertainty is a noticeable share of a compute action.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from harness.measure.trace import Event, Trace

# As an event travels back from a worker: (step, name, cat, kind, stage, mb, start_ns, end_ns)
RawEvent = tuple[int, str, str, str, int, int, int, int]


@dataclass(frozen=True)
class ClockEstimate:
    """A rank's clock against the reference clock (rank 0's; harness/runtime/clock.py): the
    reference's reading minus this rank's, at one instant, lies in [lo_ns, hi_ns]."""
    domain: str  # what identifies the clock: ranks with one domain read one clock
    lo_ns: int
    hi_ns: int
    rounds: int  # ping-pongs measured; 0 where the rank reads the reference clock (lo = hi = 0)
    seconds: float  # what the estimate took on this rank (rank 0: serving every other clock)
    # the wall clock (time.time_ns) and this rank's clock read together: rank 0's dates its timeline
    wall_ns: int | None = None
    clock_ns: int | None = None

    @property
    def reference(self) -> bool:
        return self.rounds == 0


# the bubble is flagged where the worst clock uncertainty is more than this share of the mean
# compute action: the step window's edges and every cross-rank gap carry that error
CLOCK_NOTE_SHARE = 0.05


@dataclass
class RankReport:
    rank: int
    events: list[RawEvent]
    losses: list[float] | None  # every step's, warm-up included; None off the last stage
    memory: list[tuple[int, int, int]] | None = None  # (step, ns, live activation bytes)
    peak_activation_bytes: int | None = None
    activation_bytes_per_microbatch: float | None = None  # one (stage, microbatch)'s; with chunks one chunk's
    # last step's accumulated gradients (verify_grads=true): numpy arrays, not tensors (torch's
    # queue pickling shares tensor memory by file descriptor, which dies with the worker)
    grads: dict[str, Any] | None = None
    cuda_max_memory_allocated: int | None = None
    # bytes held by the rank, largest over measured steps: params, grads, optimizer, activations,
    # peak (the accounted transient peak); a part this runner cannot meter is None
    memory_breakdown: dict[str, int | None] | None = None
    cuda_memory: dict[str, int] | None = None  # torch.cuda's allocated, reserved, max allocated
    clock: ClockEstimate | None = None  # its clock against rank 0's (None: not measured, offset taken as 0)


@dataclass
class Execution:
    trace: Trace  # seconds from the run's first event
    ranks: int  # ranks the trace holds (executor=sim: one pipeline stands for every replica)
    memory: list[tuple[int, int, float, int]]  # (rank, step, s, live activation bytes)
    losses: list[float] | None  # the global batch's loss per step, warm-up included
    reports: list[RankReport]  # per global rank; empty without processes
    # each step of the trace stands for this many identical steps (executor=sim: every step is
    # the same, so its trace holds one measured step)
    step_repeats: int = 1
    # [global rank] ns added to the rank's clock to read rank 0's, and how far off that may be
    # (half the width of the interval known to hold it); None without clocks (executor=sim)
    clock_offset_ns: list[int] | None = None
    clock_uncertainty_ns: list[int] | None = None


def offset_of(lo: int, hi: int) -> tuple[int, int]:
    """(offset, uncertainty) in ns of an interval holding the offset: its middle, and half its
    width (rounded up: the offset is within it of the middle)."""
    return (lo + hi) // 2, (hi - lo + 1) // 2


def clock_offsets(reports: list[RankReport]) -> tuple[list[int], list[int]] | None:
    """Per report, in its order: (offset, uncertainty) in ns that put its clock on rank 0's.
    The ranks reading rank 0's clock (one host's) are exact: 0 and 0. The ranks of another
    clock (another host) share one estimate, the intersection of their intervals (each holds
    the same offset), so that a host's ranks keep their exact relative timings; where the
    intersection is empty (a clock moved in between) the narrowest interval. None if a report
    measured nothing (every offset taken as 0, as one host's)."""
    if not reports or any(r.clock is None for r in reports):
        return None
    by_domain: dict[str, list[ClockEstimate]] = defaultdict(list)
    for r in reports:
        by_domain[r.clock.domain].append(r.clock)
    interval: dict[str, tuple[int, int]] = {}
    for domain, estimates in by_domain.items():
        if any(e.reference for e in estimates):
            interval[domain] = (0, 0)
            continue
        lo, hi = max(e.lo_ns for e in estimates), min(e.hi_ns for e in estimates)
        if lo > hi:
            best = min(estimates, key=lambda e: e.hi_ns - e.lo_ns)
            lo, hi = best.lo_ns, best.hi_ns
        interval[domain] = (lo, hi)
    pairs = [offset_of(*interval[r.clock.domain]) for r in reports]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def tp_representatives(reports: list[RankReport], tp: int) -> list[RankReport]:
    """tp > 1: the reports of each TP group's rank 0, renumbered as the pipeline-level rank
    (replica * pp + pipeline rank: global rank // tp), so the metrics and records read a
    world of pp x dp ranks as at tp=1. A TP group's ranks run the same actions on the same
    batch and report the same loss; its rank 0 stands for the group (its memory is one
    rank's: the local shards). tp=1: the reports as they are."""
    if tp == 1:
        return reports
    kept = [r for r in reports if r.rank % tp == 0]
    for r in kept:
        r.rank //= tp
    return kept


def from_reports(reports: list[RankReport]) -> Execution:
    """Every rank's ns timestamps, its clock's offset added, onto rank 0's clock: one timeline
    starting at 0; each replica's last stage reports its shard's loss, the global batch's is
    their mean."""
    clocks = clock_offsets(reports)
    offsets = clocks[0] if clocks else [0] * len(reports)
    origin = min(e[6] + offsets[i] for i, r in enumerate(reports) for e in r.events)
    trace = [Event(r.rank, *e[:6], (e[6] + offsets[i] - origin) / 1e9, (e[7] + offsets[i] - origin) / 1e9)
             for i, r in enumerate(reports) for e in r.events]
    memory = [(r.rank, step, (t + offsets[i] - origin) / 1e9, b)
              for i, r in enumerate(reports) for step, t, b in (r.memory or [])]
    per_replica = [r.losses for r in reports if r.losses is not None]
    losses = [sum(step) / len(per_replica) for step in zip(*per_replica)] if per_replica else None
    return Execution(trace, len(reports), memory, losses, reports,
                     clock_offset_ns=clocks[0] if clocks else None, clock_uncertainty_ns=clocks[1] if clocks else None)


def clock_record(run: Execution, trace: Trace) -> dict[str, Any]:
    """The record's clock fields (harness/records/result.py Metrics): each global rank's offset and
    uncertainty, the worst uncertainty, and a note flagging the bubble where that is more than
    CLOCK_NOTE_SHARE of the mean compute action in `trace` (the measured steps')."""
    if run.clock_offset_ns is None or run.clock_uncertainty_ns is None:
        return {}
    worst = max(run.clock_uncertainty_ns)
    actions = [e.dur for e in trace if e.in_window]
    mean_action = statistics.fmean(actions) if actions else 0.0
    note = None
    if worst and mean_action and worst / 1e9 > CLOCK_NOTE_SHARE * mean_action:
        note = (f"bubble uncertain: the ranks' clocks were put on rank 0's to within {worst / 1e3:.1f} us, "
                f"{worst / 1e9 / mean_action:.0%} of the mean compute action ({mean_action * 1e6:.1f} us): "
                "the step window's edges, the bubble, its attribution and every cross-host gap carry that error")
    return {"clock_offset_ns_per_global_rank": list(run.clock_offset_ns),
            "clock_uncertainty_ns_per_global_rank": list(run.clock_uncertainty_ns),
            "clock_uncertainty_ns": worst, "clock_note": note}
