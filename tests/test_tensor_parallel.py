"""Tensor parallelism inside a stage (harness/parallel): the (pp, dp, tp) grid, what tp refuses,
the models' plans, and (dist) a stage parallelized at tp=2 over 2 gloo processes computing
exactly what the unsplit stage computes.

dist: for mlp, gpt and tiny Hugging Face Llama (KV heads split, and replicated) and GPT-2, with
and without sequence_parallel: the stage's output, the loss, the gradient it sends back and
every parameter's gradient (gathered whole) equal the tp=1 stage's within 1e-5, after a full
backward, after the zero-bubble split into I and W (the TP linears' weight gradients held
back until W), and with activation checkpointing (the recompute redoes the collectives). All cases run in one spawn of two processes (module fixture); each test checks
one case on both ranks. Nothing is downloaded (HF_HUB_OFFLINE)."""

from __future__ import annotations

import json
import os
from contextlib import nullcontext
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from harness.config import ConfigError, model_config  # noqa: E402
from harness.model import ModelError, get_model  # noqa: E402
from harness.parallel import Coords, Grid, check_tp, tp_problem  # noqa: E402
from harness.parallel.tensor import activation_shape, has_plan, parallelize_stage, refusal  # noqa: E402

TP = 2
TOL = 1e-5
GPT = {"layers": 2, "hidden": 32, "heads": 4, "seq": 8, "vocab": 64}


# -- the grid: pure -----------------------------------------------------------------------------

def test_tp_is_innermost_and_tp1_keeps_todays_numbering():
    g = Grid(pp=2, dp=3, tp=4)
    assert g.world == 24
    assert [g.coords(r) for r in range(4)] == [Coords(0, 0, t) for t in range(4)]  # one TP group: consecutive
    assert g.coords(4) == Coords(pp=1, dp=0, tp=0) and g.coords(8) == Coords(pp=0, dp=1, tp=0)
    assert all(g.rank_of(**g.coords(r).__dict__) == r for r in range(g.world))  # inverse, every rank
    assert sorted(g.rank_of(p, d, t) for p in range(2) for d in range(3) for t in range(4)) == list(range(24))
    assert g.group(13, "tp") == [12, 13, 14, 15]
    assert g.group(13, "pp") == [9, 13] and g.group(13, "dp") == [5, 13, 21]
    from harness.runtime.groups import Layout  # at tp=1: rank = replica * pp + pipeline rank, as today

    layout, flat = Layout(pp=3, dp=2), Grid(pp=3, dp=2, tp=1)
    assert all((flat.coords(r).pp, flat.coords(r).dp) == (layout.pipeline_rank(r), layout.replica(r)) for r in range(6))
    ranks = g.ranks()
    assert ranks.shape == (2, 3, 4) and ranks[1, 2, 3].item() == g.rank_of(1, 2, 3) == 23


@pytest.mark.parametrize("bad", [dict(pp=0, dp=1, tp=1), dict(pp=1, dp=1, tp=True), dict(pp=1, dp=2.0, tp=1)])
def test_grid_refuses_what_is_no_size(bad):
    with pytest.raises(ValueError, match=r"^(pp|dp|tp)=.*integer >= 1$"):
        Grid(**bad)


def test_grid_refuses_coordinates_outside_it():
    g = Grid(2, 1, 2)
    with pytest.raises(ValueError, match=r"^rank=4: outside a world of 4"):
        g.coords(4)
    with pytest.raises(ValueError, match=r"^tp=2: outside 0..1$"):
        g.rank_of(0, 0, 2)


# -- what tp refuses: pure, one line each -----------------------------------------------------------

@pytest.mark.parametrize("name, fields, tp, sp, line", [
    ("gpt", {"heads": 6, "hidden": 48}, 4, False, "model.heads=6: tp=4 must divide it"),
    ("gpt", {"vocab": 1001}, 2, False, "model.vocab=1001: tp=2 must divide it"),
    ("gpt", {"seq": 63}, 2, True, "model.seq=63: tp=2 must divide it"),
    ("gpt", {}, 1, True, "sequence_parallel=true: needs tp > 1"),
    ("mlp", {"hidden": 33}, 2, False, "model.hidden=33: tp=2 must divide it"),
    ("mlp", {}, 2, True, "sequence_parallel=true: the model has no sequence to shard (model=mlp"),
    ("hf", {"ffn": 90}, 4, False, "model.ffn=90: tp=4 must divide it"),
    ("hf", {"heads": 6, "hidden": 48, "kv_heads": 3}, 2, False, "model.kv_heads=3: tp=2 must divide it"),
    ("hf", {"arch": "gpt2", "vocab": 50257}, 2, False, "model.vocab=50257: tp=2 must divide it"),
    ("gpt", {}, 0, False, "tp=0: must be an integer >= 1"),
])
def test_tp_refuses_sizes_it_cannot_split_in_one_line(name, fields, tp, sp, line):
    cfg = model_config(name, **fields)
    problem = tp_problem(cfg, tp, sp)
    assert problem is not None and problem.startswith(line) and "\n" not in problem
    with pytest.raises(ConfigError, match="^" + line.replace("(", r"\(").replace(".", r"\.")):
        check_tp(cfg, tp, sp)


