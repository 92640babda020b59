"""Tensor parallelism inside a pipeline stage: a model's TP plan applied to a stage's layers
with torch's own API (torch.distributed.tensor.parallel.parallelize_module over the TP
dimension of the (pp, dp, tp) mesh, mesh.py), as torchtitan's llama parallelize does.

A model declares its plan with the optional Model member `tp_plan` (protocol.py):

    tp_plan(i, tp, sequence_parallel, stage) -> dict[str, ParallelStyle] | None

the styles for layer i's submodules (keys are paths inside layer i; "" is layer i itself)
when `stage` (a range of global layer indices) is the stage holding it; None: layer i stays
replicated (every TP rank computes it whole). `parallelize_stage` applies each layer's plan.

What one stage's layers take and give (the harness's one-tensor contract, per TP rank):
- without sequence parallelism, the whole activation: every TP rank of a stage holds the
  same [B, T, d] between layers and between stages (each sends its copy to the same TP rank
  of the next stage; a scatter-gather as Megatron's would send 1/tp of it, not done here);
- with sequence_parallel, its sequence shard [B, T/tp, d] (rank t: tokens t*T/tp ..): between
  layers and between stages; what travels between stages shrinks by tp. `activation_shape`.
The first stage takes the whole batch's ids on every TP rank; the last gives the whole logits
[B, T, vocab] on every TP rank, so `model.loss` is unchanged (each TP rank computes the same
loss; the all-gather's backward is a local slice, so nothing is counted twice).

Gradients: a split parameter's gradient is the rank's shard (DTensor, the parameter's own
placement). A replicated parameter's gradient is whole and equal on every TP rank, except
under sequence parallelism (norms see one sequence shard each) and for replicated KV heads:
there it is Partial, each rank holding a part, and `sync_gradients` sums it (one all-reduce
each, Megatron's layernorm-gradient all-reduce) so every local gradient matches its
parameter's local shape before an optimizer or a data-parallel all-reduce uses it.

Zero-bubble: a TP-parallelized SplitLinear still splits its backward. Its autograd Function
runs on DTensors: I computes grad_x = g W (a Partial sum that the input's redistribute turns
into the all-reduce or reduce-scatter, as in a full backward), W computes g^T x later from the
tensors I saved, with no communication (column-parallel: the rank's output columns and the
whole input; row-parallel: the whole output gradient and the rank's input columns).
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from harness.model.protocol import ModelError

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from harness.model.protocol import Model

PLAN = "tp_plan"  # the optional Model member (protocol.py)


def has_plan(model: object) -> bool:
    return callable(getattr(model, PLAN, None))


def refusal(model: object, name: str, tp: int) -> str | None:
    """The one line refusing tp > 1 for a model without a TP plan (model=custom that did not
    write `tp_plan`); None when tp is 1 or the model has a plan."""
    if tp == 1 or has_plan(model):
        return None
    return (f"tp={tp}: model={name} declares no tensor-parallel plan (give the model a `tp_plan` member: "
            f"harness/model/protocol.py; allowed: tp=1)")


def parallelize_stage(layers: nn.Sequential, model: Model, mesh_tp: DeviceMesh | None, sequence_parallel: bool,
                      first: int = 0) -> nn.Sequential:
    """Applies `model.tp_plan` to a stage's `layers` (global layers first .. first+len-1), in
    place, over the 1-D TP mesh `mesh_tp` (mesh.device_mesh(grid)["tp"]). tp=1 (or no mesh):
    the layers unchanged. Parameters are split locally, with no communication: every rank
    built the same layers from the same seeds (build_layers), so each keeps its slice.
    ModelError (one line) for a model without a plan."""
    if mesh_tp is None or mesh_tp.size() == 1:
        return layers
    from torch.distributed.tensor.parallel import parallelize_module

    tp = mesh_tp.size()
    line = refusal(model, type(model).__name__, tp)
    if line is not None:
        raise ModelError(line)
    stage = range(first, first + len(layers))
    for i, layer in zip(stage, layers):
        plan = model.tp_plan(i, tp, sequence_parallel, stage)  # type: ignore[attr-defined]
        if not plan:
            continue
        plan = dict(plan)
        root = plan.pop("", None)
        for style in (*plan.values(), *([root] if root is not None else [])):
            style.src_data_rank = None  # no broadcast: the same weights are already on every rank
        if plan:
            parallelize_module(layer, mesh_tp, plan)
        if root is not None:
            parallelize_module(layer, mesh_tp, root)
    if len(layers):
        layers[-1].register_forward_hook(_waited)
    return layers


def activation_shape(model: Model, microbatch_size: int, tp: int, sequence_parallel: bool) -> tuple[int, ...]:
    """What one TP rank sends to the next stage for one microbatch: model.activation_shape,
    its sequence dimension (1) divided by tp under sequence parallelism."""
    shape = tuple(model.activation_shape(microbatch_size))
    if not sequence_parallel or tp == 1:
        return shape
    return (shape[0], shape[1] // tp, *shape[2:])


def _full(module: nn.Module, name: str, t: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    from harness.parallel.styles import FUSED

    if not isinstance(t, DTensor):
        return t.detach()
    full = t.full_tensor().detach()
    owner = module.get_submodule(name.rpartition(".")[0]) if "." in name else module
    k = getattr(owner, FUSED, None)
    if k is not None:  # rank-major rows [c_0 .. c_k-1 of rank 0, ...] -> the module's [c_0 of all ranks, ...]
        n = t.device_mesh.size()
        full = full.reshape(n, k, -1, *full.shape[1:]).transpose(0, 1).reshape(full.shape)
    return full


def full_parameters(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of a TP-parallelized `module`, whole, in the unsplit module's layout
    (collective over the TP group: every TP rank calls it)."""
    return {n: _full(module, n, p) for n, p in module.named_parameters()}


