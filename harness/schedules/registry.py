"""The one schedule registry: everything the harness knows about a schedule, in one entry.

A `ScheduleSpec` says how to build the schedule (per-rank action lists for N ranks, M
microbatches, V chunks), what it accepts, where its stages sit, whether it splits the backward
(I/W), its closed-form bubble and in-flight count with their source, the torch class that
runs it under executor=pytorch, and its colour in the report. Every other list of schedules
(config validation, theory, the planner, the peer executor, the figures) is read from here.

A new schedule is one module that calls `register(ScheduleSpec(...))` and is imported before
use, plus its harness/conf/schedule/<name>.yaml (ARCHITECTURE.md). The built-ins register
themselves from harness/schedules/builders.py, v_shape.py and csv_io.py (imported by the
package).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from harness.schedules.ir import Schedule

LOOP, V_SHAPE, FROM_DATA = "loop", "v", "data"  # placements: stage s on rank s % N | V | as the file says

# (N >= 2, M, V, F, B, I, W) -> makespan minus one rank's work, for per-stage costs F, B = I + W; None: no
# closed form there (one rank never waits: theory.py does not ask)
IdleForm = Callable[[int, int, int, float, float, float, float], "float | None"]


def one_chunk(v: int) -> int:
    return 1


def no_requirements(n: int, m: int, v: int) -> str | None:
    return None


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    summary: str  # one line: what it is, after whom
    build: Callable[[int, int, int], Schedule] | None  # (N, M, V) -> per-rank actions; None: given as data (csv)
    chunks: Callable[[int], int] = one_chunk  # stages per rank, for virtual_stages=V
    placement: str = LOOP  # LOOP | V_SHAPE | FROM_DATA
    split_backward: bool = False  # runs I (input gradient) and W (weight gradient) instead of B
    requirements: Callable[[int, int, int], str | None] = no_requirements  # beyond N, M, V >= 1: one line, or None
    idle: IdleForm | None = None  # closed form (theory.py turns it into the bubble); None: the simulated ideal
    theory_source: str = ""  # where `idle` comes from
    inflight: Callable[[int, int, int, int], int] | None = None  # (N, M, rank, V) -> peak (stage, mb) held on rank
    torch_class: str | None = None  # torch.distributed.pipelining.schedules class executor=pytorch runs
    color: str | None = None  # in the report's figures; None: the next free colour
    check: Callable[[Any], str | None] | None = None  # any further constraint on a Config, as one line

    @property
    def reads_virtual_stages(self) -> bool:
        """Whether virtual_stages changes it (interleaved_1f1b's V; the V shapes always have 2)."""
        return self.chunks(1) != self.chunks(2)


SCHEDULES: dict[str, ScheduleSpec] = {}


def register(spec: ScheduleSpec) -> ScheduleSpec:
    SCHEDULES[spec.name] = spec
    return spec


def unregister(name: str) -> None:
    SCHEDULES.pop(name, None)


def built_in() -> tuple[str, ...]:
    """Names of the schedules the harness builds itself (csv is read from a file)."""
    return tuple(name for name, spec in SCHEDULES.items() if spec.build is not None)


def spec(name: str) -> ScheduleSpec:
    """KeyError naming the registered schedules for an unknown name."""
    try:
        return SCHEDULES[name]
    except KeyError:
        raise KeyError(f"schedule={name}: unknown (allowed: {', '.join(SCHEDULES)})") from None


def chunks_per_rank(name: str, v: int = 1) -> int:
    """Stages each rank holds: S = N * chunks_per_rank(name, v)."""
    return spec(name).chunks(v)


def requirements(name: str, n: int, m: int, v: int = 1) -> str | None:
    """None when `name` builds for (n ranks, m microbatches, v virtual stages), else one line
    naming the key, its value and what is allowed."""
    if name not in SCHEDULES or SCHEDULES[name].build is None:
        return f"schedule={name}: no builder (have: {', '.join(built_in())})"
    for key, value in (("pp", n), ("microbatches", m), ("virtual_stages", v)):
        if value < 1:
            return f"{key}={value}: needs at least 1"
    return SCHEDULES[name].requirements(n, m, v)


def build(name: str, n: int, m: int, v: int = 1) -> Schedule:
    """The schedule `name` for (n, m, v); requirements()'s line as a ValueError if it does not
    build (KeyError for an unknown name)."""
    if (why := requirements(name, n, m, v)) is not None:
        raise KeyError(why) if name not in SCHEDULES or SCHEDULES[name].build is None else ValueError(why)
    builder = SCHEDULES[name].build
    assert builder is not None
    return builder(n, m, v)
