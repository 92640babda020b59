"""dist: pipeline x data parallelism (DDP per stage), torchrun, and the SLURM launcher config."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_module

from harness.frontend.compose import register
from harness.config import ConfigError
from harness.job import run_job
from harness.planning.plan import make_plan
from harness.measure.reference import reference_losses
from harness.records.result import read
from tests.jitter import bubble_allowance, oversleep

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.dist
@pytest.mark.parametrize("pp,dp", [(2, 2), (1, 4), (4, 1)])
def test_losses_equal_single_process_global_batch(tmp_path, config, pp, dp):
    c = config(pp=pp, dp=dp, microbatches=4, verify_grads=True, steps=2)
    result = run_job(c, tmp_path, "test", f"{pp}x{dp}")
    assert result.status == "ok", result.error
    m = result.metrics
    assert m.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    assert m.grad_check.max_rel_diff < 1e-5
    assert m.throughput_samples_s == pytest.approx(dp * 4 * c.microbatch_size / m.step_time_s)
    if dp > 1:
        trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
        syncing = {e["tid"] for e in trace if e.get("args", {}).get("kind") == "dp_sync"}
        assert syncing == set(range(pp * dp))  # every rank's track shows its gradient sync
        assert {e["pid"] for e in trace if e["ph"] == "X"} == set(range(dp))  # grouped by replica
        assert m.dp_sync_s > 0 and m.dp_sync_theory_s > 0 and 0 < m.dp_sync_share < 1


@pytest.mark.dist
@pytest.mark.parametrize("schedule", [pytest.param("interleaved_1f1b", marks=pytest.mark.slow), "zb_h1", "zbv",
                                      "dualpipev", pytest.param("zb_h2", marks=pytest.mark.slow),
                                      pytest.param("zb_auto", marks=pytest.mark.slow)])
def test_every_schedule_with_dp_trains_like_one_process(tmp_path, config, schedule):
    """pp=2 x dp=2: the zero-bubble and V schedules too (their weight gradients come in W's,
    after the backward: each stage all-reduces once its last W is done). Losses and gradients
    equal one process on the same global batch; every rank traces its sync."""
    v = 2 if schedule == "interleaved_1f1b" else 1
    c = config(pp=2, dp=2, microbatches=4, virtual_stages=v, verify_grads=True, steps=2, **{"schedule.name": schedule})
    result = run_job(c, tmp_path, "test", schedule)
    assert result.status == "ok", result.error
    m = result.metrics
    assert m.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    assert m.grad_check.max_rel_diff < 1e-5
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert {e["tid"] for e in trace if e.get("args", {}).get("kind") == "dp_sync"} == set(range(4))


@pytest.mark.dist
def test_dp_sync_is_not_bubble(tmp_path, config):
    """pp=2 dp=2, emulated equal stages: the sync is its own event after the stage's compute
    (never inside a compute slice), and the bubble stays the schedule's."""
    c = config(pp=2, dp=2, microbatches=4, compute="emulated", steps=2, **{"cost.fwd_ms_per_layer": 20.0})
    result = run_job(c, tmp_path, "test", "sync")
    trace = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "X"]
    for sync in (e for e in trace if e["args"]["kind"] == "dp_sync"):
        for e in trace:
            if e["tid"] == sync["tid"] and e["args"]["kind"] in "FB" and e["args"]["step"] == sync["args"]["step"]:
                assert e["ts"] + e["dur"] <= sync["ts"] + 1e-3  # us; compute ends before its sync starts
    b = result.metrics.bubble
    share = oversleep(c, result.metrics)  # a busy machine's part (tests/jitter.py); ~0 on a quiet one
    allowed = bubble_allowance(0.06, b.theory, share)
    assert abs(b.measured - b.theory) < allowed, (b, f"oversleep {share:.3f}, allowed {allowed:.3f}")


@pytest.mark.dist
@pytest.mark.subprocess
@pytest.mark.parametrize("dp,placement", [(1, "pp_inner"), pytest.param(2, "pp_inner", marks=pytest.mark.slow),
                                          pytest.param(2, "dp_inner", marks=pytest.mark.slow)])
