"""Hydra callbacks: a sweep's progress (job k of n, time left, each job's headline on the
console and in <sweep dir>/sweep.log) and its closing summary and exit status."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.utils import JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.records import running
from harness.records.record import RESULT
from harness.report.load import scan
from harness.records.result import RecordError, read
from harness.records.locks import SWEEP_RECORD
from harness.records.safe_io import read_text


def sweep_size(config: DictConfig) -> int | None:
    """Jobs in the sweep: its points as harness's sweeper makes them (the preset's
    hydra.sweeper.params, then the command line's). None if unknown."""
    from harness.frontend.sweeper import expand

    try:
        preset = config.hydra.sweeper.get("params")
        params = OmegaConf.to_container(preset) if preset else {}
        values = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
        return len(expand(OverridesParser.create().parse_overrides(values)))
    except Exception:  # noqa: BLE001 - progress is a nicety; a sweeper it cannot read just shows no total
        return None


SWEEP_LOG = "sweep.log"  # <sweep dir>/sweep.log: one line per finished job, whichever launcher ran it


def sweep_record(config: DictConfig, since: float = 0.0) -> dict:
    """What harness's sweeper wrote of this sweep before its first job ({points, launched,
    skipped}); {} without one (another sweeper), or with one older than `since` (an earlier sweep's)."""
    path = Path(str(config.hydra.sweep.dir)) / SWEEP_RECORD
    try:
        if path.stat().st_mtime < since:
            return {}
        data = json.loads(read_text(path, SWEEP_RECORD, "result"))  # a regular file, capped: never a FIFO
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def headline(out: Path) -> str:
    """The job's headline from its result.json, or why there is none."""
    try:
        return read(out / RESULT).headline()
    except RecordError as e:
        return f"no record ({e})"


def append_sweep_log(sweep_dir: Path, line: str) -> None:
    """One line appended in one write (O_APPEND: whole lines even when jobs on several
    processes or hosts finish together; a shared file system may still interleave)."""
    from harness.records.atomic import open_in_place

    fd = open_in_place(sweep_dir / SWEEP_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT)  # never a link or a FIFO
    try:
        os.write(fd, (line.replace("\n", " ") + "\n").encode())
    finally:
        os.close(fd)


