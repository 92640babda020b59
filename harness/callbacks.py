"""Hydra callbacks: a sweep's progress (job k of n, time left, each job's headline on the
console and in <sweep dir>/sweep.log) and its closing summary and exit status."""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.record import RESULT
from harness.report.load import scan
from harness.result import RecordError, read
from harness.sweeper import SWEEP_RECORD


def sweep_size(config: DictConfig) -> int | None:
    """Jobs in the sweep: the product of the number of values of each swept key, the
    command line's overriding the preset's (hydra.sweeper.params). None if unknown."""
    try:
        preset = config.hydra.sweeper.get("params")
        params = OmegaConf.to_container(preset) if preset else {}
        values = [f"{k}={v}" for k, v in params.items()] + list(config.hydra.overrides.task)
        counts: dict[str, int] = {}
        for o in OverridesParser.create().parse_overrides(values):
            counts[o.get_key_element()] = len(list(o.sweep_string_iterator())) if o.is_sweep_override() else 1
        return math.prod(counts.values())
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
        data = json.loads(path.read_text())
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
    fd = os.open(sweep_dir / SWEEP_LOG, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
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
        try:
            append_sweep_log(Path(str(config.hydra.sweep.dir)),
                             f"{time.strftime('%Y-%m-%dT%H:%M:%S')} {out.name} {headline(out)}")
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


class SweepSummary(Callback):
    """After a sweep: how many jobs ran ok, were skipped (theory over memory_budget_gib), which
    failed (or left a corrupt record, or none); exit 1 if any did. Records are read through result.read: never a FIFO or a device."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        status: dict[str, list[str]] = {}
        found = scan(sweep_dir)
        for path in found.records:
            try:
                s = read(path).status
            except RecordError:
                s = "corrupt"
            status.setdefault(s, []).append(os.path.relpath(path.parent, sweep_dir))
        for job in found.missing:  # a job directory without a record: killed before recording
            status.setdefault("missing", []).append(os.path.relpath(job, sweep_dir))
        for d, _why in found.unreadable:
            status.setdefault("unreadable", []).append(os.path.relpath(d, sweep_dir))
        counts = ", ".join(f"{len(v)} {k}" for k, v in sorted(status.items()))
        skipped = sweep_record(config).get("skipped") or []
        if skipped:
            counts += f"{', ' if counts else ''}{len(skipped)} skipped (cannot run; skip_invalid=true)"
        print(f"harness: sweep {sweep_dir}: {counts}", flush=True)
        bad = [j for k, v in status.items() if k not in ("ok", "skipped") for j in v]  # skipped: over memory_budget_gib
        if bad:
            print(f"harness: not ok: {', '.join(bad)}", file=sys.stderr)
            sys.exit(1)
