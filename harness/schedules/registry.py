"""The one schedule registry: everything the harness knows about a schedule, in one entry.

A `ScheduleSpec` says what the schedule is made from (`needs`: the counts N, M, V alone; the
run's priced costs; a file) and makes its plan, the per-rank Action lists, from those inputs
through one interface, `spec.make(ScheduleInputs)`; what it accepts, where its stages sit,
whether it splits the backward (I/W), its closed-form bubble and in-flight count with their
source (else theory is the simulated ideal), the torch class that runs it under
executor=pytorch, its colour and its label in the report, its own config keys (a dataclass,
registered as the root Hydra config `harness_schema_schedule_<name>`), the keys that name files, and what
the planner searches for it (a memory limit). Planning, validation, records, the report, the
planner, the peer check and the exports ask the entry, never the name.

A new schedule is one module that calls `register(ScheduleSpec(...))` and is imported before
use, plus its harness/conf/schedule/<name>.yaml (ARCHITECTURE.md). The built-ins register
themselves from harness/schedules/builders.py, v_shape.py, auto.py (made from the run's costs)
and csv_io.py (made from a file), imported by the package (and so by `import harness`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from harness.config import add_option, remove_option
from harness.schedules.ir import Schedule

LOOP, V_SHAPE, FROM_DATA = "loop", "v", "data"  # placements: stage s on rank s % N | V | as the file says
COUNTS, COSTS, FILE = "counts", "costs", "file"  # what an entry makes its plan from (ScheduleSpec.needs)

# (N >= 2, M, V, F, B, I, W) -> makespan minus one rank's work, for per-stage costs F, B = I + W; None: no
# closed form there (one rank never waits: theory.py does not ask)
IdleForm = Callable[[int, int, int, float, float, float, float], "float | None"]


def one_chunk(v: int) -> int:
    return 1


def no_requirements(n: int, m: int, v: int) -> str | None:
    return None


@dataclass
class ScheduleInputs:
    """What an entry makes its plan from: the run's Config (its counts and its schedule section)
    and, for an entry made from costs, the run's priced costs, asked for lazily (pricing builds
    nothing an entry made from counts or a file needs). The planner fills the callables
    (harness/planning/plan.py); an entry asking for one it was not given gets a ValueError."""

    config: Any  # the run's Config
    # the plan's priced per-stage costs (harness/simulate/pricing.py: compute, links, syncs, overheads:
    # what executor=sim runs on), stages placed as the entry's placement says
    priced: Callable[[], Any] | None = None
    # per stage, the share of a microbatch's activations a deferred W keeps (harness/planning/memory_theory.py)
    deferred: Callable[[], tuple[float, ...]] | None = None
    # a prior run's measured per-stage costs (its directory), over the priced ones
    measured: Callable[[str], Any] | None = None
    notes: list[str] = field(default_factory=list)  # what the user should know about how the plan was made
    _memo: dict = field(default_factory=dict, repr=False)

    @property
    def section(self) -> Any:
        """The schedule's config section: its name and its own keys (`ScheduleSpec.config`)."""
        return self.config.schedule

    @property
    def pp(self) -> int:
        return self.config.pp

    @property
    def microbatches(self) -> int:
        return self.config.microbatches

    @property
    def virtual_stages(self) -> int:
        return self.config.virtual_stages

    def costs(self) -> Any:
        """The run's priced CostModel (priced once)."""
        return self._once("costs", self.priced)

    def deferred_share(self) -> tuple[float, ...]:
        return self._once("deferred", self.deferred)

    def measured_costs(self, run_dir: str) -> Any:
        if self.measured is None:
            raise ValueError(f"schedule={self.section.name}: made from a run's measured costs, and none are given here")
        return self.measured(run_dir)

    def note(self, text: str) -> None:
        """A line for the plan's notes (printed, recorded): `schedule=<name>: <text>`."""
        self.notes.append(f"schedule={self.section.name}: {text}")

    def _once(self, key: str, make: Callable[[], Any] | None) -> Any:
        if make is None:
            raise ValueError(f"schedule={self.section.name}: made from the run's priced costs, and none are given here")
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]


