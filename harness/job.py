"""One sweep point, wrapped so that a failure is recorded and never kills the sweep:
plan -> run (a Result) -> records. Everything after planning reads the planned config."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import asdict, replace
from pathlib import Path

import torch

from harness.config import Config, ConfigError
from harness.records.disk_full import DISK_FULL, disk_full, disk_full_error
from harness.records.gantt import plot_gantt
from harness.simulate.gc_pause import paused
from harness.measure import host_load
from harness.measure.metrics import compute_metrics, grad_check, over_budget, verdict
from harness.planning.plan import Plan, make_plan
from harness.runtime.precision import Precision
from harness.records.atomic import write_json_atomic
from harness.records.identity import identity_config, provenance
from harness.records.record import GANTT, RESULT, RUNNING, TRACE, environment
from harness.measure.columns import Columns
from harness.measure.trace_json import wall_clock_origin, write_trace_json
from harness.measure.reference import reference_losses
from harness.records.result import Metrics, RecordError, Result, measurement_of, read
from harness.records import running
from harness.records.wandb_log import log_wandb
from harness.runtime.faults import maybe_fail_write, maybe_interrupt, parse_fault
from harness.measure.execution import Execution, from_reports, tp_representatives
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
    tp = plan.config.tp
    if external_rank() is not None:
        reports = run_external(plan, executor.runner)
        return None if reports is None else from_reports(tp_representatives(reports, tp))

    def started(workers: list[int]) -> None:
        if out_dir is not None:
            # this process by pid and start time: a reader tells a run killed with SIGKILL (the file left
            # behind) from a live one (harness/records/running.py)
            write_json_atomic(out_dir / RUNNING, running.stamp(workers))

    return from_reports(tp_representatives(run_processes(plan, executor.runner, pids, started, later, pool), tp))


def measure(plan: Plan, run: Execution, device_name: str | None = None,
            columns: Columns | None = None) -> Metrics:
    metrics = compute_metrics(plan, run, device_name, columns)
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
    tensor = f"  tp={c.tp}" + (" sequence_parallel" if c.sequence_parallel else "") if c.tp > 1 else ""
    return (f"{c.schedule.name}  pp={c.pp}  dp={c.dp}{tensor}  M={c.microbatches}  B={c.microbatch_size}  "
            f"compute={c.compute}  executor={c.executor}{where}  partition={c.partition.name}  step {step}\n"
            f"bubble measured {b.measured:.3f}   theory {theory}   simulated {b.simulated:.3f}"
            + ("" if b.steady_measured is None else f"   with steps overlapped {b.steady_measured:.3f}"))


def write_records(out_dir: Path, result: Result, plan: Plan, run: Execution, group: str, name: str,
                  columns: Columns) -> None:
    """trace.json and the Gantt of the last step first, then result.json (ok only once the
    others are complete: a job interrupted here is rerun by resume), then the wandb run. Every
    file is written atomically and fsynced. `columns`: run.trace's."""
    c = plan.config
    result.trace_json = write_trace_json(out_dir / TRACE, columns, run.memory, c.pp,
                                         origin_wall_s=wall_clock_origin(run))
    last = max(columns.step)
    plot_gantt(out_dir / GANTT, run.trace, last, {r: result.plan.layers_label(r, c.pp, c.dp) for r in range(run.ranks)},
               gantt_title(plan, result.metrics, last))
    fault = parse_fault(c.run.fault)
    maybe_interrupt(fault, "records")
    maybe_fail_write(fault, "records", out_dir / RESULT)
    record = result.to_json()  # one conversion for the file and the wandb run (write_json_atomic copies it)
    write_json_atomic(out_dir / RESULT, record)
    result.wandb_dir = log_wandb(record, out_dir, group, name, c.wandb.mode, c.wandb.project, c.wandb.entity)
    if result.wandb_dir is not None:  # the record names its wandb run; without one it is the record just written
        write_json_atomic(out_dir / RESULT, result.to_json())


