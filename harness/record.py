"""Record a job: result.json (atomic), trace.json (Perfetto), gantt.png, wandb run."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from harness.result import Env, PlanRecord
from harness.trace import COMPUTE, Event, Trace, events_of_step

if TYPE_CHECKING:
    from harness.plan import Plan

RESULT, TRACE, GANTT = "result.json", "trace.json", "gantt.png"


def write_json_atomic(path: Path, data: object) -> None:
    """Temporary file in the same directory, then rename: a reader never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1, default=str)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def environment(plan: "Plan") -> Env:
    import torch

    device, world = plan.device, plan.world
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    name = torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine())
    return Env(torch=torch.__version__, python=platform.python_version(), device=device, device_name=name,
               world_size=world, git_commit=commit, hostname=socket.gethostname(), cpu_count=os.cpu_count())


def write_trace_json(path: Path, trace: Trace, memory: list[tuple[int, int, float, int]] = (), pp: int = 0) -> None:
    """Chrome trace-event JSON: one process per dp replica, one track per rank in it, one
    complete event per action, and a counter track per rank of activation bytes held
    (memory: (rank, step, s, bytes)). Global rank = replica * pp + pipeline rank."""
    ranks = sorted({e.rank for e in trace})
    pp = pp or len(ranks)
    events: list[dict] = []
    for d in sorted({r // pp for r in ranks}):
        events.append({"ph": "M", "name": "process_name", "pid": d, "args": {"name": f"pipeline (dp replica {d})"}})
    for r in ranks:
        events.append({"ph": "M", "name": "thread_name", "pid": r // pp, "tid": r,
                       "args": {"name": f"rank {r} (pipeline rank {r % pp})"}})
    for e in trace:
        events.append({"ph": "X", "name": e.name, "cat": e.cat, "pid": e.rank // pp, "tid": e.rank,
                       "ts": e.start * 1e6, "dur": e.dur * 1e6,  # microseconds
                       "args": {"step": e.step, "kind": e.kind, "stage": e.stage, "microbatch": e.microbatch}})
    for rank, _step, t, nbytes in memory:
        events.append({"ph": "C", "name": f"activations rank {rank}", "pid": rank // pp, "tid": rank, "ts": t * 1e6,
                       "args": {"MiB": nbytes / 2**20}})
    write_json_atomic(path, {"traceEvents": events, "displayTimeUnit": "ms"})


def read_trace(path: Path) -> Trace:
    """trace.json (write_trace_json) back into events."""
    return [Event(e["tid"], e["args"]["step"], e["name"], e["cat"], e["args"]["kind"], e["args"]["stage"],
                  e["args"]["microbatch"], e["ts"] / 1e6, (e["ts"] + e["dur"]) / 1e6)
            for e in json.loads(path.read_text())["traceEvents"] if e["ph"] == "X"]


COLORS = {"F": "#4c72b0", "B": "#55a868", "I": "#64b5cd", "W": "#8172b2", "R": "#dd8452", "optim": "#555555",
          "recv": "#dddddd", "dp_sync": "#c44e52"}


def plot_gantt(path: Path, trace: Trace, step: int, stage_labels: dict[int, str], title: str) -> None:
    """The measured timeline of one step, one row per rank (labelled with the layers it
    holds: the stage boundaries); F and B told apart."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    ev = events_of_step(trace, step)
    ranks = sorted({e.rank for e in ev})
    t0 = min(e.start for e in ev)
    width = max(6.0, min(16.0, 0.25 * sum(1 for e in ev if e.rank == ranks[0])))
    fig, ax = plt.subplots(figsize=(width, 0.6 * len(ranks) + 1.4))
    for e in ev:
        if e.kind not in COLORS:
            continue
        y = e.rank
        ax.barh(y, (e.end - e.start) * 1e3, left=(e.start - t0) * 1e3, height=0.8 if e.cat == COMPUTE else 0.3,
                color=COLORS[e.kind], edgecolor="white" if e.cat == COMPUTE else "none", linewidth=0.5)
        if e.cat == COMPUTE and e.microbatch >= 0 and (e.end - e.start) * 1e3 > 0:
            ax.text((e.start - t0 + e.dur / 2) * 1e3, y, str(e.microbatch), ha="center", va="center",
                    fontsize=6, color="white")
    ax.set_yticks(ranks, [f"rank {r}\n{stage_labels.get(r, '')}" for r in ranks], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("ms since step start", labelpad=2)
    ax.set_title(title, fontsize=9, loc="left")
    labels = {"F": "forward", "B": "backward", "I": "backward (input)", "W": "backward (weight)",
              "R": "recompute", "recv": "waiting in recv", "dp_sync": "gradient all-reduce", "optim": "optimizer"}
    present = {e.kind for e in ev}
    fig.legend(handles=[Patch(color=COLORS[k], label=label) for k, label in labels.items() if k in present],
               loc="lower center", ncol=7, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_wandb(result: dict, out_dir: Path, group: str, name: str, mode: str, project: str,
              entity: str | None) -> str | None:
    """One wandb run per job, wandb imported only when enabled; returns the run's directory
    (offline, the default: <job dir>/wandb/offline-run-*/, what `wandb sync` takes).

    group = sweep name, job_type = schedule, name = the job's override string, config = the
    resolved config. Summary: `status`, `error`, `wall_s`, and every leaf of result.json's
    `metrics` under its path joined by "/" (`bubble/measured`, `memory/peak_activation_bytes_per_rank`),
    lists kept whole as in result.json, plus `<key>/max` for each list of numbers (a scalar a
    chart can plot: the fullest or slowest rank, the worst step). History: `loss` per step,
    warm-up included. Media: `gantt` (image), `stages` (table, one row per rank), and
    trace.json as an artifact of type `trace`."""
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    def flat(d: dict, prefix: str = "") -> dict:
        out: dict = {}
        for k, v in d.items():
            if isinstance(v, dict):
                out |= flat(v, f"{prefix}{k}/")
                continue
            out[prefix + k] = v
            if k != "losses" and isinstance(v, list) and v and all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                out[f"{prefix}{k}/max"] = max(v)
        return out

    cfg, m = result["config"], result.get("metrics")
    # console off and no system stats: the job has finished when this runs, so wandb would
    # sample nothing but itself
    settings = wandb.Settings(console="off", x_disable_stats=True, save_code=False)
    run = wandb.init(project=project, entity=entity, mode=mode, dir=str(out_dir), group=group, name=name,
                     job_type=cfg["schedule"]["name"], config=cfg, settings=settings, reinit="finish_previous")
    try:
        run.summary.update({"status": result["status"], "error": result.get("error"),
                            "wall_s": result.get("wall_s"), **flat(m or {})})
        if not m:
            return str(Path(run.dir).parent)
        for i, loss in enumerate(m.get("losses") or []):
            run.log({"loss": loss}, step=i)
        media: dict = {}
        if (out_dir / GANTT).exists():
            media["gantt"] = wandb.Image(str(out_dir / GANTT))
        if result.get("plan"):
            plan = PlanRecord(**result["plan"])
            ops, peaks = m.get("mean_op_s") or {}, m["memory"]["peak_activation_bytes_per_rank"]

            def op_s(kinds: str, stages: list[int]) -> float | None:
                """Mean seconds per microbatch of these kinds over a rank's stages (chunks)."""
                present = [k for k in kinds if k in ops]
                return sum(ops[k][s] for k in present for s in stages) if present else None

            rows = []
            for rank, bubble in enumerate(m["bubble"]["measured_per_rank"]):
                stages = plan.stages_of(rank)
                # backward: B, or input + weight gradient (I + W) for the split, zero-bubble schedules
                rows.append([rank, plan.layers_label(rank, len(m["bubble"]["measured_per_rank"])), bubble,
                             peaks[rank] if peaks else None, op_s("F", stages), op_s("BIW", stages)])
            media["stages"] = wandb.Table(columns=["rank", "layers", "bubble_measured", "peak_activation_bytes",
                                                   "mean_fwd_s", "mean_bwd_s"], data=rows)
        if media:
            run.log(media)
        if (out_dir / TRACE).exists():
            art = wandb.Artifact(f"trace-{run.id}", type="trace", description="Perfetto trace of the job")
            art.add_file(str(out_dir / TRACE))
            run.log_artifact(art)
        return str(Path(run.dir).parent)
    finally:
        run.finish()