class Progress(Callback):
    """A sweep's progress on the console, and its log.

    - Jobs run in this process (the basic launcher): `[harness] job 3/12 (schedule=1f1b pp=4
      microbatches=8), 25 s elapsed, ~75 s left` as each starts; the job prints its headline.
    - Jobs run elsewhere (submitit_local, slurm: harness/runtime/cluster.py, whose jobs' output
      goes to submitit's log files): the launcher tells this object of each job it starts
      (`job_submitted`) and of each that comes back (`job_returned`, with its headline from its
      result.json), so both reach the console as they happen.
    - Every launcher: each job appends `<time> <job dir> <headline>` to <sweep dir>/sweep.log
      as it ends (rank 0 alone where a job has several ranks), for `tail -f`.
    """

    def __init__(self) -> None:
        self.total: int | None = None
        self.launched: int | None = None  # harness's sweeper knows what it launches (skipped points left out)
        self.started = 0.0
        self.since = 0.0  # the sweep's start, wall clock: a sweep record older than it is an earlier sweep's
        self.config: DictConfig | None = None
        self.done = 0
        self.submitted = 0
        self.remote = False  # a copy sent with a job to another process (a launcher pickled it)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "remote": True}

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.total, self.started, self.done, self.submitted = sweep_size(config), time.monotonic(), 0, 0
        self.since, self.launched, self.config = time.time() - 1.0, None, config

    def _of(self) -> str:
        if self.launched is None and self.config is not None:
            self.launched = sweep_record(self.config, self.since).get("launched")
            if isinstance(self.launched, int):
                self.total = self.launched
        return f"/{self.total}" if self.total else ""

    def _timing(self) -> str:
        elapsed = time.monotonic() - self.started
        left = ""
        if self.done and self.total and self.total > self.done:
            left = f", ~{elapsed / self.done * (self.total - self.done):.0f} s left"
        return f"{elapsed:.0f} s elapsed{left}"

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.started or self.remote:  # a single run; or a job on another process (its launcher says it)
            return
        what = " ".join(config.hydra.overrides.task) or "defaults"
        of = self._of()
        print(f"[harness] job {self.done + 1}{of} ({what}), {self._timing()}", flush=True)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        if not self.remote:
            self.done += 1
        if OmegaConf.select(config, "hydra.mode") != RunMode.MULTIRUN or os.environ.get("RANK", "0") != "0":
            return  # a single run; or a rank other than 0 (torchrun, a submitit task): rank 0 records
        out = Path(str(config.hydra.runtime.output_dir))
        # the job's own headline (harness/frontend/app.py returns that of the record it wrote), else read back
        value = job_return.return_value if getattr(job_return, "status", None) == JobStatus.COMPLETED else None
        said = value.get("headline") if isinstance(value, dict) else None
        said = said if isinstance(said, str) else headline(out)
        try:
            append_sweep_log(Path(str(config.hydra.sweep.dir)),
                             f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {out.name} {said}")
        except OSError as e:  # the log is a convenience: never a job's failure
            print(f"harness: warning: {SWEEP_LOG}: {e.strerror}", file=sys.stderr)

    # the launching side of launchers whose jobs run in other processes (harness/runtime/cluster.py)
    def job_submitted(self, num: int, what: str, where: str) -> None:
        self.submitted += 1
        print(f"[harness] job {self.submitted}{self._of()} ({what}) started: {where}, {self._timing()}", flush=True)

    def job_returned(self, num: int, what: str, out: Path, seconds: float, problem: str | None = None) -> None:
        self.done += 1
        said = problem or headline(out)
        if problem:  # the job could not log itself
            try:
                append_sweep_log(out.parent, f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {out.name} {problem}")
            except OSError:
                pass
        print(f"[harness] done {self.done}{self._of()} ({what}, {seconds:.0f} s): {said}; {self._timing()}",
              file=sys.stderr if problem else sys.stdout, flush=True)


def _some(items: Any, shown: int = 5) -> str:
    items = list(items)
    return "; ".join(items[:shown]) + (f"; and {len(items) - shown} more" if len(items) > shown else "")


def _task_overrides(config: DictConfig) -> list[str]:
    """The command line's overrides as typed (`microbatches=${pp}` not resolved)."""
    node = OmegaConf.select(config, "hydra.overrides.task", default=None)
    return [str(o) for o in OmegaConf.to_container(node, resolve=False)] if node is not None else []


def _refuse(message: str) -> NoReturn:
    rank = os.environ.get("RANK", "0")
    print(f"harness: error: {message}" if rank == "0" else f"harness: error (rank {rank}): {message}",
          file=sys.stderr, flush=True)
    sys.exit(2)


class RunGuard(Callback):
    """A single run (`python -m harness ...` without -m), before Hydra makes its directory or
    writes anything there (.hydra/, app.log): the directory is refused if it is no place for
    records (locks.unsafe_dir), a sweep's or a sweep job's (the sweep owns its records), or
    being written by another harness (it or a directory above it); the config is validated
    (composed, typed, planned: what would be refused later is refused now, exit 2, nothing
    written); then the directory's lock is taken and held to the run's end, and run.resume=true
    decides whether the run's record stands (app.resume_skips: exit 0, nothing written)."""

    def __init__(self) -> None:
        self.lock: Any = None

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """Hydra turns a callback's exception into a warning and runs the job: every error here
        is said in one line and ends the run (run.debug=true or HYDRA_FULL_ERROR=1: all of it)."""
        try:
            self.check(config)
        except Exception as e:  # noqa: BLE001 - composition, interpolation, planning: one line either way
            from harness.frontend.errors import hydra_problem
            from harness.frontend.sweeper import FULL_ERRORS_ENV

            if os.environ.get(FULL_ERRORS_ENV) == "1":
                import traceback

                traceback.print_exc()
                sys.exit(1)
            _refuse(hydra_problem(e, _task_overrides(config)))

    def check(self, config: DictConfig) -> None:
        from hydra.core.hydra_config import HydraConfig

        from harness.frontend.compose import to_config
        from harness.config import ConfigError, check_values
        from harness.planning.early import check_early
        from harness.records.locks import Busy, DirLock, check_free, run_files, sweep_of, unsafe_dir, unsafe_files

        HydraConfig.instance().set_config(config)  # what ${hydra:...} reads, as Hydra sets it for the job
        cwd = str(config.hydra.runtime.cwd)
        where = OmegaConf.select(config, "hydra.run.dir", default=None)
        if why := unsafe_dir(where, cwd):
            _refuse(f"hydra.run.dir={where or ''}: {why}; nothing written")
        out = Path(os.path.abspath(os.path.join(cwd, str(where))))
        if (sweep := sweep_of(out)) is not None:
            what = "a sweep's directory" if sweep == out else f"a job directory of the sweep {sweep}"
            _refuse(f"hydra.run.dir={where}: {what}, whose records are the sweep's; run it again as part of the sweep "
                    f"(python -m harness -m <its keys> hydra.sweep.dir={sweep} run.resume=true); nothing written")
        try:
            check_free(out)
        except Busy as e:
            _refuse(str(e))
        if config.run.repeats != 1:
            _refuse(f"run.repeats={config.run.repeats}: repeats are points of a sweep (allowed: 1 here; "
                    f"python -m harness -m ... run.repeats={config.run.repeats} runs each point that many times)")
        # interpolations resolved first: one that fails is said as the command line wrote it (harness.frontend.cli)
        OmegaConf.to_container(OmegaConf.masked_copy(config, [k for k in config if k != "hydra"]), resolve=True)
        try:
            c = to_config(config, cwd=cwd)
            check_values(c)  # what the schema alone refuses, before torch is imported
            check_early(c)  # and what needs no model built, its shape at most (harness/planning/early.py)
        except ConfigError as e:
            _refuse(str(e))
        from harness.frontend.app import _cuda_devices, resume_skips
        from harness.planning.plan import make_plan

        try:
            make_plan(c, _cuda_devices())
            # harness.job only now: it imports the runtime (torch._dynamo, torch.distributed: seconds), which no
            # refusal of the plan needs
            from harness.job import rerun_statuses

            rerun_statuses(c.run.rerun)
        except ConfigError as e:
            _refuse(str(e))
        if why := unsafe_files(out, run_files(config)):
            _refuse(f"hydra.run.dir={where}: {why}; nothing written")
        try:
            self.lock = DirLock(out).acquire()
        except Busy as e:
            _refuse(str(e))
        except OSError as e:
            _refuse(f"hydra.run.dir={where}: cannot create it ({e.strerror})")
        if c.run.resume and (why := resume_skips(out, config)):
            name = config.hydra.job.override_dirname or "default"
            print(f"harness: {name}: {why}, skipped (run.resume=true)", flush=True)
            self.on_run_end(config)
            sys.exit(0)

    def on_run_end(self, config: DictConfig, **kwargs: Any) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None


class SweepSummary(Callback):
    """After a sweep: how many jobs ran ok, were skipped (theory over memory_budget_gib), which
    failed (or left a corrupt record, or none); exit 1 if any did. One record per point, its
    newest (a point's older records are superseded: listed, not counted). What harness's sweeper
    tells it (`note`): the points run.resume=true kept and why it ran others again, jobs another
    harness was writing (not run), and the job that found the disk full (the sweep stopped
    there). Records are read through result.read: never a FIFO or a device."""

    def __init__(self) -> None:
        self.notes: dict[str, Any] = {}

    def note(self, **notes: Any) -> None:
        """From the sweeper, in this process (also when the disk is too full for sweep.json)."""
        self.notes.update(notes)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.notes = {}

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        from harness.records.identity import point_of, started_at
        from harness.report.load import superseded

        sweep_dir = Path(config.hydra.sweep.dir)
        status: dict[str, str] = {}  # job (relative to the sweep) -> status
        entries = []
        found = scan(sweep_dir)
        for path in found.records:
            job = os.path.relpath(path.parent, sweep_dir)
            try:
                r = read(path)
                status[job] = r.status
                entries.append((job, point_of({"config": r.config, "provenance": r.provenance}, path.parent), started_at(
                    {"provenance": r.provenance}, path), True))
            except RecordError:
                status[job] = "corrupt"
        for job in found.missing:  # a job directory without a record: killed before recording
            rel = os.path.relpath(job, sweep_dir)
            # running while another harness still runs it (running.json's owner lives); a stale one is a kill
            status[rel] = "running" if (running.state(job) or "").startswith("running") else "missing"
            entries.append((rel, point_of({}, job), started_at({}, job), False))
        for d, _why in found.unreadable:
            status[os.path.relpath(d, sweep_dir)] = "unreadable"
        old = superseded(entries)
        by: dict[str, list[str]] = {}
        for job, s in status.items():
            if job not in old:
                by.setdefault(s, []).append(job)
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(by.items()))
        record = sweep_record(config)
        notes = {"resume": record.get("resume"), **self.notes}  # the sweeper's in this process; sweep.json's else
        skipped = record.get("skipped") or []
        if skipped:
            counts += f"{', ' if counts else ''}{len(skipped)} skipped (cannot run; run.skip_invalid=true)"
        print(f"harness: sweep {sweep_dir}: {counts or 'no records'}", flush=True)
        resume = notes.get("resume") or {}
        if resume.get("kept") or resume.get("rerun"):
            again = resume.get("rerun") or []
            print(f"harness: resume: {len(resume.get('kept') or [])} kept from earlier runs, {len(again)} run again"
                  + (f" ({_some(f'{job}: {why}' for job, why in again)})" if again else ""), flush=True)
        if old:
            print(f"harness: superseded by a newer record of the same point (not counted): "
                  f"{_some(f'{job} (by {new})' for job, new in sorted(old.items()))}", flush=True)
        bad = [j for k, v in by.items() if k not in ("ok", "skipped") for j in v]  # skipped: over memory_budget_gib
        locked = notes.get("locked") or []
        for job, why in locked:
            print(f"harness: locked: {job}: not run ({why})", file=sys.stderr)
        bad += [job for job, _ in locked if job not in bad]
        if full := notes.get("disk_full"):
            print(f"harness: disk full: {full['job']} hit it ({full['error']}); the sweep stopped there, "
                  f"{full.get('not_run', 0)} point(s) not run (run.resume=true runs them once there is space)",
                  file=sys.stderr)
            if full["job"] not in bad:
                bad.append(full["job"])
        if bad:
            print(f"harness: not ok: {', '.join(bad)}", file=sys.stderr)
            sys.exit(1)
