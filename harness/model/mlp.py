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

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, target)