@dataclass(frozen=True)
class ScheduleSpec:
    name: str
    summary: str  # one line: what it is, after whom
    build: Callable[[int, int, int], Schedule] | None  # (N, M, V) -> per-rank actions; None: made from more (`make`)
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
    # -- a schedule made from more than its counts ---------------------------------------------------
    needs: str = COUNTS  # COUNTS (`build`) | COSTS (the run's priced costs) | FILE (a file its keys name)
    make: Callable[[ScheduleInputs], Schedule] | None = None  # its plan from the inputs; None: `build`'s
    config: type | None = None  # the dataclass of its schedule section (its own keys), a ScheduleConfig subclass
    paths: tuple[str, ...] = ()  # keys of its section naming files (made absolute by the front end, hashed in records)
    inputs: Callable[[Any], dict[str, str]] | None = None  # section -> {key: file} it reads beyond `paths`
    label: Callable[[dict], str] | None = None  # a recorded section -> its name in reports; None: the name
    limit_key: str | None = None  # its key holding a memory limit in units of 1F1B's peak, that the planner searches
    plan_cost: float = 1.0  # the planner's relative cost of making one point's plan (made per point from costs)
    actions: Callable[[Any], int | None] | None = None  # a Config -> its actions a step, where the counts do not say

    def __post_init__(self) -> None:
        if self.needs not in (COUNTS, COSTS, FILE):
            raise ValueError(f"schedule {self.name}: needs={self.needs!r} (allowed: {COUNTS}, {COSTS}, {FILE})")
        if (self.build is None) == (self.needs == COUNTS) or (self.make is None and self.build is None):
            raise ValueError(f"schedule {self.name}: a schedule made from its counts has `build`, any other `make`")
        if self.make is None:
            builder = self.build
            object.__setattr__(self, "make", lambda x: builder(x.pp, x.microbatches, x.virtual_stages))

    @property
    def reads_virtual_stages(self) -> bool:
        """Whether virtual_stages changes it (interleaved_1f1b's V; the V shapes always have 2)."""
        return self.chunks(1) != self.chunks(2)

    @property
    def searchable(self) -> bool:
        """Whether the planner can make it for a point: from counts or costs (a file is the user's)."""
        return self.needs != FILE

    def owner(self, stages: int, n: int) -> tuple[int, ...]:
        """The rank of each stage as its placement puts them (a file's say their own: loop order here)."""
        if self.placement == V_SHAPE:
            return tuple(min(s, 2 * n - 1 - s) for s in range(stages))
        return tuple(s % n for s in range(stages))

    def where(self, c: Any) -> str:
        """The key an error in the plan it makes is about: its file, else the schedule."""
        if self.paths:
            return f"schedule.{self.paths[0]}={getattr(c.schedule, self.paths[0], None)}"
        return f"schedule={self.name}"

    def files(self, section: Any) -> dict[str, str]:
        """{key: path} of every file a run of it reads (provenance hashes them)."""
        out = {f"schedule.{k}": str(v) for k in self.paths if (v := getattr(section, k, None))}
        return out | (self.inputs(section) if self.inputs is not None else {})

    def name_in_report(self, section: dict) -> str:
        return self.label(section) if self.label is not None else self.name


SCHEDULES: dict[str, ScheduleSpec] = {}


def register(spec: ScheduleSpec) -> ScheduleSpec:
    """The entry, and its section's dataclass as the `schedule` group's option `name`."""
    SCHEDULES[spec.name] = spec
    if spec.config is not None:
        add_option("schedule", spec.name, spec.config)
    return spec


def unregister(name: str) -> None:
    SCHEDULES.pop(name, None)
    remove_option("schedule", name)


def built_in() -> tuple[str, ...]:
    """Names of the schedules built from their counts alone (zb_auto is made from costs, csv from a file)."""
    return tuple(name for name, spec in SCHEDULES.items() if spec.needs == COUNTS)


def searchable() -> tuple[str, ...]:
    """The schedules the planner can make for a point: those built from counts, then those made from costs."""
    return built_in() + tuple(name for name, spec in SCHEDULES.items() if spec.needs == COSTS)


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
