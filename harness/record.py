"""Record a job: result.json (atomic), trace.json (Perfetto), gantt.png, wandb run."""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
import tempfile
from pathlib import Path

from harness.trace import COMPUTE, Trace, events_of_step

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


def environment(device: str, world: int) -> dict:
    import torch

    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        commit = None
    name = torch.cuda.get_device_name(0) if device == "cuda" else (platform.processor() or platform.machine())
    return {"torch": torch.__version__, "python": platform.python_version(), "device": device,
            "device_name": name, "world_size": world, "git_commit": commit, "hostname": socket.gethostname(),
            "cpu_count": os.cpu_count()}


def write_trace_json(path: Path, trace: Trace, memory: list[tuple[int, int, float, int]] = ()) -> None:
    """Chrome trace-event JSON: one track per rank, one complete event per action, and a
    counter track per rank of activation bytes held (memory: (rank, step, s, bytes))."""
    events: list[dict] = [{"ph": "M", "name": "process_name", "pid": 0, "args": {"name": "pipeline (dp replica 0)"}}]
    for r in sorted({e.rank for e in trace}):
        events.append({"ph": "M", "name": "thread_name", "pid": 0, "tid": r, "args": {"name": f"rank {r}"}})
    for e in trace:
        events.append({"ph": "X", "name": e.name, "cat": e.cat, "pid": 0, "tid": e.rank,
                       "ts": e.start * 1e6, "dur": e.dur * 1e6,  # microseconds
                       "args": {"step": e.step, "kind": e.kind, "stage": e.stage, "microbatch": e.microbatch}})
    for rank, _step, t, nbytes in memory:
        events.append({"ph": "C", "name": f"activations rank {rank}", "pid": 0, "tid": rank, "ts": t * 1e6,
                       "args": {"MiB": nbytes / 2**20}})
    write_json_atomic(path, {"traceEvents": events, "displayTimeUnit": "ms"})


COLORS = {"F": "#4c72b0", "B": "#55a868", "I": "#64b5cd", "W": "#8172b2", "R": "#dd8452", "optim": "#555555",
          "recv": "#dddddd"}


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
              "R": "recompute", "recv": "waiting in recv", "optim": "optimizer"}
    present = {e.kind for e in ev}
    fig.legend(handles=[Patch(color=COLORS[k], label=label) for k, label in labels.items() if k in present],
               loc="lower center", ncol=7, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def log_wandb(result: dict, out_dir: Path, group: str, name: str, mode: str, project: str,
              entity: str | None) -> str | None:
    """One wandb run per job; imported only when enabled. Returns the run's directory."""
    if mode == "disabled":
        return None
    os.environ.setdefault("WANDB_SILENT", "true")
    import wandb

    cfg = result["config"]
    run = wandb.init(project=project, entity=entity, mode=mode, dir=str(out_dir), group=group, name=name,
                     job_type=cfg["schedule"]["name"], config=cfg, reinit="finish_previous")
    try:
        m = result["metrics"]
        summary = {"step_time_s": m["step_time_s"], "throughput_samples_s": m["throughput_samples_s"],
                   "bubble/theory": m["bubble"]["theory"], "bubble/simulated": m["bubble"]["simulated"],
                   "bubble/measured": m["bubble"]["measured"]}
        for i, loss in enumerate(m["losses"]):
            run.log({"loss": loss}, step=i)
        run.summary.update(summary)
        if (out_dir / GANTT).exists():
            run.log({"gantt": wandb.Image(str(out_dir / GANTT))})
        return run.dir
    finally:
        run.finish()
