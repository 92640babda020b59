"""Entry point: `python -m harness [key=value ...]`, `-m` for a sweep. Thin on purpose:
the work is in job.run_job."""

from __future__ import annotations

import signal
import sys
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from harness.compose import register, to_config
from harness.config import ConfigError
from harness.job import run_job
from harness.locks import Busy, DirLock
from harness.plan import make_plan
from harness.record import GANTT, RESULT, TRACE
from harness.result import RecordError, read
from harness.runtime.launch import external_rank, shared_pool

register()


def _cuda_devices() -> int:
    """The GPUs this job's ranks have: this node's, times the nodes an external launcher spans."""
    import torch

    from harness.runtime.cluster import world_cuda_devices

    return world_cuda_devices(torch.cuda.device_count() if torch.cuda.is_available() else 0)


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM (a scheduler's kill, `kill PID`) ends a job like Ctrl-C: recorded
    `interrupted`, workers killed, finished jobs' records kept."""
    raise KeyboardInterrupt


def resume_skips(out: Path, cfg: DictConfig) -> str | None:
    """resume=true: why this job need not run again (its record is ok and complete, and was
    made from the config asked for now), or None to run it."""
    try:
        stored = read(out / RESULT)
    except RecordError:
        return None  # missing, corrupt or partial: run it again
    if stored.status != "ok" or not all((out / f).is_file() for f in (TRACE, GANTT)):
        return None
    try:
        asked = asdict(make_plan(to_config(cfg), _cuda_devices()).config)
    except ConfigError:
        return None  # the run records why
    if diff := config_diff(stored.config, asked):
        print(f"harness: {out.name}: the earlier record was made from another config ({diff}); running it again",
              flush=True)
        return None
    return "ok in an earlier run"


def config_diff(stored: dict, asked: dict, prefix: str = "") -> str:
    """`key: old -> new` for every setting that changes what runs (run control excluded)."""
    out = []
    for key in sorted(set(stored) | set(asked)):
        if prefix == "" and key in ("resume", "debug", "wandb", "timeout_s", "skip_invalid", "fault"):
            continue
        old, new = stored.get(key), asked.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            if sub := config_diff(old, new, f"{prefix}{key}."):
                out.append(sub)
        elif old != new:
            out.append(f"{prefix}{key}: {old} -> {new}")
    return ", ".join(out)


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    group = Path(hc.sweep.dir).name if sweep else "single"
    name = hc.job.override_dirname or "default"
    rank = (external_rank() or (0, 0))[0]  # torchrun's or a submitit task's rank; 0 when harness forks them
    if not sweep and cfg.repeats != 1:
        print(f"harness: error: repeats={cfg.repeats}: repeats are points of a sweep (allowed: 1 here; "
              f"python -m harness -m ... repeats={cfg.repeats} runs each point that many times)", file=sys.stderr)
        sys.exit(2)
    if cfg.resume and (why := resume_skips(out, cfg)):
        print(f"harness: {name}: {why}, skipped (resume=true)", flush=True)
        return
    try:
        with DirLock(out):
            result = run_job(to_config(cfg), out, group, name, _cuda_devices(), shared_pool() if sweep else None)
    except Busy as e:
        print(f"harness: error: {e}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as e:
        # every rank says it: the launcher may stop rank 0 before it prints once another rank exits
        print(f"harness: error: {e}" if rank == 0 else f"harness: error (rank {rank}): {e}", file=sys.stderr)
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
    if result.status not in ("ok", "skipped") and not sweep:
        sys.exit(1)
