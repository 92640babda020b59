"""The tables of a report: runs.csv (one row per result.json, corrupt ones included, and one
per job directory without a record) and the summary table of every run."""

from __future__ import annotations

import csv
import re
from pathlib import Path

from harness.measure.intervals import tag
from harness.report.doc import Block, Table, Text
from harness.records.atomic import write_atomic
from harness.records.record import RESULT
from harness.report.load import Sweep, status_of
from harness.report.runs import Run, by_device, dim, run_id, schedule_label

COLUMNS = ["run", "status", "schedule", "virtual_stages", "pp", "dp", "tp", "sequence_parallel", "microbatches",
           "microbatch_size", "model",
           "partition", "layers_per_stage", "compute", "executor", "device", "checkpointing", "step_time_s",
           "step_time_lo_s", "step_time_hi_s", "throughput_samples_s", "tflops_per_device", "mfu", "hfu", "bubble_theory", "bubble_simulated",
           "bubble_measured", "bubble_lo", "bubble_hi", "bubble_overlapped", "peak_activation_bytes_max", "stage_time_max_s", "measured_imbalance", "recompute_s", "final_loss", "error"]


def row(run: Run) -> dict:
    c, m = run.cfg, run.result.metrics
    b, f, ci = (m.bubble, m.flops, m.intervals) if m is not None else (None, None, None)
    stages, peaks = (m.stage_time_s, m.memory.peak_activation_bytes_per_rank) if m is not None else (None, None)
    step_ci, bubble_ci = (ci.step_time_s, ci.bubble) if ci is not None else ([None, None], [None, None])
    f = f if by_device(run) else None  # emulated or simulated: the time was set or modeled, no device's rate
    return {
        "run": run.dir, "status": run.status, "schedule": schedule_label(c),
        "virtual_stages": c.virtual_stages, "pp": c.pp, "dp": c.dp, "tp": c.tp,
        "sequence_parallel": c.sequence_parallel,
        "microbatches": c.microbatches, "microbatch_size": c.microbatch_size, "model": dim(run, "model"),
        "partition": dim(run, "partition"), "layers_per_stage": run.partition.get("layers_per_stage"),
        "compute": c.compute, "executor": c.executor, "device": dim(run, "device"), "checkpointing": c.checkpointing,
        "step_time_s": m and m.step_time_s, "step_time_lo_s": step_ci[0], "step_time_hi_s": step_ci[1],
        "throughput_samples_s": m and m.throughput_samples_s,
        "tflops_per_device": f and f.tflops_per_device, "mfu": f and f.mfu, "hfu": f and f.hfu,
        "bubble_theory": b and b.theory, "bubble_simulated": b and b.simulated, "bubble_measured": b and b.measured,
        "bubble_lo": bubble_ci[0], "bubble_hi": bubble_ci[1], "bubble_overlapped": b and b.steady_measured,
        "peak_activation_bytes_max": max(peaks) if peaks else None, "stage_time_max_s": max(stages) if stages else None,
        "measured_imbalance": m and m.measured_imbalance, "recompute_s": m and m.recompute_s,
        "final_loss": (m.losses or [None])[-1] if m is not None else None, "error": run.error,
    }


def _order(run: Run) -> tuple:
    """The sweep's own order: Hydra job number, then directories without one."""
    i = run_id(run)
    return (0, int(i), "") if i.isdigit() else (1, 0, i)


def write_csv(sweep: Sweep, path: Path) -> None:
    """Every record, one row each; one that could not be reported as status `corrupt`, a job
    directory without one as `missing`, with the reason in `error`."""
    rows = [row(r) for r in sorted(sweep.runs, key=_order)]
    rows += [{"run": str(Path(f).parent) if Path(f).name == RESULT else f, "status": status_of(why), "error": why}
             for f, why in sweep.corrupt]
    def write(f) -> None:
        w = csv.DictWriter(f, fieldnames=COLUMNS, restval="")
        w.writeheader()
        w.writerows(rows)

    write_atomic(path, write)  # never through a link planted at runs.csv (harness/records/atomic.py)


# The summary in two tables of one row per run (what ran; what was measured), each narrow enough
# for a 1,280 px page (harness/report/html.py wraps the cells): one table of both overflowed it
WHAT_RAN = ["#", "status", "schedule", "pp", "tp", "dp", "M", "B", "partition", "compute", "ckpt", "other overrides"]
MEASURED = ["#", "step ms", "interval", "samples/s", "TFLOP/s/dev", "MFU", "bubble theory", "simulated", "measured",
            "overlapped", "peak act. MiB"]


def overrides(run: Run) -> list[str]:
    """A sweep directory's `key=value` overrides (`12_a=1,b=[1,2]` -> [a=1, b=[1,2]]; a part of a
    sweep under its own prefix too: `ckpt0_checkpointing=true` -> [checkpointing=true])."""
    numbered = re.fullmatch(r"[A-Za-z]*\d+", run_id(run)) is not None
    name = run.dir.split("_", 1)[1] if numbered and "_" in run.dir else ""
    return [o for o in re.split(r",(?=[\w.+~/-]+=)", name) if o]


def summary(runs: list[Run]) -> list[Block]:
    """The tables of every run, its overrides shortened to those not shared by every run. TFLOP/s
    and MFU only where a device made the times (runs.by_device): `n/a` elsewhere."""
    shared = set.intersection(*(set(overrides(r)) for r in runs)) if runs else set()
    ran, measured = [], []
    for run in sorted(runs, key=_order):
        r = row(run)
        tp = f"{r['tp']} sp" if r["sequence_parallel"] else r["tp"]
        ran.append([run_id(run), r["status"], schedule_label(run.cfg), r["pp"], tp, r["dp"], r["microbatches"],
                    r["microbatch_size"], r["partition"], r["compute"], "on" if r["checkpointing"] else "off",
                    ", ".join(o for o in overrides(run) if o not in shared)])
        measured.append([run_id(run), _scaled(r["step_time_s"], 1e3), _interval(run, r),
                         r["throughput_samples_s"], "n/a" if r["tflops_per_device"] is None else r["tflops_per_device"],
                         "n/a" if r["mfu"] is None else f"{r['mfu']:.1%}", r["bubble_theory"], r["bubble_simulated"],
                         r["bubble_measured"], r["bubble_overlapped"], _scaled(r["peak_activation_bytes_max"], 2**-20)])
    text = f"Overrides every run shares: `{', '.join(o for o in overrides(runs[0]) if o in shared)}`." if shared else ""
    return ([Text(text)] if text else []) + [
        Table(WHAT_RAN, ran), Text("What each run measured (TFLOP/s and MFU: n/a where compute was emulated or "
                                   "simulated, whose times were set or modeled, not a device's; MFU also where the "
                                   "device's peak is unknown):"), Table(MEASURED, measured)]


def _interval(run: Run, r: dict) -> str:
    """The step time's interval with its coverage and n ('98.2-101.3 (93.8%, n=5)'): the
    section "Told apart, or not" says the method."""
    ci = run.result.metrics.intervals if run.result.metrics is not None else None
    span = _span(r["step_time_lo_s"], r["step_time_hi_s"], 1e3)
    return f"{span} ({tag(ci.method, ci.level, ci.steps)})" if span and ci is not None else span


def _span(lo: float | None, hi: float | None, k: float) -> str:
    return "" if lo is None or hi is None else f"{lo * k:.4g}-{hi * k:.4g}"


def _scaled(v: float | None, k: float) -> float | None:
    return None if v is None else v * k
