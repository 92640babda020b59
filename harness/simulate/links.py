"""The link model a cluster (`cluster=<preset>`, harness/config.py's ClusterConfig) prices
communication with: stated, not measured, for the GPU presets; measured for cluster=here.

- a GPU's place: global GPU g is on node g // gpus_per_node; a TP group is tp consecutive GPUs
  (its first stands for it: a group inside a node, as the launchers place it);
- placement `pp_inner` (the harness's own rank layout, global rank = replica x pp + stage
  rank): a pipeline's ranks are consecutive GPUs, so with pp <= gpus_per_node a pipeline stays
  inside a node and its data-parallel peers sit on other nodes; `dp_inner` (GPU = stage rank x
  dp + replica): a stage's replicas are consecutive, pipeline boundaries cross nodes;
- point to point: a message between two GPUs of one node costs intra.latency_s + bytes /
  intra.bandwidth_Bps, between nodes the same with `inter` (per GPU and per direction: each GPU
  has its own NIC, as in a DGX H200); a measured hop (overhead.hop_s) replaces the latency;
- all-reduce: ring (Patarasuk & Yuan 2009), 2 (n-1) latency + 2 (n-1)/n bytes / bandwidth,
  over the slowest link the ring uses (inter-node if its members span nodes);
- ZeRO-1 (torch's ZeroRedundancyOptimizer): after the step each replica broadcasts its
  updated shard: an all-gather, (n-1) latency + (n-1)/n parameter bytes / bandwidth;
- the executor's overheads (overhead.*): tables by ranks on the host, linear between the
  measured counts.
"""

from __future__ import annotations

from harness.config import ClusterConfig, LinkConfig


def by_world(table: dict, world: int) -> float:
    """The table's value at `world` ranks: linear between the measured counts, the nearest
    count's value outside them; 0 for an empty table."""
    pts = sorted((int(k), float(v)) for k, v in table.items())
    if not pts:
        return 0.0
    if world <= pts[0][0]:
        return pts[0][1]
    for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
        if world <= n1:
            return v0 + (v1 - v0) * (world - n0) / (n1 - n0)
    return pts[-1][1]


def overhead(c: ClusterConfig, table: str, world: int) -> float:
    return by_world(getattr(c.overhead, table), world)


def node(c: ClusterConfig, gpu: int) -> int:
    return gpu // c.gpus_per_node


def gpu_of(placement: str, stage_rank: int, replica: int, pp: int, dp: int, tp: int = 1) -> int:
    """The first GPU of the TP group (tp consecutive GPUs, harness/runtime/groups.py's Layout)."""
    return tp * (replica * pp + stage_rank if placement == "pp_inner" else stage_rank * dp + replica)


def replicas(placement: str, stage_rank: int, pp: int, dp: int, tp: int = 1) -> list[int]:
    """The GPUs of a pipeline rank's dp replicas (each TP group's first)."""
    return [gpu_of(placement, stage_rank, k, pp, dp, tp) for k in range(dp)]


def crosses(c: ClusterConfig, placement: str, r: int, q: int, pp: int, dp: int, tp: int = 1) -> bool:
    """Whether the messages between pipeline ranks r and q cross nodes (in any replica: the
    slowest replica sets the pace)."""
    return any(node(c, a) != node(c, b)
               for a, b in zip(replicas(placement, r, pp, dp, tp), replicas(placement, q, pp, dp, tp)))


def p2p_s(c: ClusterConfig, nbytes: float, same_node: bool, world: int) -> float:
    link = c.intra if same_node else c.inter
    latency = overhead(c, "hop_s", world) if c.overhead.hop_s else link.latency_s
    return latency + nbytes / link.bandwidth_Bps


def ring_link(c: ClusterConfig, gpus: list[int]) -> LinkConfig:
    if len({node(c, g) for g in gpus}) == 1:
        return c.allreduce_intra or c.intra
    return c.allreduce_inter or c.inter


def ring_allreduce_s(n: int, nbytes: float, link: LinkConfig) -> float:
    """Ring all-reduce of `nbytes` over n members: 2 (n-1) steps of latency, and 2 (n-1) / n
    of the bytes over the link (Patarasuk & Yuan 2009)."""
    if n <= 1:
        return 0.0
    return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bandwidth_Bps


def allreduce_s(c: ClusterConfig, nbytes: float, gpus: list[int]) -> float:
    return ring_allreduce_s(len(gpus), nbytes, ring_link(c, gpus))


def allgather_s(c: ClusterConfig, nbytes: float, gpus: list[int]) -> float:
    n = len(gpus)
    if n <= 1:
        return 0.0
    link = ring_link(c, gpus)
    return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth_Bps


def summary(c: ClusterConfig) -> str:
    return (f"{c.name}: {c.nodes} x {c.gpus_per_node} {c.device}, {c.memory_per_gpu_gib:g} GiB - "
            f"{c.memory_reserve_gib:g} reserved, intra {_bw(c.intra)}, inter {_bw(c.inter)}")


def _bw(link: LinkConfig) -> str:
    return f"{link.bandwidth_Bps / 1e9:g} GB/s + {link.latency_s * 1e6:g} us"