def run_job(c: Config, out_dir: Path, group: str, name: str, cuda_devices: int = 0,
            pool: RankPool | None = None, point: str | None = None, record_invalid: bool = False) -> Result:
    """Runs one job and writes its records; returns its Result. Any failure is recorded and
    returned, never raised, except ConfigError (the config cannot run: raised, nothing written
    and no earlier record replaced; with `record_invalid` (a sweep's job) a failed record where
    there is none) and KeyboardInterrupt (recorded `interrupted`). A full disk fails the job
    with what record space allows (error `disk full: ...`). `point`: the job's identity as its
    sweep named it (harness/records/identity.py point_ids; None: its config's point_hash), in its
    provenance: what resume and the report match records by. A sweep's rank `pool`
    (harness/runtime/launch.py) runs it if it serves the plan."""
    pids: list[int] = []  # the workers', recorded so a test (or a suspicious user) can check they are gone
    result = Result("failed", None, asdict(c), worker_pids=pids)
    started = time.time()
    rank0 = (external_rank() or (0, 0))[0] == 0

    def fail(status: str, error: str) -> Result:
        result.status, result.error, result.wall_s = status, error, time.time() - started
        _write_within_space(out_dir, result)
        if status == "failed" and not error.startswith(DISK_FULL):  # a dashboard that hides failures misleads
            result.wandb_dir = log_wandb(result.to_json(), out_dir, group, name, c.wandb.mode, c.wandb.project,
                                         c.wandb.entity)
            _write_within_space(out_dir, result)
        return result

    try:
        with paused():  # the plan's, the trace's and the records' many objects live until the job ends
            try:
                plan = make_plan(c, cuda_devices)
            except ConfigError as e:  # refused: nothing of an earlier run in out_dir is replaced
                result.error_detail = e.detail
                if record_invalid and rank0 and not (out_dir / RESULT).exists():
                    _record_refused(result, c, point, started, str(e))
                    _write_within_space(out_dir, result)
                raise
            for f in (RESULT, TRACE, GANTT):  # a rerun's earlier records no longer describe this directory
                (out_dir / f).unlink(missing_ok=True)
            _record_plan(result, plan, point, started)
            maybe_interrupt(parse_fault(c.run.fault), "plan")
            if why := over_budget(plan):  # theory says it cannot fit: not run, and said so
                result.status, result.error, result.wall_s = "skipped", why, time.time() - started
                _write_within_space(out_dir, result)
                return result
            with ExitStack() as later:  # the workers' exit overlaps the measuring
                before = None if plan.simulated else host_load.sample()  # what else used the host meanwhile
                run = execute(plan, pids, out_dir, later, pool)
                if run is None:
                    return result  # a torchrun/submitit rank other than 0: rank 0 records the job
                if result.env is not None:
                    result.env.host_load = host_load.host_load(before, None if before is None else host_load.sample())
                columns = Columns.of(run.trace)  # read once, by the metrics and by trace.json
                result.metrics = measure(plan, run, result.env.device_name, columns)
                result.status, result.error = verdict(plan.config, result.metrics)
                result.wall_s = time.time() - started
                write_records(out_dir, result, plan, run, group, name, columns)
    except ConfigError:
        raise
    except KeyboardInterrupt:
        if not _recorded_ok(out_dir):  # interrupted after result.json said ok: the record stands
            fail("interrupted", "interrupted (Ctrl-C or SIGTERM)")
        raise
    except Exception as e:  # noqa: BLE001 - a bug in one job must not end the sweep
        if (error := _job_error(e, c.run.debug, rank0)) is None:
            raise  # torchrun's agent ends the other ranks; rank 0 records what it saw
        return fail("failed", error)
    finally:
        try:
            (out_dir / RUNNING).unlink(missing_ok=True)
        except OSError:
            pass
    return result


def _write_within_space(out_dir: Path, data: Result) -> None:
    """result.json, or as much of it as the disk takes: a record without its measurements
    where the whole one does not fit (the error says so), none where nothing does."""
    try:
        write_json_atomic(out_dir / RESULT, data.to_json())
    except OSError as e:
        if not disk_full(e):
            raise
        if not (data.error or "").startswith(DISK_FULL):
            data.status, data.error = "failed", disk_full_error(e)
        small = replace(data, env=None, plan=None, partition=None, metrics=None, trace_json=None)
        try:
            write_json_atomic(out_dir / RESULT, small.to_json())
        except OSError as again:
            if not disk_full(again):
                raise
            data.error = f"{data.error}; no record written: the disk is full"


def _record_refused(result: Result, c: Config, point: str | None, started: float, error: str) -> None:
    """A sweep job's config that cannot run, as its record says it: failed, why, and the
    sweep's name for the point (the report counts the record as that point's)."""
    result.status, result.error, result.wall_s = "failed", error, time.time() - started
    try:
        result.provenance = provenance(c, point, started)
    except Exception:  # noqa: BLE001 - a config that cannot plan may name files that are not there
        pass


def _record_plan(result: Result, plan: Plan, point: str | None, started: float) -> None:
    """What the plan says into the job's record, before anything runs."""
    result.config = asdict(plan.config)  # as planned: global_batch sets microbatch_size, timeout_s scaled
    result.measurement = measurement_of(plan.config.executor, plan.config.compute, plan.simulated)
    result.provenance = provenance(plan.config, point, started)
    result.env, result.plan, result.partition = environment(plan), plan.record(), plan.partition.describe()


def _job_error(e: Exception, debug: bool, rank0: bool) -> str | None:
    """A failed job's error, one line; None: raised instead (run.debug=true shows the traceback;
    a rank other than 0 leaves the record to rank 0). A worker's failure and a full disk are
    recorded whatever run.debug says."""
    if isinstance(e, WorkerError):
        return str(e)
    if disk_full(e) and rank0:  # the job fails; the sweep stops and says which (harness/frontend/sweeper.py)
        return disk_full_error(e)  # type: ignore[arg-type]
    if debug or not rank0:
        return None
    return f"{type(e).__name__}: {e}".replace("\n", " ")


