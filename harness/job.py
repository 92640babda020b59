"""One sweep point, wrapped so that a failure is recorded and never kills the sweep:
plan -> run (a Result) -> records. Everything after planning reads the planned config."""

from __future__ import annotations

import os
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

import torch

from harness.config import Config, ConfigError
from harness.gantt import plot_gantt
from harness.gc_pause import paused
from harness.metrics import compute_metrics, grad_check, over_budget, verdict
from harness.plan import Plan, make_plan
from harness.precision import Precision
from harness.record import (GANTT, RESULT, RUNNING, TRACE, environment, wall_clock_origin, write_json_atomic,
                            write_trace_json)
from harness.reference import reference_losses
from harness.result import Metrics, RecordError, Result, read
from harness.wandb_log import log_wandb
from harness.runtime.faults import maybe_interrupt, parse_fault
from harness.execution import Execution, from_reports
from harness.runtime.launch import (RankPool, WorkerError, external_rank, run_external,
                                   run_processes)
from harness.runtime.registry import entry_point, get_executor


def execute(plan: Plan, pids: list[int], out_dir: Path | None = None, later: ExitStack | None = None,
            pool: RankPool | None = None) -> Execution | None:
    """The plan through its executor (a lookup in the registry); None on a rank other than 0
    of an external launcher (torchrun, SLURM/submitit: rank 0 records the job). While workers
    run, <out_dir>/running.json names this process and them (what to look for if a job seems
    stuck; tests wait on it). A sweep's `pool` runs them if it serves the plan; other workers
    that all reported are joined when `later` closes."""
    executor = get_executor(plan.config.executor)
    if executor.run is not None:
        return entry_point(executor.run)(plan, pids)
    if external_rank() is not None:
        reports = run_external(plan, executor.runner)
        return None if reports is None else from_reports(reports)

    def started(workers: list[int]) -> None:
        if out_dir is not None:
            write_json_atomic(out_dir / RUNNING, {"pid": os.getpid(), "worker_pids": workers})

    return from_reports(run_processes(plan, executor.runner, pids, started, later, pool))


def measure(plan: Plan, run: Execution, device_name: str | None = None) -> Metrics:
    metrics = compute_metrics(plan, run, device_name)
    if plan.config.verify_grads:  # replica 0's: after the all-reduce every replica holds the same
        scale = Precision(plan.config.dtype).loss_scale  # fp16's: the reference's are unscaled
        grads = {k: torch.from_numpy(v) / scale for r in run.reports[:plan.config.pp] for k, v in (r.grads or {}).items()}
        metrics.grad_check = grad_check(grads, reference_losses(plan.config, plan.model)[1])
    return metrics


def gantt_title(plan: Plan, metrics: Metrics, step: int) -> str:
    """What ran (the planned config: global_batch has set B), and its bubbles."""
    c, b = plan.config, metrics.bubble
    where = f"  {plan.device}/{plan.backend} p2p={plan.p2p}" if get_executor(c.executor).transport else ""
    theory = "n/a" if b.theory is None else f"{b.theory:.3f}"
    return (f"{c.schedule.name}  pp={c.pp}  dp={c.dp}  M={c.microbatches}  B={c.microbatch_size}  "
            f"compute={c.compute}  executor={c.executor}{where}  partition={c.partition.name}  step {step}\n"
            f"bubble measured {b.measured:.3f}   theory {theory}   simulated {b.simulated:.3f}"
            + ("" if b.steady_measured is None else f"   with steps overlapped {b.steady_measured:.3f}"))


