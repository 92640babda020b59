"""The Trace: timed events of each step, per rank, the same type from every executor.

Times are seconds on one clock for all ranks of the run, rank 0's, relative to the run's
origin: each rank's own clock (time.perf_counter_ns, CLOCK_MONOTONIC: one per host) plus its
offset to rank 0's, measured at the start of the job (harness/runtime/clock.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Categories as in trace.json: compute (F/B/I/W and the optimizer), comm (sends posted, the
# dp and tp gradient syncs), wait (blocked in a receive), tp (a tensor-parallel collective
# inside a compute action, nested in its event: harness/parallel/tp_trace.py).
COMPUTE, COMM, WAIT, TP = "compute", "comm", "wait", "tp"
# Kinds that are pipeline compute; "optim" is compute but outside the step window.
PIPELINE_KINDS = frozenset("FBIW")


@dataclass(frozen=True)
class Event:
    rank: int
    step: int
    name: str  # action string ("2F0") or what it is ("recv 1F0", "optim")
    cat: str  # COMPUTE | COMM | WAIT
    kind: str  # F B I W | send | recv | optim
    stage: int  # -1 when not a stage's action
    microbatch: int  # -1 when not a microbatch's action
    start: float  # s
    end: float  # s

    @property
    def dur(self) -> float:
        return self.end - self.start

    @property
    def in_window(self) -> bool:
        """A pipeline compute action: what the step window and the bubble are made of."""
        return self.cat == COMPUTE and self.kind in PIPELINE_KINDS

    def to_dict(self) -> dict:
        return asdict(self)


Trace = list[Event]


def events_of_step(trace: Trace, step: int) -> Trace:
    return [e for e in trace if e.step == step]


def step_numbers(trace: Trace) -> list[int]:
    return sorted({e.step for e in trace})


# An action's key on its rank's track: (rank, step, stage, microbatch, kind).
ActionKey = tuple[int, int, int, int, str]


def tp_inside(trace: Trace) -> dict[ActionKey, float]:
    """Seconds of TP collectives nested in each compute action (cat TP events, kind tp_<K>,
    carry their action's stage and microbatch). A collective runs inside its action's span,
    so the action's compute is its span less these (`compute_s`); a checkpointed recompute's
    collectives count in the B or I that runs the recompute, as the recompute does."""
    inside: dict[ActionKey, float] = {}
    for e in trace:
        if e.cat == TP:
            key = (e.rank, e.step, e.stage, e.microbatch, e.kind[3:])
            inside[key] = inside.get(key, 0.0) + e.dur
    return inside


def compute_s(e: Event, inside: dict[ActionKey, float]) -> float:
    """A compute event's compute seconds: its span less the TP collectives traced inside it."""
    return e.dur - inside.get((e.rank, e.step, e.stage, e.microbatch, e.kind), 0.0) if inside else e.dur
