"""Typed config schema (registered in Hydra's ConfigStore) and validation.

Every field has a comment saying what it is and its unit. `validate` checks a whole
resolved config before any worker starts and raises ConfigError with one line naming
the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import os
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import (ConfigAttributeError, ConfigKeyError, InterpolationResolutionError,
                              MissingMandatoryValue, OmegaConfBaseException, ValidationError)

from harness import compat
from harness.runtime.faults import parse_fault
from harness.runtime.registry import EXECUTORS
from harness.schedules.registry import SCHEDULES, chunks_per_rank, requirements


class ConfigError(ValueError):
    """A config value that cannot run; str() is one line for the user, `detail` (optional)
    what more there is to show (a schedule's grid)."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


PARTITIONS_SUPPORTED = ("uniform", "params", "flops", "profile", "explicit")
P2P_MODES = ("auto", "eager", "safe")
PLACEMENTS = ("pp_inner", "dp_inner")  # harness.runtime.groups.Layout: a launcher slot <-> a global rank
COMPUTE_MODES = ("auto", "real", "emulated")
DEVICES = ("cpu", "cuda", "auto")
WANDB_MODES = ("offline", "online", "disabled")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("sgd", "adamw")


@dataclass
class OptimizerConfig:
    """torch's own optimizer, stepping fp32 (master copies in low precision: harness/optimizer.py)."""

    name: str = "sgd"  # sgd | adamw
    momentum: float = 0.0  # sgd: 0 keeps no state
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # adamw: moment decay rates
    eps: float = 1e-8  # adamw
    weight_decay: float = 0.0  # sgd: L2; adamw: decoupled (AdamW's own)


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
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    pp: int = 4  # pipeline ranks N (one stage each)
    virtual_stages: int = 1  # model chunks per rank (interleaved_1f1b; zbv and dualpipev always 2)
    microbatches: int = 8  # M per step
    microbatch_size: int = 4  # B samples per microbatch
    dp: int = 1  # data-parallel replicas of the pipeline (world = pp x dp), DDP per stage
    placement: str = "pp_inner"  # where ranks land: pp_inner (a pipeline on consecutive GPUs/launcher ranks) | dp_inner (a stage's replicas consecutive)
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
    lr: float = 0.01  # the optimizer's learning rate
    dtype: str = "fp32"  # fp32 | bf16 | fp16: parameters, activations, messages, gradients (fp32 masters in the optimizer)
    zero: int = 0  # 0 | 1: ZeRO-1, each stage's optimizer state sharded across its dp replicas
    memory_budget_gib: float | None = None  # per rank: each run says if it fits; a sweep skips points theory says cannot
    max_processes: int = 16  # refuse pp x dp above this (each rank is a process)
    start_method: str = "forkserver"  # forkserver: ranks fork from a server that imported torch once | spawn
    timeout_s: float | None = None  # watchdog: workers not done by then are killed, the job fails; None: scaled to the run
    resume: bool = False  # in an existing sweep dir: skip jobs whose result.json says ok
    skip_invalid: bool = False  # a sweep with points that cannot run: run the others (listed as skipped) instead of none
    debug: bool = False  # show tracebacks instead of one-line errors
    profile: str | None = None  # per-layer profile JSON: partition=profile costs; compute=emulated sleeps it
    fault: str | None = None  # TEST ONLY: raise|kill|hang@rankR,stepS (harness/runtime/faults.py)


def set_keys(c: Config, **values: Any) -> Config:
    """`c` with dotted keys set (`set_keys(c, **{"model.hidden": 64})`), unvalidated: for code
    that builds a Config without Hydra (calibration runs, tests)."""
    for key, value in values.items():
        target = c
        *path, leaf = key.split(".")
        for part in path:
            target = getattr(target, part)
        setattr(target, leaf, value)
    return c


def register() -> None:
    ConfigStore.instance().store(name="harness_schema", node=Config)
    if not OmegaConf.has_resolver("harness.dirname"):
        OmegaConf.register_new_resolver("harness.dirname", job_dirname)


DIRNAME_BYTES = 100  # a sweep job's directory name past `<n>_`: far below NAME_MAX (255) with any prefix


def job_dirname(override_dirname: str, limit: int = DIRNAME_BYTES) -> str:
    """A sweep job's directory name (after `<n>_`) from Hydra's override_dirname: itself when
    short, else its first characters and a hash of the whole (a sweep with many overrides
    would hit the file system's 255-byte limit). "/" (a path in a value) becomes "-", so a
    job is one directory."""
    name = str(override_dirname).replace("/", "-").replace(os.sep, "-")
    raw = name.encode()
    if len(raw) <= limit:
        return name
    digest = hashlib.sha1(raw).hexdigest()[:10]
    head = raw[:limit - len(digest) - 1].decode(errors="ignore").rstrip(",_=")
    return f"{head}_{digest}"


def schema_keys(cls: type | None = None, prefix: str = "") -> dict[str, Any]:
    """Every key of the typed schema, dotted, with its type hint (nested dataclasses included
    as keys of their own too)."""
    out: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(cls or Config).items():
        out[prefix + name] = hint
        if dataclasses.is_dataclass(hint):
            out |= schema_keys(hint, f"{prefix}{name}.")
    return out


def _what_fits(hint: Any) -> str:
    """What a value of type `hint` must be, for a one-line message."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    optional = type(None) in typing.get_args(hint)
    base = args[0] if optional and len(args) == 1 else hint
    origin = typing.get_origin(base)
    if base is bool:
        what = "true or false"
    elif base is int:
        what = "an integer"
    elif base is float:
        what = "a number"
    elif base is str:
        what = "a string"
    elif origin is list:
        item = typing.get_args(base)[0] if typing.get_args(base) else None
        what = "a list of integers, e.g. [3,2,2,1]" if item is int else "a list, e.g. [a,b]"
    elif base is dict or origin is dict:
        what = "a dict, e.g. {depth:3}"
    elif dataclasses.is_dataclass(base):
        keys = ", ".join(f.name for f in dataclasses.fields(base))
        return f"is a group of keys, not a value (set one of them: {keys})"
    else:
        what = str(base)
    return f"must be {what}" + (" or null" if optional else "")


def unknown_key(key: str, value: object) -> str:
    """`ppp=2: unknown key (did you mean pp?)`."""
    keys = list(schema_keys())
    near = difflib.get_close_matches(key.lstrip("+~"), keys, n=1, cutoff=0.6)
    return f"{key}={value}: unknown key " + (f"(did you mean {near[0]}?)" if near else
                                            "(every key is listed in harness/config.py)")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in str(text).strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def omegaconf_problem(e: OmegaConfBaseException, shown: str | None = None) -> str:
    """One line for an error OmegaConf raised about a key: `<key>=<value>: <what is allowed>`.
    `shown` is the override as the user wrote it (`pp=abc`), when known."""
    key = getattr(e, "full_key", None) or getattr(e, "key", None) or ""
    value = getattr(e, "value", None)
    shown = shown or (f"{key}={value}" if key else None)
    if isinstance(e, (ConfigAttributeError, ConfigKeyError)) and "not in" in str(e):
        return unknown_key(shown.partition("=")[0] if shown else str(key), shown.partition("=")[2] if shown else "")
    if isinstance(e, ValidationError) and str(key) in (keys := schema_keys()):
        return f"{shown}: {_what_fits(keys[str(key)])}"
    if isinstance(e, MissingMandatoryValue):
        return f"{key}: needs a value ({_first_line(getattr(e, 'msg', '') or str(e))})"
    if isinstance(e, InterpolationResolutionError):
        return f"{shown or key}: {_first_line(getattr(e, 'msg', '') or str(e))}"
    what = _first_line(getattr(e, "msg", None) or str(e))
    return f"{shown}: {what}" if shown else what


def to_config(cfg: DictConfig, cwd: str | Path | None = None) -> Config:
    """The composed config as a typed Config: keys the schema lacks (`+typo=1`) refused with
    a did-you-mean, interpolations resolved, relative paths made absolute against `cwd`
    (default: where the command ran, Hydra's original cwd, also under hydra.job.chdir=true).
    ConfigError (one line) for anything wrong."""
    _refuse_unknown(cfg, Config)
    try:
        if "hydra" in cfg:  # a whole composed config (a sweep's point): its task part, read in place
            values = {f.name: (OmegaConf.to_object(node) if OmegaConf.is_config(node := cfg._get_node(f.name))
                               else cfg[f.name]) for f in dataclasses.fields(Config) if f.name in cfg}
            c = Config(**values)
        else:
            c = OmegaConf.to_object(cfg)  # type: ignore[assignment]
    except OmegaConfBaseException as e:
        raise ConfigError(omegaconf_problem(e)) from None
    return absolute_paths(c, cwd)


def _refuse_unknown(node: DictConfig, cls: type, prefix: str = "") -> None:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    for key in node.keys():
        key = str(key)
        if key == "hydra" and not prefix:
            continue
        if key not in fields:
            raise ConfigError(unknown_key(prefix + key, _raw(node, key)))
        sub = node._get_node(key)
        if dataclasses.is_dataclass(hints[key]) and isinstance(sub, DictConfig) and not sub._is_none() \
                and not sub._is_missing() and not sub._is_interpolation():
            _refuse_unknown(sub, hints[key], f"{prefix}{key}.")


def _raw(node: DictConfig, key: str) -> object:
    """The value at `key` as written (no interpolation resolved)."""
    sub = node._get_node(key)
    return OmegaConf.to_container(sub, resolve=False) if OmegaConf.is_config(sub) else sub._value()  # type: ignore[union-attr]


def original_cwd() -> Path:
    """Where the user ran the command: Hydra's runtime.cwd while a Hydra app runs (the job's
    own cwd may be its output directory under hydra.job.chdir=true), else the current one."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.cwd)
    return Path.cwd()


PACKAGE_ROOT = Path(__file__).resolve().parents[1]  # where data/ ships beside harness/ (a source checkout)


def absolute_path(path: str | None, cwd: str | Path | None = None) -> str | None:
    """`path` made absolute against `cwd` (default: original_cwd()); "~" expanded. A relative
    path that does not exist there but does beside the harness package (data/..., what the
    scenario presets name) is taken from there, so presets work from any directory."""
    if not path:
        return path
    p = Path(os.path.expanduser(path))
    if p.is_absolute():
        return str(p)
    here = Path(cwd) if cwd is not None else original_cwd()
    if not (here / p).exists() and (PACKAGE_ROOT / p).exists():
        return str(PACKAGE_ROOT / p)
    return os.path.normpath(here / p)


def absolute_paths(c: Config, cwd: str | Path | None = None) -> Config:
    """profile, schedule.csv_path and a file model.target (path/file.py:fn) as absolute paths:
    the config then means the same in any directory (a job's own under hydra.job.chdir=true,
    a worker's) and the record says which file ran."""
    c.profile = absolute_path(c.profile, cwd)
    c.schedule.csv_path = absolute_path(c.schedule.csv_path, cwd)
    target = c.model.target
    if target:
        module, sep, attr = target.rpartition(":")
        if sep and (module.endswith(".py") or "/" in module or os.sep in module):
            c.model.target = f"{absolute_path(module, cwd)}:{attr}"
    return c


def _one_of(key: str, value: object, allowed: tuple[str, ...], planned: tuple[str, ...] = ()) -> None:
    if value in planned:
        raise ConfigError(f"{key}={value}: not supported yet (supported: {', '.join(allowed)})")
    if value not in allowed:
        raise ConfigError(f"{key}={value}: unknown (allowed: {', '.join(allowed)})")


def _at_least(key: str, value: float, low: float, what: str = "an integer") -> None:
    if value < low:
        raise ConfigError(f"{key}={value}: must be {what} >= {low}")


def _check_optimizer(c: Config) -> None:
    o = c.optimizer
    for key in ("momentum", "eps", "weight_decay"):
        value = getattr(o, key)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"optimizer.{key}={value}: must be a finite number >= 0")
    if len(o.betas) != 2 or not all(math.isfinite(b) and 0 <= b < 1 for b in o.betas):
        raise ConfigError(f"optimizer.betas={list(o.betas)}: must be two numbers in [0, 1)")
    if c.placement not in PLACEMENTS:
        raise ConfigError(f"placement={c.placement}: unknown (allowed: {', '.join(PLACEMENTS)})")
    if c.zero not in (0, 1):
        raise ConfigError(f"zero={c.zero}: unknown (allowed: 0, 1)")
    if c.zero == 1 and c.dp == 1:
        raise ConfigError("zero=1: shards optimizer state across data-parallel replicas, and dp=1 has none "
                          "(allowed: zero=1 with dp > 1, or zero=0)")
    if c.memory_budget_gib is not None and not (math.isfinite(c.memory_budget_gib) and c.memory_budget_gib > 0):
        raise ConfigError(f"memory_budget_gib={c.memory_budget_gib}: must be a positive number of GiB")


