"""Plan = validated config -> partition + schedule + modeled costs. Picklable: workers
receive it whole and build their stage from it."""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, replace

import torch

from harness.config import Config, ConfigError, validate
from harness.model import Model, get_model
from harness.model.partition import Partition, explicit, min_max, uniform
from harness.model.profile_data import ProfileError, load_profile
from harness.precision import Precision
from harness.result import PlanRecord
from harness.runtime.registry import EXECUTORS
from harness.schedules import p2p
from harness.schedules.registry import build
from harness.schedules.csv_io import read_csv
from harness.schedules.ir import Schedule, stage_to_rank
from harness.schedules.validate import ScheduleError
from harness.schedules.validate import validate as validate_schedule
from harness.simulate.cost import CostModel
from harness.simulate.engine import simulate


@dataclass(frozen=True)
class Plan:
    config: Config
    schedule: Schedule
    stage_layers: tuple[tuple[int, int], ...]  # [stage] (first layer, end layer)
    partition: Partition
    stage_rank: dict[int, int]
    emulated_cost: CostModel  # what compute=emulated sleeps, per stage
    device: str  # cpu | cuda (auto resolved)
    backend: str  # nccl (a GPU per rank) | gloo (CPU, or ranks sharing GPUs: tensors through host memory)
    p2p: str  # eager | safe (auto resolved): the transport of the native executor's messages
    notes: tuple[str, ...] = ()  # what the user should know about how this plan was made (printed, recorded)
    cores: int = 1  # CPU cores this process may run on
    ranks_on_host: int = 1  # worker processes on this host
    oversubscribed: bool = False  # compute=real with more busy ranks than cores (or ranks sharing a GPU)

    @property
    def world(self) -> int:
        return self.config.pp * self.config.dp

    def sim_cost(self) -> CostModel:
        """The modeled costs with the configured P2P cost: what executor=sim runs on."""
        c = self.config
        shape = get_model(c.model).activation_shape(c.microbatch_size)
        nbytes = Precision(c.dtype).bytes * math.prod(shape)  # an activation / gradient between stages
        return replace(self.emulated_cost, p2p_latency_s=c.comm.latency_s, p2p_bandwidth_Bps=c.comm.bandwidth_Bps,
                       message_bytes=(nbytes,) * len(self.stage_layers))

    def record(self) -> PlanRecord:
        """What result.json keeps of the plan: enough to draw and simulate it again without planning."""
        return PlanRecord(stage_layers=[list(b) for b in self.stage_layers], partition=self.partition.describe(),
                          stage_rank={str(k): v for k, v in self.stage_rank.items()}, device=self.device,
                          backend=self.backend, emulated_cost=asdict(self.emulated_cost),
                          sim_cost=asdict(self.sim_cost()), p2p=self.p2p, notes=list(self.notes),
                          schedule={str(r): [str(a) for a in acts] for r, acts in sorted(self.schedule.items())})


def layer_params(model: Model) -> list[int]:
    """Parameter count per layer, built on the meta device (no memory, no init)."""
    with torch.device("meta"):
        return [sum(p.numel() for p in model.build_layer(i).parameters()) for i in range(model.num_layers)]


def make_partition(c: Config, model: Model, stages: int) -> Partition:
    """With a profile, params and flops come from it too: the profile describes the model
    under study (a GPU model replayed by a small stand-in has the profile's layers, not the
    stand-in's parameters)."""
    n, method = model.num_layers, c.partition.name
    if method == "uniform":
        return Partition(method, uniform(n, stages), "layers", [1.0] * n)
    if method == "explicit":
        return Partition(method, explicit(list(c.partition.layers_per_stage), n), "layers", [1.0] * n)
    prof = load_profile(c.profile, c.microbatch_size, n) if c.profile else None
    if method == "params":
        costs = [float(lc.params) for lc in prof] if prof else [float(p) for p in layer_params(model)]
        unit = "params"
    elif method == "flops":  # forward + backward = 3 forward
        costs = [3 * (lc.fwd_flops if prof else model.fwd_flops(i, c.microbatch_size))
                 for i, lc in enumerate(prof or [None] * n)]
        unit = "flops"
    else:  # profile: measured forward + backward seconds
        costs, unit = [lc.fwd_s + lc.bwd_s for lc in prof], "s"
    return Partition(method, min_max(costs, stages), unit, costs)


def emulated_costs(c: Config, bounds: list[tuple[int, int]], num_layers: int) -> tuple[CostModel, list[str]]:
    """What compute=emulated holds each action for, per stage, and notes for the user: the
    profile's per-layer times at B when a profile is given, else CostConfig's fixed part plus
    per-sample part; a split backward as I = (1 - w) B, W = w B; all times cost.time_scale."""
    k, w = c.cost.time_scale, c.cost.weight_grad_share
    notes: list[str] = []
    if c.profile:
        layers = load_profile(c.profile, c.microbatch_size, num_layers, notes)
        fwd = tuple(k * sum(lc.fwd_s for lc in layers[a:b]) for a, b in bounds)
        bwd = tuple(k * sum(lc.bwd_s for lc in layers[a:b]) for a, b in bounds)
    else:
        cc = c.cost
        per_layer_s = cc.fwd_ms_per_layer / 1e3 * (cc.fixed_fraction + (1 - cc.fixed_fraction) * c.microbatch_size
                                                   / cc.at_microbatch_size)
        fwd = tuple(k * (b - a) * per_layer_s for a, b in bounds)
        bwd = tuple(f * cc.bwd_over_fwd for f in fwd)
    return CostModel(fwd_s=fwd, bwd_s=bwd, input_grad_s=tuple((1 - w) * b for b in bwd),
                     weight_grad_s=tuple(w * b for b in bwd)), notes


