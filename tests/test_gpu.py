"""gpu: CUDA end to end, skipped without a GPU. `make gpu-check` runs this file (-s) and
prints the figures a closing note needs.

- one GPU: pp=1 over NCCL (CUDA-event timing); every schedule at pp=2 with both ranks on
  the one GPU, exchanging through host memory over gloo (NCCL refuses two ranks on one
  device), against the single-process losses;
- two or more GPUs: every schedule at pp=2 over NCCL with the NCCL-safe transport (pp=4
  with four GPUs), against the single-process losses.
"""

from __future__ import annotations

import pytest
import torch

from harness.planning.devices import lookup
from harness.job import run_job
from harness.measure.reference import reference_losses

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(GPUS == 0, reason="needs a CUDA device")]


def _run(tmp_path, config, schedule: str, pp: int, **overrides):
    v = 2 if schedule == "interleaved_1f1b" else 1
    c = config(pp=pp, microbatches=2 * pp, virtual_stages=v, device="cuda", **{"schedule.name": schedule},
               **overrides)
    result = run_job(c, tmp_path, "gpu", schedule, cuda_devices=GPUS)
    assert result.status == "ok", result.error
    m = result.metrics
    assert m.losses == pytest.approx(reference_losses(c)[0], rel=1e-4)  # CPU reference, fp32
    print(f"\n[gpu] {schedule} pp={pp} {result.plan.backend} p2p={result.plan.p2p}: step "
          f"{m.step_time_s * 1e3:.2f} ms, bubble {m.bubble.measured:.3f} (theory {m.bubble.theory:.3f}), "
          f"hop {m.p2p_hop_s if m.p2p_hop_s is None else round(m.p2p_hop_s * 1e6)} us, "
          f"cuda max allocated {m.memory.cuda_max_memory_allocated_per_rank}")
    return result


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_cuda_pp1_end_to_end(tmp_path, config, schedule):
    result = _run(tmp_path, config, schedule, 1, **{"model.hidden": 1024})
    assert result.env.device == "cuda" and result.plan.backend == "nccl"
    assert result.metrics.bubble.measured < 0.5  # one stage: only launch gaps
    assert result.metrics.memory.cuda_max_memory_allocated_per_rank[0] > 0
    f = result.metrics.flops  # a listed GPU (harness/planning/devices.py) gets MFU; fp32 against its CUDA-core peak
    print(f"[gpu] {result.env.device_name}: {f.tflops_per_device:.3g} TFLOP/s, MFU {f.mfu}, {f.note}")
    if lookup(result.env.device_name) is not None:
        assert f.device is not None and 0 < f.mfu <= 1 and f.hfu == f.mfu
    else:
        assert f.mfu is None and "not in harness/planning/devices.py" in f.note


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_ranks_sharing_one_gpu_exchange_through_host(tmp_path, config, schedule):
    if GPUS >= 2:
        pytest.skip("several GPUs: NCCL runs instead (below)")
    assert _run(tmp_path, config, schedule, 2).plan.backend == "gloo"


@pytest.mark.parametrize("pp", [2, 4])
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_over_nccl(tmp_path, config, schedule, pp):
    if GPUS < pp:
        pytest.skip(f"needs {pp} CUDA devices (found {GPUS})")
    result = _run(tmp_path, config, schedule, pp)
    assert (result.plan.backend, result.plan.p2p) == ("nccl", "safe")