def validate(c: Config, cuda_devices: int = 0) -> None:
    """Everything a run needs that the schema cannot express, checked before any worker."""
    _one_of("schedule", c.schedule.name, tuple(SCHEDULES))
    from harness.model import MODELS as registered  # the model registry (harness.model imports this module)

    _one_of("model", c.model.name, tuple(registered))
    _one_of("partition", c.partition.name, PARTITIONS_SUPPORTED)
    _one_of("executor", c.executor, tuple(EXECUTORS))
    _one_of("p2p", c.p2p, P2P_MODES)
    _one_of("compute", c.compute, COMPUTE_MODES)
    _one_of("device", c.device, DEVICES)
    _one_of("wandb.mode", c.wandb.mode, WANDB_MODES)
    _one_of("start_method", c.start_method, ("forkserver", "spawn"))
    _one_of("dtype", c.dtype, DTYPE_NAMES)
    _one_of("optimizer", c.optimizer.name, OPTIMIZERS)
    _check_optimizer(c)
    for key in ("pp", "microbatches", "microbatch_size", "steps", "virtual_stages", "dp", "max_processes"):
        _at_least(key, getattr(c, key), 1)
    _at_least("warmup_steps", c.warmup_steps, 0)
    _at_least("model.layers", c.model.layers, 1)
    _at_least("model.hidden", c.model.hidden, 1)
    _check_numbers(c)
    if c.model.name == "gpt":
        for key in ("heads", "seq", "vocab"):
            _at_least(f"model.{key}", getattr(c.model, key), 1)
        if c.model.hidden % c.model.heads:
            raise ConfigError(f"model.heads={c.model.heads}: must divide model.hidden={c.model.hidden}")
    _check_sizes(c, cuda_devices)
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
    if c.timeout_s is not None and c.timeout_s < MIN_TIMEOUT_S:
        raise ConfigError(f"timeout_s={c.timeout_s}: must be at least {MIN_TIMEOUT_S:g} s (or null: 60 s + 10x the "
                          "modeled run)")
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
    if fault and fault.rank is not None and not (fault.rank < c.pp * c.dp and fault.step < c.warmup_steps + c.steps):
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
    split = SCHEDULES[c.schedule.name].split_backward
    if split and not executor.split_backward:
        raise ConfigError(f"schedule={c.schedule.name}: executor={c.executor} runs no split backward (I/W)")
    if executor.private_torch(c) and (problem := compat.untested_torch()):
        raise ConfigError(f"executor={c.executor}: {problem}")
    if executor.check is not None and (problem := executor.check(c)):
        raise ConfigError(problem)
    if c.dp > 1 and split:
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
    if world > c.max_processes and not executor.simulated:  # a simulated executor starts no process
        raise ConfigError(f"pp={c.pp} x dp={c.dp}: {world} processes, more than max_processes={c.max_processes}")
    if c.device == "cuda" and cuda_devices == 0:
        raise ConfigError("device=cuda: no CUDA device here (use device=cpu or device=auto)")