def load_schedule(c: Config) -> Schedule:
    """The built-in schedule, or the CSV file's; validated (counts, order, no deadlock)."""
    try:
        if c.schedule.name == "csv":
            schedule = read_csv(c.schedule.csv_path)
            if sorted(schedule) != list(range(c.pp)):
                raise ConfigError(f"schedule.csv_path={c.schedule.csv_path}: {len(schedule)} rows (ranks), "
                                  f"pp={c.pp} (allowed: one row per rank)")
        else:
            schedule = build(c.schedule.name, c.pp, c.microbatches, c.virtual_stages)
        stages = 1 + max(a.stage for acts in schedule.values() for a in acts)
        validate_schedule(schedule, stages, c.microbatches)
    except ScheduleError as e:
        first, _, grid = str(e).partition("\n")
        where = f"schedule.csv_path={c.schedule.csv_path}" if c.schedule.name == "csv" else f"schedule={c.schedule.name}"
        raise ConfigError(f"{where}: {first}", detail=grid) from None
    return schedule


def make_plan(c: Config, cuda_devices: int = 0) -> Plan:
    """Raises ConfigError (one line) for any input that cannot run."""
    validate(c, cuda_devices)
    if c.global_batch is not None:  # fixed global batch: the microbatch follows dp and M
        c = replace(c, microbatch_size=c.global_batch // (c.dp * c.microbatches))
    device = c.device if c.device != "auto" else ("cuda" if cuda_devices >= c.pp * c.dp else "cpu")
    model = get_model(c.model)
    schedule = load_schedule(c)
    if c.dp > 1 and any(a.kind.value in "IW" for acts in schedule.values() for a in acts):
        raise ConfigError(f"dp={c.dp}: this schedule splits I and W; DDP syncs only a full backward (use dp=1)")
    stages = 1 + max(a.stage for acts in schedule.values() for a in acts)
    if stages > model.num_layers:
        raise ConfigError(f"schedule: {stages} stages, more than the model's {model.num_layers} layers")
    try:
        partition = make_partition(c, model, stages)
        cost, notes = emulated_costs(c, partition.bounds, model.num_layers)
    except ProfileError as e:
        raise ConfigError(str(e)) from None
    # NCCL needs a GPU per rank (it refuses two ranks on one device); ranks sharing GPUs
    # exchange through host memory over gloo
    backend = "nccl" if device == "cuda" and cuda_devices >= c.pp * c.dp else "gloo"
    cores, on_host = host_cores(), ranks_on_host(c.pp * c.dp)
    # busy ranks outnumber what they run on: real timings would measure the contention
    crowded = (on_host > cores) if device == "cpu" else backend == "gloo"
    if EXECUTORS[c.executor].simulated:  # no process: its timings are the modeled costs
        crowded, on_host = False, 0
        c = replace(c, compute="emulated") if c.compute == "auto" else c
    if c.compute == "auto":
        c = replace(c, compute="emulated" if crowded else "real")
        if crowded:
            notes.append(f"compute=auto: emulated, since {on_host} ranks would share "
                         f"{f'{cores} cores' if device == 'cpu' else f'{cuda_devices} GPUs'} (compute=real times the "
                         "contention)")
    if device == "cuda" and backend == "gloo" and not EXECUTORS[c.executor].transport:
        raise ConfigError(f"device=cuda: executor={c.executor} needs a GPU per rank ({c.pp * c.dp} ranks, "
                          f"{cuda_devices} GPUs); only harness's own transport stages through host memory")
    transport = c.p2p if c.p2p != "auto" else ("safe" if backend == "nccl" else "eager")
    if EXECUTORS[c.executor].transport:
        check_transport(c, schedule, transport, backend)
    if c.timeout_s is None:  # 60 s to start, then 10x the modeled run: a hang ends, a slow run does not
        step_s = max(e.end for e in simulate(schedule, cost))
        c = replace(c, timeout_s=round(60.0 + 10 * step_s * (c.warmup_steps + c.steps), 1))
    return Plan(c, schedule, tuple(partition.bounds), partition, stage_to_rank(schedule), cost, device, backend,
                transport, tuple(notes), cores, on_host, crowded and c.compute == "real")


def host_cores() -> int:
    """CPU cores this process may run on (its affinity: a container's or taskset's share)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def ranks_on_host(world: int) -> int:
    """Worker processes on this host: torchrun's per-node count, else the whole world (forked here)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def check_transport(c: Config, schedule: Schedule, transport: str, backend: str) -> None:
    """The schedule's messages, as the transport sends them, run on this backend: no
    deadlock, every receive matched with its own message (harness/schedules/p2p.py)."""
    try:
        p2p.check(schedule, transport, backend, c.pp, c.dp, c.p2p_single_tag, validated=True)
    except p2p.P2PError as e:
        first, _, grid = str(e).partition("\n")
        raise ConfigError(f"p2p={transport} on {backend}: {first}", detail=grid) from None
