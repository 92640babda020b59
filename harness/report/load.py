"""Find sweeps and read their records. A record that cannot be read, or lacks what the report
needs, is listed with the reason, never fatal; so is a job directory without a record."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path

from harness.config import Config
from harness.records.record import RESULT
from harness.records.result import RecordError, Result, _value, read
from harness.report.runs import Run

# What a record's config (a free dict in the schema) must hold to be reported, as dotted keys.
CONFIG_KEYS = ("schedule.name", "pp", "microbatches", "microbatch_size", "compute", "executor", "partition.name",
               "model.name")
# Every config key the report reads: where present, it must have the type harness.config.Config
# gives it (other keys are not looked at: a record from another version may differ there).
# The report reads these of `Result.cfg` only (tests/test_report_schema.py holds it to that).
REPORTED = CONFIG_KEYS + ("dp", "tp", "sequence_parallel", "virtual_stages", "device", "checkpointing", "profile", "model.layers",
                          "model.hidden", "cost.fwd_ms_per_layer", "zero", "dtype", "global_batch", "optimizer.name", "warmup_steps")
POSITIVE = ("pp", "dp", "tp", "virtual_stages", "microbatches", "microbatch_size")  # in a run that finished ok
# Beyond these no run was made (pp x dp is one process each): figures draw per rank and per M, so a
# tampered record's 2**40 would cost the report hours, not a run
LIMITS = {"pp": 1024, "dp": 1024, "tp": 1024, "virtual_stages": 1024, "microbatches": 65536}
MISSING = "missing: no result.json (killed before recording?)"
JOB_DIR = re.compile(r"[a-z]*\d+(_.*)?", re.S)  # a Hydra job's directory: `12_pp=4,...`, `ckpt0_...`


@dataclass
class Sweep:
    path: Path
    runs: list[Run] = field(default_factory=list)  # the records as read (older versions upgraded): one per point
    # (record path relative to the sweep, why): unreadable or partial records, job directories
    # without one (why == MISSING), directories that could not be listed (path ends in "/")
    corrupt: list[tuple[str, str]] = field(default_factory=list)
    # (job directory relative to the sweep, the newer one of the same point): records (and job
    # directories without one) a newer record of their point replaces; not reported
    superseded: list[tuple[str, str]] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.path.resolve().name  # `.` and `..` name the directory they stand for


def status_of(why: str) -> str:
    """runs.csv's status for a listed record: `missing` for a job without one, else `corrupt`."""
    return "missing" if why == MISSING else "corrupt"


@dataclass
class Scan:
    records: list[Path] = field(default_factory=list)  # every result.json (of any file type)
    missing: list[Path] = field(default_factory=list)  # job directories without one
    unreadable: list[tuple[Path, str]] = field(default_factory=list)  # directories that could not be listed


def scan(root: Path) -> Scan:
    """Walks root without following links to directories or opening any file. A job directory
    is one holding Hydra's `.hydra/`, or a child of root named like one (`3_pp=2`, `ckpt0_...`)."""
    root, found = Path(root), Scan()

    def failed(e: OSError) -> None:
        found.unreadable.append((Path(e.filename or root), f"unreadable directory: {type(e).__name__}: {e.strerror}"))

    for d, dirs, files in os.walk(root, onerror=failed):
        here = Path(d)
        if RESULT in files or RESULT in dirs:  # a directory named result.json is listed, not entered
            found.records.append(here / RESULT)
        elif ".hydra" in dirs or (here.parent == root and JOB_DIR.fullmatch(here.name)):
            found.missing.append(here)
        dirs[:] = sorted(x for x in dirs if x not in (RESULT, ".hydra"))
    return found


def superseded(entries: list[tuple[str, str | None, float, bool]]) -> dict[str, str]:
    """{job: the job superseding it} from (job, point, started, has a record) of a sweep's job
    directories: of the records of one point (identity.point_of: its resolved config, whatever
    its job number) the newest stands, the others are superseded, and so is a job directory without a
    record older than it. Where no point is known (a job directory its sweep.json does not list),
    none is; nor is a record as old as the newest (a copy of it)."""
    newest: dict[str, tuple[float, str]] = {}
    for job, point, when, record in entries:
        if point is not None and record and (point not in newest or (when, job) > newest[point]):
            newest[point] = (when, job)
    return {job: newest[point][1] for job, point, when, record in entries  # a copy (the same start) stands
            if point in newest and newest[point][1] != job and (when < newest[point][0] if record else
                                                                 when <= newest[point][0])}