def full_gradients(module: nn.Module) -> dict[str, torch.Tensor | None]:
    """Every parameter's gradient, whole (Partial ones summed), in the unsplit layout
    (collective over the TP group)."""
    return {n: None if p.grad is None else _full(module, n, p.grad) for n, p in module.named_parameters()}


def sync_gradients(module: nn.Module) -> int:
    """Brings every DTensor gradient to its parameter's placement (Partial -> Replicate: an
    all-reduce over the TP group; Replicate -> Shard: a local slice), so each local gradient
    has its parameter's local shape. Call after the step's last backward (and W), before the
    data-parallel all-reduce and the optimizer. Returns how many gradients it changed."""
    from torch.distributed.tensor import DTensor

    changed = 0
    for p in module.parameters():
        g = p.grad
        if isinstance(g, DTensor) and isinstance(p, DTensor) and g.placements != p.placements:
            p.grad = g.redistribute(placements=p.placements)
            changed += 1
    return changed


def local_numel(module: nn.Module) -> int:
    """Parameters a rank holds (its shards plus the replicated parts): memory per rank."""
    from torch.distributed.tensor import DTensor

    return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in module.parameters())


def local(t: Any) -> Any:
    """A DTensor's local shard (the same storage, outside autograd), anything else as it is.
    Imports nothing: a DTensor exists only once torch.distributed.tensor was imported, and at
    tp=1 the rank loop need not pay for that import."""
    api = sys.modules.get("torch.distributed.tensor")
    if api is not None and isinstance(t, api.DTensor):
        with torch.no_grad():
            t = t.to_local()
    under = getattr(t, "_get_acs_underlying_tensor", None)  # a functional collective's output: its buffer
    return under() if under is not None else t


def _waited(module: nn.Module, args: tuple, output: object) -> object:
    """A stage's output as a plain tensor with its collective done: a row-parallel layer ends
    on torch's functional all-reduce, whose output (AsyncCollectiveTensor) waits only when an
    op reads it; sent or counted as it is, it would be its unfinished buffer. clone() waits,
    and keeps autograd's graph (a copy of one activation, where a stage ends on an all-reduce)."""
    if isinstance(output, torch.Tensor) and hasattr(output, "_get_acs_underlying_tensor"):
        return output.clone()
    return output


def local_grads(params: list[torch.Tensor], shards: list[torch.Tensor]) -> None:
    """Each shard's .grad = its DTensor parameter's local gradient (sync_gradients ran: the
    parameter's placement, so the shard's shape), for an optimizer over the local shards."""
    for p, s in zip(params, shards):
        if s is not p:
            s.grad = None if p.grad is None else local(p.grad)
