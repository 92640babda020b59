"""Bad input: one line naming the key, the value and what is allowed, before any worker."""

from __future__ import annotations

import pytest

from harness.planning.checks import validate
from harness.planning.early import check_early
from harness.planning.plan import make_plan
from harness.config import ConfigError, check_values

BAD = [
    ({"pp": 0}, "pp=0: must be an integer >= 1"),
    ({"microbatches": 0}, "microbatches=0: must be an integer >= 1"),
    ({"microbatch_size": -2}, "microbatch_size=-2: must be an integer >= 1"),
    ({"steps": 0}, "steps=0: must be an integer >= 1"),
    ({"warmup_steps": -1}, "warmup_steps=-1: must be an integer >= 0"),
    ({"model.layers": 0}, "model.layers=0: must be an integer >= 1"),
    ({"model.hidden": -1}, "model.hidden=-1: must be an integer >= 1"),
    ({"pp": 9}, "pp=9: 9 stages, more than the model's 8 layers"),
    ({"model.name": "gpt", "model.heads": 3}, "model.heads=3: must divide model.hidden=32"),
    ({"schedule.name": "bogus"}, "schedule=bogus: unknown (allowed: gpipe, 1f1b, interleaved_1f1b, zb_h1, zb_h2, zbv, dualpipev, zb_auto"),
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
    ({"run.timeout_s": 0.0}, "run.timeout_s=0.0: must be at least 1 s"),
    ({"run.timeout_s": 1e-9}, "run.timeout_s=1e-09: must be at least 1 s"),
    ({"lr": float("nan")}, "lr=nan: must be a finite number"),
    ({"lr": float("inf")}, "lr=inf: must be a finite number"),
    ({"run.timeout_s": float("inf")}, "run.timeout_s=inf: must be a finite number"),
    ({"cost.fwd_ms_per_layer": float("nan")}, "cost.fwd_ms_per_layer=nan: must be a finite number"),
    ({"cost.weight_grad_share": -0.5}, "cost.weight_grad_share=-0.5: must be >= 0"),
    ({"comm.latency_s": float("-inf")}, "comm.latency_s=-inf: must be a finite number"),
    ({"comm.latency_s": -1.0}, "comm.latency_s=-1.0: must be >= 0"),
    ({"seed": 10**20}, "seed=100000000000000000000: must be an integer in 0..9223344366820"),
    ({"seed": -1}, "seed=-1: must be an integer in 0.."),
    ({"microbatches": 10**9}, "microbatches=1000000000: pp=4 x 1 chunks x 1000000000 microbatches x 3"),
    ({"schedule.name": "interleaved_1f1b", "virtual_stages": 10**6, "microbatches": 4},
     "virtual_stages=1000000: pp=4 x 1000000 chunks x 4 microbatches x 3"),
    ({"microbatch_size": 10**9}, "microbatch_size=1000000000: the activations of this machine's 4 ranks"),
    ({"model.hidden": 10**9}, "model.hidden=1000000000: the activations of this machine's"),
    ({"model.name": "gpt", "model.seq": 10**9}, "model.seq=1000000000: the activations of this machine's"),
    ({"model.layers": 2**16, "model.hidden": 1024, "pp": 2}, "model.layers=65536: 68,786,585,600 parameters, weights and "
     "gradients in fp32"),
    ({"model.layers": 10**8, "pp": 2}, "model.layers=100000000: 100,000,000 layers, more than 65,536"),
    ({"run.max_processes": 2}, "pp=4 x dp=1: 4 processes on this machine, more than run.max_processes=2"),
    ({"run.fault": "explode@rank0"}, "run.fault=explode@rank0: expected KIND@rankR,stepS"),
    ({"run.fault": "raise@rank7,step0"}, "run.fault=raise@rank7,step0: rank or step outside this run"),
]


@pytest.mark.parametrize("overrides,expected", BAD)
def test_bad_input_is_one_clear_line(config, overrides, expected):
    with pytest.raises(ConfigError) as err:
        validate(config(**overrides))
    assert expected in str(err.value)
    assert "\n" not in str(err.value)


def early(c) -> str | None:
    """What the frontend says before torch (check_values, then planning/early.py), or None."""
    try:
        check_values(c)
        check_early(c)
    except ConfigError as e:
        return str(e)
    return None


@pytest.mark.parametrize("overrides,expected", BAD)
def test_the_early_check_says_what_planning_says_or_nothing(config, overrides, expected):
    """Every bad input above: refused before torch with planning's own line, or left to planning."""
    said = early(config(**overrides))
    if said is not None:
        with pytest.raises(ConfigError) as err:
            make_plan(config(**overrides))
        assert said == str(err.value)


SHAPE_CASES = [  # (overrides) over models and schedules, each refused or not by the stage rule
    {"model.name": name, "model.layers": layers, "pp": pp, **extra}
    for name in ("mlp", "gpt", "hf")
    for layers in (1, 2, 6)
    for pp, extra in ((2, {}), (4, {}), (8, {}),
                      (2, {"schedule.name": "interleaved_1f1b", "virtual_stages": 2, "microbatches": 4}),
                      (2, {"schedule.name": "zbv", "microbatches": 4}),
                      (4, {"schedule.name": "zb_auto", "microbatches": 4, "executor": "sim"}),
                      (2, {"partition.name": "explicit", "partition.layers_per_stage": [1, 3]}),
                      (2, {"partition.name": "explicit", "partition.layers_per_stage": [4, 4]}),
                      (2, {"checkpointing": True, "checkpoint_every": 2}))
]


