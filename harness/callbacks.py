"""Hydra callbacks: a sweep's progress (job k of n, time left) and its closing summary
and exit status."""

from __future__ import annotations

import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from harness.report.load import scan
from harness.result import RecordError, read
from harness.sweeper import State


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


class Progress(Callback):
    """`[harness] job 3/12 (schedule=1f1b pp=4 microbatches=8), 25 s elapsed, ~75 s left`."""

    def __init__(self) -> None:
        self.total: int | None = None
        self.started = 0.0
        self.done = 0

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        State.reset()
        self.total, self.started, self.done = sweep_size(config), time.monotonic(), 0

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.started:  # a single run
            return
        if State.total is not None:  # harness's sweeper knows what it launches (skipped points left out)
            self.total = State.total
        elapsed = time.monotonic() - self.started
        of = f"/{self.total}" if self.total else ""
        left = ""
        if self.done and self.total:
            left = f", ~{elapsed / self.done * (self.total - self.done):.0f} s left"
        what = " ".join(config.hydra.overrides.task) or "defaults"
        print(f"[harness] job {self.done + 1}{of} ({what}), {elapsed:.0f} s elapsed{left}", flush=True)

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        self.done += 1


class SweepSummary(Callback):
    """After a sweep: how many jobs ran ok, which failed (or left a corrupt record, or none);
    exit 1 if any did. Records are read through result.read: never a FIFO or a device."""

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
        if State.skipped:
            counts += f"{', ' if counts else ''}{len(State.skipped)} skipped (cannot run; skip_invalid=true)"
        print(f"harness: sweep {sweep_dir}: {counts}", flush=True)
        bad = [j for k, v in status.items() if k != "ok" for j in v]
        if bad:
            print(f"harness: not ok: {', '.join(bad)}", file=sys.stderr)
            sys.exit(1)