MIN_TIMEOUT_S = 1.0  # a job starts its ranks and joins their world first: less cannot run anything
SEED_MAX = (2**63 - 1) // 1_000_003 - 1  # layer i is seeded with seed x 1000003 + i: torch.manual_seed's int64
MAX_ACTIONS = 1_000_000  # schedule actions per step (pp x chunks x M x 3): what planning may build and check
GPU_BYTES_BOUND = 256 * 2**30  # no GPU has more memory than this (an upper bound, not a query)


def _check_numbers(c: Config) -> None:
    """Floats finite (nan and inf compare false with every bound), costs not negative, the
    seed within what torch.manual_seed takes once a layer's index is mixed in."""
    floats = {"lr": c.lr, "timeout_s": c.timeout_s,
              **{f"cost.{f.name}": getattr(c.cost, f.name) for f in dataclasses.fields(c.cost)},
              **{f"comm.{f.name}": getattr(c.comm, f.name) for f in dataclasses.fields(c.comm)}}
    for key, value in floats.items():
        if value is not None and not math.isfinite(value):
            raise ConfigError(f"{key}={value}: must be a finite number")
    for key, value in floats.items():
        if key.startswith(("cost.", "comm.")) and value < 0:
            raise ConfigError(f"{key}={value}: must be >= 0")
    if not 0 <= c.seed <= SEED_MAX:
        raise ConfigError(f"seed={c.seed}: must be an integer in 0..{SEED_MAX} (layer i is seeded with "
                          "seed x 1000003 + i, which torch.manual_seed must take)")


