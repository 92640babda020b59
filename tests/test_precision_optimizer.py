"""dist: dtype and optimizer, every executor against the single-process reference run in the
same precision with the same optimizer.

Tolerances fit each dtype: fp32 1e-5 relative (summation order only); bf16 (8 bits of
mantissa) 2e-2 and fp16 (11 bits) 2e-3, since the pipeline accumulates each microbatch's
gradient in the dtype where the reference computes the whole batch's at once."""

from __future__ import annotations

import pytest

from harness.job import run_job
from harness.measure.reference import reference_losses

pytestmark = pytest.mark.dist
TOLERANCE = {"fp32": 1e-5, "bf16": 2e-2, "fp16": 2e-3}


@pytest.mark.parametrize("dtype,optimizer,schedule,executor", [
    ("fp32", "adamw", "1f1b", "native"),
    ("bf16", "adamw", "1f1b", "native"),
    ("fp16", "sgd", "zb_h1", "native"),
    ("bf16", "adamw", "gpipe", "pytorch"),
])
def test_losses_equal_the_reference_in_each_precision(tmp_path, config, dtype, optimizer, schedule, executor):
    c = config(pp=2, microbatches=4, steps=2, dtype=dtype, executor=executor, verify_grads=executor == "native",
               **{"optimizer.name": optimizer, "schedule.name": schedule, "model.hidden": 64})
    result = run_job(c, tmp_path, "test", dtype)
    assert result.status == "ok", result.error
    losses = result.metrics.losses
    assert losses == pytest.approx(reference_losses(c)[0], rel=TOLERANCE[dtype])
    assert len(set(round(x, 4) for x in losses)) > 1  # the optimizer moved the model
    if executor == "native":
        assert result.metrics.grad_check.max_rel_diff < max(1e-5, 5 * TOLERANCE[dtype])
    measured = result.metrics.memory.measured_per_rank
    assert measured[0]["params"] == {"fp32": 4, "bf16": 2, "fp16": 2}[dtype] * sum(
        p for p in (64 * 64 + 64,) * 4)  # 4 layers of Linear(64, 64) per rank
    if optimizer == "adamw":  # its state exists, and is in the accounting
        assert measured[0]["optimizer"] >= 8 * 4 * (64 * 64 + 64)


def test_bad_precision_and_optimizer_input_is_one_line(config):
    from harness.config import ConfigError
    from harness.planning.plan import make_plan

    for overrides, expected in (({"dtype": "fp8"}, "dtype=fp8: unknown (allowed: fp32, bf16, fp16)"),
                                ({"optimizer.name": "lion"}, "optimizer=lion: unknown (allowed: sgd, adamw)"),
                                ({"optimizer.name": "adamw", "optimizer.betas": [0.9, 1.5]},
                                 "optimizer.betas=[0.9, 1.5]: must be two numbers"),
                                ({"optimizer.weight_decay": -1.0}, "optimizer.weight_decay=-1.0: must be a finite")):
        with pytest.raises(ConfigError) as err:
            make_plan(config(**overrides))
        assert str(err.value).startswith(expected) and "\n" not in str(err.value)
