"""What every model shares: a stack of layers, each built from its own seed."""

from __future__ import annotations

import torch
from torch import nn

from harness.config import ModelConfig


class LayerStack:
    """A model as `num_layers` layers (`build_layer(i)`, in subclasses). Layer i is built
    from seed (seed, i), so a rank builds only its stage's layers and the stages together
    equal the single-process model."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg

    @property
    def num_layers(self) -> int:
        return self.cfg.num_layers

    def build_layer(self, i: int) -> nn.Module:
        raise NotImplementedError

    def build_layers(self, start: int, end: int, seed: int) -> nn.Sequential:
        """Layers [start, end) of the model, each from its own generator."""
        layers = []
        for i in range(start, end):
            torch.manual_seed(seed * 1_000_003 + i)
            layers.append(self.build_layer(i))
        return nn.Sequential(*layers)