@pytest.mark.parametrize("name, fields, tp, sp", [
    ("gpt", {}, 4, True), ("gpt", {}, 1, False), ("mlp", {}, 8, False),
    ("hf", {"kv_heads": 2}, 4, True),  # KV heads replicated: tp a multiple of them
    ("hf", {"kv_heads": 4, "heads": 8}, 2, True),  # KV heads split
    ("custom", {}, 2, False),  # the plan decides (or tensor.refusal)
])
def test_tp_accepts_what_it_can_split(name, fields, tp, sp):
    assert tp_problem(model_config(name, **fields), tp, sp) is None


def test_a_model_without_a_plan_is_refused_in_one_line_at_tp_above_1():
    class NoPlan:
        pass

    line = refusal(NoPlan(), "custom", 2)
    assert line is not None and line.startswith("tp=2: model=custom declares no tensor-parallel plan") \
        and "tp_plan" in line and "\n" not in line
    assert refusal(NoPlan(), "custom", 1) is None
    assert refusal(get_model(model_config("gpt")), "gpt", 2) is None
    with pytest.raises(ModelError, match="^tp=2: model=NoPlan declares no tensor-parallel plan"):
        parallelize_stage(nn.Sequential(nn.Linear(2, 2)), NoPlan(), _FakeMesh(2), False)  # type: ignore[arg-type]
    assert not has_plan(NoPlan()) and has_plan(get_model(model_config("mlp")))


class _FakeMesh:
    def __init__(self, n: int):
        self.n = n

    def size(self) -> int:
        return self.n


# -- the plans name real submodules: pure ---------------------------------------------------------------

PLANNED = [("mlp", {"layers": 5, "hidden": 16}), ("gpt", GPT),
           ("hf", {**GPT, "arch": "llama", "kv_heads": 2}), ("hf", {**GPT, "arch": "llama", "kv_heads": 1}),
           ("hf", {**GPT, "arch": "qwen2", "kv_heads": 2}), ("hf", {**GPT, "arch": "gpt2"})]


@pytest.mark.parametrize("name, fields", PLANNED, ids=lambda v: v if isinstance(v, str) else v.get("arch", ""))
@pytest.mark.parametrize("sp", [False, True])
def test_every_plan_key_is_a_submodule_of_its_layer(name, fields, sp):
    if sp and name == "mlp":
        pytest.skip("mlp refuses sequence_parallel")
    model = get_model(model_config(name, **fields))
    layers = model.build_layers(0, model.num_layers, seed=0)
    stage = range(model.num_layers)
    for i, layer in enumerate(layers):
        plan = model.tp_plan(i, TP, sp, stage)
        assert plan, (name, i)  # every layer split: nothing left whole
        for key in plan:
            layer.get_submodule(key)  # raises AttributeError for a key naming nothing


def test_mlp_pairs_count_from_the_stage_and_an_odd_stage_ends_gathered():
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = get_model(model_config("mlp", layers=8))
    kinds = [type(model.tp_plan(i, TP, False, range(3, 6))["0"]) for i in range(3, 6)]
    assert kinds == [ColwiseParallel, RowwiseParallel, ColwiseParallel]
    assert model.tp_plan(5, TP, False, range(3, 6))["0"].output_layouts == (Replicate(),)


def test_sequence_parallel_sends_the_sequence_shard():
    model = get_model(model_config("gpt", **GPT))
    assert activation_shape(model, 3, TP, False) == (3, 8, 32)
    assert activation_shape(model, 3, TP, True) == (3, 4, 32)


# -- dist: tp=2 equals tp=1 ----------------------------------------------------------------------------

def _case(cid: str, name: str, fields: dict, sp: bool, split: bool, stage: tuple[int, int] | None = None,
          checkpoint: bool = False) -> dict:
    return {"id": cid, "name": name, "fields": fields, "sp": sp, "split": split, "stage": stage,
            "checkpoint": checkpoint}


