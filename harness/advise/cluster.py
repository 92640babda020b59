"""The cluster a plan is predicted for: `cluster=<preset>` (harness/conf/cluster/*.yaml), typed
and checked here, and the link model every prediction prices its communication with.

Link model (stated, not measured, for the GPU presets; measured for cluster=here):
- a GPU's place: global GPU g is on node g // gpus_per_node;
- placement `pp_inner` (the harness's own rank layout, global rank = replica x pp + stage
  rank): a pipeline's ranks are consecutive GPUs, so with pp <= gpus_per_node a pipeline stays
  inside a node and its data-parallel peers sit on other nodes; `dp_inner` (GPU = stage rank x
  dp + replica): a stage's replicas are consecutive, pipeline boundaries cross nodes;
- point to point: a message between two GPUs of one node costs intra.latency_s + bytes /
  intra.bandwidth_Bps, between nodes the same with `inter` (per GPU and per direction: each GPU
  has its own NIC, as in a DGX H200);
- all-reduce: ring (Patarasuk & Yuan 2009), 2 (n-1) latency + 2 (n-1)/n bytes / bandwidth,
  over the slowest link the ring uses (inter-node if its members span nodes), no overlap with
  the backward (the harness's own dp_sync_theory_s model);
- ZeRO-1 (torch's ZeroRedundancyOptimizer): after the step each replica broadcasts its
  updated shard: an all-gather, (n-1) latency + (n-1)/n parameter bytes / bandwidth;
- the optimizer step: parameters x bytes it reads and writes / memory_bandwidth_Bps (AdamW with
  fp32 masters in low precision touches 28 B per parameter, SGD 10: a memory-bound elementwise pass).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

PLACEMENTS = ("pp_inner", "dp_inner")
GIB = 2**30


class AdviseError(ValueError):
    """An input the advisor cannot plan for; str() is one line naming why (exit 2)."""


@dataclass
class LinkConfig:
    latency_s: float = 10e-6  # seconds per message (or per ring step) on this link
    bandwidth_Bps: float = 100e9  # bytes per second, per GPU and per direction


@dataclass
class OverheadConfig:
    """What an executor adds to the modeled costs (measured on cluster=here by calibrate.py;
    zero where nothing was measured): the simulator adds it so predictions hold for real runs."""

    # each table: ranks on the host -> seconds, linear between the measured counts (ranks
    # beyond the cores share them, so every figure grows with the ranks); empty: zero
    action_s: dict[str, float] = field(default_factory=dict)  # per emulated compute action: oversleep, tracing, hooks
    real_fwd_scale: dict[str, float] = field(default_factory=dict)  # compute=real: a run's F over the profile's (1 if empty)
    real_bwd_scale: dict[str, float] = field(default_factory=dict)  # compute=real: a run's B over the profile's (1 if empty)
    step_s: dict[str, float] = field(default_factory=dict)  # per step: window edges, optimizer launch, stragglers
    send_s: dict[str, float] = field(default_factory=dict)  # posting a send to another rank (the sender waits)
    recv_s: dict[str, float] = field(default_factory=dict)  # a receive whose message is already there
    hop_s: dict[str, float] = field(default_factory=dict)  # the rest of a P2P hop (replaces the link's latency)
    allreduce_s: dict[str, float] = field(default_factory=dict)  # per DDP sync beyond the ring model (replica skew)

    def at(self, table: str, world: int) -> float:
        return by_world(getattr(self, table), world)

    def any(self) -> bool:
        return any(getattr(self, k) for k in TABLES)


TABLES = ("action_s", "real_fwd_scale", "real_bwd_scale", "step_s", "send_s", "recv_s", "hop_s", "allreduce_s")


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


@dataclass
class ClusterConfig:
    name: str = "unnamed"
    description: str = ""
    source: str = ""  # where every figure comes from
    device: str = "cuda"  # cuda: GPUs (activations traced on fake tensors) | cpu: ranks are processes here
    gpus_per_node: int = 8
    nodes: int = 1
    memory_per_gpu_gib: float = 80.0  # what the device has
    memory_reserve_gib: float = 0.0  # not for the model: context, communication buffers, fragmentation
    memory_bandwidth_Bps: float = 1e12  # device memory bandwidth: the optimizer step's elementwise pass
    intra: LinkConfig = field(default_factory=LinkConfig)
    inter: LinkConfig = field(default_factory=LinkConfig)
    allreduce: str = "ring"  # the collective algorithm priced (ring only)
    allreduce_intra: LinkConfig | None = None  # measured all-reduce figures, if they differ from the P2P link
    allreduce_inter: LinkConfig | None = None
    overhead: OverheadConfig = field(default_factory=OverheadConfig)
    cores: int | None = None  # cluster=here: CPU cores (ranks beyond them share)
    calibrated: dict[str, Any] = field(default_factory=dict)  # cluster=here: the raw calibration figures

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def usable_bytes(self) -> int:
        return int((self.memory_per_gpu_gib - self.memory_reserve_gib) * GIB)

    # -- links ------------------------------------------------------------------------------
    def node(self, gpu: int) -> int:
        return gpu // self.gpus_per_node

    def gpu_of(self, placement: str, stage_rank: int, replica: int, pp: int, dp: int) -> int:
        return replica * pp + stage_rank if placement == "pp_inner" else stage_rank * dp + replica

    def p2p_s(self, nbytes: float, same_node: bool, world: int) -> float:
        link = self.intra if same_node else self.inter
        latency = self.overhead.at("hop_s", world) if self.overhead.hop_s else link.latency_s
        return latency + nbytes / link.bandwidth_Bps

    def ring_link(self, gpus: list[int]) -> LinkConfig:
        same = len({self.node(g) for g in gpus}) == 1
        if same:
            return self.allreduce_intra or self.intra
        return self.allreduce_inter or self.inter

    def allreduce_s(self, nbytes: float, gpus: list[int]) -> float:
        n = len(gpus)
        if n <= 1:
            return 0.0
        link = self.ring_link(gpus)
        return 2 * (n - 1) * link.latency_s + 2 * (n - 1) / n * nbytes / link.bandwidth_Bps

    def allgather_s(self, nbytes: float, gpus: list[int]) -> float:
        n = len(gpus)
        if n <= 1:
            return 0.0
        link = self.ring_link(gpus)
        return (n - 1) * link.latency_s + (n - 1) / n * nbytes / link.bandwidth_Bps

    @cached_property
    def summary(self) -> str:
        return (f"{self.name}: {self.nodes} x {self.gpus_per_node} {self.device}, "
                f"{self.memory_per_gpu_gib:g} GiB - {self.memory_reserve_gib:g} reserved, "
                f"intra {_bw(self.intra)}, inter {_bw(self.inter)}")


def _bw(link: LinkConfig) -> str:
    return f"{link.bandwidth_Bps / 1e9:g} GB/s + {link.latency_s * 1e6:g} us"


def _check_link(key: str, link: LinkConfig | None) -> None:
    if link is None:
        return
    if not (math.isfinite(link.latency_s) and link.latency_s >= 0):
        raise AdviseError(f"cluster.{key}.latency_s={link.latency_s}: must be a finite number >= 0")
    if not (math.isfinite(link.bandwidth_Bps) and link.bandwidth_Bps > 0):
        raise AdviseError(f"cluster.{key}.bandwidth_Bps={link.bandwidth_Bps}: must be a finite number > 0")


def check(c: ClusterConfig) -> ClusterConfig:
    """Everything a cluster must say, each problem one line naming the key."""
    if c.device not in ("cuda", "cpu"):
        raise AdviseError(f"cluster.device={c.device}: unknown (allowed: cuda, cpu)")
    for key in ("gpus_per_node", "nodes"):
        if getattr(c, key) < 1:
            raise AdviseError(f"cluster.{key}={getattr(c, key)}: must be an integer >= 1")
    for key in ("memory_per_gpu_gib", "memory_bandwidth_Bps"):
        v = getattr(c, key)
        if not (math.isfinite(v) and v > 0):
            raise AdviseError(f"cluster.{key}={v}: must be a finite number > 0")
    if not (math.isfinite(c.memory_reserve_gib) and 0 <= c.memory_reserve_gib < c.memory_per_gpu_gib):
        raise AdviseError(f"cluster.memory_reserve_gib={c.memory_reserve_gib}: must be >= 0 and below "
                          f"memory_per_gpu_gib={c.memory_per_gpu_gib}")
    if c.allreduce != "ring":
        raise AdviseError(f"cluster.allreduce={c.allreduce}: unknown (allowed: ring)")
    for key in ("intra", "inter", "allreduce_intra", "allreduce_inter"):
        _check_link(key, getattr(c, key))
    o = c.overhead
    for key in TABLES:
        for k, v in getattr(o, key).items():
            if not str(k).isdigit() or not (math.isfinite(float(v)) and float(v) >= 0):
                raise AdviseError(f"cluster.overhead.{key}: {k}: {v} (allowed: ranks on the host -> seconds >= 0)")
    return c


def _refuse_unknown(node: Any, cls: type, prefix: str = "cluster.") -> None:
    from omegaconf import DictConfig

    names = {f.name: f for f in dataclasses.fields(cls)}
    hints = {f.name: f.type for f in dataclasses.fields(cls)}
    for key in node.keys():
        if key not in names:
            near = difflib.get_close_matches(str(key), list(names), n=1)
            raise AdviseError(f"{prefix}{key}: unknown key" + (f" (did you mean {prefix}{near[0]}?)" if near else
                                                                f" (allowed: {', '.join(names)})"))
        sub = node[key]
        if isinstance(sub, DictConfig) and "LinkConfig" in str(hints[key]):
            _refuse_unknown(sub, LinkConfig, f"{prefix}{key}.")
        elif isinstance(sub, DictConfig) and key == "overhead":
            _refuse_unknown(sub, OverheadConfig, f"{prefix}{key}.")


def from_dict(d: Any) -> ClusterConfig:
    """A ClusterConfig from the composed `cluster` node (or a dict), typed and checked."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    node = OmegaConf.create(d) if not OmegaConf.is_config(d) else d
    _refuse_unknown(node, ClusterConfig)
    try:
        merged = OmegaConf.merge(OmegaConf.structured(ClusterConfig), node)
        c = OmegaConf.to_object(merged)
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", "") or ""
        raise AdviseError(f"cluster.{key}: {str(e).splitlines()[0]}") from None
    return check(c)  # type: ignore[arg-type]