def newest_sweep(root: Path) -> Path:
    """The most recently modified directory under root/sweeps (or root) holding records."""
    def newest(p: Path) -> float | None:
        times = []
        for f in scan(p).records:
            try:
                times.append(f.lstat().st_mtime)
            except OSError:
                pass
        return max(times, default=None)

    for pattern in ("sweeps/*", "*/*"):
        candidates = {p: t for p in root.glob(pattern) if p.is_dir() and (t := newest(p)) is not None}
        if candidates:
            return max(candidates, key=candidates.__getitem__)
    raise FileNotFoundError(f"no sweep with a {RESULT} under {root}/ (run `make sweep` first)")


_HINTS: dict[type, dict[str, object]] = {}


def _hint(cls: type, name: str) -> object:
    if cls not in _HINTS:
        _HINTS[cls] = typing.get_type_hints(cls)
    return _HINTS[cls][name]


def _check_config(c: dict, ok: bool) -> str | None:
    """Why a record's config cannot be reported (a missing key, a wrong type), or None;
    RecordError naming the key for a value of the wrong type."""
    missing = []
    for key in REPORTED:
        cls, value, where = Config, c, "config"
        for part in key.split("."):
            if not isinstance(value, dict):
                raise RecordError(f"{where}: {type(value).__name__} where a JSON object belongs")
            if part not in value:
                missing += [key] if key in CONFIG_KEYS else []
                break
            hint, value, where = _hint(cls, part), value[part], f"{where}.{part}"
            if dataclasses.is_dataclass(hint):
                cls = hint  # a group (schedule, model, ...): its own keys follow
            else:
                _value(hint, value, where)
        else:
            if ok and key in POSITIVE and isinstance(value, int) and value < 1:
                return f"{where}={value}: must be >= 1 in a run that finished ok"
            if ok and key in LIMITS and isinstance(value, int) and value > LIMITS[key]:
                return f"{where}={value}: more than {LIMITS[key]}, not a run this harness makes"
    return f"config lacks {', '.join(missing)}" if missing else None


def problem(result: Result) -> str | None:
    """Why a well-formed record still cannot be reported, or None."""
    try:
        if why := _check_config(result.config, result.status == "ok"):
            return why
        if isinstance(result.partition, dict):  # free-form in the schema; the partition table reads these
            for key, hint in (("layers_per_stage", list[int] | None), ("predicted_cost_per_stage", list[float] | None),
                              ("cost_unit", str | None), ("imbalance", float | None)):
                _value(hint, result.partition.get(key), f"partition.{key}")
    except RecordError as e:
        return str(e)
    if result.status == "ok" and result.metrics is None:
        return "status ok but no metrics"
    try:  # the report writes UTF-8: no lone surrogates (JSON's "\ud800")
        json.dumps(result.to_json(), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return "a string that is not valid UTF-8 (a lone surrogate)"
    return None


def _rel(f: Path, root: Path) -> str:
    """f relative to root, as text the report can write (a name that is not UTF-8 escaped)."""
    rel = os.path.relpath(f, root)
    return rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def load_sweep(path: Path) -> Sweep:
    sweep = Sweep(path)
    found = scan(path)
    sweep.corrupt += [(_rel(d / RESULT, path), MISSING) for d in found.missing]
    sweep.corrupt += [(_rel(d, path).rstrip("/") + "/", why) for d, why in found.unreadable]
    for f in found.records:
        rel = _rel(f, path)
        try:
            result = read(f)
            why = problem(result)
            if why is None and rel != os.path.relpath(f, path):
                why = "its path is not valid UTF-8"
        except RecordError as e:
            why = str(e)
        except Exception as e:  # noqa: BLE001 - a bug here must not cost the report; the record is listed
            why = f"unreadable: {type(e).__name__}: {e}"
        if why is not None:
            sweep.corrupt.append((rel, " ".join(why.split())))
            continue
        sweep.runs.append(Run(result, str(f.parent.relative_to(path)), path))
    _newest_per_point(sweep, found.missing)
    sweep.corrupt.sort()
    return sweep


def _newest_per_point(sweep: Sweep, missing: list[Path]) -> None:
    """One record per point: the others (`superseded`) move from runs (and corrupt's missing) to
    sweep.superseded."""
    from harness.records.identity import point_of, started_at

    def record(r: Run) -> dict:  # what point_of and started_at read of a record
        return {"provenance": r.result.provenance}

    entries = [(r.dir, point_of(record(r), sweep.path / r.dir), started_at(record(r), sweep.path / r.dir / RESULT),
                True) for r in sweep.runs]
    entries += [(str(d.relative_to(sweep.path)), point_of({}, d), started_at({}, d), False) for d in missing]
    old = superseded(entries)
    if not old:
        return
    sweep.runs = [r for r in sweep.runs if r.dir not in old]
    gone = {_rel(sweep.path / job / RESULT, sweep.path) for job in old}
    sweep.corrupt = [(f, why) for f, why in sweep.corrupt if not (why == MISSING and f in gone)]
    sweep.superseded = sorted(old.items())