def _recorded_ok(out_dir: Path) -> bool:
    try:
        return read(out_dir / RESULT).status == "ok"
    except RecordError:
        return False


# -- resume: whether a point's earlier record still stands, by content ---------------------------

KEPT = ("ok", "diverged", "skipped")  # statuses run.resume=true keeps (run.rerun= names those to run again); others rerun
RERUN = ("diverged", "skipped")  # what rerun= may name


def rerun_statuses(value: str | None) -> frozenset[str]:
    """run.rerun=diverged, skipped or diverged+skipped: the kept statuses run.resume=true
    runs again; ConfigError (one line) for anything else."""
    if value is None or value == "":
        return frozenset()
    names = str(value).split("+")
    if any(n not in RERUN for n in names):
        raise ConfigError(f"run.rerun={value}: unknown (allowed: {', '.join(RERUN)}, or both as diverged+skipped; "
                          "failed, interrupted and missing records are always rerun by run.resume=true)")
    return frozenset(names)


def config_diff(stored: dict, asked: dict, prefix: str = "") -> str:
    """`key: old -> new` for every setting that changes what runs: the points' resolved configs
    compared as identity_config has them (run control left out, one spelling per value)."""
    if prefix == "":
        stored, asked = identity_config(stored), identity_config(asked)
    out = []
    for key in sorted(set(stored) | set(asked)):
        old, new = stored.get(key), asked.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            if sub := config_diff(old, new, f"{prefix}{key}."):
                out.append(sub)
        elif old != new:
            out.append(f"{prefix}{key}: {old} -> {new}")
    return ", ".join(out)


def _short(h: str | None) -> str:
    return "none" if h is None else h[:12]


def content_changed(stored: Result, asked_config: dict, asked: dict) -> str | None:
    """Why a record no longer stands for what is asked now (`asked`: identity.provenance of the
    asked config), or None: its config, the code (commit, uncommitted changes, untracked files)
    or a file the run reads (by sha256, a custom model's imported modules included)."""
    if diff := config_diff(stored.config, asked_config):
        return f"the config changed ({diff})"
    code, prov = asked.get("code") or {}, stored.provenance
    if prov is None:  # a record from before provenance: its commit, and no file it read can be compared
        commit, now = stored.env.git_commit if stored.env else None, code.get("commit")
        if commit and now and not now.startswith(commit):
            return f"the code changed (commit {commit} -> {now[:12]})"
        if asked.get("files"):
            return f"its record has no content hashes of {', '.join(sorted(asked['files']))}"
        return None
    was = prov.get("code") or {}
    if was.get("commit") and code.get("commit") and was["commit"] != code["commit"]:
        return f"the code changed (commit {_short(was['commit'])} -> {_short(code['commit'])})"
    if was.get("commit") and code.get("commit") and was.get("diff_sha256") != code.get("diff_sha256"):
        return (f"the code's uncommitted changes differ (diff sha256 {_short(was.get('diff_sha256'))} -> "
                f"{_short(code.get('diff_sha256'))})")
    if was.get("commit") and code.get("commit") and was.get("untracked_sha256") != code.get("untracked_sha256"):
        return (f"the harness's untracked files differ (sha256 {_short(was.get('untracked_sha256'))} -> "
                f"{_short(code.get('untracked_sha256'))})")
    files, before = asked.get("files") or {}, prov.get("files") or {}
    for key in sorted(set(files) | set(before)):
        old, new = (before.get(key) or {}).get("sha256"), (files.get(key) or {}).get("sha256")
        if old is None or new is None or old != new:
            path = (files.get(key) or before.get(key) or {}).get("path")
            if key not in before:  # a custom model's new helper module, say
                return f"{key} is read now and was not before ({path})"
            if key not in files:
                return f"{key} is no longer read ({path})"
            return f"{key} changed ({path}: sha256 {_short(old)} -> {_short(new)})"
    return None


def resume_why_not(stored: Result | None, run_dir: Path, asked_config: dict, asked: dict,
                   rerun: frozenset[str] = frozenset()) -> str | None:
    """Why run.resume=true runs a point again, or None: its newest record (`stored`, in run_dir;
    None: there is none) is kept: ok and complete, diverged or skipped unless `rerun` names it,
    and made from the same content (`content_changed`)."""
    if stored is None:
        return "no record"
    if stored.status not in KEPT:
        return f"its record says {stored.status}"
    if stored.status in rerun:
        return f"its record says {stored.status} (run.rerun={'+'.join(sorted(rerun))})"
    if stored.status in ("ok", "diverged") and not all((run_dir / f).is_file() for f in (TRACE, GANTT)):
        return "its record lacks its trace.json or gantt.png"
    return content_changed(stored, asked_config, asked)
