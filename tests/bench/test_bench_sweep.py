"""Benchmark: what one more job costs a sweep. `python -m harness -m` (a fresh interpreter, as
a user runs it) over pp=4 with near-zero compute, 4 jobs and 12 jobs (`repeat=` labels:
the same job each time); the marginal wall time of a job is their difference over 8, so
the interpreter's start, the forkserver's and the planning of a sweep cancel out. Goal: under
0.25 s a job.

`make bench` times it (the pair of sweeps, 3 rounds); `make test-all` runs it once untimed
(`slow`: two sweeps in fresh interpreters, ~30 s); `make test` leaves it out.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.bench, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
FEW, MANY = 4, 12
# near-zero compute: a 32-wide mlp, one step, no warm-up; native forks 4 ranks per job
TINY = ["pp=4", "microbatches=4", "model.hidden=32", "steps=1", "warmup_steps=0", "compute=real", "wandb.mode=disabled"]


@pytest.mark.parametrize("executor", ["sim", "native"])
def test_sweep_marginal_job_wall_time(benchmark, tmp_path: Path, executor: str):
    """Timed: a 4-job sweep then a 12-job sweep. extra_info: each sweep's wall time and
    `marginal_job_s`, the median over rounds of (12-job - 4-job) / 8."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    walls: list[tuple[float, float]] = []

    def sweep(jobs: int) -> float:
        out = tmp_path / f"{len(walls)}-{jobs}"
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "harness", "-m", f"executor={executor}", *TINY,
                            f"repeat={','.join(str(i) for i in range(jobs))}", f"hydra.sweep.dir={out}"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        wall = time.perf_counter() - t0
        assert p.returncode == 0 and f"{jobs} ok" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
        return wall

    benchmark.pedantic(lambda: walls.append((sweep(FEW), sweep(MANY))), rounds=3, iterations=1)
    marginal = statistics.median((many - few) / (MANY - FEW) for few, many in walls)
    benchmark.extra_info.update(marginal_job_s=marginal, few_jobs=FEW, many_jobs=MANY,
                                few_sweep_s=statistics.median(w[0] for w in walls),
                                many_sweep_s=statistics.median(w[1] for w in walls))
