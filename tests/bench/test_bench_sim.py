"""Benchmarks: the simulator on interleaved 1F1B at N=64, M=1024, V=2 (262,144 actions), and a
whole simulated job (python -m harness executor=sim) of 65,536 actions end to end.

`make bench` times them; under the default --benchmark-disable each runs once as a test.
"""

from __future__ import annotations

import pytest

import time
from pathlib import Path

from harness.planning import theory
from harness.config import Config, set_keys
from harness.job import run_job
from harness.measure.metrics import bubble_per_rank
from harness.schedules.registry import build
from harness.simulate.cost import CostModel
from harness.simulate import engine
from harness.simulate.engine import simulate

N, M, V = 64, 1024, 2


@pytest.mark.bench
def test_simulate_interleaved_64_ranks_1024_microbatches(benchmark):
    """Timed: one simulation with events from the schedule (compile, then a pass). extra_info:
    its parts: compiling (once per schedule), timing (one pass per cost model: what the planner
    and a job's second cost model pay) and the events."""
    schedule = build("interleaved_1f1b", N, M, V)
    cost = CostModel.uniform(N * V)
    trace = benchmark.pedantic(simulate, args=(schedule, cost), rounds=3, iterations=1)
    assert len(trace) == 2 * N * V * M
    got = sum(bubble_per_rank(trace, N)) / N
    assert got == pytest.approx(theory.bubble_fraction("interleaved_1f1b", N, M, V), abs=1e-9)
    t0 = time.perf_counter()
    compiled = engine.compile_schedule(schedule)
    t1 = time.perf_counter()
    end = engine.timing(compiled, cost)
    t2 = time.perf_counter()
    engine.trace(compiled, cost, 0, end)
    benchmark.extra_info.update(compile_s=t1 - t0, timing_s=t2 - t1, events_s=time.perf_counter() - t2)


def _sim_job(pp: int, m: int) -> Config:
    return set_keys(Config(), **{"executor": "sim", "schedule.name": "interleaved_1f1b", "pp": pp, "microbatches": m,
                                 "virtual_stages": 2, "model.layers": 2 * pp, "wandb.mode": "disabled"})


@pytest.mark.bench
def test_a_simulated_job_per_action(benchmark, tmp_path: Path):
    """Timed: run_job of executor=sim, interleaved 1F1B pp=32, M=512, v=2 (65,536 actions a
    step): plan (build, validate, compile), simulate, metrics, memory theory, result.json,
    trace.json and the Gantt chart. extra_info: microseconds per action, wall and this
    process's CPU (the goal: under 10). The assertion only catches a return to per-event
    Python everywhere (~70 us an action before the one simulator)."""
    run_job(_sim_job(4, 8), tmp_path / "warm", "bench", "warm-up")  # imports, fonts, torch's first calls
    times: dict[str, list[float]] = {"wall": [], "cpu": []}
    c = _sim_job(32, 512)

    def job() -> None:
        w, cpu = time.perf_counter(), time.process_time()
        r = run_job(c, tmp_path / "job", "bench", "sim")
        times["wall"].append(time.perf_counter() - w)
        times["cpu"].append(time.process_time() - cpu)
        assert r.status == "ok", r.error

    benchmark.pedantic(job, rounds=3, iterations=1)
    actions = 32 * 2 * 512 * 2
    per = {f"{k}_us_per_action": min(v) / actions * 1e6 for k, v in times.items()}
    benchmark.extra_info.update(actions=actions, **per)
    assert per["cpu_us_per_action"] < (600 if benchmark.disabled else 60), per  # untimed: maybe a busy machine
