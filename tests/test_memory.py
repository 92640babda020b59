"""dist: activation memory measured per rank, checkpointing, and the gradient proof."""

from __future__ import annotations

import json

import pytest

from harness.job import run_job

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("compute", ["real", "emulated"])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_peak_activations_follow_the_schedule(tmp_path, config, schedule, compute):
    """GPipe holds all M microbatches on every rank; 1F1B at most min(M, N - rank)."""
    c = config(pp=4, microbatches=8, compute=compute, steps=1, **{"schedule.name": schedule,
               "cost.fwd_ms_per_layer": 0.5})
    result = run_job(c, tmp_path, "test", "memory")
    assert result.status == "ok", result.error
    mem = result.metrics.memory
    want = [8] * 4 if schedule == "gpipe" else [4, 3, 2, 1]
    assert mem.theory_peak_microbatches_per_rank == want
    for rank in range(4):
        predicted = want[rank] * mem.activation_bytes_per_microbatch_per_rank[rank]
        assert mem.peak_activation_bytes_per_rank[rank] == pytest.approx(predicted, rel=0.05), rank
    counters = [e for e in json.loads((tmp_path / "trace.json").read_text())["traceEvents"] if e["ph"] == "C"]
    assert {e["tid"] for e in counters} == {0, 1, 2, 3}  # a memory track per rank
    assert max(e["args"]["MiB"] for e in counters if e["tid"] == 0) * 2**20 == pytest.approx(
        mem.peak_activation_bytes_per_rank[0])


def test_checkpointing_halves_memory_keeps_losses_and_traces_recompute(tmp_path, config):
    base = dict(pp=2, microbatches=4, **{"model.layers": 8, "schedule.name": "1f1b"})  # 4 layers per stage
    plain = run_job(config(**base), tmp_path / "plain", "test", "plain")
    ckpt = run_job(config(checkpointing=True, **base), tmp_path / "ckpt", "test", "ckpt")
    assert plain.status == ckpt.status == "ok"
    for rank in range(2):
        assert (ckpt.metrics.memory.peak_activation_bytes_per_rank[rank]
                <= 0.5 * plain.metrics.memory.peak_activation_bytes_per_rank[rank])
    assert ckpt.metrics.losses == pytest.approx(plain.metrics.losses, rel=1e-6)
    assert ckpt.metrics.recompute_s > 0 and plain.metrics.recompute_s == 0
    events = json.loads((tmp_path / "ckpt" / "trace.json").read_text())["traceEvents"]
    assert any(e["name"] == "0R0" for e in events)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_accumulated_gradients_equal_the_full_batch_gradient(tmp_path, config, schedule):
    c = config(pp=4, microbatches=4, verify_grads=True, steps=1, **{"schedule.name": schedule})
    result = run_job(c, tmp_path, "test", "grads")
    check = result.metrics.grad_check
    assert check.params == 16 and check.max_rel_diff < 1e-5, check


def test_broken_accumulation_is_caught(tmp_path, config):
    """run.fault=noaccum keeps only the last microbatch's gradient on rank 1: verify_grads sees it,
    and the job fails with the figure in its error."""
    c = config(pp=2, microbatches=4, verify_grads=True, steps=1, warmup_steps=0, **{"run.fault": "noaccum@rank1,step0"})
    result = run_job(c, tmp_path, "test", "broken")
    check = result.metrics.grad_check
    assert check.max_rel_diff > 0.1 and check.tolerance == 1e-4
    assert check.worst_param.split(".")[0] in {"4", "5", "6", "7"}  # a layer of rank 1's stage
    assert result.status == "failed" and f"by {check.max_rel_diff:.3g}" in result.error
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "failed"


def test_a_diverged_run_is_recorded_as_such_and_read_back(tmp_path, config):
    """lr=1e30: the loss goes non-finite; the record says diverged, its losses null from there
    (strict JSON), its timings measured, and it reads back (not corrupt)."""
    from harness.records.result import read

    result = run_job(config(pp=2, microbatches=2, steps=2, lr=1e30), tmp_path, "test", "diverged")
    assert result.status == "diverged" and "not finite from step 1" in result.error
    back = read(tmp_path / "result.json")
    assert back.status == "diverged" and back.metrics.losses[0] is not None and None in back.metrics.losses
    assert back.metrics.step_time_s > 0
