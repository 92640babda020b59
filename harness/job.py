"""One sweep point, wrapped so that a failure is recorded and never kills the sweep:
config -> plan -> execute -> metrics -> record."""

from __future__ import annotations

import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from harness.config import Config, ConfigError
from harness.metrics import compute_metrics, grad_check, ring_allreduce_s
from harness.plan import Plan, make_plan
from harness.reference import reference_losses
from harness.record import GANTT, RESULT, TRACE, environment, log_wandb, plot_gantt, write_json_atomic, write_trace_json
from harness.runtime.launch import RankReport, WorkerError, run_native, run_torchrun, torchrun_rank
from harness.runtime.worker import run_rank
from harness.simulate.engine import simulate
from harness.trace import COMM, Event, Trace


def to_trace(reports: list[RankReport]) -> tuple[Trace, list[tuple[int, int, float, int]]]:
    """Raw ns timestamps of every rank onto one timeline starting at 0 (one host, one clock):
    the trace, and the memory samples as (rank, step, s, live activation bytes)."""
    origin = min(e[6] for r in reports for e in r.events)
    trace = [Event(r.rank, *e[:6], (e[6] - origin) / 1e9, (e[7] - origin) / 1e9) for r in reports for e in r.events]
    memory = [(r.rank, step, (t - origin) / 1e9, b) for r in reports for step, t, b in r.memory]
    return trace, memory


def headline(result: dict) -> str:
    c, m = result["config"], result.get("metrics")
    mode = c["compute"] if c["executor"] == "native" else f"{c['compute']}, executor={c['executor']}"
    what = f"{c['schedule']['name']} pp={c['pp']} M={c['microbatches']} B={c['microbatch_size']} ({mode})"
    if result["status"] != "ok":
        return f"{what}: {result['status']}: {result['error']}"
    b = m["bubble"]
    theory = "n/a" if b["theory"] is None else f"{b['theory']:.3f}"
    return (f"{what}: bubble measured {b['measured']:.3f} (theory {theory}, simulated "
            f"{b['simulated']:.3f}), step {m['step_time_s'] * 1e3:.1f} ms, "
            f"{m['throughput_samples_s']:.0f} samples/s"
            + (f", {m['throughput_tokens_s']:.0f} tokens/s" if m.get("throughput_tokens_s") else ""))


def simulate_steps(plan: Plan) -> Trace:
    """executor=sim: every step simulated on the modeled costs (cost.*, comm.*), back to back.
    With dp > 1 each stage's last backward is followed by its ring all-reduce (dp_sync), as
    the native executor traces it; replicas are identical, so one pipeline stands for all."""
    one = simulate(plan.schedule, plan.sim_cost())
    if plan.config.dp > 1:
        sync = ring_allreduce_s(plan)
        last = {}  # (rank, stage) -> its last backward event
        for e in one:
            if e.kind in "BI":
                last[(e.rank, e.stage)] = e
        for (rank, stage), e in last.items():  # sync after the stage's last backward (no overlap)
            one.append(Event(rank, 0, f"dp_sync {stage}", COMM, "dp_sync", stage, -1, e.end, e.end + sync))
    span = max(e.end for e in one)
    return [replace(e, step=s, start=e.start + s * span, end=e.end + s * span)
            for s in range(plan.config.warmup_steps + plan.config.steps) for e in one]


def execute(plan: Plan, pids: list[int]) -> tuple[Trace, list, list[float] | None, list[RankReport]]:
    if plan.config.executor == "sim":
        return simulate_steps(plan), [], None, []
    if plan.config.executor == "pytorch":  # imported only when asked for: it reaches into torch internals
        from harness.runtime.peer import peer_worker_main, run_peer_rank
    if torchrun_rank() is not None:
        reports = run_torchrun(plan, run_peer_rank if plan.config.executor == "pytorch" else run_rank)
        if reports is None:  # not rank 0: rank 0 records
            return [], [], None, []
    elif plan.config.executor == "pytorch":
        reports = run_native(plan, peer_worker_main, pids)
    else:
        reports = run_native(plan, pids=pids)
    return *to_trace(reports), replica_mean_losses(reports), reports


def replica_mean_losses(reports: list[RankReport]) -> list[float]:
    """Each replica's last stage reports its shard's loss; the global batch's is their mean."""
    per_replica = [r.losses for r in reports if r.losses is not None]
    return [sum(step) / len(per_replica) for step in zip(*per_replica)]