def presets() -> list[str]:
    return sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "cluster").glob("*.yaml"))


def load(overrides: list[str]) -> ClusterConfig:
    """`cluster=<preset>` and `cluster.<key>=<value>` overrides, composed by Hydra from
    harness/conf/cluster/, typed and checked. AdviseError (one line) for a missing preset, an
    unknown key or a bad value."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    chosen = [o for o in overrides if o.split("=", 1)[0].lstrip("+") == "cluster"]
    if not chosen:
        raise AdviseError(f"cluster: no cluster given (allowed: cluster=<{'|'.join(presets())}>)")
    name = chosen[-1].split("=", 1)[1]
    if name not in presets():
        near = difflib.get_close_matches(name, presets(), n=1)
        raise AdviseError(f"cluster={name}: no such preset" + (f" (did you mean {near[0]}?)" if near else "") +
                          f" (allowed: {', '.join(presets())})")
    rest = [o if o.startswith("+") or "." not in o.split("=", 1)[0] else o for o in overrides
            if o not in chosen]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module(config_module="harness.conf", version_base="1.3"):
            cfg = compose(config_name=None, overrides=[f"+cluster={name}", *rest])
    except Exception as e:  # noqa: BLE001 - Hydra's parse errors: one line
        raise AdviseError(f"cluster: {str(e).splitlines()[0]}") from None
    finally:
        GlobalHydra.instance().clear()
    return from_dict(cfg.cluster)
