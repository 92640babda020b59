"""Llama 3 405B's pre-training rows (arXiv:2407.21783 Table 4, H100 BF16) reproduced by
executor=sim (tools/llama3.py, issue 37): the Hopper twin of tests/test_sc21.py. The 8,192-GPU
row is the one Hopper calibration (devices.py's GEMM share), the 16,384-GPU row its check."""

from __future__ import annotations

import pytest

from harness.planning.devices import lookup
from tools import llama3

CALIBRATION, CHECK = llama3.ROWS


@pytest.fixture(scope="module")
def cm():
    return llama3.compute_model()


@pytest.mark.slow  # ~5-8 s on the 2-core VM: the 405B's layers built on meta (make_plan's size checks, the profile)
def test_the_check_row_is_within_15_percent(cm, tmp_path):
    """The row the calibration was not set on: 400 TFLOP/s per GPU on 16,384 H100s."""
    x = llama3.reproduce(CHECK, cm, tmp_path)
    assert abs(x.ratio - 1) <= llama3.TOLERANCE, (x.ratio, x.parts)
    # the harness's own MFU (flops.py, the Megatron/PaLM convention) is the tool's count within 1%
    assert x.harness_mfu == pytest.approx(x.tflops * 1e12 / lookup(llama3.DEVICE).peak_bf16, rel=0.01)
    # fewer microbatches per DP than the calibration row: the bubble and the DP sync weigh more
    assert x.parts["pipeline_bubble_and_hops"] / x.step_s > 0.1


@pytest.mark.slow  # as above
def test_the_calibration_row_is_what_devices_py_says(cm, tmp_path):
    """devices.py's Hopper share (0.57) is the one that reproduces the 8,192-GPU row: within 2%."""
    x = llama3.reproduce(CALIBRATION, cm, tmp_path)
    assert x.ratio == pytest.approx(1.0, abs=0.02), x.parts
    assert lookup(llama3.DEVICE).sustained == lookup("NVIDIA H200").sustained == 0.57
    y = llama3.reproduce(CHECK, cm, tmp_path)
    # the published rows fall 430 -> 400 from 32 to 16 microbatches; the prediction falls with them
    assert y.tflops < x.tflops


def test_the_hopper_share_is_one_stated_calibration():
    """The cheap sibling of the two above (default suite): every Hopper entry carries the one
    calibrated share, its source names the row it came from; Ampere is untouched."""
    from harness.planning.devices import DEVICES

    hopper = [d for d in DEVICES if d.name.startswith(("NVIDIA H1", "NVIDIA H2", "NVIDIA GH"))]
    assert len(hopper) == 6 and {d.sustained for d in hopper} == {0.57}
    assert all(d.sustained_source.startswith("CALIBRATED") and "8,192 H100s" in d.sustained_source for d in hopper)
    assert lookup("NVIDIA A100-SXM4-80GB").sustained == 0.73


def test_rows_are_the_published_configurations():
    for r in llama3.ROWS:
        assert r.gpus == llama3.TP * llama3.PP * r.dp and r.dp * r.batch_per_dp * llama3.SEQ == 16 * 2 ** 20
        assert r.batch_per_dp % llama3.PP == 0  # Megatron's interleaving: M a multiple of pp
    assert [(r.gpus, r.dp, r.published_tflops) for r in llama3.ROWS] == [(8192, 64, 430), (16384, 128, 400)]
    # 126 blocks + embedding + head in 16 x 8 one-slot chunks: the first holds only the embedding,
    # the last only the head (the paper's first and last stages one layer fewer)
    assert llama3.stages() == [1] * 128


def test_flops_are_the_mfu_convention():
    """6 N a token + causal attention's whole s^2 term (12 l s d a token); 430 TFLOP/s per GPU is the
    published 43% of 989."""
    n = 405_000_000_000
    per_token = llama3.paper_flops(CALIBRATION, n) / (64 * 32 * 8192)
    assert per_token == pytest.approx(6 * n + 12 * 126 * 8192 * 16384)
    assert CALIBRATION.published_tflops / 989 == pytest.approx(CALIBRATION.published_mfu, abs=0.005)
