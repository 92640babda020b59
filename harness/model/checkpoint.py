"""Activation checkpointing of a stage: every `every` consecutive layers form one
segment run under non-reentrant torch.utils.checkpoint, so only each segment's input is
kept for backward and the rest is recomputed then (Chen et al. 2016, arXiv 1604.06174).
"""

from __future__ import annotations

from typing import Callable, Hashable

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


Keep = Callable[[Hashable, torch.Tensor], None]
Timed = Callable[[Hashable, Callable], Callable]


class CheckpointedStage(nn.Module):
    """Runs `layers` in segments of `every` (0: one segment). forward(x, key): `keep(key, t)`
    is told of every tensor kept for backward (each segment's input); `timed(key, fn)` wraps
    that forward's recompute so it is traced. The key (the runner's (stage, microbatch), or
    None) travels with the call, so the callbacks need no shared state."""

    def __init__(self, layers: nn.Sequential, every: int, keep: Keep, timed: Timed):
        super().__init__()
        self.layers, self.every = layers, every or len(layers)
        self.keep, self.timed = keep, timed

    def forward(self, x: torch.Tensor, key: Hashable = None) -> torch.Tensor:
        mods = list(self.layers)
        for i in range(0, len(mods), self.every):
            segment = nn.Sequential(*mods[i:i + self.every])
            self.keep(key, x)
            x = checkpoint(self._runner(segment, key), x, use_reentrant=False)
        return x

    def _runner(self, segment: nn.Sequential, key: Hashable) -> Callable:
        first = [True]  # the first call is the forward; any later one is the recompute

        def run(x: torch.Tensor) -> torch.Tensor:
            if first[0]:
                first[0] = False
                return segment(x)
            return self.timed(key, segment)(x)

        return run
