"""tp= wired into a run (issue 36): the layout of pp x dp x tp ranks, what a tp run refuses
before any worker, the exports' TP flags, and (dist) whole runs at tp=2 whose losses and
gradients equal the single-process full batch (verify_grads): natively the zero-bubble I/W
split with sequence parallelism and pp=2 x dp=2 x tp=2 (8 processes, emulated compute);
executor=pytorch's PipelineStage on the TP-parallelized stages.

The layer-level equality of tp=2 with tp=1 (every model, style and backward) is
tests/test_tensor_parallel.py's; here the runner, the groups and the records around it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from harness.config import ConfigError
from harness.job import run_job
from harness.measure.reference import reference_losses
from harness.planning.plan import make_plan
from harness.runtime.groups import Layout
from tests.test_tp_memory import assert_memory_is_theory
from tests.conftest import megatron_runnable_rank

ROOT = Path(__file__).resolve().parents[1]
GPT = {"model.name": "gpt", "model.layers": 2, "model.hidden": 32, "model.heads": 4, "model.seq": 8,
       "model.vocab": 64}


# -- the layout: pure ---------------------------------------------------------------------------

@pytest.mark.parametrize("placement", ["pp_inner", "dp_inner"])
def test_layout_puts_a_tp_group_on_consecutive_slots_and_keeps_tp1_numbering(placement):
    layout = Layout(pp=2, dp=3, tp=2)
    slots = [layout.slot(r, placement) for r in range(12)]
    assert sorted(slots) == list(range(12))
    assert all(layout.rank_of_slot(layout.slot(r, placement), placement) == r for r in range(12))
    for r in range(0, 12, 2):  # a TP group: one stage and replica, consecutive slots
        assert (layout.pipeline_rank(r), layout.replica(r)) == (layout.pipeline_rank(r + 1), layout.replica(r + 1))
        assert slots[r + 1] == slots[r] + 1
    assert (layout.replica(11), layout.pipeline_rank(11), layout.tp_rank(11)) == (2, 1, 1)
    assert layout.global_rank(2, 1, 1) == 11
    flat = Layout(pp=2, dp=3)  # tp=1: as before tensor parallelism
    before = [r if placement == "pp_inner" else r % 2 * 3 + r // 2 for r in range(6)]  # pipeline rank * dp + replica
    assert [flat.slot(r, placement) for r in range(6)] == before


# -- refused before any worker: one line ----------------------------------------------------------

@pytest.mark.parametrize("keys, line", [
    ({**GPT, "tp": 3}, "model.heads=4: tp=3 must divide it"),
    ({**GPT, "tp": 2, "model.seq": 7, "sequence_parallel": True}, "model.seq=7: tp=2 must divide it"),
    ({**GPT, "sequence_parallel": True}, "sequence_parallel=true: needs tp > 1"),
    ({**GPT, "tp": 4, "pp": 2, "dp": 2, "run.max_processes": 8}, "pp=2 x dp=2 x tp=4: 16 processes on this machine"),
    ({"tp": 0}, "tp=0: must be"),
])
def test_a_tp_run_that_cannot_run_is_one_line_before_any_worker(config, keys, line):
    c = config(**{"pp": 2, **keys})
    with pytest.raises(ConfigError) as e:
        make_plan(c)
    assert str(e.value).startswith(line) and "\n" not in str(e.value)


def test_a_tp_plan_counts_every_rank_and_says_whose_figures_it_keeps(config):
    plan = make_plan(config(pp=2, dp=2, tp=2, **GPT))
    assert plan.world == 8
    assert any(n.startswith("tp=2: the memory theory per rank and the measured figures are tp rank 0's") for n in plan.notes)


# -- exports ----------------------------------------------------------------------------------------

def test_exports_carry_tp_and_sequence_parallel():
    from harness.export import megatron, torchtitan
    from harness.export.point import load

    advice = ROOT / "reports" / "advise_example" / "advice.json"
    p = replace(load(f"{advice}#{megatron_runnable_rank(advice)}"), tp=2, sequence_parallel=True)
    text = megatron.render(p).text()
    assert "--tensor-model-parallel-size 2" in text and "--sequence-parallel" in text
    assert f"= {p.world} / (2 x {p.point.pp})" in text.replace("\n#   ", " ")
    off = torchtitan.render(replace(p, sequence_parallel=False), "s.csv").script.text()
    assert "--parallelism.tensor_parallel_degree 2" in off and "--parallelism.no-enable_sequence_parallel" in off
    assert "--sequence-parallel" not in megatron.render(replace(p, sequence_parallel=False)).text()


# -- whole runs ------------------------------------------------------------------------------------

def _run(tmp_path, config, name, **keys):
    c = config(verify_grads=True, steps=1, microbatches=2, microbatch_size=2, **GPT, **keys)
    result = run_job(c, tmp_path, "test", name)
    assert result.status == "ok", result.error
    m = result.metrics
    assert m.losses == pytest.approx(reference_losses(c)[0], rel=1e-5, abs=1e-5)
    assert m.grad_check.max_rel_diff < 1e-5
    return c, result


@pytest.mark.dist
def test_tp2_zero_bubble_with_sequence_parallelism_trains_like_one_process(tmp_path, config):
    """zbv at pp=2 (4 stages, a V): sequence-sharded messages between stages, TP linears'
    weight gradients held for their W, the TP gradient sync after each stage's last W."""
    c, result = _run(tmp_path, config, "zbv", pp=2, tp=2, sequence_parallel=True, **{"schedule.name": "zbv"})
    assert "tp=2 sequence_parallel" in result.headline()
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert {e["tid"] for e in trace if e.get("args", {}).get("kind") == "tp_sync"} == {0, 1}  # tp rank 0 of each
    assert_memory_is_theory(result)
    # sequence parallelism's collectives per block and direction (tests/test_tp_comm.py: Megatron's
    # all-reduces without it): an all-gather before each column-parallel linear, a reduce-scatter
    # after each row-parallel one, mirrored in the I; the W (weight gradients) communicates nothing
    tp = [e for e in trace if e.get("cat") == "tp"]
    model = make_plan(c).model.model
    for e in tp:
        assert e["args"]["kind"] in ("tp_F", "tp_I")
    for i in (i for i in range(4) if model.kind(i) == "block"):
        for kind in ("tp_F", "tp_I"):
            got = [e for e in tp if e["name"].split()[2] == f"L{i}" and e["args"]["kind"] == kind
                   and e["args"]["step"] == 0 and e["args"]["microbatch"] == 0]
            assert sorted(e["name"].split()[3] for e in got) == ["all_gather"] * 2 + ["reduce_scatter"] * 2


