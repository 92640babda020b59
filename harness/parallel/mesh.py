"""The (pp, dp, tp) process grid: which global rank holds which pipeline stage, data-parallel
replica and tensor-parallel shard, and the torch DeviceMesh over it.

Numbering: rank = (replica * pp + pipeline_rank) * tp + tp_rank. tp is innermost, so a
tensor-parallel group is tp consecutive ranks: consecutive launcher slots, one node (TP's two
collectives per block want the node's fast links; Megatron, torchtitan and Llama 3 all put TP
inside the node). Above tp it is harness/runtime/groups.py's Layout (rank = replica * pp +
pipeline rank), so at tp=1 every rank keeps the number it has today.

The DeviceMesh's dimensions are named ("pp", "dp", "tp") and its rank tensor holds this
numbering (mesh[p, d, t] = rank_of(p, d, t)), so `mesh["tp"]` is a rank's TP group and
`mesh["dp"]` its data-parallel group of the same tp shard.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DIMS: tuple[str, str, str] = ("pp", "dp", "tp")


@dataclass(frozen=True)
class Coords:
    """Where one global rank sits in the grid."""

    pp: int  # pipeline rank (which stages)
    dp: int  # data-parallel replica
    tp: int  # tensor-parallel shard within the stage


@dataclass(frozen=True)
class Grid:
    """A world of pp x dp x tp ranks (each >= 1)."""

    pp: int
    dp: int
    tp: int

    def __post_init__(self) -> None:
        for name in DIMS:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")

    @property
    def world(self) -> int:
        return self.pp * self.dp * self.tp

    def coords(self, rank: int) -> Coords:
        """The (pp, dp, tp) coordinates of global `rank`."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank={rank}: outside a world of {self.world} (allowed: 0..{self.world - 1})")
        outer, t = divmod(rank, self.tp)
        d, p = divmod(outer, self.pp)
        return Coords(pp=p, dp=d, tp=t)

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        """The global rank at coordinates (pp, dp, tp): the inverse of `coords`."""
        for name, value, size in (("pp", pp, self.pp), ("dp", dp, self.dp), ("tp", tp, self.tp)):
            if not 0 <= value < size:
                raise ValueError(f"{name}={value}: outside 0..{size - 1}")
        return (dp * self.pp + pp) * self.tp + tp

    def group(self, rank: int, dim: str) -> list[int]:
        """The ranks that share every coordinate of `rank` but `dim` ("pp", "dp" or "tp"), in
        that dimension's order: its TP group, its data-parallel group, its pipeline."""
        if dim not in DIMS:
            raise ValueError(f"dim={dim}: unknown (allowed: {', '.join(DIMS)})")
        c = self.coords(rank)
        return [self.rank_of(**{**c.__dict__, dim: i}) for i in range(getattr(self, dim))]

    def ranks(self) -> torch.Tensor:
        """The DeviceMesh's rank tensor, shape (pp, dp, tp): ranks()[p, d, t] = rank_of(p, d, t)."""
        mesh = torch.empty(self.pp, self.dp, self.tp, dtype=torch.int)
        for p in range(self.pp):
            for d in range(self.dp):
                for t in range(self.tp):
                    mesh[p, d, t] = self.rank_of(p, d, t)
        return mesh


def device_mesh(grid: Grid, device_type: str = "cpu"):
    """The torch DeviceMesh of `grid` (dimensions "pp", "dp", "tp"), over the default process
    group, which must be initialised with grid.world ranks. Collective: every rank calls it,
    in the same order as its other group creations (it creates one group per dimension)."""
    from torch.distributed.device_mesh import DeviceMesh

    return DeviceMesh(device_type, grid.ranks(), mesh_dim_names=DIMS)
