"""Typed config schema (registered in Hydra's ConfigStore) and validation.

Every field has a comment saying what it is and its unit. `validate` checks a whole
resolved config before any worker starts and raises ConfigError with one line naming
the key, the value and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from harness import compat
from harness.runtime.faults import parse_fault
from harness.runtime.registry import EXECUTORS
from harness.schedules.builders import chunks_per_rank, requirements


class ConfigError(ValueError):
    """A config value that cannot run; str() is one line for the user, `detail` (optional)
    what more there is to show (a schedule's grid)."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "zbv", "dualpipev", "csv")
SPLIT_BACKWARD = ("zb_h1", "zbv", "dualpipev")  # I/W schedules
PARTITIONS_SUPPORTED = ("uniform", "params", "flops", "profile", "explicit")
P2P_MODES = ("auto", "eager", "safe")
COMPUTE_MODES = ("auto", "real", "emulated")
DEVICES = ("cpu", "cuda", "auto")
WANDB_MODES = ("offline", "online", "disabled")


@dataclass
class ScheduleConfig:
    name: str = "1f1b"  # gpipe | 1f1b | interleaved_1f1b | zb_h1 | zbv | dualpipev | csv
    csv_path: str | None = None  # schedule=csv: PyTorch compute_only CSV, one row per rank


@dataclass
class ModelConfig:
    """Which model (the registry in harness/model/__init__.py) and its sizes. Each model
    reads the fields it needs; the rest are ignored."""

    name: str = "mlp"  # mlp: Linear+GELU layers | gpt: embedding, blocks, LM head | hf: a Hugging Face decoder | custom
    layers: int = 8  # mlp: layers; gpt, hf: transformer blocks (plus embedding and head)
    hidden: int = 256  # features per sample (mlp) or per token (gpt, hf: d_model)
    heads: int = 4  # gpt, hf: attention heads (hidden % heads == 0)
    seq: int = 64  # gpt, hf: tokens per sample
    vocab: int = 1024  # gpt, hf: vocabulary size
    arch: str = "llama"  # hf: gpt2 | llama | mistral | qwen2 (transformers' own classes, random weights, no download)
    kv_heads: int | None = None  # hf: key/value heads (grouped-query attention, heads % kv_heads == 0); null: heads
    ffn: int | None = None  # hf: feed-forward width (intermediate size); null: 4 x hidden
    target: str | None = None  # custom: "module:factory" (from the current directory or PYTHONPATH) | "path/file.py:factory"
    kwargs: dict = field(default_factory=dict)  # custom: the factory's keyword arguments (+model.kwargs.depth=3)

    @property
    def num_layers(self) -> int:
        """Partitionable layers, as the model says (mlp: layers; gpt, hf: blocks + embedding
        + head; custom: its factory's model). ModelError (a ConfigError) if it cannot be built."""
        from harness.model import get_model  # lazily: harness.model imports this module

        return get_model(self).num_layers


@dataclass
class PartitionConfig:
    """Which layers each stage holds (harness/model/partition.py)."""

    name: str = "uniform"  # uniform | params | flops | profile (needs `profile`) | explicit
    layers_per_stage: list[int] | None = None  # partition=explicit: one entry per stage, summing to the layers


@dataclass
class CostConfig:
    """Modeled op costs for compute=emulated: each action is held this long (after its
    real math, which a small model finishes well within it). Without a profile, one layer's
    forward on a microbatch of B samples costs
        fwd_ms_per_layer x (fixed_fraction + (1 - fixed_fraction) x B / at_microbatch_size):
    a fixed part (launches, per-op overhead) plus a part per sample, so sweeping B, or dp at a
    fixed global batch, changes the work as it would on hardware. With a profile, its times at
    B (interpolated between its measured sizes)."""

    fwd_ms_per_layer: float = 5.0  # forward ms of one layer on a microbatch of at_microbatch_size samples
    at_microbatch_size: int = 4  # the microbatch size fwd_ms_per_layer is given at
    fixed_fraction: float = 0.2  # share of fwd_ms_per_layer that does not scale with B
    bwd_over_fwd: float = 2.0  # backward / forward time (2: two matmuls per forward one)
    weight_grad_share: float = 0.5  # split backward: W = share x B, I = (1 - share) x B (zero-bubble schedules)
    time_scale: float = 1.0  # multiplies every emulated cost, e.g. a GPU profile slowed so CPU math fits


@dataclass
class CommConfig:
    """Point-to-point cost for executor=sim, and for `bubble.simulated` when a run measured
    no hop latency (gloo on loopback here: ~150 us latency, ~2 GB/s)."""

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
    virtual_stages: int = 1  # model chunks per rank (interleaved_1f1b; zbv and dualpipev always 2)
    microbatches: int = 8  # M per step
    microbatch_size: int = 4  # B samples per microbatch
    dp: int = 1  # data-parallel replicas of the pipeline (world = pp x dp), DDP per stage
    global_batch: int | None = None  # samples per step over all replicas; sets microbatch_size = it / (dp x M)
    checkpointing: bool = False  # activation checkpointing of every stage (non-reentrant)
    checkpoint_every: int = 0  # layers per checkpointed segment (only its input is kept); 0: whole stage
    verify_grads: bool = False  # compare the last step's gradients with a single-process run
    executor: str = "native"  # native | pytorch: torch.distributed.pipelining, same plan | sim: the simulator
    p2p: str = "auto"  # eager: tagged isend/irecv on one group | safe: a group per stage edge (NCCL-safe) | auto: safe on NCCL, else eager
    p2p_single_tag: bool = False  # every message with tag 0: gloo then matches in FIFO order, as NCCL does
    compute: str = "auto"  # real: timed math | emulated: each op held to its modeled cost (cost.*) | auto: real unless ranks would outnumber cores
    device: str = "auto"  # cpu | cuda (fewer GPUs than ranks: they share, over gloo) | auto (cuda when there are pp x dp GPUs)
    steps: int = 5  # measured steps
    warmup_steps: int = 1  # steps run before measuring (not in the metrics, losses kept)
    seed: int = 0  # model init and data
    repeat: int = 0  # a label, nothing else: sweep repeat=0,1,2 to see how much the same config varies run to run
    lr: float = 0.01  # SGD learning rate
    max_processes: int = 16  # refuse pp x dp above this (each rank is a process)
    start_method: str = "forkserver"  # forkserver: ranks fork from a server that imported torch once | spawn
    timeout_s: float | None = None  # watchdog: workers not done by then are killed, the job fails; None: scaled to the run
    resume: bool = False  # in an existing sweep dir: skip jobs whose result.json says ok
    debug: bool = False  # show tracebacks instead of one-line errors
    profile: str | None = None  # per-layer profile JSON: partition=profile costs; compute=emulated sleeps it
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
    _one_of("schedule", c.schedule.name, SCHEDULES)
    from harness.model import MODELS as registered  # the model registry (harness.model imports this module)

    _one_of("model", c.model.name, tuple(registered))
    _one_of("partition", c.partition.name, PARTITIONS_SUPPORTED)
    _one_of("executor", c.executor, tuple(EXECUTORS))
    _one_of("p2p", c.p2p, P2P_MODES)
    _one_of("compute", c.compute, COMPUTE_MODES)
    _one_of("device", c.device, DEVICES)
    _one_of("wandb.mode", c.wandb.mode, WANDB_MODES)
    _one_of("start_method", c.start_method, ("forkserver", "spawn"))
    for key in ("pp", "microbatches", "microbatch_size", "steps", "virtual_stages", "dp", "max_processes"):
        _at_least(key, getattr(c, key), 1)
    _at_least("warmup_steps", c.warmup_steps, 0)
    _at_least("model.layers", c.model.layers, 1)
    _at_least("model.hidden", c.model.hidden, 1)
    if c.model.name == "gpt":
        for key in ("heads", "seq", "vocab"):
            _at_least(f"model.{key}", getattr(c.model, key), 1)
        if c.model.hidden % c.model.heads:
            raise ConfigError(f"model.heads={c.model.heads}: must divide model.hidden={c.model.hidden}")
    if c.partition.name == "profile" and not c.profile:
        raise ConfigError("partition=profile: needs profile=<per-layer profile JSON> "
                          "(write one with `python -m harness.profile`)")
    lps = c.partition.layers_per_stage
    if c.partition.name == "explicit":
        stages = c.pp * chunks_per_rank(c.schedule.name, c.virtual_stages)
        if not lps or len(lps) != stages:
            raise ConfigError(f"partition.layers_per_stage={lps}: partition=explicit needs {stages} entries "
                              f"(one per stage)")
        if any(n < 1 for n in lps) or sum(lps) != c.model.num_layers:
            raise ConfigError(f"partition.layers_per_stage={lps}: entries must be >= 1 and sum to the "
                              f"model's {c.model.num_layers} layers")
    if c.lr <= 0:
        raise ConfigError(f"lr={c.lr}: must be > 0")
    if c.timeout_s is not None and c.timeout_s <= 0:
        raise ConfigError(f"timeout_s={c.timeout_s}: must be > 0 seconds")
    if c.cost.time_scale <= 0:
        raise ConfigError(f"cost.time_scale={c.cost.time_scale}: must be > 0")
    if c.cost.fwd_ms_per_layer < 0 or c.cost.bwd_over_fwd < 0:
        raise ConfigError(f"cost.fwd_ms_per_layer={c.cost.fwd_ms_per_layer}, cost.bwd_over_fwd="
                          f"{c.cost.bwd_over_fwd}: must be >= 0")
    _at_least("cost.at_microbatch_size", c.cost.at_microbatch_size, 1)
    for key in ("fixed_fraction", "weight_grad_share"):
        if not 0 <= getattr(c.cost, key) <= 1:
            raise ConfigError(f"cost.{key}={getattr(c.cost, key)}: must be between 0 and 1")
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
    if c.schedule.name == "csv":
        if not c.schedule.csv_path or not Path(c.schedule.csv_path).is_file():
            raise ConfigError(f"schedule.csv_path={c.schedule.csv_path}: schedule=csv needs an existing "
                              "compute_only CSV file (export one: python -m harness.schedules.export)")
    elif (why := requirements(c.schedule.name, c.pp, c.microbatches, c.virtual_stages)) is not None:
        raise ConfigError(why)
    if c.global_batch is not None:
        if c.global_batch < 1 or c.global_batch % (c.dp * c.microbatches):
            raise ConfigError(f"global_batch={c.global_batch}: must split evenly into dp={c.dp} x "
                              f"microbatches={c.microbatches} microbatches (allowed: multiples of "
                              f"{c.dp * c.microbatches})")
    executor = EXECUTORS[c.executor]
    if c.dp > 1 and not executor.dp:
        able = ", ".join(n for n, e in EXECUTORS.items() if e.dp)
        raise ConfigError(f"dp={c.dp}: executor={c.executor} runs one pipeline (allowed: dp=1, or executor={able})")
    if fault and fault.kind not in executor.faults:
        raise ConfigError(f"fault={c.fault}: executor={c.executor} honours "
                          f"{', '.join(executor.faults) or 'no faults'}")
    if c.device == "cuda" and "cuda" not in executor.devices:
        raise ConfigError(f"device=cuda: executor={c.executor} runs on {', '.join(executor.devices)}")
    if c.schedule.name in SPLIT_BACKWARD and not executor.split_backward:
        raise ConfigError(f"schedule={c.schedule.name}: executor={c.executor} runs no split backward (I/W)")
    if executor.private_torch(c) and (problem := compat.untested_torch()):
        raise ConfigError(f"executor={c.executor}: {problem}")
    if executor.check is not None and (problem := executor.check(c)):
        raise ConfigError(problem)
    if c.dp > 1 and c.schedule.name in SPLIT_BACKWARD:
        raise ConfigError(f"dp={c.dp}: schedule={c.schedule.name} defers weight gradients past the backward, "
                          f"where DDP's gradient hooks never see them (allowed with dp > 1: gpipe, 1f1b, "
                          "interleaved_1f1b, or dp=1)")
    _at_least("checkpoint_every", c.checkpoint_every, 0)
    smallest = c.model.num_layers // (c.pp * chunks_per_rank(c.schedule.name, c.virtual_stages))
    if c.checkpointing and c.checkpoint_every > smallest:
        raise ConfigError(f"checkpoint_every={c.checkpoint_every}: more than the {smallest} layers of the "
                          f"smallest stage (allowed: 1..{smallest})")
    stages = c.pp * chunks_per_rank(c.schedule.name, c.virtual_stages)
    if stages > c.model.num_layers:
        raise ConfigError(f"pp={c.pp}: {stages} stages, more than the model's {c.model.num_layers} layers "
                          f"(allowed: pp x chunks per rank <= {c.model.num_layers}, or raise model.layers)")
    world = c.pp * c.dp
    if world > c.max_processes:
        raise ConfigError(f"pp={c.pp} x dp={c.dp}: {world} processes, more than max_processes={c.max_processes}")
    if c.device == "cuda" and cuda_devices == 0:
        raise ConfigError("device=cuda: no CUDA device here (use device=cpu or device=auto)")
