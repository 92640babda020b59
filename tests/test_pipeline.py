"""dist: real gloo multi-process runs against the single-process full-batch reference."""

from __future__ import annotations

import json

import pytest

from harness.job import run_job
from harness.measure.reference import reference_losses
from tests.jitter import bubble_allowance, oversleep
from tests.test_trace_json import check_trace

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_losses_equal_single_process_reference(tmp_path, config, schedule, pp):
    c = config(pp=pp, microbatches=4, microbatch_size=3, compute="real", **{"schedule.name": schedule})
    result = run_job(c, tmp_path, "test", "equal")
    assert result.status == "ok", result.error
    got = result.metrics.losses
    want, _ = reference_losses(c)
    assert len(got) == c.warmup_steps + c.steps
    assert got == pytest.approx(want, rel=1e-5)
    assert len(set(round(x, 6) for x in got)) > 1  # SGD moved the model: later steps were checked too
    on_disk = json.loads((tmp_path / "result.json").read_text())
    assert on_disk["metrics"]["losses"] == got
    for name in ("trace.json", "gantt.png"):
        assert (tmp_path / name).stat().st_size > 0
    # a real run's trace: whole-ns timestamps, no two slices of a track overlapping, every flow
    # forward in time (tests/test_trace_json.py check_trace), one per message between ranks
    found = check_trace(json.loads((tmp_path / "trace.json").read_text()))
    assert len(found["flows"]) == 2 * (pp - 1) * c.microbatches * (c.warmup_steps + c.steps)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_emulated_bubble_matches_closed_form(tmp_path, config, schedule):
    """Equal stages of 40 ms forward, 80 ms backward, pp=4, M=8: (N-1)/(M+N-1) = 3/11.
    (Each hop costs ~0.5-1 ms here and lies on the critical path M + N - 1 times, so
    shorter stages measure a larger bubble: the simulator's figure shows how much.)
    Within 0.03 on a quiet machine (seen: 0.02), plus what the run's own oversleep says a
    busy machine adds (tests/jitter.py: two `yes` beside it moved the bubble to 0.34-0.41
    with actions 9-14% over their sleep); a runtime that serialized the stages (3/4) fails."""
    c = config(pp=4, microbatches=8, compute="emulated", steps=2, **{"schedule.name": schedule,
               "cost.fwd_ms_per_layer": 20.0, "model.layers": 8})
    result = run_job(c, tmp_path, "test", "bubble")
    assert result.status == "ok", result.error
    b = result.metrics.bubble
    assert b.theory == pytest.approx(3 / 11)
    share = oversleep(c, result.metrics)
    allowed = bubble_allowance(0.03, 3 / 11, share)
    assert abs(b.measured - 3 / 11) < allowed, (b, f"oversleep {share:.3f}, allowed {allowed:.3f}")
    assert len(b.measured_per_rank) == 4
    assert abs(b.simulated - 3 / 11) < allowed, (b, f"oversleep {share:.3f}, allowed {allowed:.3f}")
    # every rank computed for real: 8 F and 8 B per measured step
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    for rank in range(4):
        names = [e["name"] for e in trace if e.get("tid") == rank and e.get("cat") == "compute"
                 and e["args"]["step"] == c.warmup_steps]
        assert sum(n[1] == "F" for n in names) == 8 and sum(n[1] == "B" for n in names) == 8


@pytest.mark.parametrize("fault", ["raise@rank1,step1", "kill@rank0,step2", "hang@rank1,step0"])
def test_a_failing_rank_fails_the_job_and_leaves_no_process(tmp_path, config, fault):
    """A rank that raises, dies or hangs: the job records `failed` naming the rank, and no
    worker process outlives it."""
    import multiprocessing

    c = config(pp=2, microbatches=2, **{"run.fault": fault, "run.timeout_s": 3.0 if fault.startswith("hang") else 60.0})
    result = run_job(c, tmp_path, "test", "fault")
    assert result.status == "failed"
    assert result.error.startswith("rank ") or "run.timeout_s" in result.error, result.error
    if fault.startswith("hang"):  # the rank that hung, not every rank (the other waits for it)
        assert "rank 1 stopped: it never started step 0" in result.error, result.error
    assert json.loads((tmp_path / "result.json").read_text())["status"] == "failed"
    assert multiprocessing.active_children() == []