@pytest.mark.grid
def test_the_stage_rule_before_torch_is_plannings(config):
    """Over models, layer counts, schedules (V and interleaved chunks, zb_auto's stages, which the
    plan checks), explicit partitions and checkpoint segments: the early check refuses exactly
    where planning refuses for the stages, with the same line."""
    refused = 0
    for overrides in SHAPE_CASES:
        small = {} if overrides["model.name"] == "mlp" else {"model.hidden": 16, "model.heads": 2, "model.vocab": 32,
                                                             "model.seq": 8}
        c = config(**overrides, **small)  # model.name first: the sizes are its keys
        said = early(c)
        try:
            make_plan(c)
            planned = None
        except ConfigError as e:
            planned = str(e)
        stage_rule = planned is not None and planned.startswith(("pp=", "partition.layers_per_stage=",
                                                                 "checkpoint_every="))
        assert said == (planned if stage_rule else None), overrides
        refused += said is not None
    assert refused > len(SHAPE_CASES) // 3  # the grid exercises the rule


def test_default_config_is_valid(config):
    validate(config())


def test_the_size_check_counts_this_machine_in_the_runs_dtype_after_global_batch(config, monkeypatch):
    """A machine of 1 GiB (patched): 4 ranks x 8 microbatches x B x 32 features are over it in
    fp32 at B=400,000 and within it in bf16; B set by global_batch is checked as B; a torchrun
    node running one of the ranks holds its share only; executor=sim allocates nothing and is
    never checked."""
    from harness.planning import checks

    monkeypatch.setattr(checks, "machine_bytes", lambda device, gpus: 2**30)
    big = 400_000
    with pytest.raises(ConfigError, match=r"^microbatch_size=400000: the activations of this machine's 4 ranks"):
        validate(config(microbatch_size=big))
    validate(config(microbatch_size=big, dtype="bf16"))
    with pytest.raises(ConfigError, match=r"^microbatch_size=400000: the activations"):
        validate(config(microbatch_size=1, global_batch=8 * big))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    validate(config(microbatch_size=big))
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    validate(config(microbatch_size=big, executor="sim"))


# --- the command line's overrides against the schema (harness/frontend/errors.py) -----------------

GOOD_OVERRIDES = ["pp=2", "model=custom", "model.kwargs.depth=3", "+model.kwargs.width=4", "+global_batch=8",
                  "microbatches=${pp}", "wandb.mode=disabled", "hydra/launcher=slurm", "hydra.launcher.partition=x",
                  "hydra.job.chdir=true", "hydra.job.env_set.X=1", "cluster=h200_node", "cluster.nodes=2",
                  "cluster.overhead.action_s.4=0.001", "run.clock_skew_s=[0,0.5]", "run.fault='raise@rank1,step2'",
                  "schedule=csv", "schedule.csv_path=x.csv", "run.timeout_s=null", "experiment=bubble", "~profile",
                  "optimizer=adamw", "optimizer.betas=[0.9,0.95]", "lr=1e-3", "seed=3", "wandb={mode:disabled}"]


def test_the_schema_takes_every_kind_of_good_override():
    """Checked only when composition failed; a good override here must never take the blame."""
    from harness.frontend.errors import check_overrides

    check_overrides(GOOD_OVERRIDES)
    check_overrides(["pp=2,4", "model=gpt,mlp"], sweep=True)


@pytest.mark.parametrize("overrides,expected", [
    (["pp=abc"], "pp=abc: must be an integer"),
    (["pp=null"], "pp=null: must be an integer"),
    (["lr=fast"], "lr=fast: must be a number"),
    (["optimizer=sgd", "optimizer.betas=[0.9,0.95]"], "optimizer.betas=[0.9,0.95]: not a key of optimizer=sgd (it is "
                                                      "optimizer=adamw's)"),
    (["model.heads=2"], None),  # the model is a preset's or the default: its keys are not judged here
    (["modle.hidden=3"], "modle.hidden=3: unknown key (did you mean model.hidden?)"),
    (["+seed=3"], "+seed=3: seed is already set: drop the + to change it"),
    (["pp=2,4"], "pp=2,4: several values need -m to sweep them"),
    (["pp=range(1,3)"], "pp=range(1,3): a sweep (allowed with -m only)"),
    (["hydra.jobs.chdir=true"], "hydra.jobs.chdir=true: unknown Hydra key"),
    (["microbatches=${model.hiden}"], "microbatches=${model.hiden}: no key model.hiden to interpolate"),
    (["pp=[1,"], "pp=[1,: not an override Hydra can parse"),
])
def test_a_bad_override_is_named_by_the_schema(overrides, expected):
    from harness.frontend.errors import check_overrides

    if expected is None:
        check_overrides(overrides)
        return
    with pytest.raises(ConfigError) as e:
        check_overrides(overrides)
    assert str(e.value).startswith(expected) and "\n" not in str(e.value)


def test_the_key_composition_stopped_at_is_explained_first():
    """`pp=abc` fails composition; `+modle.x=1` before it is wrong too (added, so refused only
    once composed), but Hydra's typed error names pp: that is the one said."""
    from harness.frontend.compose import compose_config

    with pytest.raises(ConfigError, match=r"^pp=abc: must be an integer$"):
        compose_config(["+modle.x=1", "pp=abc"])