def write_records(out_dir: Path, result: Result, plan: Plan, run: Execution, group: str, name: str) -> None:
    """trace.json and the Gantt of the last step first, then result.json (ok only once the
    others are complete: a job interrupted here is rerun by resume), then the wandb run. Every
    file is written atomically and fsynced."""
    c = plan.config
    result.trace_json = write_trace_json(out_dir / TRACE, run.trace, run.memory, c.pp,
                                         origin_wall_s=wall_clock_origin(run))
    last = max(e.step for e in run.trace)
    plot_gantt(out_dir / GANTT, run.trace, last, {r: result.plan.layers_label(r, c.pp, c.dp) for r in range(run.ranks)},
               gantt_title(plan, result.metrics, last))
    maybe_interrupt(parse_fault(c.fault), "records")
    write_json_atomic(out_dir / RESULT, result.to_json())
    result.wandb_dir = log_wandb(result.to_json(), out_dir, group, name, c.wandb.mode, c.wandb.project,
                                 c.wandb.entity)
    write_json_atomic(out_dir / RESULT, result.to_json())


def run_job(c: Config, out_dir: Path, group: str, name: str, cuda_devices: int = 0,
            pool: RankPool | None = None) -> Result:
    """Runs one job and writes its records; returns its Result. Any failure is recorded and
    returned, never raised, except ConfigError (the config cannot run; raised after its
    failed record is written) and KeyboardInterrupt (recorded `interrupted`). A sweep's rank
    `pool` (harness/runtime/launch.py) runs it if it serves the plan."""
    pids: list[int] = []  # the workers', recorded so a test (or a suspicious user) can check they are gone
    result = Result("failed", None, asdict(c), worker_pids=pids)
    (out_dir / RESULT).unlink(missing_ok=True)  # a rerun's earlier record no longer describes this directory
    started = time.time()
    rank0 = (external_rank() or (0, 0))[0] == 0

    def fail(status: str, error: str) -> Result:
        result.status, result.error, result.wall_s = status, error, time.time() - started
        write_json_atomic(out_dir / RESULT, result.to_json())
        if status == "failed":  # a dashboard that hides failures misleads; not on Ctrl-C
            result.wandb_dir = log_wandb(result.to_json(), out_dir, group, name, c.wandb.mode, c.wandb.project,
                                         c.wandb.entity)
            write_json_atomic(out_dir / RESULT, result.to_json())
        return result

    try:
        with paused():  # the plan's, the trace's and the records' many objects live until the job ends
            plan = make_plan(c, cuda_devices)
            result.config = asdict(plan.config)  # as planned: global_batch sets microbatch_size, timeout_s scaled
            result.env, result.plan, result.partition = environment(plan), plan.record(), plan.partition.describe()
            if why := over_budget(plan):  # theory says it cannot fit: not run, and said so
                result.status, result.error, result.wall_s = "skipped", why, time.time() - started
                write_json_atomic(out_dir / RESULT, result.to_json())
                return result
            with ExitStack() as later:  # the workers' exit overlaps the measuring
                run = execute(plan, pids, out_dir, later, pool)
                if run is None:
                    return result  # a torchrun/submitit rank other than 0: rank 0 records the job
                result.metrics = measure(plan, run, result.env.device_name)
                result.status, result.error = verdict(plan.config, result.metrics)
                result.wall_s = time.time() - started
                write_records(out_dir, result, plan, run, group, name)
    except ConfigError as e:
        result.error_detail = e.detail
        if rank0:
            fail("failed", str(e))
        raise
    except KeyboardInterrupt:
        if not _recorded_ok(out_dir):  # interrupted after result.json said ok: the record stands
            fail("interrupted", "interrupted (Ctrl-C or SIGTERM)")
        raise
    except WorkerError as e:
        return fail("failed", str(e))
    except Exception as e:  # noqa: BLE001 - a bug in one job must not end the sweep
        if c.debug or not rank0:
            raise  # torchrun's agent ends the other ranks; rank 0 records what it saw
        return fail("failed", f"{type(e).__name__}: {e}".replace("\n", " "))
    finally:
        (out_dir / RUNNING).unlink(missing_ok=True)
    return result


def _recorded_ok(out_dir: Path) -> bool:
    try:
        return read(out_dir / RESULT).status == "ok"
    except RecordError:
        return False