def test_torchrun_uses_its_ranks_and_rank0_records(tmp_path, dp, placement):
    """pp=2 x dp torchrun processes (each a fresh interpreter importing torch: make test runs
    dp=1, make test-all dp=2 as well; pp x dp ranks from a launch are tests/test_dp.py's above)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node",
                        str(2 * dp), "-m", "harness", "pp=2", f"dp={dp}", f"placement={placement}", "microbatches=2",
                        "steps=1",
                        "model.hidden=32", "wandb.mode=disabled", f"hydra.run.dir={tmp_path}/run"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    result = read(tmp_path / "run" / "result.json")
    assert result.status == "ok" and result.env.world_size == 2 * dp
    assert p.stdout.count("harness: 1f1b pp=2") == 1  # rank 0 alone reports


@pytest.mark.parametrize("how", ["in-process", pytest.param("torchrun", marks=[pytest.mark.slow, pytest.mark.dist,
                                                                                pytest.mark.subprocess])])
def test_a_torchrun_world_of_another_size_is_refused(tmp_path, monkeypatch, run_harness, how):
    """2 processes for pp=2 x dp=2: refused before any process group. In this process: rank 0
    of the world torchrun describes in its variables (what the check reads)."""
    args = ["pp=2", "dp=2", "wandb.mode=disabled", f"hydra.run.dir={tmp_path}/bad"]
    if how == "torchrun":
        mismatch = subprocess.run([str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node",
                                   "2", "-m", "harness", *args], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                                  capture_output=True, text=True, timeout=300)
    else:
        for key, value in {"TORCHELASTIC_RUN_ID": "test", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
            monkeypatch.setenv(key, value)
        mismatch = run_harness(*args, cwd=tmp_path)
    assert mismatch.returncode != 0
    assert "WORLD_SIZE=2 from torchrun, but pp=2 x dp=2 = 4" in mismatch.stderr


@pytest.mark.parametrize("overrides,expected", [
    ({"dp": 2, "global_batch": 12, "microbatches": 4}, "global_batch=12: must split evenly into dp=2 x microbatches=4"),
    ({"dp": 5}, "pp=4 x dp=5: 20 processes on this machine, more than run.max_processes=16"),
    ({"dp": 2, "device": "cuda"}, "device=cuda: no CUDA device here (use device=cpu or device=auto)"),
])
def test_bad_dp_input_is_one_line(config, overrides, expected):
    with pytest.raises(ConfigError) as err:
        make_plan(config(**overrides))
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_global_batch_sets_the_microbatch(config):
    plan = make_plan(config(dp=2, microbatches=4, global_batch=32))
    assert plan.config.microbatch_size == 4


def test_slurm_launcher_config_composes():
    register()
    with initialize_config_module(config_module="harness.conf", version_base="1.3"):
        cfg = compose(config_name="config", overrides=["hydra/launcher=slurm", "hydra.launcher.partition=gpu"],
                      return_hydra_config=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert launcher.partition == "gpu" and launcher.tasks_per_node == 1


def test_the_gantt_title_shows_what_ran(config):
    """global_batch sets B at planning: the title reads the planned config (pp=2 M=4 dp=4
    global_batch=32 runs B=2, not the default 4)."""
    from tests.test_report import fake
    from harness.job import gantt_title

    plan = make_plan(config(pp=2, microbatches=4, dp=4, global_batch=32))
    title = gantt_title(plan, fake(0).metrics, 3)
    assert "pp=2  dp=4  M=4  B=2" in title and "cpu/gloo p2p=eager" in title


@pytest.mark.parametrize("pp,dp", [(1, 4), (2, 2), (4, 2), (3, 1)])
def test_placement_maps_launcher_slots_to_ranks_one_to_one(pp, dp):
    """placement=dp_inner: a stage's replicas in consecutive slots (their all-reduce inside a
    node), rank 0 in slot 0; pp_inner: slot = rank."""
    from harness.runtime.groups import Layout

    layout = Layout(pp, dp)
    for placement in ("pp_inner", "dp_inner"):
        slots = [layout.slot(r, placement) for r in range(pp * dp)]
        assert sorted(slots) == list(range(pp * dp)) and slots[0] == 0
        assert [layout.rank_of_slot(s, placement) for s in slots] == list(range(pp * dp))
    for stage in range(pp):  # dp_inner: the replicas of a stage are neighbours
        replicas = sorted(layout.slot(layout.global_rank(d, stage), "dp_inner") for d in range(dp))
        assert replicas == list(range(stage * dp, stage * dp + dp))


@pytest.mark.dist
def test_a_dp_inner_launch_trains_as_pp_inner(tmp_path, config, monkeypatch):
    """placement moves ranks between slots (GPUs, launcher ranks), never what they compute:
    the same losses (torchrun's slots: test_torchrun_uses_its_ranks_and_rank0_records)."""
    from harness.job import run_job

    results = {}
    for placement in ("pp_inner", "dp_inner"):
        c = config(pp=2, dp=2, microbatches=2, placement=placement)
        r = run_job(c, tmp_path / placement, "test", placement)
        assert r.status == "ok", r.error
        results[placement] = r.metrics.losses
    assert results["pp_inner"] == results["dp_inner"]


@pytest.mark.parametrize("schedule", ["zb_h1", "zbv", "dualpipev"])
def test_the_simulator_syncs_a_w_stage_after_its_last_w(schedule):
    """Where the backward is split, a stage's gradients are complete after its last W: its
    sync starts there (the rank waits for it), as the native runner all-reduces."""
    from harness.schedules.registry import build
    from harness.simulate import engine
    from harness.simulate.cost import CostModel

    sched = build(schedule, 2, 4)
    S = 1 + max(a.stage for acts in sched.values() for a in acts)
    cost = CostModel((1.0,) * S, (2.0,) * S, (1.0,) * S, (1.0,) * S, sync_s=(0.5,) * S)
    c = engine.compile_schedule(sched)
    events = engine.trace(c, cost)
    for s in range(S):
        grads = [e for e in events if e.stage == s and e.kind in ("B", "I", "W")]
        sync = [e for e in events if e.kind == "dp_sync" and e.stage == s]
        assert len(sync) == 1 and sync[0].start == pytest.approx(max(e.end for e in grads))
    free = engine.step_time(c, CostModel((1.0,) * S, (2.0,) * S, (1.0,) * S, (1.0,) * S))
    assert engine.step_time(c, cost) > free
