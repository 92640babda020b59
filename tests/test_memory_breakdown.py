"""dist: every byte of every rank, measured against theory, ZeRO-1, and the memory budget."""

from __future__ import annotations

import pytest

from harness.config import ConfigError
from harness.job import run_job
from harness.planning.plan import make_plan
from harness.measure.reference import reference_losses
from tests.test_tp_memory import GPT as SMALL_GPT, assert_memory_is_theory

GPT = {"model.name": "gpt", "model.layers": 2, "model.hidden": 32, "model.heads": 2, "model.seq": 16,
       "model.vocab": 64}
LLAMA = {"model.name": "hf", "model.arch": "llama", "model.layers": 2, "model.hidden": 32, "model.heads": 4,
         "model.kv_heads": 2, "model.seq": 16, "model.vocab": 64}
KEYS = ("params", "grads", "optimizer", "activations", "peak")


@pytest.mark.dist
@pytest.mark.parametrize("case", [
    dict(pp=2),
    dict(pp=4, **{"schedule.name": "gpipe", "optimizer.name": "adamw"}, checkpointing=True, checkpoint_every=1),
    dict(pp=2, dp=2, zero=1, **{"optimizer.name": "adamw"}),
    dict(pp=2, dp=2, checkpointing=True, **GPT),
    dict(pp=4, **{"optimizer.name": "adamw"}, **GPT),
    dict(pp=2, dp=2, zero=1, dtype="bf16", **{"optimizer.name": "adamw"}, **GPT),
    dict(pp=2, **{"optimizer.name": "adamw"}, **LLAMA),
    dict(pp=2, dp=2, zero=1, **{"schedule.name": "zb_h2", "optimizer.name": "adamw"}, **GPT),
], ids=["mlp-sgd-pp2", "mlp-adamw-ckpt-pp4", "mlp-adamw-zero1-dp2", "gpt-sgd-ckpt-dp2", "gpt-adamw-pp4",
        "gpt-bf16-adamw-zero1-dp2", "hf-llama-adamw-pp2", "gpt-zb_h2-adamw-zero1-dp2"])
def test_measured_equals_theory_for_every_component_on_every_rank(tmp_path, config, case):
    c = config(microbatches=4, steps=2, **case)
    result = run_job(c, tmp_path, "test", "bytes")
    assert result.status == "ok", result.error
    mem = result.metrics.memory
    assert len(mem.measured_per_rank) == len(mem.theory_per_rank) == c.pp * c.dp
    for g, (measured, theory) in enumerate(zip(mem.measured_per_rank, mem.theory_per_rank)):
        for key in KEYS:
            assert measured[key] == theory[key], (g, key, measured, theory)


@pytest.mark.dist
@pytest.mark.parametrize("case", [
    # a V's last stage: its Is write the norms' and embeddings' gradients, its first W its split
    # linears' (the peak falls between them)
    dict(microbatches=2, microbatch_size=2, **{"schedule.name": "zbv"}),
    # each I's recompute lives beside what is held at that I, not at the rank's peak elsewhere
    dict(microbatches=4, checkpointing=True, **{"schedule.name": "zb_h1"}),
    # at B=1 the last stage's loss saves targets of their own storage (a loader's copy)
    dict(microbatches=4, microbatch_size=1, **{"schedule.name": "1f1b"}),
], ids=["zbv", "zb_h1-ckpt", "1f1b-B1"])
def test_split_backward_and_single_sample_memory_is_its_theory_to_the_byte(tmp_path, config, case):
    result = run_job(config(pp=2, steps=1, **SMALL_GPT, **case), tmp_path, "test", "zb")
    assert result.status == "ok", result.error
    assert_memory_is_theory(result)


@pytest.mark.dist
def test_zero1_halves_the_optimizer_state_and_keeps_the_losses(tmp_path, config):
    runs = {z: run_job(config(pp=2, dp=2, microbatches=4, steps=2, zero=z, **{"optimizer.name": "adamw"}),
                       tmp_path / str(z), "test", f"zero{z}") for z in (0, 1)}
    assert all(r.status == "ok" for r in runs.values())
    for g in range(4):
        full, shard = (runs[z].metrics.memory.measured_per_rank[g]["optimizer"] for z in (0, 1))
        assert shard == pytest.approx(full / 2, rel=0.02)
    assert runs[1].metrics.losses == pytest.approx(runs[0].metrics.losses, rel=1e-5)
    c = config(pp=2, dp=2, microbatches=4, steps=2, zero=1, **{"optimizer.name": "adamw"})
    assert runs[1].metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)


@pytest.mark.dist
def test_a_point_over_the_budget_is_skipped_and_one_under_runs(tmp_path, config):
    small = make_plan(config(pp=2, microbatches=4))
    from harness.planning.memory_theory import theory_per_rank

    peak = max(r.peak for r in theory_per_rank(small)) / 2**30
    over = run_job(config(pp=2, microbatches=4, memory_budget_gib=peak / 2), tmp_path / "over", "test", "over")
    assert over.status == "skipped" and over.metrics is None
    assert over.error.startswith(f"memory_budget_gib={peak / 2}: theory puts rank ") and "activations" in over.error
    fits = run_job(config(pp=2, microbatches=4, memory_budget_gib=peak * 2), tmp_path / "fits", "test", "fits")
    assert fits.status == "ok" and fits.metrics.memory.budget.fits_per_rank == [True, True]
    assert all(h > 0 for h in fits.metrics.memory.budget.headroom_bytes_per_rank)


@pytest.mark.parametrize("overrides,expected", [
    ({"zero": 2}, "zero=2: unknown (allowed: 0, 1)"),
    ({"zero": 1}, "zero=1: shards optimizer state across data-parallel replicas, and dp=1 has none"),
    ({"memory_budget_gib": -1.0}, "memory_budget_gib=-1.0: must be a positive number of GiB"),
    ({"memory_budget_gib": float("nan")}, "memory_budget_gib=nan: must be a positive number of GiB"),
])
def test_bad_memory_input_is_one_line(config, overrides, expected):
    with pytest.raises(ConfigError) as err:
        make_plan(config(**overrides))
    assert str(err.value).startswith(expected) and "\n" not in str(err.value)
