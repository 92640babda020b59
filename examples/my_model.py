"""A model of your own, run through the pipeline harness without touching the package:

    PYTHONPATH=examples python -m harness model=custom model.target=my_model:build pp=2

A small residual MLP classifier, written as a user would: plain torch, its own layers. The
harness asks for the members listed in harness/model/protocol.py; this file provides them
all, with no base class. (Subclassing harness.model.stack.LayerStack would give
`build_layers`, `kind` and `input_shape` for free; calling
harness.model.split_linear.to_split_linear(layer) in build_layer would let the zero-bubble
schedules defer its Linear weight gradients to W. Without it they are computed in I:
slower to overlap, equally correct.)

Layers: 0 projects the input features to the width; 1..depth are residual blocks; the last
is the classifier head. Any contiguous run of them is a pipeline stage, and between two
stages exactly one tensor of `activation_shape` travels.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up, self.down = nn.Linear(width, 2 * width), nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.silu(self.up(self.norm(x))))


class ResMLPClassifier:
    """features -> width -> `depth` residual blocks -> `classes` logits."""

    def __init__(self, features: int, width: int, depth: int, classes: int):
        self.features, self.width, self.depth, self.classes = features, width, depth, classes

    @property
    def num_layers(self) -> int:
        return self.depth + 2

    def kind(self, i: int) -> str:
        return "embed" if i == 0 else "head" if i == self.num_layers - 1 else "block"

    def build_layer(self, i: int) -> nn.Module:
        kind = self.kind(i)
        if kind == "embed":
            return nn.Linear(self.features, self.width)
        if kind == "head":
            return nn.Sequential(nn.LayerNorm(self.width), nn.Linear(self.width, self.classes))
        return ResidualBlock(self.width)

    def build_layers(self, start: int, end: int, seed: int) -> nn.Sequential:
        """Layer i from its own seed: every rank builds the same layer i."""
        layers = []
        for i in range(start, end):
            torch.manual_seed(seed * 1_000_003 + i)
            layers.append(self.build_layer(i))
        return nn.Sequential(*layers)

    def batch(self, seed: int, step: int, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Synthetic data: the label is which of `classes` random directions x is nearest."""
        g = torch.Generator().manual_seed(seed * 7919 + step + 1)
        centers = torch.randn(self.classes, self.features, generator=torch.Generator().manual_seed(seed))
        x = torch.randn(samples, self.features, generator=g)
        return x, (x @ centers.t()).argmax(dim=1)

    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output, target)  # a mean over samples, as the harness needs

    def activation_shape(self, microbatch_size: int) -> tuple[int, ...]:
        return (microbatch_size, self.width)

    def input_shape(self, i: int, microbatch_size: int) -> tuple[tuple[int, ...], torch.dtype]:
        return ((microbatch_size, self.features) if i == 0 else self.activation_shape(microbatch_size)), torch.float32

    def fwd_flops(self, i: int, microbatch_size: int) -> float:
        kind = self.kind(i)
        per_sample = {"embed": self.features * self.width, "head": self.width * self.classes,
                      "block": 4 * self.width * self.width}[kind]
        return 2.0 * microbatch_size * per_sample


def build(cfg, features: int = 16, classes: int = 10) -> ResMLPClassifier:
    """The factory model.target names: gets the ModelConfig (model.hidden is the width,
    model.layers the depth) and model.kwargs (+model.kwargs.classes=4)."""
    return ResMLPClassifier(features=features, width=cfg.hidden, depth=cfg.layers, classes=classes)
