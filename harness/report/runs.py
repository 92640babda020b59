"""Reading run records for figures: the Run (a typed record and where it lives), which runs
are ok, what each run is (its sweep dimensions), which dimensions a set of runs varies, and
short names for runs. Figures read typed fields (Result, its typed Config `cfg`), never a
record's dicts: tests/test_report.py checks every field they read against the schema."""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from harness.config import Config
from harness.records.result import Env, Metrics, PlanRecord, Result
from harness.schedules.registry import SCHEDULES


def config_key(r: "Run", leave_out: Iterable[str]) -> tuple:
    """The run's config as a hashable key, the top-level fields in `leave_out` left out: what runs
    that differ only there share (the same setting, the same plan)."""
    return tuple(sorted((f.name, repr(getattr(r.cfg, f.name))) for f in dataclasses.fields(r.cfg)
                        if f.name not in leave_out))


@dataclass(eq=False)  # two runs are the same run only if they are one object
class Run:
    """One reported record: the Result as read (older versions upgraded) and its job directory."""
    result: Result
    dir: str  # the job directory, relative to the sweep
    sweep: Path | None = None  # the sweep directory, where a figure reads a job's trace.json; None: made up

    @property
    def cfg(self) -> Config:
        return self.result.cfg

    @property
    def status(self) -> str:
        return self.result.status

    @property
    def error(self) -> str | None:
        return self.result.error

    @property
    def metrics(self) -> Metrics:
        """The measurements (present in every ok run: harness/report/load.py refuses one without)."""
        assert self.result.metrics is not None, f"{self.dir}: no metrics"
        return self.result.metrics

    @property
    def env(self) -> Env | None:
        return self.result.env

    @property
    def plan(self) -> PlanRecord | None:
        return self.result.plan

    @property
    def partition(self) -> dict:
        return self.result.partition or {}

    @property
    def measurement(self) -> str | None:
        """measured | emulated | simulated: what made its times (Result.measurement)."""
        return self.result.measurement

    @property
    def simulated(self) -> bool:
        return self.result.simulated

    @property
    def oversubscribed(self) -> bool:
        return bool(self.env is not None and self.env.oversubscribed)


def ok(runs: Iterable[Run]) -> list[Run]:
    return [r for r in runs if r.status == "ok"]


def by_device(r: Run) -> bool:
    """Whether a device made its times (Result.measurement == "measured"): the only runs whose
    TFLOP/s and MFU the report shows (an emulated run's times were set, a simulated one's modeled)."""
    return r.measurement == "measured"


def schedule_label(c: Config) -> str:
    """The schedule as its entry names it (a generated one with the key that says which), and its v."""
    name = c.schedule.name
    if name in SCHEDULES:
        name = SCHEDULES[name].name_in_report(dataclasses.asdict(c.schedule))
    return f"{name} v={c.virtual_stages}" if c.virtual_stages > 1 else name


def _model(c: Config) -> str:
    return f"{c.model.name} L{c.model.layers} h{c.model.hidden}"


def _profile(c: Config) -> str | None:
    return Path(c.profile).stem if c.profile else None


# The dimensions a sweep can vary, as short names; a figure's series are labelled by those
# its runs vary (and that are not its x axis), so runs that differ are never drawn as one line.
DIMS: dict[str, Callable[[Config], object]] = {
    "schedule": schedule_label,
    "pp": lambda c: c.pp,
    "dp": lambda c: c.dp,
    "tp": lambda c: c.tp,
    "sequence_parallel": lambda c: bool(c.sequence_parallel),
    "M": lambda c: c.microbatches,
    "B": lambda c: c.microbatch_size,
    "partition": lambda c: c.partition.name,
    "checkpointing": lambda c: bool(c.checkpointing),
    "model": _model,
    "profile": _profile,
    "compute": lambda c: c.compute,
    "device": lambda c: c.device,
    "executor": lambda c: c.executor,
    "fwd_ms_per_layer": lambda c: c.cost.fwd_ms_per_layer,
}
SCENARIO = ("model", "profile", "compute")  # what a partition comparison holds fixed


MODE = ("compute", "device", "executor")  # how the times were made: a figure never joins runs that differ here
# What makes two runs comparable at all: a line, front or bar group holds runs alike in these
# (besides its own axis), and its label names them
COMPARABLE = ("model", "B", *MODE, "tp")


def dim(run: Run, name: str) -> object:
    if name == "device":  # where it ran (the record's env), else what it asked for
        return (run.env.device if run.env is not None else None) or run.cfg.device
    return DIMS[name](run.cfg)


def mode(run: Run) -> str:
    """`compute=real device=cpu executor=native`: the runs a trend or a front may join."""
    return " ".join(f"{d}={dim(run, d)}" for d in MODE)


def by_mode(runs: Iterable[Run]) -> dict[str, list[Run]]:
    out: dict[str, list[Run]] = defaultdict(list)
    for r in runs:
        out[mode(r)].append(r)
    return dict(out)


def varying(runs: list[Run]) -> list[str]:
    """The dimensions over which the runs take more than one value, in DIMS order."""
    return [d for d in DIMS if len({repr(dim(r, d)) for r in runs}) > 1]


def label(run: Run, dims: Iterable[str]) -> str:
    return " ".join(str(dim(run, d)) if d == "schedule" else f"{d}={dim(run, d)}" for d in dims)


def comparable(run: Run) -> tuple:
    """The run's COMPARABLE dimensions: runs with equal keys may share a line or a front."""
    return tuple(repr(dim(run, d)) for d in COMPARABLE)


def series(runs: list[Run], x: str, always: tuple[str, ...] = ()) -> dict[str, list[Run]]:
    """Runs grouped into the lines of a plot against dimension x: one line per combination of
    the other dimensions the runs vary (and of `always`), sorted by x."""
    vary = varying(runs)
    dims = [d for d in DIMS if d != x and (d in always or d in vary)]
    out: dict[str, list[Run]] = defaultdict(list)
    for r in sorted(runs, key=lambda r: dim(r, x)):
        out[label(r, dims) or "all runs"].append(r)
    return dict(out)


def job_id(job_dir: str) -> str:
    """The job's id in its sweep directory: what precedes the first "_" (`12_pp=4,...` -> `12`;
    make sweep's later parts use `ckpt0_...`, `dp1_...`), else the directory's name."""
    head = job_dir.split("_", 1)[0]
    return head if re.fullmatch(r"[a-z]*\d+", head) else job_dir


def run_id(run: Run) -> str:
    return job_id(run.dir)


def run_ids(runs: Iterable[Run]) -> str:
    """`0-7, 9, other`: the runs a figure holds, consecutive job numbers as ranges."""
    ids = [run_id(r) for r in runs]
    nums, names = sorted(int(i) for i in ids if i.isdigit()), sorted(i for i in ids if not i.isdigit())
    spans: list[str] = []
    for n in nums:
        if spans and n == int(spans[-1].split("-")[-1]) + 1:
            spans[-1] = f"{spans[-1].split('-')[0]}-{n}"
        else:
            spans.append(str(n))
    return ", ".join(spans + names) or "none"


def setting(r: Run) -> tuple:
    """What else sets a bubble besides schedule, N and M: runs differing in these are not
    points of one curve."""
    c = r.cfg
    return (mode(r), c.partition.name, c.profile, c.dp, c.tp, c.checkpointing, c.model.name, c.microbatch_size)
