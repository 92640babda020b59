"""One sweep point, wrapped so that a failure is recorded and never kills the sweep:
config -> plan -> execute -> metrics -> record."""

from __future__ import annotations

import time
from dataclasses import asdict
from pathlib import Path

import torch

from harness.config import Config, ConfigError
from harness.metrics import compute_metrics, grad_check
from harness.plan import Plan, make_plan
from harness.reference import reference_losses
from harness.record import GANTT, RESULT, TRACE, environment, log_wandb, plot_gantt, write_json_atomic, write_trace_json
from harness.runtime.launch import RankReport, WorkerError, run_native
from harness.trace import Event, Trace


def to_trace(reports: list[RankReport]) -> tuple[Trace, list[tuple[int, int, float, int]]]:
    """Raw ns timestamps of every rank onto one timeline starting at 0 (one host, one clock):
    the trace, and the memory samples as (rank, step, s, live activation bytes)."""
    origin = min(e[6] for r in reports for e in r.events)
    trace = [Event(r.rank, *e[:6], (e[6] - origin) / 1e9, (e[7] - origin) / 1e9) for r in reports for e in r.events]
    memory = [(r.rank, step, (t - origin) / 1e9, b) for r in reports for step, t, b in r.memory]
    return trace, memory


def headline(result: dict) -> str:
    c, m = result["config"], result.get("metrics")
    what = f"{c['schedule']['name']} pp={c['pp']} M={c['microbatches']} B={c['microbatch_size']} ({c['compute']})"
    if result["status"] != "ok":
        return f"{what}: {result['status']}: {result['error']}"
    b = m["bubble"]
    return (f"{what}: bubble measured {b['measured']:.3f} (theory {b['theory']:.3f}, simulated "
            f"{b['simulated']:.3f}), step {m['step_time_s'] * 1e3:.1f} ms, "
            f"{m['throughput_samples_s']:.0f} samples/s")


def execute(plan: Plan) -> tuple[Trace, list, list[float], list[RankReport]]:
    reports = run_native(plan)
    losses = next(r.losses for r in reports if r.losses is not None)
    return *to_trace(reports), losses, reports


def run_job(c: Config, out_dir: Path, group: str, name: str, cuda_devices: int = 0) -> dict:
    """Runs one job and writes its records; returns result.json's content. Raises
    ConfigError (after writing a failed record) when the config cannot run."""
    result: dict = {"status": "failed", "error": None, "config": asdict(c), "env": None, "metrics": None}
    started = time.time()
    try:
        plan = make_plan(c, cuda_devices)
    except ConfigError as e:
        result["error"] = str(e)
        write_json_atomic(out_dir / RESULT, result)
        raise
    result["env"] = environment(plan.device, plan.world)
    result["plan"] = plan.describe()
    try:
        trace, memory, losses, reports = execute(plan)
        result["metrics"] = compute_metrics(plan, trace, losses, reports)
        if c.verify_grads:
            grads = {k: torch.from_numpy(v) for r in reports for k, v in (r.grads or {}).items()}
            result["metrics"]["grad_check"] = grad_check(grads, reference_losses(c)[1])
        if plan.device == "cuda":
            result["metrics"]["memory"]["cuda_max_memory_allocated_per_stage"] = [
                r.cuda_max_memory_allocated for r in reports]
        result["status"] = "ok"
    except (WorkerError, KeyboardInterrupt) as e:
        result["status"] = "interrupted" if isinstance(e, KeyboardInterrupt) else "failed"
        result["error"] = str(e) or type(e).__name__
        result["wall_s"] = time.time() - started
        write_json_atomic(out_dir / RESULT, result)
        if isinstance(e, KeyboardInterrupt):
            raise
        return result
    result["wall_s"] = time.time() - started
    write_json_atomic(out_dir / RESULT, result)  # the source of truth, first
    write_trace_json(out_dir / TRACE, trace, memory)
    last = max(e.step for e in trace)
    b = result["metrics"]["bubble"]
    plot_gantt(out_dir / GANTT, trace, last,
               f"{c.schedule.name}  pp={c.pp}  M={c.microbatches}  B={c.microbatch_size}  "
               f"compute={c.compute}  {plan.device}/{plan.backend}  step {last}\n"
               f"bubble measured {b['measured']:.3f}   theory {b['theory']:.3f}   simulated {b['simulated']:.3f}")
    w = c.wandb
    result["wandb_dir"] = log_wandb(result, out_dir, group, name, w.mode, w.project, w.entity)
    write_json_atomic(out_dir / RESULT, result)
    return result
