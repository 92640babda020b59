"""Launchers (harness/runtime/cluster.py, hydra_plugins/harness_launcher): submitit_local runs one
job at a time and a point's ranks as submitit tasks joined through submitit's environment (rank 0
alone records); the SLURM launcher sizes each point's allocation from its pp x dp (checked on the
sbatch file it would submit; there is no SLURM here); progress reaches the console and sweep.log."""

from __future__ import annotations

import gc
import pickle
import sys
import time

import pytest
from hydra import compose, initialize_config_module
from omegaconf import OmegaConf

from harness.frontend.callbacks import SWEEP_LOG, Progress
from harness.frontend.compose import register, to_config
from harness.measure.reference import reference_losses
from harness.records.result import read
from harness.runtime.cluster import Resources, master_port, rank_env, spread
from hydra_plugins.harness_launcher import HarnessLocalLauncher, HarnessSlurmLauncher
from tests.test_cli import harness  # `harness ARGS` in this process: only the jobs' tasks start cold

QUIET = ["wandb.mode=disabled", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]


def composed(*overrides: str):
    register()
    with initialize_config_module(config_module="harness.conf", version_base="1.3"):
        return compose(config_name="config", overrides=list(overrides), return_hydra_config=True)


def launcher(cls, *overrides: str):
    """The launcher Hydra would build from `hydra/launcher=...` and these overrides (not set up)."""
    params = OmegaConf.to_container(composed(*overrides).hydra.launcher, resolve=False)
    params.pop("_target_")
    return cls(**params)


@pytest.mark.dist
@pytest.mark.subprocess
def test_submitit_local_runs_a_point_as_ranks_and_rank0_records(tmp_path, monkeypatch, capsys):
    """pp=2 dp=2 as 4 submitit tasks (each one rank, joined over gloo through the env the
    launcher sets from submitit's job environment); one record, from rank 0."""
    point = ["pp=2", "dp=2", "microbatches=2", "steps=1", "warmup_steps=1", "model.hidden=32", "compute=real"]
    sweep = tmp_path / "sweep"
    started = time.monotonic()
    code, out, err = harness(monkeypatch, capsys, "-m", "hydra/launcher=submitit_local",
                             "hydra.launcher.ranks_as_tasks=true", *point, *QUIET, f"hydra.sweep.dir={sweep}")
    took = time.monotonic() - started
    assert code == 0, err[-3000:]
    records = sorted(sweep.rglob("result.json"))
    assert len(records) == 1, records  # ranks 1..3 wrote nothing into the sweep
    result = read(records[0])
    assert result.status == "ok", result.error
    assert result.env.world_size == 4
    assert result.metrics.losses == pytest.approx(reference_losses(to_config(composed(*point)))[0], rel=1e-5)
    assert {p.name for p in sweep.iterdir()} == {records[0].parent.name, ".submitit", "multirun.yaml", SWEEP_LOG,
                                                 "sweep.json", ".harness.lock"}
    tasks = list((sweep / ".submitit").glob("*/*_log.out"))
    assert len(tasks) == 4  # one log per task: the 4 ranks were submitit's tasks, not forked by harness
    # progress on the console as the job starts and comes back, and the headline in sweep.log
    assert "started: local job" in out and "1 node x 4 tasks" in out
    assert "[harness] done 1/1" in out and "1f1b pp=2 M=2" in out
    log = (sweep / SWEEP_LOG).read_text().splitlines()
    assert len(log) == 1 and records[0].parent.name in log[0] and "1f1b pp=2 M=2" in log[0]
    print(f"submitit_local pp=2 dp=2 as 4 tasks: {took:.1f} s", file=sys.stderr)


def test_submitit_local_is_one_job_at_a_time(capsys):
    local = launcher(HarnessLocalLauncher, "hydra/launcher=submitit_local")
    assert local.params["array_parallelism"] == 1 and local.params["ranks_as_tasks"] is False
    assert local.resources(2, 2, "cpu") == Resources(1, 1, 0)  # harness forks the ranks in the one task
    assert "local_array_parallelism" not in local.executor_keys()  # harness's key, not submitit's
    local.warn()
    assert capsys.readouterr().err == ""
    crowded = launcher(HarnessLocalLauncher, "hydra/launcher=submitit_local", "hydra.launcher.array_parallelism=3")
    crowded.warn()
    assert "share its cores" in capsys.readouterr().err


