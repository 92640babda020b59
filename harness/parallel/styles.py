"""Tensor-parallel styles torch does not ship, in torch's own ParallelStyle form (they compose
with ColwiseParallel, RowwiseParallel, SequenceParallel and PrepareModuleInput in one plan):

- `FusedColwiseParallel`: a column-parallel linear whose output is `chunks` tensors side by
  side (GPT's and GPT-2's fused [q; k; v]): each rank keeps its columns of every chunk, so
  its output is [q_r, k_r, v_r], its own heads' query, key and value;
- `VocabParallelEmbedding`: an embedding split by rows (vocabulary), looked up locally with
  the ids outside a rank's rows masked, then summed (all-reduce) or summed and scattered
  (reduce-scatter, sequence parallel): Megatron's VocabParallelEmbedding. torch's
  RowwiseParallel on an nn.Embedding computes the same forward, but its backward (torch 2.13)
  hands every rank the whole [vocab, d] weight gradient, Replicate where the weight is
  Shard(0): vocab x d floats per rank, and a gradient whose local shape is not the
  parameter's. This one's gradient is the rank's rows only;
- `ReplicatedKVHeads`: the key or value projection of grouped-query attention when tp is a
  multiple of the KV heads (tp % kv_heads == 0, kv_heads < tp): the weight is replicated, each
  rank keeps the one KV head its query heads use (rank r: head r // (tp / kv_heads)), and the
  gradient is the sum over the ranks sharing it (Partial: summed when gathered or synced);
- `Attributes`: sets module attributes a model reads its local sizes from (a GPT-2
  attention's split width, the KV groups per rank, a block's sequence shards).

Every parameter becomes a DTensor over the TP mesh; a style here keeps the layouts torch's
sharding rules expect, so autograd, the zero-bubble I/W split of SplitLinear (its backward is
DTensor arithmetic) and `full_tensor()` work unchanged.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_module, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel
from torch.distributed.tensor.parallel.style import ParallelStyle

FUSED = "_tp_fused_chunks"  # on a module whose parameters FusedColwiseParallel holds rank-major


def _sharded_param(local: torch.Tensor, like: torch.Tensor, mesh: DeviceMesh, placement: Placement,
                   requires_grad: bool) -> nn.Parameter:
    return nn.Parameter(DTensor.from_local(local, mesh, [placement], run_check=False, shape=like.shape,
                                           stride=like.stride()), requires_grad=requires_grad)


class FusedColwiseParallel(ColwiseParallel):
    """ColwiseParallel for a linear whose output rows are `chunks` equal blocks ([q; k; v]):
    rank r keeps rows r of every block, so its local output is its heads' [q_r; k_r; v_r].

    The DTensor's global row order is then rank-major ([q_0 k_0 v_0 q_1 k_1 v_1 ...]), not the
    module's: `full_tensor()` of the weight or its gradient is a row permutation of the
    unsplit module's, which `harness.parallel.tensor.full_parameters`/`full_gradients` undo
    (the module is marked with FUSED). Elementwise work (optimizers, gradient all-reduce over
    dp) does not care about the order."""

    def __init__(self, chunks: int = 3, **kwargs: Any):
        super().__init__(**kwargs)
        self.chunks = chunks

    def _partition_linear_fn(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        n, r, k = device_mesh.size(), device_mesh.get_local_rank(), self.chunks
        for pname, param in list(module.named_parameters(recurse=False)):
            rows = param.shape[0] // (k * n)
            local = param.detach().reshape(k, n, rows, *param.shape[1:])[:, r].reshape(k * rows, *param.shape[1:])
            module.register_parameter(pname, _sharded_param(local.clone(), param, device_mesh, Shard(0),
                                                            param.requires_grad))
        setattr(module, FUSED, k)


def _vocab_forward(module: nn.Embedding, mesh: DeviceMesh, lo: int, hi: int, layout: Placement,
                   pad: int | None, ids: torch.Tensor) -> torch.Tensor:
    outside = (ids < lo) | (ids >= hi)
    local = F.embedding((ids - lo).masked_fill(outside, 0), module.weight.to_local(), pad)
    local = local.masked_fill(outside.unsqueeze(-1), 0.0)
    summed = DTensor.from_local(local, mesh, [Partial()], run_check=False)
    return summed.redistribute(placements=[layout]).to_local()


class VocabParallelEmbedding(ParallelStyle):
    """An nn.Embedding split by vocabulary rows (vocab % tp == 0): each rank looks up the ids
    in its rows (zeros elsewhere), then the partial rows are summed into `output_layout`:
    Replicate() (an all-reduce) or Shard(d) (a reduce-scatter along dim d: sequence parallel).
    Plain tensors in and out, like the styles with use_local_output."""

    def __init__(self, output_layout: Placement | None = None):
        super().__init__()
        self.output_layout = output_layout or Replicate()

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if not isinstance(module, nn.Embedding):
            raise NotImplementedError(f"VocabParallelEmbedding: needs an nn.Embedding, not {type(module).__name__}")
        if module.max_norm is not None or module.sparse:
            raise NotImplementedError("VocabParallelEmbedding: max_norm and sparse embeddings are not supported")
        n, r = device_mesh.size(), device_mesh.get_local_rank()
        rows = module.num_embeddings // n
        lo, hi = r * rows, (r + 1) * rows
        pad = module.padding_idx
        local_pad = pad - lo if pad is not None and lo <= pad < hi else None
        weight = module.weight
        module.weight = _sharded_param(weight.detach()[lo:hi].clone(), weight, device_mesh, Shard(0),
                                       weight.requires_grad)
        module.forward = partial(_vocab_forward, module, device_mesh, lo, hi, self.output_layout, local_pad)
        return module


class ReplicatedKVHeads(ParallelStyle):
    """The key or value projection of GQA with fewer KV heads than tp (tp % kv_heads == 0):
    the weight is replicated (Replicate DTensor), and rank r's output is KV head
    r // (tp // kv_heads) of it, the one its query heads attend with (Megatron's rule for
    tp > query groups). The gradient is Partial: each rank holds its heads' part, summed when
    synced or gathered. Input: `input_layouts` (Replicate(), or Shard(1) all-gathered)."""

    def __init__(self, kv_heads: int, head_dim: int, input_layouts: Placement | None = None):
        super().__init__()
        self.kv_heads, self.head_dim = kv_heads, head_dim
        self.input_layouts = input_layouts or Replicate()

    def _partition(self, name: str, module: nn.Module, device_mesh: DeviceMesh) -> None:
        for pname, param in list(module.named_parameters(recurse=False)):
            module.register_parameter(pname, nn.Parameter(
                distribute_tensor(param, device_mesh, [Replicate()], src_data_rank=None),
                requires_grad=param.requires_grad))

    def _input(self, module: nn.Module, inputs: tuple, device_mesh: DeviceMesh) -> tuple:
        x = inputs[0]
        if not isinstance(x, DTensor):
            x = DTensor.from_local(x, device_mesh, [self.input_layouts], run_check=False)
        if x.placements != (Replicate(),):
            x = x.redistribute(placements=[Replicate()])
        return (x, *inputs[1:])

    def _output(self, module: nn.Module, output: DTensor, device_mesh: DeviceMesh) -> torch.Tensor:
        head = device_mesh.get_local_rank() // (device_mesh.size() // self.kv_heads)
        local = output.to_local(grad_placements=[Partial()])
        return local[..., head * self.head_dim:(head + 1) * self.head_dim]

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        if device_mesh.size() % self.kv_heads:
            raise ValueError(f"ReplicatedKVHeads: tp={device_mesh.size()} is not a multiple of "
                             f"kv_heads={self.kv_heads}")
        return distribute_module(module, device_mesh, self._partition, self._input, self._output)


class Attributes(ParallelStyle):
    """Sets attributes on the module (its local sizes under TP); no parameters, no hooks."""

    def __init__(self, **attributes: Any):
        super().__init__()
        self.attributes = attributes

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for key, value in self.attributes.items():
            if not hasattr(module, key):
                raise AttributeError(f"Attributes: {type(module).__name__} has no attribute {key!r} to set")
            setattr(module, key, value)
        return module


class Sequenced(ParallelStyle):
    """Several styles on one module, applied in order (a plan names each module once)."""

    def __init__(self, *styles: ParallelStyle):
        super().__init__()
        self.styles = styles

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        for style in self.styles:
            style.src_data_rank = self.src_data_rank
            module = style._apply(module, device_mesh)
        return module
