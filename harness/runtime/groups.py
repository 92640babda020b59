"""Process-group layout of pp x dp x tp ranks: global rank = (replica * pp + pipeline rank) *
tp + tp rank (harness/parallel/mesh.py's Grid: tp innermost, so at tp=1 global rank = replica
* pp + pipeline rank, as before tensor parallelism).

Each pipeline rank's dp copies of one tp shard (the same stages and shard in every replica)
form a data-parallel group that all-reduces their gradients. Pipeline messages travel between
the same tp rank of neighbouring stages, on the world group (p2p=eager) or on one group per
stage edge and tp rank (p2p=safe, harness/runtime/transport.py). A stage's tp ranks form its
tensor-parallel group (the DeviceMesh's "tp" dimension, made in harness/runtime/loop.py).

`placement` says where a global rank runs: its slot, i.e. the launcher's RANK (torchrun,
SLURM: consecutive slots share a node) or the GPU index of a forked rank. pp_inner: slot =
global rank, so a pipeline's ranks are neighbours and its data-parallel peers far apart;
dp_inner: slot = (pipeline rank * dp + replica) * tp + tp rank, so a stage's replicas are
neighbours (their all-reduce stays inside a node) and pipeline messages cross nodes. A TP
group is consecutive slots in both (one node). Rank 0 is slot 0 in both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.distributed as dist


@dataclass(frozen=True)
class Layout:
    pp: int
    dp: int
    tp: int = 1

    def replica(self, rank: int) -> int:
        return rank // self.tp // self.pp

    def pipeline_rank(self, rank: int) -> int:
        return rank // self.tp % self.pp

    def tp_rank(self, rank: int) -> int:
        return rank % self.tp

    def global_rank(self, replica: int, pipeline_rank: int, tp_rank: int = 0) -> int:
        return (replica * self.pp + pipeline_rank) * self.tp + tp_rank

    def slot(self, rank: int, placement: str) -> int:
        """Where global `rank` runs (the launcher's RANK, or the GPU of a forked rank)."""
        if placement == "dp_inner":
            return (self.pipeline_rank(rank) * self.dp + self.replica(rank)) * self.tp + self.tp_rank(rank)
        return rank

    def rank_of_slot(self, slot: int, placement: str) -> int:
        """The global rank that runs in launcher slot `slot` (inverse of `slot`)."""
        if placement == "dp_inner":
            outer, t = divmod(slot, self.tp)
            return self.global_rank(outer % self.dp, outer // self.dp, t)
        return slot

    def dp_group(self, rank: int) -> dist.ProcessGroup | None:
        """This rank's data-parallel group (None with dp=1). Every rank must call this, in the
        same order as its other group creations: new_group is collective over the world."""
        if self.dp == 1:
            return None
        mine = None
        for p in range(self.pp):
            for t in range(self.tp):
                g = dist.new_group([self.global_rank(d, p, t) for d in range(self.dp)])
                if (self.pipeline_rank(rank), self.tp_rank(rank)) == (p, t):
                    mine = g
        return mine