LLAMA = {**GPT, "arch": "llama", "kv_heads": 2}
CASES = [
    _case("mlp", "mlp", {"layers": 5, "hidden": 16}, False, False),
    _case("mlp-split", "mlp", {"layers": 5, "hidden": 16}, False, True),
    _case("mlp-stage-1-4", "mlp", {"layers": 5, "hidden": 16}, False, True, (1, 4)),
    _case("gpt", "gpt", GPT, False, False),
    _case("gpt-sp", "gpt", GPT, True, False),
    _case("gpt-split", "gpt", GPT, False, True),
    _case("gpt-sp-split", "gpt", GPT, True, True),
    _case("gpt-sp-blocks", "gpt", GPT, True, True, (1, 3)),  # a middle stage: sequence shards in and out
    _case("gpt-sp-checkpointed", "gpt", GPT, True, True, checkpoint=True),  # recompute redoes the collectives
    _case("llama", "hf", LLAMA, False, False),
    _case("llama-sp-split", "hf", LLAMA, True, True),
    _case("llama-kv1", "hf", {**LLAMA, "kv_heads": 1}, False, True),  # KV heads replicated
    _case("llama-kv1-sp", "hf", {**LLAMA, "kv_heads": 1}, True, False),
    _case("llama-checkpointed", "hf", LLAMA, False, False, checkpoint=True),
    _case("gpt2", "hf", {**GPT, "arch": "gpt2", "kv_heads": None}, False, True),
    _case("gpt2-sp", "hf", {**GPT, "arch": "gpt2", "kv_heads": None}, True, False),
]


def _max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return float("inf")
    return (a - b).abs().max().item() / max(1.0, b.abs().max().item())


def _run_case(case: dict, mesh, rank: int) -> dict:
    from torch.distributed.tensor import DTensor, Shard

    from harness.model.split_linear import SplitLinear, WeightGradStore, attach_store
    from harness.parallel.tensor import full_gradients, local_numel, sync_gradients

    model = get_model(model_config(case["name"], **case["fields"]))
    start, end = case["stage"] or (0, model.num_layers)
    sp, samples, seed = case["sp"], 3, 11
    ref = model.build_layers(start, end, seed)
    net = parallelize_stage(model.build_layers(start, end, seed), model, mesh, sp, first=start)
    if start == 0:
        x = model.batch(seed, 0, samples)[0]
    else:
        x = torch.randn(model.activation_shape(samples), generator=torch.Generator().manual_seed(5))
    last = end == model.num_layers
    g = torch.Generator().manual_seed(6)
    target = model.batch(seed, 0, samples)[1] if last else torch.randn(model.activation_shape(samples), generator=g)

    def loss_of(out: torch.Tensor) -> torch.Tensor:
        return model.loss(out, target) if last else ((out - target) ** 2).mean()

    xr = x.clone().requires_grad_(x.is_floating_point())
    out_ref = ref(xr)
    loss_ref = loss_of(out_ref)
    loss_ref.backward()

    shard = sp and start > 0
    xt = (x.chunk(TP, dim=1)[rank] if shard else x).clone().requires_grad_(x.is_floating_point())
    store = WeightGradStore() if case["split"] else None
    if store is not None:
        attach_store(net, store)
    run = net
    if case["checkpoint"]:  # as runtime/native.py does with checkpointing=true: segments of 2 layers
        from harness.model.checkpoint import CheckpointedStage

        run = CheckpointedStage(net, 2, keep=lambda key, t: None, timed=lambda key, fn: fn)
    defer = store.defer("mb") if store is not None else nullcontext()
    with defer:
        out = run(xt)
    whole = DTensor.from_local(out, mesh, [Shard(1)], run_check=False).full_tensor() if sp and not last else out
    loss = loss_of(whole)
    with (store.defer("mb") if store is not None else nullcontext()):
        loss.backward()
    result: dict = {}
    if store is not None:
        tp_linears = [m for m in net.modules() if isinstance(m, SplitLinear) and isinstance(m.weight, DTensor)]
        result["deferred"] = len(store.pending.get("mb", []))
        result["held_back"] = bool(tp_linears) and all(m.weight.grad is None for m in tp_linears)
        store.run("mb")
    result["synced"] = sync_gradients(net)
    result["local_shapes"] = all(
        p.grad is not None and tuple((p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad).shape)
        == tuple((p.to_local() if isinstance(p, DTensor) else p).shape) for p in net.parameters())
    grads = full_gradients(net)
    ref_grads = {n: p.grad for n, p in ref.named_parameters()}
    assert set(grads) == set(ref_grads)
    result["out"] = _max_err(whole, out_ref.detach())
    result["loss"] = abs(loss.item() - loss_ref.item())
    result["grads"] = max(_max_err(grads[n], ref_grads[n]) for n in grads)
    if x.is_floating_point():
        expect = xr.grad.chunk(TP, dim=1)[rank] if shard else xr.grad
        result["dinput"] = _max_err(xt.grad, expect)
    result["split_share"] = local_numel(net) / sum(p.numel() for p in ref.parameters())
    return result