@pytest.mark.parametrize("pp,dp,expected", [
    (1, 1, (1, 1, 1)), (2, 2, (1, 4, 4)), (4, 2, (1, 8, 8)), (4, 4, (2, 8, 8)), (3, 4, (2, 6, 6)), (8, 4, (4, 8, 8)),
])
def test_slurm_sizes_each_point_from_pp_x_dp(pp, dp, expected):
    slurm = launcher(HarnessSlurmLauncher, "hydra/launcher=slurm", "hydra.launcher.partition=gpu")
    cfg = composed(f"pp={pp}", f"dp={dp}", "device=cuda")
    nodes, tasks, gpus = expected
    assert slurm.job_parameters(cfg) == {"nodes": nodes, "tasks_per_node": tasks, "gpus_per_node": gpus}
    cpu = slurm.job_parameters(composed(f"pp={pp}", f"dp={dp}", "device=cpu"))
    assert cpu == {"nodes": nodes, "tasks_per_node": tasks}  # the same packing, no GPU asked


def test_slurm_sbatch_of_a_point(tmp_path, monkeypatch):
    """The sbatch file submitit would submit for pp=4 dp=4 on 8-GPU nodes (srun faked present)."""
    import submitit

    monkeypatch.setattr(submitit.SlurmExecutor, "affinity", classmethod(lambda cls: 1))
    slurm = launcher(HarnessSlurmLauncher, "hydra/launcher=slurm", "hydra.launcher.partition=gpu")
    executor = slurm.make_executor(tmp_path)
    executor.update_parameters(**slurm.job_parameters(composed("pp=4", "dp=4", "device=cuda")))
    sbatch = executor._executor._make_submission_file_text("python job.py", "uid")
    for line in ("--nodes=2", "--ntasks-per-node=8", "--gpus-per-node=8", "--exclusive", "--partition=gpu",
                 "--cpus-per-task=4", "--time=60"):
        assert f"#SBATCH {line}\n" in sbatch, line
    assert "--array" not in sbatch  # each point its own job, not an array sharing one size


def test_slurm_refuses_a_point_that_cannot_spread_evenly():
    assert spread(12, 8) == (2, 6)
    with pytest.raises(ValueError, match="7 ranks do not spread evenly over 2 nodes of at most 4"):
        spread(7, 4)
    slurm = launcher(HarnessSlurmLauncher, "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=4")
    with pytest.raises(ValueError):
        slurm.resources(7, 1, "cuda")
    shared = launcher(HarnessSlurmLauncher, "hydra/launcher=slurm", "hydra.launcher.ranks_as_tasks=false")
    assert shared.resources(2, 2, "cuda") == Resources(1, 1, 4)  # one task forking 4 ranks, a GPU each


def test_slurm_sizes_a_tp_point_by_pp_x_dp_x_tp_and_never_splits_a_tp_group():
    slurm = launcher(HarnessSlurmLauncher, "hydra/launcher=slurm", "hydra.launcher.gpus_per_node=8")
    cfg = composed("pp=2", "dp=2", "tp=4", "device=cuda")
    assert slurm.job_parameters(cfg) == {"nodes": 2, "tasks_per_node": 8, "gpus_per_node": 8}
    with pytest.raises(ValueError, match="^tp=4: 6 ranks per node would split a TP group across nodes"):
        slurm.resources(3, 1, "cuda", tp=4)  # 12 ranks: 2 nodes of 6


