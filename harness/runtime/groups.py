"""Process-group layout of pp x dp ranks: global rank = replica * pp + pipeline rank.

One group per pipeline (its pp ranks exchange activations and gradients) and one per
pipeline rank across replicas (its dp copies of the same stages all-reduce gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int

    def replica(self, rank: int) -> int:
        return rank // self.pp

    def pipeline_rank(self, rank: int) -> int:
        return rank % self.pp

    def global_rank(self, replica: int, pipeline_rank: int) -> int:
        return replica * self.pp + pipeline_rank

    def new_groups(self, rank: int) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
        """(this rank's pipeline group, its data-parallel group); every rank must call this,
        since new_group is collective over the whole world, in the same order."""
        pipe = dp = None
        for d in range(self.dp):
            g = dist.new_group([self.global_rank(d, p) for p in range(self.pp)])
            if self.replica(rank) == d:
                pipe = g
        for p in range(self.pp):
            g = dist.new_group([self.global_rank(d, p) for d in range(self.dp)])
            if self.pipeline_rank(rank) == p:
                dp = g
        return pipe, dp
