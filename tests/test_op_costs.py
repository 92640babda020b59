"""Compute priced per operation (harness/planning/op_costs.py): a block's operations from its
shape (their FLOPs are the model's closed form), TP's split of the GEMMs (column parallel
divides n, row parallel k) and what it does to their rate, the GEMM roofline's efficiency
rising with the smallest dimension toward the sustained share and never past it, attention at
the published FlashAttention rates, memory-bound work at the bandwidth share."""

from __future__ import annotations

import pytest

from harness.config import model_config
from harness.model import get_model
from harness.planning.devices import lookup
from harness.planning.op_costs import Rates, Shape, block_ops, head_ops

H100, H200, A100 = lookup("NVIDIA H100 80GB HBM3"), lookup("NVIDIA H200"), lookup("NVIDIA A100-SXM4-80GB")
LLAMA = dict(name="hf", arch="llama", layers=2, hidden=1024, heads=16, kv_heads=4, ffn=2816, vocab=4096, seq=512)
GPT2 = dict(name="hf", arch="gpt2", layers=2, hidden=768, heads=12, vocab=4096, seq=256)


def _shape(kw: dict, tp: int = 1) -> Shape:
    return Shape(kw["seq"], kw["hidden"], kw["heads"], kw.get("kv_heads") or kw["heads"],
                 kw.get("ffn") or 4 * kw["hidden"], kw["vocab"], kw["arch"] == "llama", 2, tp)


@pytest.mark.parametrize("kw", [LLAMA, GPT2], ids=["llama", "gpt2"])
def test_a_blocks_operations_run_the_models_closed_form_flops(kw):
    """The GEMMs and the causal attention of a block's forward add up to HFModel.fwd_flops;
    a backward runs twice the GEMM FLOPs (input and weight gradients) and 2.5 x the attention's
    (FlashAttention's count); at tp the GEMM and attention FLOPs divide by tp."""
    m, b = get_model(model_config(**kw)), 3
    fwd = block_ops(_shape(kw), b, "fwd")
    assert sum(o.flops for o in fwd if o.cls in ("gemm", "attention")) == pytest.approx(m.fwd_flops(1, b))
    bwd = block_ops(_shape(kw), b, "bwd")
    gemm = lambda ops: sum(o.flops for o in ops if o.cls == "gemm")  # noqa: E731
    att = lambda ops: sum(o.flops for o in ops if o.cls == "attention")  # noqa: E731
    assert gemm(bwd) == pytest.approx(2 * gemm(fwd)) and att(bwd) == pytest.approx(2.5 * att(fwd))
    split = block_ops(_shape(kw, tp=4), b, "fwd")
    assert gemm(split) == pytest.approx(gemm(fwd) / 4) and att(split) == pytest.approx(att(fwd) / 4)


def test_tp_splits_column_parallel_n_and_row_parallel_k():
    full = {o.name: o.mnk for o in block_ops(_shape(LLAMA), 1, "fwd") if o.cls == "gemm"}
    tp4 = {o.name: o.mnk for o in block_ops(_shape(LLAMA, tp=4), 1, "fwd") if o.cls == "gemm"}
    assert full["qkv"] == (512, (16 + 8) * 64, 1024) and tp4["qkv"] == (512, (16 + 8) * 64 // 4, 1024)
    assert full["mlp_in"] == (512, 2 * 2816, 1024) and tp4["mlp_in"] == (512, 2 * 2816 // 4, 1024)
    assert tp4["attn_out"] == (512, 1024, 1024 // 4) and tp4["mlp_out"] == (512, 1024, 2816 // 4)
    # norms and residual adds stay whole on every TP rank unless sequence parallelism shards them
    mem = lambda ops: {o.name: o.bytes for o in ops if o.cls == "memory"}  # noqa: E731
    assert mem(block_ops(_shape(LLAMA, tp=4), 1, "fwd"))["norms"] == mem(block_ops(_shape(LLAMA), 1, "fwd"))["norms"]


@pytest.mark.parametrize("device", [H200, A100], ids=["h200", "a100"])
def test_gemm_efficiency_rises_with_the_smallest_dimension_toward_the_sustained_share(device):
    r = Rates(device, "bf16", device.sustained)
    eff = []
    for x in (16, 64, 256, 1024, 4096, 16384):
        m, n, k = 8192, 8192, x
        eff.append(2 * m * n * k / r.gemm_s(m, n, k, 2 * (m * k + k * n + m * n)) / r.peak)
    assert eff == sorted(eff) and eff[0] < 0.2 * device.sustained
    assert eff[-1] == pytest.approx(device.sustained) and max(eff) <= device.sustained * (1 + 1e-12)
    # fewer output tiles than SMs: idle SMs (a 256 x 256 output is 4 tiles of 128 x 128)
    small = 2 * 256 * 256 * 65536 / r.gemm_s(256, 256, 65536, 0) / r.peak
    assert small == pytest.approx(device.sustained * 4 / device.sms)


def test_tp_slows_a_blocks_gemms_and_the_block():
    """A 4096-wide block at B=1, s=1024: at tp=8 its GEMMs run further from peak."""
    kw = dict(LLAMA, hidden=4096, heads=32, kv_heads=8, ffn=11008, seq=1024)
    r = Rates(H100, "bf16", 0.75)
    eff = {}
    for tp in (1, 8):
        ops = [o for o in block_ops(_shape(kw, tp), 1, "fwd") if o.cls == "gemm"]
        eff[tp] = sum(o.flops for o in ops) / sum(r.op_s(o, 1024, "fwd") for o in ops) / r.peak
    assert eff[8] < eff[1] <= 0.75


def test_attention_at_flashattentions_published_rates():
    r = Rates(H100, "bf16", 0.75)
    assert r.attention_flops_per_s(4096, "fwd") == 579e12 and r.attention_flops_per_s(4096, "bwd") == 542e12
    assert r.attention_flops_per_s(100, "fwd") == 292e12 and r.attention_flops_per_s(1 << 20, "fwd") == 616e12
    between = r.attention_flops_per_s(3000, "fwd")
    assert 521e12 < between < 579e12
    a = Rates(A100, "bf16", 0.73)
    assert a.attention_flops_per_s(16384, "fwd") == pytest.approx(0.73 * 312e12)
    assert a.attention_flops_per_s(16384, "bwd") == pytest.approx(0.63 * 312e12)
    assert A100.attention.derived and not H100.attention.derived and H200.attention.derived


def test_memory_bound_work_at_the_bandwidth_share_and_the_head():
    r = Rates(H200, "bf16", 0.75)
    ops = head_ops(_shape(LLAMA), 2, "fwd")
    ce = next(o for o in ops if o.name == "cross_entropy")
    assert r.op_s(ce, 512, "fwd") == pytest.approx(ce.bytes / (0.8 * 4.8e12))
    assert ce.bytes == (2 + 12) * 2 * 512 * 4096
    described = r.describe(4096)
    assert set(described) == {"gemm", "attention", "memory"} and all("derived" in v for v in described.values())
