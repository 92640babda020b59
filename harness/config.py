"""Typed config schema (registered in Hydra's ConfigStore) and validation.

Every field has a comment saying what it is and its unit. `validate` checks a whole
resolved config before any worker starts and raises ConfigError with one line naming
the key, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from harness.runtime.faults import parse_fault


class ConfigError(ValueError):
    """A config value that cannot run; str() is one line for the user."""


# What this version runs; schedule files for the others exist so `schedule=zbv` says
# "not supported yet" instead of "not found".
SCHEDULES_SUPPORTED = ("gpipe", "1f1b")
SCHEDULES_PLANNED = ("interleaved_1f1b", "zb_h1", "zbv", "dualpipev", "csv")
MODELS = ("mlp",)
PARTITIONS_SUPPORTED = ("uniform",)
PARTITIONS_PLANNED = ("params", "flops", "profile", "explicit")
EXECUTORS_SUPPORTED = ("native",)
EXECUTORS_PLANNED = ("pytorch", "sim")
COMPUTE_MODES = ("real", "emulated")
DEVICES = ("cpu", "cuda", "auto")
WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class ScheduleConfig:
    name: str = "1f1b"  # gpipe | 1f1b (interleaved_1f1b, zb_h1, zbv, dualpipev, csv: later)
    csv_path: str | None = None  # schedule=csv: PyTorch compute_only CSV (later)


@dataclass
class ModelConfig:
    name: str = "mlp"  # mlp: a stack of identical Linear+GELU layers
    layers: int = 8  # layers in the whole model (split across stages)
    hidden: int = 256  # features per sample in and out of every layer


@dataclass
class PartitionConfig:
    name: str = "uniform"  # uniform: equal layer counts, the first stages take the remainder
    layers_per_stage: list[int] | None = None  # partition=explicit (later)


@dataclass
class CostConfig:
    """Modeled op costs for compute=emulated: each action sleeps this long (after its
    real math, which a small model finishes well within it)."""

    fwd_ms_per_layer: float = 5.0  # forward ms of one layer for one microbatch
    bwd_over_fwd: float = 2.0  # backward / forward time (2: two matmuls per forward one)


@dataclass
class CommConfig:
    """Point-to-point cost the simulator uses for `bubble.simulated` (gloo on loopback
    here measured ~150 us latency, ~2 GB/s)."""

    latency_s: float = 150e-6
    bandwidth_Bps: float = 2e9


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline (files under the job dir; `wandb sync` later) | online | disabled
    project: str = "harness"
    entity: str | None = None


@dataclass
class Config:
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    pp: int = 4  # pipeline ranks N (one stage each)
    virtual_stages: int = 1  # model chunks per rank (interleaved / V schedules; later)
    microbatches: int = 8  # M per step
    microbatch_size: int = 4  # B samples per microbatch
    dp: int = 1  # data-parallel replicas of the pipeline (later)
    checkpointing: bool = False  # activation checkpointing of every stage (non-reentrant)
    checkpoint_every: int = 0  # layers per checkpointed segment (only its input is kept); 0: whole stage
    verify_grads: bool = False  # compare the last step's gradients with a single-process run
    executor: str = "native"  # native (pytorch, sim: later)
    compute: str = "real"  # real math | emulated: each op sleeps its modeled cost (cost.*)
    device: str = "auto"  # cpu | cuda | auto (cuda when there are pp x dp GPUs)
    steps: int = 5  # measured steps
    warmup_steps: int = 1  # steps run before measuring (not in the metrics, losses kept)
    seed: int = 0  # model init and data
    lr: float = 0.01  # SGD learning rate
    max_processes: int = 16  # refuse pp x dp above this (each rank is a process)
    timeout_s: float = 300.0  # a job whose workers have not finished by then fails
    fault: str | None = None  # TEST ONLY: raise|kill|hang@rankR,stepS (harness/runtime/faults.py)


def register() -> None:
    ConfigStore.instance().store(name="harness_schema", node=Config)


def to_config(cfg: DictConfig) -> Config:
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]


def _one_of(key: str, value: object, allowed: tuple[str, ...], planned: tuple[str, ...] = ()) -> None:
    if value in planned:
        raise ConfigError(f"{key}={value}: not supported yet (supported: {', '.join(allowed)})")
    if value not in allowed:
        raise ConfigError(f"{key}={value}: unknown (allowed: {', '.join(allowed)})")


def _at_least(key: str, value: float, low: float, what: str = "an integer") -> None:
    if value < low:
        raise ConfigError(f"{key}={value}: must be {what} >= {low}")


def validate(c: Config, cuda_devices: int = 0) -> None:
    """Everything a run needs that the schema cannot express, checked before any worker."""
    _one_of("schedule", c.schedule.name, SCHEDULES_SUPPORTED, SCHEDULES_PLANNED)
    _one_of("model", c.model.name, MODELS)
    _one_of("partition", c.partition.name, PARTITIONS_SUPPORTED, PARTITIONS_PLANNED)
    _one_of("executor", c.executor, EXECUTORS_SUPPORTED, EXECUTORS_PLANNED)
    _one_of("compute", c.compute, COMPUTE_MODES)
    _one_of("device", c.device, DEVICES)
    _one_of("wandb.mode", c.wandb.mode, WANDB_MODES)
    for key in ("pp", "microbatches", "microbatch_size", "steps", "virtual_stages", "dp", "max_processes"):
        _at_least(key, getattr(c, key), 1)
    _at_least("warmup_steps", c.warmup_steps, 0)
    _at_least("model.layers", c.model.layers, 1)
    _at_least("model.hidden", c.model.hidden, 1)
    if c.lr <= 0:
        raise ConfigError(f"lr={c.lr}: must be > 0")
    if c.timeout_s <= 0:
        raise ConfigError(f"timeout_s={c.timeout_s}: must be > 0 seconds")
    if c.cost.fwd_ms_per_layer < 0 or c.cost.bwd_over_fwd < 0:
        raise ConfigError(f"cost.fwd_ms_per_layer={c.cost.fwd_ms_per_layer}, cost.bwd_over_fwd="
                          f"{c.cost.bwd_over_fwd}: must be >= 0")
    if c.comm.latency_s < 0 or c.comm.bandwidth_Bps <= 0:
        raise ConfigError(f"comm.latency_s={c.comm.latency_s}, comm.bandwidth_Bps={c.comm.bandwidth_Bps}: "
                          "latency must be >= 0 and bandwidth > 0")
    try:
        fault = parse_fault(c.fault)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if fault and not (fault.rank < c.pp * c.dp and fault.step < c.warmup_steps + c.steps):
        raise ConfigError(f"fault={c.fault}: rank or step outside this run ({c.pp * c.dp} ranks, "
                          f"{c.warmup_steps + c.steps} steps)")
    if c.virtual_stages != 1:
        raise ConfigError(f"virtual_stages={c.virtual_stages}: not supported yet (supported: 1)")
    if c.dp != 1:
        raise ConfigError(f"dp={c.dp}: not supported yet (supported: 1)")
    _at_least("checkpoint_every", c.checkpoint_every, 0)
    smallest = c.model.layers // (c.pp * c.virtual_stages)
    if c.checkpointing and c.checkpoint_every > smallest:
        raise ConfigError(f"checkpoint_every={c.checkpoint_every}: more than the {smallest} layers of the "
                          f"smallest stage (allowed: 1..{smallest})")
    if c.pp > c.model.layers:
        raise ConfigError(f"pp={c.pp}: more stages than model.layers={c.model.layers} "
                          f"(allowed: pp <= {c.model.layers}, or raise model.layers)")
    world = c.pp * c.dp
    if world > c.max_processes:
        raise ConfigError(f"pp={c.pp} x dp={c.dp}: {world} processes, more than max_processes={c.max_processes}")
    if c.device == "cuda" and cuda_devices < world:
        raise ConfigError(f"device=cuda: pp x dp = {world} ranks need {world} CUDA devices, found {cuda_devices} "
                          "(use device=cpu or device=auto)")
