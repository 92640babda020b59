"""Benchmark: what one more job costs a sweep. `python -m harness -m` (a fresh interpreter, as
a user runs it) over pp=4 with near-zero compute, 16 jobs (`repeat=` labels: the same job each
time); the marginal wall time of a job is the median interval between consecutive jobs' starts
(result.json's provenance.started_at), the first two left out (the pool of ranks starts with
the first). The interpreter's start, the forkserver's and the planning of the sweep fall
outside every interval, and a median of 13 intervals is not moved by one slow job (the
difference of a 12-job and a 4-job sweep's walls, the measure before, moved 0.003-0.24 s a job
between runs of the same code). Goal: under 0.1 s a job.

`make bench` times it (one sweep a round, 3 rounds); `make test-all` runs it once untimed
(`slow`: a sweep in a fresh interpreter, ~10 s); `make test` leaves it out.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.records.identity import started_at

pytestmark = [pytest.mark.bench, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[2]
JOBS, SKIP = 16, 2
# near-zero compute: a 32-wide mlp, one step, no warm-up; native forks 4 ranks per job
TINY = ["pp=4", "microbatches=4", "model.hidden=32", "steps=1", "warmup_steps=0", "compute=real", "wandb.mode=disabled"]


@pytest.mark.parametrize("executor", ["sim", "native"])
def test_sweep_marginal_job_wall_time(benchmark, tmp_path: Path, executor: str):
    """Timed: a 16-job sweep. extra_info: `marginal_job_s`, the median over rounds of each
    sweep's median interval between job starts; `sweep_s`, the median sweep's wall time."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    marginal: list[float] = []
    walls: list[float] = []

    def sweep() -> None:
        out = tmp_path / str(len(walls))
        t0 = time.perf_counter()
        p = subprocess.run([sys.executable, "-m", "harness", "-m", f"executor={executor}", *TINY,
                            f"repeat={','.join(str(i) for i in range(JOBS))}", f"hydra.sweep.dir={out}"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        walls.append(time.perf_counter() - t0)
        assert p.returncode == 0 and f"{JOBS} ok" in p.stdout, p.stdout[-2000:] + p.stderr[-2000:]
        starts = sorted(started_at(json.loads(f.read_text()), f) for f in out.glob("*/result.json"))
        assert len(starts) == JOBS, starts
        marginal.append(statistics.median(b - a for a, b in zip(starts[SKIP:], starts[SKIP + 1:])))

    benchmark.pedantic(sweep, rounds=3, iterations=1)
    benchmark.extra_info.update(marginal_job_s=statistics.median(marginal), jobs=JOBS,
                                sweep_s=statistics.median(walls))
