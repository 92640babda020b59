"""gpu: device=cuda end to end at pp=1 (one GPU holds the stage), CUDA-event timing."""

from __future__ import annotations

import pytest
import torch

from harness.job import run_job
from harness.reference import reference_losses

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_cuda_pp1_end_to_end(tmp_path, config, schedule):
    c = config(pp=1, microbatches=4, device="cuda", **{"schedule.name": schedule, "model.hidden": 1024})
    result = run_job(c, tmp_path, "gpu", schedule, cuda_devices=torch.cuda.device_count())
    assert result["status"] == "ok", result["error"]
    assert result["env"]["device"] == "cuda" and result["plan"]["backend"] == "nccl"
    m = result["metrics"]
    want, _ = reference_losses(c)  # CPU reference, fp32
    assert m["losses"] == pytest.approx(want, rel=1e-4)
    assert m["bubble"]["measured"] < 0.5  # one stage: only launch gaps
    assert m["memory"]["cuda_max_memory_allocated_per_stage"][0] > 0
    print(f"\n{schedule}: step {m['step_time_s'] * 1e3:.2f} ms, bubble {m['bubble']['measured']:.4f}, "
          f"{m['throughput_samples_s']:.0f} samples/s, mean ops {m['mean_op_s']}")
