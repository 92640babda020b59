"""FLOPs, TFLOP/s, MFU and HFU (harness/planning/flops.py): the closed form against torch's FLOP
counter, per step with and without recompute, and in records and headlines."""

from __future__ import annotations

import json

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from harness.frontend.compose import compose_config
from harness.config import model_config
from harness.planning.devices import lookup
from harness.planning.flops import step_flops
from harness.job import run_job
from harness.model import get_model
from harness.planning.plan import make_plan
from harness.records.result import read

MODELS = [dict(name="mlp", layers=3, hidden=24),
          dict(name="gpt", layers=2, hidden=32, heads=2, seq=16, vocab=64),
          dict(name="hf", arch="llama", layers=2, hidden=32, heads=4, kv_heads=2, ffn=64, vocab=64, seq=16),
          dict(name="hf", arch="gpt2", layers=2, hidden=32, heads=4, vocab=64, seq=16)]


@pytest.mark.parametrize("kw", MODELS, ids=lambda kw: kw.get("arch", kw["name"]))
def test_closed_form_equals_torchs_flop_counter(kw):
    """Every layer's Model.fwd_flops against FlopCounterMode on one microbatch. Attention runs
    through the math kernel, which the counter sees as two full matmuls: the closed form counts
    the causal half (as causal kernels compute it), so a block differs by exactly 2 B T^2 d."""
    m, b = get_model(model_config(**kw)), 3
    for i in range(m.num_layers):
        layer = m.build_layer(i)
        if i == 0:
            x, _ = m.batch(0, 0, b)
        else:
            shape, _ = m.input_shape(i, b)
            x = torch.randn(shape)
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            layer(x)
        causal_half = 2 * b * kw["seq"] ** 2 * kw["hidden"] if m.kind(i) == "block" else 0
        assert counter.get_total_flops() == m.fwd_flops(i, b) + causal_half


def test_step_flops_three_forwards_and_one_more_with_checkpointing():
    keys = ["model=gpt", "model.layers=2", "model.hidden=32", "model.heads=2", "model.seq=16", "model.vocab=64",
            "pp=2", "dp=2", "microbatches=4", "microbatch_size=3", "executor=sim"]
    plan = make_plan(compose_config(keys), 0)
    m = plan.model.model
    causal = sum(m.fwd_flops(i, 3) for i in range(m.num_layers))
    fwd = causal + 2 * 2 * 3 * 16 ** 2 * 32  # the causal half of attention again, in each of 2 blocks
    f = step_flops(plan)
    assert f.model == f.hardware == 3 * fwd * 4 * 2 and f.model_causal == 3 * causal * 4 * 2
    assert step_flops(make_plan(compose_config(keys + ["checkpointing=true"]), 0)).hardware == 4 * fwd * 4 * 2


@pytest.mark.parametrize("kw", [dict(name="gpt", layers=96, hidden=12288, heads=96, seq=2048, vocab=51200),
                                dict(name="hf", arch="gpt2", layers=96, hidden=12288, heads=96, seq=2048, vocab=51200)],
                         ids=["gpt", "hf-gpt2"])
def test_model_flops_are_megatrons_and_palms_on_gpt3_175b(kw):
    """GPT-3 175B's shape (Brown et al. 2020, Table 2.1). Megatron-LM (Narayanan et al., SC21,
    appendix): with full recompute a step is 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs,
    i.e. model FLOPs (no recompute: 3 passes) 72 B s l h^2 (1 + s/(6h) + V/(12 l h)). PaLM
    (Chowdhery et al. 2022, appendix B): 6N + 12 L H Q T per token, N the non-embedding
    parameters here (the head's matmul is Megatron's V term; PaLM ties it to the embedding)."""
    from harness.planning.flops import uncounted_attention_flops

    m, b = get_model(model_config(**kw)), 2
    L, h, s, V = 96, 12288, 2048, 51200
    fwd = sum(m.fwd_flops(i, b) + uncounted_attention_flops(m, i, b) for i in range(m.num_layers))
    assert 3 * fwd == pytest.approx(72 * b * s * L * h ** 2 * (1 + s / (6 * h) + V / (12 * L * h)), rel=1e-12)
    head = 2 * b * s * h * V
    blocks = 12 * L * h ** 2  # a block's matmul parameters (biases and norms aside)
    assert 3 * (fwd - head) == pytest.approx(6 * blocks * b * s + 12 * L * h * s * b * s, rel=1e-12)
    # the older count: the causal half of the s^2 term, 1-7% below for such shapes
    causal = sum(m.fwd_flops(i, b) for i in range(m.num_layers))
    assert 3 * causal == pytest.approx(72 * b * s * L * h ** 2 * (1 + s / (12 * h) + V / (12 * L * h)), rel=1e-12)


def test_a_simulated_h200_run_records_mfu_and_hfu(tmp_path):
    c = compose_config(["executor=sim", "cluster=h200_node", "model=gpt", "model.layers=12", "model.hidden=768",
                        "model.heads=12", "model.seq=1024", "model.vocab=50257", "dtype=bf16", "pp=4",
                        "microbatches=8", "microbatch_size=4", "checkpointing=true", "profile=data/gpt2_h200_profile.json",
                        "partition=profile", "wandb.mode=disabled"])
    result = run_job(c, tmp_path, "test", "mfu")
    assert result.status == "ok", result.error
    f = read(tmp_path / "result.json").metrics.flops
    peak = lookup("NVIDIA H200").peak_flops("bf16")
    assert f.device == "NVIDIA H200 SXM" and f.peak_tflops_per_device == pytest.approx(peak / 1e12)
    per_device = f.model_per_step / result.metrics.step_time_s / 4
    assert f.tflops_per_device == pytest.approx(per_device / 1e12)
    assert f.mfu == pytest.approx(per_device / peak) and f.hfu == pytest.approx(f.mfu * 4 / 3)
    assert f.convention == "megatron" and f.model_per_step_causal < f.model_per_step
    assert f"MFU {f.mfu:.1%}" in result.headline()
    summary = json.loads((tmp_path / "result.json").read_text())["metrics"]["flops"]
    assert summary["mfu"] == pytest.approx(f.mfu)


def test_memory_bandwidth_comes_from_the_device_table_unless_the_cluster_measured_its_own():
    """One home for a device's bandwidth: the GPU presets read the table; cluster=here (a CPU,
    which the table does not list) gives its measured figure; a GPU the table lacks, with no
    figure, is refused in one line naming the key and what is allowed."""
    from harness.config import ConfigError
    from harness.planning.checks import validate
    from harness.planning.devices import memory_bandwidth

    h200 = compose_config(["cluster=h200_node"]).cluster
    assert h200.memory_bandwidth_Bps is None and memory_bandwidth(h200) == lookup("NVIDIA H200").memory_bandwidth_Bps
    here = compose_config(["cluster=here"]).cluster
    assert memory_bandwidth(here) == here.memory_bandwidth_Bps > 0
    odd = compose_config(["cluster=h200_node", "cluster.gpu=Imaginary X1", "executor=sim"])
    with pytest.raises(ConfigError) as e:
        validate(odd)
    assert str(e.value).startswith("cluster.gpu='Imaginary X1': not in the device table") and "\n" not in str(e.value)
    odd.cluster.memory_bandwidth_Bps = 2e12  # a figure of its own: used
    assert memory_bandwidth(odd.cluster) == 2e12