def machine_bytes(device: str, cuda_devices: int) -> int:
    """An upper bound on the memory a run here can use: this machine's RAM (os.sysconf), plus,
    where its ranks may run on GPUs, GPU_BYTES_BOUND per GPU."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound
        return 2**63
    return ram + (cuda_devices * GPU_BYTES_BOUND if device != "cpu" else 0)


def _param_count(model: Any) -> int | None:
    """Parameters of the whole model, from a few layers built on the meta device (no memory):
    every layer when there are few, else the first, the last and a middle one for the rest.
    None when the model cannot be built there (a custom model may not support it)."""
    import torch

    n = model.num_layers
    picked = list(range(n)) if n <= 8 else [0, n // 2, n - 1]
    try:
        with torch.device("meta"):
            count = {i: sum(p.numel() for p in model.build_layer(i).parameters()) for i in picked}
    except Exception:  # noqa: BLE001 - only a bound: without it the workers say what fails
        return None
    return sum(count.values()) if n <= 8 else count[0] + count[n - 1] + (n - 2) * count[n // 2]


def _check_sizes(c: Config, cuda_devices: int) -> None:
    """Inputs that pass every range check but cannot fit: a schedule too long to build
    (microbatches=1000000000), activations or parameters larger than the machine
    (microbatch_size, model.hidden, model.seq of 1e9). Checked before anything is built."""
    chunks = chunks_per_rank(c.schedule.name, c.virtual_stages)
    actions = c.pp * chunks * c.microbatches * 3
    if actions > MAX_ACTIONS:
        big, value = ("virtual_stages", c.virtual_stages) if c.virtual_stages > c.microbatches else \
            ("microbatches", c.microbatches)
        allowed = max(1, MAX_ACTIONS // (3 * c.pp * (chunks if big == "microbatches" else c.microbatches)))
        raise ConfigError(f"{big}={value}: pp={c.pp} x {chunks} chunks x {c.microbatches} microbatches x 3 = "
                          f"{actions:,} schedule actions, more than {MAX_ACTIONS:,} (allowed: {big} <= {allowed})")
    from harness.model import get_model  # lazily: harness.model imports this module

    model = get_model(c.model)
    limit = machine_bytes(c.device, cuda_devices)
    per_microbatch = 4 * math.prod(model.activation_shape(c.microbatch_size))  # fp32 between stages
    activations = c.dp * c.microbatches * per_microbatch
    if activations > limit:
        shape = "x".join(str(d) for d in model.activation_shape(c.microbatch_size))
        dims = model.activation_shape(c.microbatch_size)
        key, value = max([("microbatches", c.microbatches)] +
                         [(k, v) for k, v in (("microbatch_size", c.microbatch_size), ("model.hidden", c.model.hidden),
                                              ("model.seq", c.model.seq)) if v in dims], key=lambda kv: kv[1])
        raise ConfigError(f"{key}={value}: the step's activations (dp={c.dp} x microbatches={c.microbatches} x "
                          f"{shape} fp32) are {_gib(activations)}, more than this machine's {_gib(limit)}")
    params = _param_count(model)
    if params is not None and 8 * params * c.dp > limit:  # fp32 weights and gradients, per replica
        sizes = ("layers", "hidden") if c.model.name == "mlp" else ("layers", "hidden", "vocab", "ffn")
        key = max(sizes, key=lambda k: getattr(c.model, k) or 0)
        raise ConfigError(f"model.{key}={getattr(c.model, key)}: {params:,} parameters x dp={c.dp} "
                          f"need {_gib(8 * params * c.dp)} (fp32 weights and gradients), more than this machine's "
                          f"{_gib(limit)}")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
