"""What an executor hands to the metrics: an Execution (every rank's timed events on one
timeline, the losses, the ranks' reports), from worker processes or from the simulator; and a
RankReport, what one rank measured. Torch-free: the metrics, the records and the simulator read
these without the runtime.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.trace import Event, Trace

# As an event travels back from a worker: (step, name, cat, kind, stage, mb, start_ns, end_ns)
RawEvent = tuple[int, str, str, str, int, int, int, int]


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


def from_reports(reports: list[RankReport]) -> Execution:
    """Every rank's raw ns timestamps onto one timeline starting at 0 (one host, one clock);
    each replica's last stage reports its shard's loss, the global batch's is their mean."""
    origin = min(e[6] for r in reports for e in r.events)
    trace = [Event(r.rank, *e[:6], (e[6] - origin) / 1e9, (e[7] - origin) / 1e9) for r in reports for e in r.events]
    memory = [(r.rank, step, (t - origin) / 1e9, b) for r in reports for step, t, b in (r.memory or [])]
    per_replica = [r.losses for r in reports if r.losses is not None]
    losses = [sum(step) / len(per_replica) for step in zip(*per_replica)] if per_replica else None
    return Execution(trace, len(reports), memory, losses, reports)
