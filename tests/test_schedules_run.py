"""dist: every schedule runs for real and reproduces the single-process reference:
losses of every step (1e-5 relative, fp32) and the accumulated gradients (verify_grads)."""

from __future__ import annotations

import pytest

from harness.job import run_job
from harness.reference import reference_losses
from harness.schedules.builders import requirements

pytestmark = pytest.mark.dist

CASES = [(s, pp, m) for s in ("interleaved_1f1b", "zb_h1", "zbv", "dualpipev") for pp in (2, 4) for m in (4, 8)]


@pytest.mark.parametrize("schedule,pp,m", CASES)
def test_schedule_matches_single_process_reference(tmp_path, config, schedule, pp, m):
    v = 2 if schedule == "interleaved_1f1b" else 1
    if requirements(schedule, pp, m, v):
        pytest.skip(requirements(schedule, pp, m, v))
    c = config(pp=pp, microbatches=m, virtual_stages=v, steps=2, verify_grads=True, **{"schedule.name": schedule})
    result = run_job(c, tmp_path, "test", schedule)
    assert result["status"] == "ok", result["error"]
    metrics = result["metrics"]
    assert metrics["losses"] == pytest.approx(reference_losses(c)[0], rel=1e-5)
    assert metrics["grad_check"]["max_rel_diff"] < 1e-5, metrics["grad_check"]
    if schedule in ("zb_h1", "zbv", "dualpipev"):  # the backward really was split
        assert metrics["mean_op_s"].get("I") and metrics["mean_op_s"].get("W")