def run_job(c: Config, out_dir: Path, group: str, name: str, cuda_devices: int = 0) -> dict:
    """Runs one job and writes its records; returns result.json's content. Any failure is
    recorded and returned, never raised, except ConfigError (the config cannot run; raised
    after its failed record is written) and KeyboardInterrupt (recorded `interrupted`)."""
    pids: list[int] = []  # the workers', recorded so a test (or a suspicious user) can check they are gone
    result: dict = {"status": "failed", "error": None, "config": asdict(c), "env": None, "metrics": None,
                    "worker_pids": pids}
    started = time.time()

    def fail(status: str, error: str) -> dict:
        result.update(status=status, error=error, wall_s=time.time() - started)
        write_json_atomic(out_dir / RESULT, result)
        if status == "failed":  # a dashboard that hides failures misleads; not on Ctrl-C
            try:
                result["wandb_dir"] = log_wandb(result, out_dir, group, name, c.wandb.mode, c.wandb.project,
                                                c.wandb.entity)
                write_json_atomic(out_dir / RESULT, result)
            except Exception:  # noqa: BLE001 - the record on disk is what counts
                pass
        return result

    try:
        plan = make_plan(c, cuda_devices)
        result["env"] = environment(plan.device, plan.world)
        result["plan"] = plan.describe()
        result["partition"] = plan.partition.describe()
        trace, memory, losses, reports = execute(plan, pids)
        if not trace:
            return result  # a torchrun rank other than 0: rank 0 records the job
        result["config"] = asdict(plan.config)  # microbatch_size set by global_batch
        result["metrics"] = compute_metrics(plan, trace, losses, reports)
        if c.verify_grads:  # replica 0's: after the all-reduce every replica holds the same
            grads = {k: torch.from_numpy(v) for r in reports[:c.pp] for k, v in (r.grads or {}).items()}
            result["metrics"]["grad_check"] = grad_check(grads, reference_losses(plan.config)[1])
        if plan.device == "cuda":
            result["metrics"]["memory"]["cuda_max_memory_allocated_per_stage"] = [
                r.cuda_max_memory_allocated for r in reports]
    except ConfigError as e:
        if e.detail:
            result["error_detail"] = e.detail
        if (torchrun_rank() or (0, 0))[0] == 0:
            fail("failed", str(e))
        raise
    except KeyboardInterrupt:
        fail("interrupted", "interrupted (Ctrl-C or SIGTERM)")
        raise
    except WorkerError as e:
        return fail("failed", str(e))
    except Exception as e:  # noqa: BLE001 - a bug in one job must not end the sweep
        if c.debug or (torchrun_rank() or (0, 0))[0] != 0:
            raise  # torchrun's agent ends the other ranks; rank 0 records what it saw
        return fail("failed", f"{type(e).__name__}: {e}".replace("\n", " "))
    result.update(status="ok", wall_s=time.time() - started)
    write_json_atomic(out_dir / RESULT, result)  # the source of truth, first
    write_trace_json(out_dir / TRACE, trace, memory, c.pp)
    last = max(e.step for e in trace)
    b = result["metrics"]["bubble"]
    stage_labels = {r: ("" if c.dp == 1 else f"replica {r // c.pp}\n") + ", ".join(
        f"layers {lo}-{hi - 1}" for s, (lo, hi) in enumerate(plan.stage_layers) if plan.stage_rank[s] == r % c.pp)
        for r in range(plan.world)}
    plot_gantt(out_dir / GANTT, trace, last, stage_labels,
               f"{c.schedule.name}  pp={c.pp}  M={c.microbatches}  B={c.microbatch_size}  "
               f"compute={c.compute}  "
               f"{plan.device + '/' + plan.backend if c.executor == 'native' else 'executor=' + c.executor}  "
               f"partition={c.partition.name}  step {last}\n"
               f"bubble measured {b['measured']:.3f}   theory {b['theory'] if b['theory'] is None else round(b['theory'], 3)}"
               f"   simulated {b['simulated']:.3f}")
    w = c.wandb
    result["wandb_dir"] = log_wandb(result, out_dir, group, name, w.mode, w.project, w.entity)
    write_json_atomic(out_dir / RESULT, result)
    return result