@pytest.mark.dist
def test_pp2_dp2_tp2_trains_like_one_process(tmp_path, config):
    """8 processes: dp groups per tp rank, pipeline peers the same tp rank (p2p=safe: an edge
    group per tp rank, matched in FIFO order with one tag), 1F1B."""
    c, result = _run(tmp_path, config, "3d", pp=2, dp=2, tp=2, compute="emulated", p2p="safe", p2p_single_tag=True,
                     **{"schedule.name": "1f1b"})
    assert len(result.metrics.memory.measured_per_rank) == 4  # a TP group's rank 0 stands for it
    assert_memory_is_theory(result)
    # emulated: an action computes its modeled seconds besides its TP collectives (held after them),
    # and its compute is measured without them (tests/test_tp_comm.py)
    modeled = make_plan(c).emulated_cost
    for kind, seconds in (("F", modeled.fwd_s), ("B", modeled.bwd_s)):
        assert all(got >= 0.95 * want for got, want in zip(result.metrics.mean_op_s[kind], seconds)), kind


@pytest.mark.dist
def test_pytorch_executor_runs_tp_parallelized_stages_like_one_process(tmp_path, config):
    """torch's PipelineStage on each TP rank's pipeline (its own group), sequence-sharded
    messages, torch's ZB-H1 splitting the TP linears' backward itself."""
    _, result = _run(tmp_path, config, "pytorch", pp=2, tp=2, sequence_parallel=True, executor="pytorch",
                     **{"schedule.name": "zb_h1"})
    trace = json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert {e["tid"] for e in trace if e.get("cat") == "tp" and e["args"]["kind"] == "tp_F"} == {0, 1}
    assert result.metrics.tp_comm_s > 0


@pytest.mark.dist
def test_mlp_stages_ending_on_a_row_parallel_all_reduce_train_like_one_process(tmp_path, config):
    """model=mlp: each stage's 4 layers are 2 column/row pairs, so a stage's output is the
    all-reduce's (waited before it is sent and counted)."""
    c = config(pp=2, tp=2, verify_grads=True, steps=1, microbatches=2, **{"schedule.name": "1f1b"})
    result = run_job(c, tmp_path, "test", "mlp")
    assert result.status == "ok", result.error
    assert result.metrics.losses == pytest.approx(reference_losses(c)[0], rel=1e-5, abs=1e-5)
    assert result.metrics.grad_check.max_rel_diff < 1e-5
    assert all(m["activations"] for m in result.metrics.memory.measured_per_rank)  # metered
    assert_memory_is_theory(result)
