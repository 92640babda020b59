"""The DGX presets (harness/conf/cluster/dgx_*.yaml): they load with their sources, their GPU is
the device table's (so MFU has a peak), and the simulator prices a plan on them: a ring
all-reduce over InfiniBand is slower than over NVLink by the links' ratio."""

from __future__ import annotations

import pytest

from harness.frontend.compose import compose_config
from harness.job import run_job
from harness.planning.devices import lookup, memory_bandwidth
from harness.records.result import read
from harness.simulate.links import allreduce_s

PRESETS = {"dgx_a100_80gb": ("NVIDIA A100 80GB", 300e9, 25e9, 2.039e12),
           "dgx_h100": ("NVIDIA H100 SXM", 450e9, 50e9, 3.35e12)}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_dgx_presets_load_with_their_sources_and_devices(name):
    device, nvlink, ib, hbm = PRESETS[name]
    cl = compose_config([f"cluster={name}", "cluster.nodes=4"]).cluster
    assert cl.source and cl.name == name and cl.gpus == 32
    assert (cl.intra.bandwidth_Bps, cl.inter.bandwidth_Bps, memory_bandwidth(cl)) == (nvlink, ib, hbm)
    assert cl.memory_bandwidth_Bps is None  # the device table's, not the preset's
    assert 64 * 2**30 < cl.usable_bytes < 80e9
    d = lookup(cl.gpu)
    assert d is not None and d.name == device and d.memory_bandwidth_Bps == hbm
    # 8 GPUs of one node all-reduce over NVLink; 8 GPUs one per node over InfiniBand
    one_node, across = allreduce_s(cl, 1e9, list(range(8))), allreduce_s(cl, 1e9, list(range(0, 32, 4)))
    assert across / one_node == pytest.approx(nvlink / ib, rel=0.05)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_a_plan_prices_on_a_dgx_preset(tmp_path, name):
    c = compose_config(["executor=sim", f"cluster={name}", "cluster.nodes=2", "model=gpt", "model.layers=8",
                        "model.hidden=256", "model.heads=4", "model.seq=128", "model.vocab=1024", "dtype=bf16",
                        "pp=4", "dp=4", "microbatches=8", "microbatch_size=2", "wandb.mode=disabled"])
    result = run_job(c, tmp_path, "test", name)
    assert result.status == "ok", result.error
    f = read(tmp_path / "result.json").metrics.flops
    assert f.device == PRESETS[name][0] and f.mfu is not None and f.mfu > 0


def test_tp_collectives_of_a_block_over_nvlink():
    """Per block and direction: 2 ring all-reduces of B x s x h (39.1B's h=8192, s=2048, B=1, bf16:
    32 MiB) over a DGX A100's NVLink at tp=8; sequence parallelism moves the same bytes."""
    from harness.simulate.pricing import tp_collectives_s

    link = compose_config(["cluster=dgx_a100_80gb"]).cluster.intra
    nbytes = 1 * 2048 * 8192 * 2
    ar = tp_collectives_s(8, 8192, 2048, 1, 2, link)
    assert ar == pytest.approx(2 * (14 * 10e-6 + 2 * 7 / 8 * nbytes / 300e9))
    sp = tp_collectives_s(8, 8192, 2048, 1, 2, link, sequence_parallel=True)
    assert sp == pytest.approx(ar) and tp_collectives_s(1, 8192, 2048, 1, 2, link) == 0.0
