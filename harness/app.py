"""Entry point: `python -m harness [key=value ...]`, `-m` for a sweep. Thin on purpose:
the work is in job.run_job."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.config import ConfigError, register, to_config
from harness.job import run_job
from harness.record import RESULT
from harness.result import RecordError, read
from harness.runtime.launch import torchrun_rank

register()


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a scheduler's kill, `kill PID`) ends a job like Ctrl-C: recorded
    `interrupted`, workers killed, finished jobs' records kept."""
    raise KeyboardInterrupt


def already_ok(out: Path) -> bool:
    try:
        return read(out / RESULT).status == "ok"
    except RecordError:
        return False  # missing, corrupt or partial: run it again


@hydra.main(version_base="1.3", config_path="pkg://conf", config_name="config")
def main(cfg: DictConfig) -> None:
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    group = Path(hc.sweep.dir).name if sweep else "single"
    name = hc.job.override_dirname or "default"
    rank = (torchrun_rank() or (0, 0))[0]
    if cfg.resume and already_ok(out):
        print(f"harness: {name}: ok in an earlier run, skipped (resume=true)", flush=True)
        return
    try:
        result = run_job(to_config(cfg), out, group, name, _cuda_devices())
    except ConfigError as e:
        if rank == 0:
            print(f"harness: error: {e}", file=sys.stderr)
        if not sweep:
            sys.exit(2)
        return  # recorded as failed; the sweep goes on and its exit status counts it
    except KeyboardInterrupt:
        print(f"harness: interrupted; {out / RESULT} says so, finished jobs keep their records", file=sys.stderr)
        sys.exit(130)
    if rank != 0:
        return
    for note in result.plan.notes if result.plan else []:
        print(f"harness: note: {note}", flush=True)
    print(f"harness: {result.headline()}", flush=True)
    print(f"harness: records in {out}", flush=True)
    if result.status != "ok" and not sweep:
        sys.exit(1)
