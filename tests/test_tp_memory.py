"""The memory theory at tp > 1 (harness/planning/fake_tp.py): TP rank 0's bytes, held to what a
run measures on TP rank 0 of each group, to the byte, with and without sequence parallelism
and checkpointing; the planner's function taking tp and sequence_parallel; a memory budget at
tp > 1. tests/test_tp_runs.py's whole runs check the same equality on their runs (zero-bubble
with sequence parallelism, pp x dp x tp with ZeRO-1, model=mlp's row-parallel stage ends)."""

from __future__ import annotations

import pytest

from harness.job import run_job
from harness.measure.metrics import over_budget
from harness.planning.memory_theory import Layout, fullest, theory_per_rank
from harness.planning.plan import make_plan

GPT = {"model.name": "gpt", "model.layers": 2, "model.hidden": 32, "model.heads": 4, "model.seq": 8,
       "model.vocab": 64}
KEYS = ("params", "grads", "optimizer", "activations", "peak")


def assert_memory_is_theory(result) -> None:
    """Every byte of every measured rank (TP rank 0 of each group) equals the theory's."""
    mem = result.metrics.memory
    assert mem.theory_per_rank is not None and len(mem.measured_per_rank) == len(mem.theory_per_rank)
    for g, (measured, theory) in enumerate(zip(mem.measured_per_rank, mem.theory_per_rank)):
        assert {k: measured[k] for k in KEYS} == {k: theory[k] for k in KEYS}, g


# -- pure: the theory alone (one process, a fake TP group) ------------------------------------------

def test_tp_splits_weights_and_sequence_parallel_shrinks_activations_on_every_rank(config):
    one, two, sp = (theory_per_rank(make_plan(config(pp=2, microbatches=4, **GPT, **k)))
                    for k in ({}, {"tp": 2}, {"tp": 2, "sequence_parallel": True}))
    for a, b, s in zip(one, two, sp):
        # split: the linears and the vocabulary; whole: norms, row-parallel biases, positions
        assert a.params / 2 < b.params < a.params and b.grads == b.params
        assert s.activations < b.activations < a.activations
    assert sp[0].params < two[0].params and sp[1].params == two[1].params  # SP splits the positions (stage 0)
    import torch.distributed as dist

    assert not dist.is_initialized()  # the fake TP group took no default process group


def test_the_planners_memory_takes_tp_and_sequence_parallel(config):
    """`fullest` at tp= and sequence_parallel= from a tp=1 plan's memory equals the tp=2 plan's
    theory (what advise's search calls for a point); tp=1 stays the tp=1 theory."""
    c1 = config(pp=2, microbatches=4, **GPT)
    p1 = make_plan(c1)
    layout = Layout(p1.stage_layers, p1.replays)
    assert fullest(p1.memory(), c1, layout)[0] == max(p1.theory_per_rank(), key=lambda r: r.peak)
    p2 = make_plan(config(pp=2, microbatches=4, tp=2, sequence_parallel=True, **GPT))
    at2, _ = fullest(p1.memory(), c1, layout, tp=2, sequence_parallel=True)
    assert at2 == max(p2.theory_per_rank(), key=lambda r: r.peak)
    assert at2.peak < fullest(p1.memory(), c1, layout)[0].peak


def test_a_memory_budget_holds_at_tp2(config):
    plan = make_plan(config(pp=2, tp=2, microbatches=4, **GPT))
    peak = max(r.peak for r in plan.theory_per_rank()) / 2**30
    assert over_budget(make_plan(config(pp=2, tp=2, microbatches=4, memory_budget_gib=peak, **GPT))) is None
    line = over_budget(make_plan(config(pp=2, tp=2, microbatches=4, memory_budget_gib=peak / 2, **GPT)))
    assert line.startswith(f"memory_budget_gib={peak / 2}: theory puts rank ")


# -- dist: measured = theory to the byte ---------------------------------------------------------

def _ran(tmp_path, config, **keys):
    result = run_job(config(microbatches=4, steps=1, **keys), tmp_path, "test", "tpmem")
    assert result.status == "ok", result.error
    return result


@pytest.mark.dist
def test_gpt_gpipe_with_sequence_parallelism_and_checkpointing_is_its_theory(tmp_path, config):
    """The checkpoint keeps each stage's sequence-sharded input; the recompute is the split
    stage's, traced in each worker over its fake TP group before the steps, which still train
    like one process (the fake group is not the run's)."""
    result = _ran(tmp_path, config, pp=2, tp=2, sequence_parallel=True, checkpointing=True, verify_grads=True,
                  **GPT, **{"schedule.name": "gpipe", "optimizer.name": "adamw"})
    assert_memory_is_theory(result)
    # status ok: the gradients within fp32's tolerance (AdamW's step amplifies TP's reordered sums
    # to ~2e-5 here, with or without the trace)
    assert result.metrics.grad_check is not None


GRID = [dict(model, **{"schedule.name": s}, sequence_parallel=sp, checkpointing=ck)
        for model in ({}, GPT) for s in ("gpipe", "1f1b", "zb_h1") for sp in (False, True) for ck in (False, True)
        if not (sp and not model)]  # model=mlp has no sequence
LLAMA = {"model.name": "hf", "model.arch": "llama", "model.layers": 2, "model.hidden": 32, "model.heads": 4,
         "model.seq": 16, "model.vocab": 64}
