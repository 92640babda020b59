"""Entry point: `python -m harness [key=value ...]`, `-m` for a sweep. Thin on purpose:
the work is in job.run_job. Importing this module imports no torch (the job, the plan and the
runtime are imported when a job runs): `--help`, tab completion and every refusal the schema can
make answer in well under a second (tests/bench/test_bench_cli.py)."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from harness.frontend import signals
from harness.frontend.compose import register, to_config
from harness.config import ConfigError
from harness.records.locks import Busy, DirLock
from harness.records.identity import provenance
from harness.records.record import RESULT
from harness.records.result import RecordError, read
from harness.runtime.faults import maybe_interrupt, parse_fault
from harness.frontend.sweeper import point_id

register()


def _cuda_devices() -> int:
    """The GPUs this job's ranks have: this node's, times the nodes an external launcher spans."""
    import torch

    from harness.runtime.cluster import world_cuda_devices

    return world_cuda_devices(torch.cuda.device_count() if torch.cuda.is_available() else 0)


def resume_skips(out: Path, cfg: DictConfig, point: str | None = None) -> str | None:
    """run.resume=true for one run directory: why its job need not run again (its record is kept:
    ok and complete, diverged or skipped unless rerun= names it, and made from the same config,
    code and input files: job.resume_why_not), or None to run it, saying why where there was a
    record. A sweep's points are decided by its sweeper, before any is launched."""
    from harness.job import rerun_statuses, resume_why_not
    from harness.planning.plan import make_plan

    try:
        stored = read(out / RESULT)
    except RecordError:
        return None  # missing, corrupt or partial: run it again
    try:
        c = to_config(cfg)
        plan = make_plan(c, _cuda_devices())
        rerun = rerun_statuses(c.run.rerun)
    except ConfigError:
        return None  # refused when it runs
    why = resume_why_not(stored, out, asdict(plan.config), provenance(plan.config, point), rerun)
    if why is None:
        return f"{stored.status} in an earlier run"
    print(f"harness: {out.name}: running it again: {why}", flush=True)
    return None


@hydra.main(version_base="1.3", config_path="pkg://harness.conf", config_name="config")
def main(cfg: DictConfig) -> dict:
    signals.ensure()  # SIGTERM ends a job like Ctrl-C (harness/frontend/signals.py)
    fault = parse_fault(cfg.run.fault) if isinstance(cfg.run.fault, str) else None  # a bad one is refused below
    maybe_interrupt(fault, "start")
    signals.check()  # a signal since the last job (even one an earlier raise lost) ends the sweep here
    from harness.job import run_job
    from harness.records.disk_full import DISK_FULL
    from harness.runtime.launch import external_rank, shared_pool

    hc = HydraConfig.get()
    out = Path(hc.runtime.output_dir)
    sweep = hc.mode == RunMode.MULTIRUN
    group = Path(hc.sweep.dir).name if sweep else "single"
    name = hc.job.override_dirname or "default"
    rank = (external_rank() or (0, 0))[0]  # torchrun's or a submitit task's rank; 0 when harness forks them
    if not sweep and cfg.run.repeats != 1:
        print(f"harness: error: run.repeats={cfg.run.repeats}: repeats are points of a sweep (allowed: 1 here; "
              f"python -m harness -m ... run.repeats={cfg.run.repeats} runs each point that many times)", file=sys.stderr)
        sys.exit(2)
    # the job's identity, whatever its number (harness/records/identity.py point_ids: its sweeper's, in a sweep;
    # None: its config's own point_hash)
    point = point_id(Path(hc.sweep.dir), int(hc.job.num)) if sweep else None
    # the run guard (harness.frontend.callbacks.RunGuard) or harness's sweeper decided resume before Hydra wrote anything
    decided = (str(OmegaConf.select(hc, "sweeper._target_", default="")).startswith("hydra_plugins.harness_sweeper")
               if sweep else "guard" in (hc.callbacks or {}))
    if cfg.run.resume and not decided and (why := resume_skips(out, cfg, point)):
        print(f"harness: {name}: {why}, skipped (run.resume=true)", flush=True)
        return {"status": "kept"}
    try:
        with DirLock(out):  # taken already by the guard or the sweeper: held once more
            result = run_job(to_config(cfg), out, group, name, _cuda_devices(), shared_pool() if sweep else None,
                             point=point, record_invalid=sweep)
    except Busy as e:
        if sweep:  # left to the other writer; the sweep goes on and its summary says so
            print(f"harness: {name}: not run: {e}", file=sys.stderr, flush=True)
            return {"status": "locked", "error": str(e)}
        print(f"harness: error: {e}", file=sys.stderr)
        sys.exit(2)
    except ConfigError as e:
        # every rank says it: the launcher may stop rank 0 before it prints once another rank exits
        print(f"harness: error: {e}" if rank == 0 else f"harness: error (rank {rank}): {e}", file=sys.stderr)
        if not sweep:
            sys.exit(2)
        return {"status": "failed", "error": str(e)}  # the sweep goes on and its exit status counts it
    except KeyboardInterrupt:
        print(f"harness: interrupted; {out / RESULT} says so, finished jobs keep their records", file=sys.stderr)
        sys.exit(130)
    maybe_interrupt(fault, "end")
    signals.check()  # the job's records are complete; the sweep goes no further
    outcome = {"status": result.status, "error": result.error,
               "disk_full": (result.error or "").startswith(DISK_FULL)}
    if rank != 0:
        return outcome
    for note in result.plan.notes if result.plan else []:
        print(f"harness: note: {note}", flush=True)
    outcome["headline"] = result.headline()  # sweep.log's line (harness/frontend/callbacks.py), not read back
    print(f"harness: {outcome['headline']}", flush=True)
    print(f"harness: records in {out}", flush=True)
    if result.status not in ("ok", "skipped") and not sweep:
        sys.exit(1)
    return outcome
