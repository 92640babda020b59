"""dist: every schedule runs for real and reproduces the single-process reference:
losses of every step (1e-5 relative, fp32) and the accumulated gradients (verify_grads)."""

from __future__ import annotations

import pytest

from harness.job import run_job
from harness.measure.reference import reference_losses
from harness.schedules.registry import requirements

pytestmark = pytest.mark.dist

CASES = [(s, pp, m) for s in ("interleaved_1f1b", "zb_h1", "zbv", "dualpipev") for pp in (2, 4) for m in (4, 8)] + [
    ("zb_h2", 4, 8)]


@pytest.mark.parametrize("schedule,pp,m", CASES)
def test_schedule_matches_single_process_reference(tmp_path, config, schedule, pp, m):
    v = 2 if schedule == "interleaved_1f1b" else 1
    if requirements(schedule, pp, m, v):
        pytest.skip(requirements(schedule, pp, m, v))
    c = config(pp=pp, microbatches=m, virtual_stages=v, steps=2, verify_grads=True, **{"schedule.name": schedule})
    result = run_job(c, tmp_path, "test", schedule)
    assert result.status == "ok", result.error
    metrics = result.metrics
    assert metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
    assert metrics.grad_check.max_rel_diff < 1e-5, metrics.grad_check
    if schedule in ("zb_h1", "zb_h2", "zbv", "dualpipev"):  # the backward really was split
        assert metrics.mean_op_s.get("I") and metrics.mean_op_s.get("W")


FIFO_CASES = [(s, pp) for s in ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev") for pp in (2, 4)] + [
    pytest.param("zb_h2", 4, marks=pytest.mark.slow)]


@pytest.mark.parametrize("schedule,pp", FIFO_CASES)
def test_nccl_safe_transport_in_fifo_mode_matches_single_process(tmp_path, config, schedule, pp):
    """p2p=safe with one tag for every message: gloo then matches each edge's messages in
    posting order, as NCCL does, so this proves the NCCL-safe transport's matching on CPU."""
    m, v = 2 * pp, 2 if schedule == "interleaved_1f1b" else 1
    c = config(pp=pp, microbatches=m, virtual_stages=v, steps=2, p2p="safe", p2p_single_tag=True,
               **{"schedule.name": schedule})
    result = run_job(c, tmp_path, "test", schedule)
    assert result.status == "ok", result.error
    assert result.plan.p2p == "safe"
    assert result.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5)
