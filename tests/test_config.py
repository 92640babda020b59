"""Bad input: one line naming the key, the value and what is allowed, before any worker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.cli import check_groups
from harness.config import ConfigError, validate

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("overrides,expected", [
    ({"pp": 0}, "pp=0: must be an integer >= 1"),
    ({"microbatches": 0}, "microbatches=0: must be an integer >= 1"),
    ({"microbatch_size": -2}, "microbatch_size=-2: must be an integer >= 1"),
    ({"steps": 0}, "steps=0: must be an integer >= 1"),
    ({"warmup_steps": -1}, "warmup_steps=-1: must be an integer >= 0"),
    ({"model.layers": 0}, "model.layers=0: must be an integer >= 1"),
    ({"model.hidden": -1}, "model.hidden=-1: must be an integer >= 1"),
    ({"pp": 9}, "pp=9: 9 stages, more than the model's 8 layers"),
    ({"model.name": "gpt", "model.heads": 3}, "model.heads=3: must divide model.hidden=32"),
    ({"schedule.name": "bogus"}, "schedule=bogus: unknown (allowed: gpipe, 1f1b, interleaved_1f1b, zb_h1, zbv"),
    ({"schedule.name": "interleaved_1f1b", "virtual_stages": 2, "microbatches": 9},
     "microbatches=9: interleaved_1f1b needs M < pp=4 or a multiple"),
    ({"schedule.name": "1f1b", "virtual_stages": 2}, "virtual_stages=2: 1f1b has no chunks (allowed: 1)"),
    ({"schedule.name": "zbv", "virtual_stages": 3}, "virtual_stages=3: zbv places exactly 2 chunks per rank"),
    ({"schedule.name": "dualpipev", "microbatches": 4}, "microbatches=4: dualpipev needs at least 2 * pp = 8"),
    ({"schedule.name": "zbv", "pp": 8, "model.layers": 8}, "pp=8: 16 stages, more than the model's 8 layers"),
    ({"schedule.name": "csv"}, "schedule.csv_path=None: schedule=csv needs an existing compute_only CSV"),
    ({"model.name": "resnet"}, "model=resnet: unknown (allowed: mlp, gpt, hf, custom)"),
    ({"partition.name": "bogus"}, "partition=bogus: unknown (allowed: uniform, params, flops, profile, explicit)"),
    ({"cost.time_scale": 0.0}, "cost.time_scale=0.0: must be > 0"),
    ({"executor": "tpu"}, "executor=tpu: unknown"),
    ({"compute": "fake"}, "compute=fake: unknown (allowed: auto, real, emulated)"),
    ({"device": "tpu"}, "device=tpu: unknown (allowed: cpu, cuda, auto)"),
    ({"device": "cuda"}, "device=cuda: no CUDA device here (use device=cpu or device=auto)"),
    ({"wandb.mode": "sometimes"}, "wandb.mode=sometimes: unknown (allowed: offline, online, disabled)"),
    ({"checkpointing": True, "checkpoint_every": 3}, "checkpoint_every=3: more than the 2 layers of the smallest stage"),
    ({"lr": 0.0}, "lr=0.0: must be > 0"),
    ({"timeout_s": 0.0}, "timeout_s=0.0: must be > 0"),
    ({"max_processes": 2}, "pp=4 x dp=1: 4 processes, more than max_processes=2"),
    ({"fault": "explode@rank0"}, "fault=explode@rank0: expected KIND@rankR,stepS"),
    ({"fault": "raise@rank7,step0"}, "fault=raise@rank7,step0: rank or step outside this run"),
])
def test_bad_input_is_one_clear_line(config, overrides, expected):
    with pytest.raises(ConfigError) as err:
        validate(config(**overrides))
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def test_default_config_is_valid(config):
    validate(config())


def test_group_choices_are_checked_before_hydra():
    assert check_groups(["schedule=gpipe,1f1b", "pp=2"]) is None
    assert check_groups(["schedule=gpipe,nope"]) == "schedule=nope: unknown (allowed: 1f1b, csv, dualpipev, " \
        "gpipe, interleaved_1f1b, zb_h1, zbv)"
    assert check_groups(["model=gpt3"]) == "model=gpt3: unknown (allowed: custom, gpt, gpt2_small, hf, mlp)"


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "harness", *args, "wandb.mode=disabled"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,expected", [
    (["pp=0"], "pp=0: must be an integer >= 1"),
    (["microbatches=0"], "microbatches=0"),
    (["microbatch_size=-1"], "microbatch_size=-1"),
    (["schedule=nope"], "schedule=nope: unknown"),
    (["model=nope"], "model=nope: unknown"),
    (["pp=12"], "pp=12: 12 stages, more than the model's 8 layers"),
    (["pp=abc"], "pp=abc: must be an integer"),
    (["ppp=2"], "ppp=2: unknown key (did you mean pp?)"),
    (["checkpointing=maybe"], "checkpointing=maybe: must be true or false"),
    (["schedule=dualpipev", "microbatches=2"], "microbatches=2: dualpipev needs at least 2 * pp = 8"),
])
def test_cli_refuses_bad_input_in_one_line_without_workers(tmp_path, args, expected):
    p = run_cli(*args, f"hydra.run.dir={tmp_path}/run", cwd=tmp_path)
    assert p.returncode == 2
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert expected in lines[0] and "Traceback" not in p.stderr
    assert not (tmp_path / "run" / "trace.json").exists()  # no worker ran