def test_rank_env_from_submitit():
    one = rank_env(global_rank=5, local_rank=1, num_tasks=8, num_nodes=2, hostnames=["gpu-a", "gpu-b"], job_id="42")
    assert one["MASTER_ADDR"] == "gpu-a"  # rank 0's node
    assert (one["RANK"], one["WORLD_SIZE"], one["LOCAL_RANK"], one["LOCAL_WORLD_SIZE"]) == ("5", "8", "1", "4")
    assert one["MASTER_PORT"] == str(master_port("42")) == rank_env(0, 0, 8, 2, ["gpu-a", "gpu-b"], "42")["MASTER_PORT"]
    assert 10000 <= master_port("42") < 30000 and master_port("42") != master_port("43")
    assert rank_env(0, 0, 4, 1, ["vm"], "7")["MASTER_ADDR"] == "127.0.0.1"  # one node: loopback


def test_progress_sent_with_a_job_stays_quiet(capsys):
    p = Progress()
    p.started = 1.0
    copy = pickle.loads(pickle.dumps(p))
    assert copy.remote and not p.remote
    copy.on_job_start(config=composed("pp=2"))
    assert capsys.readouterr().out == ""  # its launcher says when the job starts


def test_basic_launcher_sweep_writes_sweep_log(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "sweep"
    code, out, err = harness(monkeypatch, capsys, "-m", "executor=sim", "pp=2,4", "microbatches=4", "steps=1",
                             *QUIET, f"hydra.sweep.dir={sweep}")
    assert code == 0, err
    log = (sweep / SWEEP_LOG).read_text().splitlines()
    assert len(log) == 2 and all("simulated" in line for line in log)
    for line in log:  # the job's headline as it returned it: its record's, word for word
        _, job, said = line.split(" ", 2)
        assert said == read(sweep / job / "result.json").headline()
    assert "[harness] job 2/2" in out
    assert gc.get_freeze_count() == 0  # the heap the sweep froze while planning and running is collectable again


def test_gpu_counts_for_planning_across_nodes():
    from harness.runtime.cluster import point_resources, world_cuda_devices

    def point_cuda_devices(cfg):  # the GPUs a point's SLURM allocation gives it; None: this machine's
        r = point_resources(cfg)
        return None if r is None else r.nodes * r.gpus_per_node

    assert world_cuda_devices(8, {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}) == 16  # 2 nodes x 8: NCCL
    assert world_cuda_devices(4, {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}) == 4  # ranks share GPUs
    assert world_cuda_devices(2, {}) == 2  # one machine: its own
    slurm = ["hydra/launcher=slurm", "device=cuda"]
    assert point_cuda_devices(composed(*slurm, "pp=4", "dp=4")) == 16  # a login node without GPUs plans 16
    assert point_cuda_devices(composed(*slurm, "pp=2", "dp=1")) == 2
    assert point_cuda_devices(composed("hydra/launcher=submitit_local", "pp=2")) is None  # this machine's
    assert point_cuda_devices(composed("pp=2")) is None


def test_a_job_that_died_is_said_and_logged(tmp_path, capsys):
    """A job whose tasks were killed (no result): said on the console with its log, a line in
    sweep.log, and a JobReturn the sweep goes on past (its summary lists the job as missing)."""
    import submitit

    from harness.runtime.cluster import _Point

    class Dead:
        job_id, state = "77", "INTERRUPTED"
        paths = type("Paths", (), {"stderr": tmp_path / ".submitit" / "77" / "77_0_log.err"})()

        def results(self):
            raise submitit.core.utils.UncompletedJobError("Job 77 (task: 0) has not produced any output")

    cfg = composed("pp=2", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=job0")
    progress = Progress()
    progress.started = time.monotonic()
    local = launcher(HarnessLocalLauncher, "hydra/launcher=submitit_local")
    ret = local.collect(_Point(0, ["pp=2"], cfg, Resources(1, 1, 0), time.monotonic()), Dead(), progress)
    assert ret.return_value is None  # the sweeper reads it without raising
    err = capsys.readouterr().err
    assert "[harness] done 1" in err and "local job 77 ended: no result, state INTERRUPTED" in err
    assert "77_0_log.err" in err
    assert "job0 local job 77 ended" in (tmp_path / SWEEP_LOG).read_text()
