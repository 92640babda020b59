"""Record a job: the names of a job's files and its environment. result.json is written through
harness/records/atomic.py, its provenance and identity are harness/records/identity.py,
trace.json (Perfetto; capped) harness/measure/trace_json.py, the Gantt chart (gantt.png)
harness/records/gantt.py, the wandb run harness/records/wandb_log.py."""

from __future__ import annotations

import functools
import os
import platform
import socket
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from harness.records.result import Env

if TYPE_CHECKING:
    from harness.planning.plan import Plan

RESULT, TRACE, GANTT, RUNNING = "result.json", "trace.json", "gantt.png", "running.json"


@functools.lru_cache(maxsize=1)
def _git_commit() -> str | None:
    """The harness's commit, asked once per process: the code that runs is what was imported
    (and a fork of this process per job costs ~10 ms)."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent, timeout=5).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def environment(plan: "Plan") -> Env:
    import torch

    device, world = plan.device, plan.world
    commit = _git_commit()
    if plan.simulated:  # nothing ran on a device: what was modeled
        cluster = plan.config.cluster
        name = f"simulated ({f'cluster={cluster.name}' if cluster is not None else 'comm.*'})"
    elif device == "cuda":
        name = torch.cuda.get_device_name(0)
    else:
        name = platform.processor() or platform.machine()
    return Env(torch=torch.__version__, python=platform.python_version(), device=device, device_name=name,
               world_size=world, git_commit=commit, hostname=socket.gethostname(), cpu_count=os.cpu_count(),
               cores=plan.cores, ranks_on_host=plan.ranks_on_host, oversubscribed=plan.oversubscribed)