BEYOND = {  # other models, schedules and dimensions, one run each
    "llama-gqa-sp-adamw": dict(LLAMA, **{"model.kv_heads": 2, "optimizer.name": "adamw"}, sequence_parallel=True),
    "llama-replicated-kv": dict(LLAMA, **{"model.kv_heads": 1}),
    "gpt-interleaved": dict(GPT, **{"model.layers": 4, "schedule.name": "interleaved_1f1b"}),
    "gpt-dp2-zero1-bf16": dict(GPT, dp=2, zero=1, dtype="bf16", compute="emulated",
                               **{"optimizer.name": "adamw", "schedule.name": "1f1b"}),
}


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("name", BEYOND)
def test_measured_equals_theory_at_tp2_beyond_the_grid(tmp_path, config, name):
    assert_memory_is_theory(_ran(tmp_path, config, pp=2, tp=2, **BEYOND[name]))


@pytest.mark.dist
@pytest.mark.slow
@pytest.mark.parametrize("keys", GRID, ids=lambda k: "-".join(
    [k.get("model.name", "mlp"), k["schedule.name"]] + ["sp"] * k["sequence_parallel"] + ["ckpt"] * k["checkpointing"]))
def test_measured_equals_theory_at_tp2_on_the_grid(tmp_path, config, keys):
    assert_memory_is_theory(_ran(tmp_path, config, pp=2, tp=2, **keys))


# -- composed per layer at tp > 1 = the whole split stage's trace -----------------------------------
SHAPES = {  # embedding, blocks, head; llama's grouped-query heads split (kv 2 at tp 2) and replicated (kv 1)
    "gpt": dict(GPT, **{"model.layers": 4}),
    "llama": dict(LLAMA, **{"model.layers": 4, "model.kv_heads": 2, "model.ffn": 48}),
    "llama-kv1": dict(LLAMA, **{"model.kv_heads": 1}),
}
CHECKPOINTING = ((False, 0), (True, 0), (True, 1))  # none, the whole stage, each layer


def _assert_composed_is_whole(plan, tp: int, sp: bool, stages, sizes, checkpointing=CHECKPOINTING,
                              deferred: bool = True) -> None:
    from harness.planning.fake_tp import stage_tensors
    from harness.planning.memory_theory import _trace_deferred, layer_memory, trace_stage

    built, L = plan.model, plan.model.num_layers
    mem = layer_memory(built, "fp32", "cpu", tp, sp)
    for a, e in stages:
        assert mem.composable(a, e)
        assert sorted(mem.tensors(a, e)) == sorted(stage_tensors(built, a, e, tp, sp))
        for b in sizes:
            for ck, every in checkpointing:
                whole = trace_stage(built, a, e, a == 0, e == L, "fp32", b, ck, every, "cpu", tp, sp)
                assert mem.stage(a, e, b, ck, every) == whole, (tp, sp, a, e, b, ck, every)
            if not deferred:
                continue
            split = [_trace_deferred(built, i, "fp32", b, "cpu", tp, sp, (a, e)) for i in range(a, e)]
            assert (mem.deferred(a, e, b), mem.deferred_grads(a, e, b)) == tuple(map(sum, zip(*split)))


def test_tp_memory_composed_per_layer_equals_the_whole_split_model(config):
    """At tp > 1 a stage's bytes are composed from its layers' traces, each layer split alone
    (hf's and gpt's splits are per layer), as at tp=1: the whole llama (embedding, blocks, head)
    as one stage, sequence parallel, to the byte what tracing it whole gives, and its local
    parameter shards. The grid below (slow) holds it for checkpointing, the deferred W, and
    every stage shape."""
    plan = make_plan(config(pp=2, microbatches=2, **LLAMA, **{"model.kv_heads": 2}))
    _assert_composed_is_whole(plan, 2, True, [(0, plan.model.num_layers)], (1,), ((False, 0),), deferred=False)


@pytest.mark.slow  # ~1,000 split traces (minutes); the test above keeps the property in make test
@pytest.mark.parametrize("model", list(SHAPES))
def test_tp_memory_composed_per_layer_equals_the_whole_split_stages_trace(config, model):
    """The composition, to the byte, on a grid: gpt and llama shapes, tp 2 and 4, sequence
    parallelism on and off, no checkpointing, the whole stage's and each layer's, B 1 and 2 (at
    tp 4: 2), the stages of pp = 1, 2, 3 and of pp=2 at v=2 (first with the embedding, middle,
    last with the head); what a split backward's deferred W keeps and the local shards too."""
    plan = make_plan(config(pp=2, microbatches=2, **SHAPES[model]))
    L = plan.model.num_layers
    h, t = L // 2, L // 3
    stages = sorted({(0, L), (0, h), (h, L), (0, t), (t, 2 * t), (2 * t, L), (0, L // 4), (L // 4, h), (h, L - 1),
                     (L - 1, L)} - {(x, x) for x in range(L)})
    for tp, sizes in ((2, (1, 2)), (4, (2,))):
        for sp in (False, True):
            _assert_composed_is_whole(plan, tp, sp, stages, sizes)


def test_a_layer_split_by_its_stage_is_traced_with_its_stage(config):
    """model=mlp pairs a stage's layers (column then row parallel from the stage's first): a
    layer is not split alone as in its stage, so its stages are traced whole, not composed."""
    from harness.planning.memory_theory import layer_memory

    plan = make_plan(config(pp=2, tp=2, microbatches=2, **{"model.layers": 4}))
    mem = layer_memory(plan.model, "fp32", "cpu", 2, False)
    assert not mem.composable(0, 2) and not mem.composable(1, 4)