COMMS = {"gpt": ("gpt", GPT), "llama": ("hf", LLAMA)}


def _block_comms(name: str, fields: dict, sp: bool, mesh) -> dict:
    """The collectives one parallelized block issues, forward and backward (torch's
    CommDebugMode): what the simulator prices per block and direction."""
    from torch.distributed.tensor.debug import CommDebugMode

    model = get_model(model_config(name, **fields))
    net = parallelize_stage(model.build_layers(1, 2, 0), model, mesh, sp, first=1)
    x = torch.randn(activation_shape(model, 3, TP, sp), requires_grad=True)
    with CommDebugMode() as fwd:
        y = net(x)
    with CommDebugMode() as bwd:
        y.sum().backward()
    return {d: {str(op).split(".")[-1]: n for op, n in mode.get_comm_counts().items()}
            for d, mode in (("fwd", fwd), ("bwd", bwd))}


def _worker(rank: int, store_path: str, out_dir: str) -> None:
    import torch.distributed as dist

    from harness.parallel.mesh import device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=TP)
    try:
        mesh = device_mesh(Grid(pp=1, dp=1, tp=TP))["tp"]
        results = {}
        for case in CASES:
            try:
                results[case["id"]] = _run_case(case, mesh, rank)
            except Exception as e:  # reported per case: one broken plan does not hide the others
                results[case["id"]] = {"error": f"{type(e).__name__}: {e}"}
        for key, (name, fields) in COMMS.items():
            for sp in (False, True):
                results[f"comms-{key}{'-sp' * sp}"] = _block_comms(name, fields, sp, mesh)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp2(tmp_path_factory) -> list[dict]:
    """Every case's figures on each of the two ranks (one start of two processes for all),
    forked from the harness's forkserver: torch is imported there once, not in two fresh
    interpreters."""
    import torch.multiprocessing as mp

    from harness.runtime.launch import context, preloads
    from harness.runtime.registry import get_executor

    d = tmp_path_factory.mktemp("tp2")
    context("forkserver", preloads(get_executor("native").runner))  # the server the harness's jobs use
    mp.start_processes(_worker, args=(str(d / "store"), str(d)), nprocs=TP, join=True, start_method="forkserver")
    return [json.loads((d / f"rank{r}.json").read_text()) for r in range(TP)]


@pytest.mark.dist
@pytest.mark.parametrize("case", CASES, ids=[c["id"] for c in CASES])
def test_tp2_stage_equals_the_unsplit_stage(tp2, case):
    for rank, results in enumerate(tp2):
        r = results[case["id"]]
        assert "error" not in r, (rank, r)
        assert r["out"] <= TOL and r["loss"] <= TOL and r["grads"] <= TOL, (rank, r)
        assert r.get("dinput", 0.0) <= TOL, (rank, r)
        assert r["local_shapes"], (rank, r)  # after sync_gradients every gradient is its parameter's shard
        assert r["split_share"] < 0.75, (rank, r)  # the weights are split, not replicated
        if case["split"]:  # zero-bubble: the TP linears' weight gradients waited for W
            assert r["deferred"] > 0 and r["held_back"], (rank, r)
        if case["sp"]:  # the norms' gradients were partial sums, summed by sync_gradients
            assert r["synced"] > 0, (rank, r)


@pytest.mark.dist
@pytest.mark.parametrize("model", sorted(COMMS))
@pytest.mark.parametrize("sp", [False, True])
def test_a_block_issues_megatrons_collectives(tp2, model, sp):
    """Per block and direction: two all-reduces (after attention and after the MLP; before
    each in the backward), or with sequence parallelism two all-gathers and two
    reduce-scatters (Korthikanti et al. 2022, fig. 5), nothing else."""
    expected = {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2} if sp else {"all_reduce": 2}
    for results in tp2:
        assert results[f"comms-{model}{'-sp' * sp}"] == {"fwd": expected, "bwd": expected}
