"""mlp: a stack of identical Linear + GELU layers on synthetic regression data.

Layer i is initialised from its own seed (seed, i), so a rank builds only its stage's
layers and the stages together equal the single-process model.
"""

from __future__ import annotations

import torch
from torch import nn

from harness.model.split_linear import SplitLinear
from harness.model.stack import LayerStack


class MLP(LayerStack):
    def build_layer(self, i: int) -> nn.Module:
        return nn.Sequential(SplitLinear(self.cfg.hidden, self.cfg.hidden), nn.GELU())

    def batch(self, seed: int, step: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and targets of one step's global batch: [samples, hidden] each."""
        g = torch.Generator().manual_seed(seed * 7919 + step + 1)
        x = torch.randn(samples, self.cfg.hidden, generator=g)
        y = torch.randn(samples, self.cfg.hidden, generator=g)
        return x, y

    def activation_shape(self, microbatch_size: int) -> tuple[int, ...]:
        """Shape of the tensor between any two layers, for one microbatch."""
        return (microbatch_size, self.cfg.hidden)

    def kind(self, i: int) -> str:
        return "linear"

    def input_shape(self, i: int, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
        return self.activation_shape(microbatch_size), torch.float32

    def fwd_flops(self, i: int, microbatch_size: int) -> float:
        """Forward FLOPs of one layer for one microbatch: 2 B h^2 (the GELU is noise)."""
        return 2.0 * microbatch_size * self.cfg.hidden ** 2

    def tp_plan(self, i: int, tp: int, sequence_parallel: bool, stage: range) -> dict | None:
        """Tensor parallelism (harness/parallel/tensor.py): the stage's layers in column then row
        pairs (Megatron's MLP): the first of a pair splits its output features (each rank keeps
        hidden/tp of them, the GELU runs on the shard), the second its input features, summed by
        one all-reduce into the whole activation. Pairs count from the stage's first layer, so a
        stage never ends on half a pair; an odd stage's last layer is column-parallel with its
        output all-gathered. No sequence to shard: sequence_parallel is refused (checks.py)."""
        from torch.distributed.tensor import Replicate
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

        if sequence_parallel:
            raise ValueError("sequence_parallel=true: model=mlp has no sequence to shard (allowed: false)")
        pos = i - stage.start
        if pos % 2:
            return {"0": RowwiseParallel()}
        if pos + 1 < len(stage):
            return {"0": ColwiseParallel()}
        return {"0": ColwiseParallel(output_layouts=Replicate())}

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, target)
