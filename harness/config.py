"""The typed config schema: plain data, at the bottom of the import graph (it imports nothing
of the harness).

Every field has a comment saying what it is and its unit. A config group's options are one
dataclass each (a model kind's sizes, an optimizer's hyperparameters), as in Hydra's structured
config examples: Hydra composes `model=gpt` into a GPTConfig, so `model=mlp model.heads=4` is
refused as an unknown key. `check_values` checks what the schema alone can say (ranges, finite
numbers, the fixed value sets); everything that needs a registry (schedules, models,
executors) or the built model is checked in planning (harness/planning/checks.py). Either raises
ConfigError with one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import math
import os
import typing
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A config value that cannot run; str() is one line for the user, `detail` (optional)
    what more there is to show (a schedule's grid)."""

    def __init__(self, message: str, detail: str | None = None):
        super().__init__(message)
        self.detail = detail


P2P_MODES = ("auto", "eager", "safe")
PLACEMENTS = ("pp_inner", "dp_inner")  # harness.runtime.groups.Layout: a launcher slot <-> a global rank
DP_SYNCS = ("in_backward", "after_flush")  # where the dp all-reduce runs (harness/simulate/pricing.py)
COMPUTE_MODES = ("auto", "real", "emulated")
DEVICES = ("cpu", "cuda", "auto")
WANDB_MODES = ("offline", "online", "disabled")
DTYPE_NAMES = ("fp32", "bf16", "fp16")
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}  # per element of parameters, gradients, activations, messages
START_METHODS = ("forkserver", "spawn")
PARTITIONS = ("uniform", "params", "flops", "profile", "explicit")  # harness/model/partition.py
CLUSTER_DEVICES = ("cuda", "cpu")
ALLREDUCE_ALGORITHMS = ("ring",)


# -- the groups: one dataclass per option ------------------------------------------------------
@dataclass
class ScheduleConfig:
    """Any registered schedule (harness/schedules/registry.py); a schedule with keys of its own
    registers its subclass with its entry (`ScheduleSpec.config`: zb_auto's in
    harness/schedules/auto.py, csv's in harness/schedules/csv_io.py)."""

    name: str = "1f1b"  # gpipe | 1f1b | interleaved_1f1b | zb_h1 | zb_h2 | zbv | dualpipev | zb_auto | csv | any registered

    def problem(self, c: "Config") -> str | None:
        """What the schema alone refuses in a subclass's keys (`check_values`), as one line; None: nothing."""
        return None


@dataclass
class ModelConfig:
    """What every model kind has (harness/model/: the registry). `model=<kind>` picks its own
    dataclass below; a model registered from outside the package takes this one."""

    name: str = "mlp"  # mlp | gpt | hf | custom
    layers: int = 8  # mlp: layers; gpt, hf: transformer blocks (plus embedding and head); custom: its factory's
    hidden: int = 256  # features per sample (mlp) or per token (gpt, hf: d_model)


@dataclass
class MLPConfig(ModelConfig):
    """Linear + GELU layers."""

    name: str = "mlp"


@dataclass
class GPTConfig(ModelConfig):
    """A small GPT: embedding, pre-norm blocks, LM head."""

    name: str = "gpt"
    layers: int = 4
    hidden: int = 128
    heads: int = 4  # attention heads (hidden % heads == 0)
    seq: int = 64  # tokens per sample
    vocab: int = 2048  # vocabulary size


@dataclass
class HFConfig(GPTConfig):
    """A Hugging Face decoder (transformers' own classes, random weights, no download)."""

    name: str = "hf"
    arch: str = "llama"  # gpt2 | llama | mistral | qwen2
    kv_heads: int | None = None  # key/value heads (grouped-query attention, heads % kv_heads == 0); null: heads
    ffn: int | None = None  # feed-forward width (intermediate size); null: 4 x hidden
    attention: str = "sdpa"  # sdpa (fused: keeps no T x T scores) | eager (keeps them, as Megatron without flash attention)


@dataclass
class CustomConfig(ModelConfig):
    """Your factory: factory(cfg, **kwargs) returns a model (harness/model/custom.py)."""

    name: str = "custom"
    layers: int = 4
    hidden: int = 64
    target: str | None = None  # "module:factory" (from the current directory or PYTHONPATH) | "path/file.py:factory"
    kwargs: dict = field(default_factory=dict)  # the factory's keyword arguments (+model.kwargs.depth=3)


@dataclass
class PartitionConfig:
    """Which layers each stage holds (harness/model/partition.py)."""

    name: str = "uniform"  # uniform | params | flops | profile (needs `profile`) | explicit


@dataclass
class ExplicitPartitionConfig(PartitionConfig):
    name: str = "explicit"
    layers_per_stage: list[int] | None = None  # one entry per stage, summing to the layers, e.g. [3,2,2,1]


@dataclass
class OptimizerConfig:
    """torch's own optimizer, stepping fp32 (master copies in low precision: harness/runtime/optimizer.py)."""

    name: str = "sgd"  # sgd | adamw
    weight_decay: float = 0.0  # sgd: L2; adamw: decoupled (AdamW's own)


@dataclass
class SGDConfig(OptimizerConfig):
    name: str = "sgd"
    momentum: float = 0.0  # 0 keeps no state


@dataclass
class AdamWConfig(OptimizerConfig):
    name: str = "adamw"
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])  # moment decay rates
    eps: float = 1e-8
    weight_decay: float = 0.01


# group -> option -> its dataclass: what Hydra registers (harness/frontend/compose.py) and set_keys switches
OPTIONS: dict[str, dict[str, type]] = {
    "schedule": {},  # each schedule's own, registered with its entry (harness/schedules/registry.py)
    "model": {"mlp": MLPConfig, "gpt": GPTConfig, "hf": HFConfig, "custom": CustomConfig},
    "partition": {"explicit": ExplicitPartitionConfig},
    "optimizer": {"sgd": SGDConfig, "adamw": AdamWConfig},
}
BASES: dict[str, type] = {"schedule": ScheduleConfig, "model": ModelConfig, "partition": PartitionConfig,
                          "optimizer": OptimizerConfig}


def add_option(group: str, name: str, cls: type) -> None:
    """`cls` as `group`'s option `name` (a registry adds its entries' own: schedules)."""
    if not (isinstance(cls, type) and issubclass(cls, BASES[group]) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"{group}={name}: its config {cls!r} must be a dataclass subclassing {BASES[group].__name__}")
    OPTIONS[group][name] = cls


def remove_option(group: str, name: str) -> None:
    OPTIONS[group].pop(name, None)


def option_class(group: str, name: str) -> type:
    """The dataclass of `group`'s option `name` (the group's base for a name it does not list)."""
    return OPTIONS[group].get(name, BASES[group])


def model_config(name: str = "mlp", **fields: Any) -> ModelConfig:
    """The model kind's config with `fields` set: model_config("gpt", heads=2)."""
    return option_class("model", name)(name=name, **fields)


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
    """Point-to-point and all-reduce cost for executor=sim without a `cluster`, and for
    `bubble.simulated` when a run measured no hop latency (gloo on loopback here: ~150 us
    latency, ~2 GB/s)."""

    latency_s: float = 150e-6
    bandwidth_Bps: float = 2e9


@dataclass
class WandbConfig:
    mode: str = "offline"  # offline (files under the job dir; `wandb sync` later) | online | disabled
    project: str = "harness"
    entity: str | None = None


@dataclass
class LinkConfig:
    latency_s: float = 10e-6  # seconds per message (or per ring step) on this link
    bandwidth_Bps: float = 100e9  # bytes per second, per GPU and per direction


@dataclass
class OverheadConfig:
    """What an executor adds to the modeled costs (measured on cluster=here by
    tools/calibrate.py, make calibrate; zero where nothing was measured): priced so predictions hold for
    real runs. Each table: ranks on the host -> seconds, linear between the measured counts
    (ranks beyond the cores share them, so every figure grows with the ranks); empty: zero."""

    action_s: dict[str, float] = field(default_factory=dict)  # per emulated compute action: oversleep, tracing, hooks
    real_fwd_scale: dict[str, float] = field(default_factory=dict)  # compute=real: a run's F over the profile's (1 if empty)
    real_bwd_scale: dict[str, float] = field(default_factory=dict)  # compute=real: a run's B over the profile's (1 if empty)
    step_s: dict[str, float] = field(default_factory=dict)  # per step: window edges, optimizer launch, stragglers
    send_s: dict[str, float] = field(default_factory=dict)  # posting a send to another rank (the sender waits)
    recv_s: dict[str, float] = field(default_factory=dict)  # a receive whose message is already there
    hop_s: dict[str, float] = field(default_factory=dict)  # the rest of a P2P hop (replaces the link's latency)
    allreduce_s: dict[str, float] = field(default_factory=dict)  # per DDP sync beyond the ring model (replica skew)


OVERHEAD_TABLES = tuple(f.name for f in dataclasses.fields(OverheadConfig))


@dataclass
class ClusterConfig:
    """The machines a plan is priced for (`cluster=<preset>`, harness/conf/cluster/; the link
    model is harness/simulate/links.py). executor=sim prices communication, the gradient
    all-reduce, the optimizer step and the executor's overheads with it; the planner
    (harness.advise) searches it."""

    name: str = "unnamed"
    description: str = ""
    source: str = ""  # where every figure comes from
    device: str = "cuda"  # cuda: GPUs (activations traced on fake tensors) | cpu: ranks are processes here
    gpu: str = ""  # the GPU as torch names it (e.g. "NVIDIA H200"): its peak (harness/planning/devices.py) gives MFU
    gpus_per_node: int = 8
    nodes: int = 1
    memory_per_gpu_gib: float = 80.0  # what the device has
    memory_reserve_gib: float = 0.0  # not for the model: context, communication buffers, fragmentation
    # device memory bandwidth, the optimizer step's elementwise pass: null (presets) reads the device table
    # by `gpu` (harness/planning/devices.py memory_bandwidth); set it only for a device the table lacks
    # (cluster=here: this CPU's, measured)
    memory_bandwidth_Bps: float | None = None
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
        return int((self.memory_per_gpu_gib - self.memory_reserve_gib) * 2**30)


@dataclass
class RunConfig:
    """Run control (`run.*`): how a point runs, never what it measures. Changing one of these
    reruns nothing under run.resume=true, and two points that differ only here are the same point
    (harness/records/identity.py)."""

    max_processes: int = 16  # refuse pp x dp above this (each rank is a process)
    start_method: str = "forkserver"  # forkserver: ranks fork from a server that imported torch once | spawn
    timeout_s: float | None = None  # watchdog: workers not done by then are killed, the job fails; None: scaled to the run
    resume: bool = False  # in an existing sweep dir: skip points whose record for the same config, code and input files is ok (or diverged, skipped)
    rerun: str | None = None  # with resume: also rerun records that say diverged | skipped | diverged+skipped
    skip_invalid: bool = False  # a sweep with points that cannot run: run the others (listed as skipped) instead of none
    debug: bool = False  # show tracebacks instead of one-line errors
    repeats: int = 1  # a sweep (-m) runs every point this many times, as repeat=0..repeats-1, interleaved across points
    fault: str | None = None  # TEST ONLY: raise|kill|hang@rankR,stepS (harness/runtime/faults.py)
    clock_skew_s: list[float] | None = None  # TEST ONLY: [global rank] seconds added to its clock, as another host's (harness/runtime/clock.py)


@dataclass
class Config:
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    model: ModelConfig = field(default_factory=MLPConfig)
    partition: PartitionConfig = field(default_factory=PartitionConfig)
    cost: CostConfig = field(default_factory=CostConfig)
    comm: CommConfig = field(default_factory=CommConfig)
    wandb: WandbConfig = field(default_factory=WandbConfig)
    optimizer: OptimizerConfig = field(default_factory=SGDConfig)
    cluster: ClusterConfig | None = None  # cluster=<preset>: what executor=sim prices a plan on (null: comm.*)
    pp: int = 4  # pipeline ranks N (one stage each)
    virtual_stages: int = 1  # model chunks per rank (interleaved_1f1b; zbv and dualpipev always 2)
    microbatches: int = 8  # M per step
    microbatch_size: int = 4  # B samples per microbatch
    dp: int = 1  # data-parallel replicas of the pipeline (world = pp x dp x tp), DDP per stage
    tp: int = 1  # tensor-parallel ranks inside each stage (Megatron-style, torch's DTensor API; consecutive ranks, one node)
    sequence_parallel: bool = False  # with tp > 1: norms on sequence shards, all-gather/reduce-scatter for the all-reduces
    dp_sync: str = "in_backward"  # dp > 1: DDP's all-reduce inside each stage's last backward, its gradient sent on after it | after_flush: after the rank's last action, as Megatron-LM (executor=sim only)
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
    repeat: int = 0  # a label, part of the point: sweep repeat=0,1,2 (or run.repeats=3) to see how much the same config varies run to run
    lr: float = 0.01  # the optimizer's learning rate
    dtype: str = "fp32"  # fp32 | bf16 | fp16: parameters, activations, messages, gradients (fp32 masters in the optimizer)
    zero: int = 0  # 0 | 1: ZeRO-1, each stage's optimizer state sharded across its dp replicas
    memory_budget_gib: float | None = None  # per rank: each run says if it fits; a sweep skips points theory says cannot
    profile: str | None = None  # per-layer profile JSON: partition=profile costs; compute=emulated sleeps it
    run: RunConfig = field(default_factory=RunConfig)  # how the point runs, not what it measures: no part of its identity


# Config sections that say how a point runs, not what it measures: a point's identity (what
# resume and the report match records by, harness/records/identity.py) is the config without them.
RUN_SECTIONS = ("run", "wandb")
# keys that moved into run.* (old top-level name -> new): a command line or a record that still
# says `timeout_s=60` is told where it went (unknown_key), an old record is read as if it had (upgrade_config)
MOVED = {name: f"run.{name}" for name in ("max_processes", "start_method", "timeout_s", "resume", "rerun",
                                          "skip_invalid", "debug", "repeats", "fault", "clock_skew_s")}


def upgrade_config(d: dict) -> dict:
    """A config dict written before run control had its own section (a record's, schema < 6),
    with the moved keys under `run` (a new dict; a current one comes back equal)."""
    d = dict(d)
    moved = {k: d.pop(k) for k in list(d) if k in MOVED}
    if moved:
        d["run"] = {**moved, **(d.get("run") if isinstance(d.get("run"), dict) else {})}
    return d


def planned_microbatch_size(c: Config) -> int:
    """B as planning sets it: global_batch / (dp x M) where a global batch is fixed, else microbatch_size."""
    return c.global_batch // (c.dp * c.microbatches) if c.global_batch is not None else c.microbatch_size


def set_keys(c: Config, **values: Any) -> Config:
    """`c` with dotted keys set (`set_keys(c, **{"model.hidden": 64})`), unvalidated: for code
    that builds a Config without Hydra (calibration runs, the planner, tests). Setting a
    group's `name` to another option switches to that option's dataclass, keeping the fields
    both have (as `model=gpt` on the command line would, from the option's defaults)."""
    for key, value in values.items():
        target = c
        *path, leaf = key.split(".")
        for part in path:
            target = getattr(target, part)
        if leaf == "name" and len(path) == 1 and path[0] in OPTIONS:
            switch_option(c, path[0], value)
        elif dataclasses.is_dataclass(target) and leaf not in {f.name for f in dataclasses.fields(target)}:
            option = target.name if len(path) == 1 and path[0] in OPTIONS else None
            raise ConfigError(unknown_key(key, value, option))
        else:
            setattr(target, leaf, value)
    return c


def config_from_record(data: dict) -> Config:
    """A record's `config` (result.json, any version) as a typed Config, for readers of records
    (the report): each group as its option's dataclass, keys this schema lacks ignored (a key
    a later version dropped), keys the record lacks at their defaults (one an older version did
    not have), numbers where floats belong as floats. Unchecked: a reader that needs a value of
    the right type checks it on the dict first (harness/report/load.py)."""
    return _dataclass_from(Config, data if isinstance(data, dict) else {})


def _dataclass_from(cls: type, data: dict) -> Any:
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.name not in data:
            continue
        value, hint = data[f.name], hints[f.name]
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if len(args) == 1 else hint
        if cls is Config and f.name in OPTIONS and isinstance(value, dict):
            base = option_class(f.name, str(value.get("name", BASES[f.name].name)))
        if dataclasses.is_dataclass(base) and isinstance(value, dict):
            value = _dataclass_from(base, value)
        elif base is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        values[f.name] = value
    return cls(**values)


def switch_option(c: Config, group: str, name: str) -> None:
    """c.<group> becomes option `name`: its dataclass's defaults, and the values of the fields
    the old option shares with it."""
    old, cls = getattr(c, group), option_class(group, name)
    if type(old) is cls:
        old.name = name
        return
    names = {f.name for f in dataclasses.fields(cls)} - {"name"}
    new = cls(name=name)
    defaults = option_class(group, old.name)(name=old.name)
    for f in dataclasses.fields(old):
        # carried over: what was set on the old option, not its own kind's defaults
        if f.name in names and getattr(old, f.name) != getattr(defaults, f.name):
            setattr(new, f.name, getattr(old, f.name))
    setattr(c, group, new)


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
    as keys of their own too; a group's keys are those of all its options)."""
    out: dict[str, Any] = {}
    for name, hint in typing.get_type_hints(cls or Config).items():
        out[prefix + name] = hint
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        inner = args[0] if len(args) == 1 else hint
        if dataclasses.is_dataclass(inner):
            for option in (inner, *OPTIONS.get(name, {}).values()) if not prefix else (inner,):
                out |= {k: v for k, v in schema_keys(option, f"{prefix}{name}.").items() if k not in out}
    return out


def what_fits(hint: Any) -> str:
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


def keys_of(chosen: dict[str, str] | None = None) -> set[str]:
    """Every key a config has with each group's option as `chosen` (a group not in it: the
    schema's default option), dotted, sections included: the keys that exist, where
    schema_keys has every option's."""
    default = Config()
    out: set[str] = set()
    for name, hint in typing.get_type_hints(Config).items():
        out.add(name)
        if name in OPTIONS:
            kind: Any = option_class(name, (chosen or {}).get(name, getattr(default, name).name))
        else:
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            kind = args[0] if len(args) == 1 else hint
        if dataclasses.is_dataclass(kind):
            out |= set(schema_keys(kind, f"{name}."))
    return out


def _near(key: str, keys: set[str]) -> str | None:
    """The key of `keys` `key` was likely meant to be. Within a section that exists, only its
    own keys, compared by their last part (`model.` common to all would make any model key
    look near: model.dropout is no model.arch); else any key, whole (modle.hidden)."""
    section, _, leaf = key.rpartition(".")
    if not section or section in keys:
        siblings = {k.rpartition(".")[2]: k for k in keys if k.rpartition(".")[0] == section and k != key}
        near = difflib.get_close_matches(leaf, list(siblings), n=1, cutoff=0.6)
        if not near:  # a key's first part (cost.fwd_ms): the one key it begins
            near = [k for k in siblings if k.startswith(leaf)] if len(leaf) >= 3 else []
        return siblings[near[0]] if len(near) == 1 else None
    near = difflib.get_close_matches(key, sorted(keys - {key}), n=1, cutoff=0.6)
    return near[0] if near else None


def unknown_key(key: str, value: object, option: str | None = None, shown: str | None = None) -> str:
    """`ppp=2: unknown key (did you mean pp?)`; `model.heads=2: not a key of model=mlp (it is
    model=gpt's, model=hf's)` where another option of the group has it (`option`: the one chosen,
    None: the schema's default); `timeout_s=60: moved to run.timeout_s` for a key that moved into
    the run section. A suggestion is always a key of the config as chosen; one near key only
    another option has is said to be that option's. `shown`: the override as written, where
    not `<key>=<value>` (`~ppp`)."""
    bare = key.lstrip("+~")
    shown = shown if shown is not None else f"{key}={value}"
    if (moved := MOVED.get(bare)) is not None:
        return f"{shown}: {bare} moved to {moved} (write {moved}={value})"
    group, _, leaf = bare.partition(".")
    owners = [name for name, cls in OPTIONS.get(group, {}).items() if leaf in {f.name for f in dataclasses.fields(cls)}]
    if owners:  # another option's key: never "did you mean" the very key given
        chosen = f"{group}={option}" if option is not None else f"the {group} chosen"
        return (f"{shown}: not a key of {chosen} (it is " + ", ".join(f"{group}={o}'s" for o in owners)
                + f"): {chosen} has no {leaf}; set {group}={owners[0]} to use it")
    if (near := _near(bare, keys_of({group: option} if group in OPTIONS and option is not None else None))):
        return f"{shown}: unknown key (did you mean {near}?)"
    if group in OPTIONS and "." not in leaf:  # near a key of another option: whose it is, not a suggestion
        name = option if option is not None else getattr(Config(), group).name
        others = {o: {f.name for f in dataclasses.fields(cls)} for o, cls in OPTIONS[group].items() if o != name}
        if (near := difflib.get_close_matches(leaf, sorted(set().union(*others.values())), n=1, cutoff=0.6)):
            return (f"{shown}: unknown key ({group}={name} has no key like it; {group}.{near[0]} is "
                    + ", ".join(f"{group}={o}'s" for o in sorted(others) if near[0] in others[o]) + ")")
    return f"{shown}: unknown key (every key is listed in harness/config.py)"


# -- what the schema alone can check ---------------------------------------------------------------
MIN_TIMEOUT_S = 1.0  # a job starts its ranks and joins their world first: less cannot run anything
SEED_MAX = (2**63 - 1) // 1_000_003 - 1  # layer i is seeded with seed x 1000003 + i: torch.manual_seed's int64
MAX_ACTIONS = 1_000_000  # schedule actions per step (pp x chunks x M x 3): what planning may build and check
# Bounds on the numbers, checked before anything is allocated (README, "Keys"): each says what it protects.
MAX_STEPS = 100_000  # warmup_steps + steps: result.json keeps ~60 bytes a step (times, bubbles, losses): ~6 MB
MAX_RUN_ACTIONS = 2_000_000  # (warmup_steps + steps) x actions a step, with worker processes: each action is
# kept as events (its messages, its memory samples: ~1 KB) until the job's records are written
MAX_WORLD = 2**16  # pp x dp ranks, executor=sim included: result.json keeps ~130 bytes a rank (~8 MB at 65,536)
MAX_GPUS = MAX_WORLD  # cluster.nodes x cluster.gpus_per_node: a point uses them all (pp x dp), the planner
# lists every divisor of them
MAX_DIM = 2**31 - 1  # microbatch_size, model.hidden, model.seq, model.vocab, model.ffn: a tensor dimension
# torch indexes with 32 bits in many kernels (and B x hidden x seq must stay an int64 element count)
MAX_TIMEOUT_S = 7 * 86_400  # run.timeout_s: a week; torch's process-group timeout and timedelta overflow far beyond
MAX_TIME_SCALE = 1e6  # cost.time_scale: a GPU profile slowed a million-fold still fits a CPU's math
MAX_LAYER_MS = 86_400_000.0  # cost.fwd_ms_per_layer: a day a layer
MAX_BWD_OVER_FWD = 1_000.0  # cost.bwd_over_fwd
MAX_LATENCY_S = 60.0  # comm.latency_s and a cluster link's: a message takes microseconds
MAX_BANDWIDTH_BPS = 1e15  # comm.bandwidth_Bps and a link's: 1 PB/s, ~1000x NVLink
MIN_BANDWIDTH_BPS = 1.0  # a byte a second: below it one activation takes longer than any watchdog
MAX_GPU_MEMORY_GIB = 2**14  # cluster.memory_per_gpu_gib, memory_budget_gib: 16 TiB, ~100x an H200
MAX_REPEATS = 1_000  # run.repeats: points x repeats jobs in one sweep
MAX_LAYERS = 2**16  # a model's layers: a plan lists each (partition, costs, profile, memory per layer)
MAX_CLOCK_SKEW_S = 86_400.0  # run.clock_skew_s: a day either way; past it a timestamp in ns nears int64's range


def one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{key}={value}: unknown (allowed: {', '.join(allowed)})")


def at_least(key: str, value: float, low: float, what: str = "an integer") -> None:
    if value < low:
        raise ConfigError(f"{key}={value}: must be {what} >= {low}")


def at_most(key: str, value: float, high: float, why: str) -> None:
    """`key=value: more than HIGH (allowed: ... <= HIGH; why)`: a bound on what the harness can hold."""
    if value > high:
        shown = f"{high:,}" if isinstance(high, int) else f"{high:g}"
        raise ConfigError(f"{key}={value}: more than {shown} (allowed: {key.rpartition('.')[2]} <= {shown}; {why})")


def check_values(c: Config) -> None:
    """Every value against what the schema allows: ranges, finite numbers, the fixed value
    sets, an option's dataclass matching its name. ConfigError (one line) for the first wrong."""
    for group in OPTIONS:
        _check_option(c, group)
    one_of("partition", c.partition.name, PARTITIONS)
    one_of("optimizer", c.optimizer.name, tuple(OPTIONS["optimizer"]))  # harness/runtime/optimizer.py
    one_of("p2p", c.p2p, P2P_MODES)
    one_of("compute", c.compute, COMPUTE_MODES)
    one_of("device", c.device, DEVICES)
    one_of("wandb.mode", c.wandb.mode, WANDB_MODES)
    one_of("run.start_method", c.run.start_method, START_METHODS)
    one_of("dtype", c.dtype, DTYPE_NAMES)
    one_of("placement", c.placement, PLACEMENTS)
    one_of("dp_sync", c.dp_sync, DP_SYNCS)
    if c.dp_sync != "in_backward" and c.executor != "sim":
        raise ConfigError(f"dp_sync={c.dp_sync}: executor={c.executor} all-reduces inside each stage's last backward "
                          "(DDP) (allowed: dp_sync=in_backward, or executor=sim)")
    for key in ("pp", "microbatches", "microbatch_size", "steps", "virtual_stages", "dp", "tp"):
        at_least(key, getattr(c, key), 1)
    for key in ("max_processes", "repeats"):
        at_least(f"run.{key}", getattr(c.run, key), 1)
    at_least("warmup_steps", c.warmup_steps, 0)
    at_least("checkpoint_every", c.checkpoint_every, 0)
    at_least("model.layers", c.model.layers, 1)
    at_least("model.hidden", c.model.hidden, 1)
    if isinstance(c.model, GPTConfig):
        for key in ("heads", "seq", "vocab"):
            at_least(f"model.{key}", getattr(c.model, key), 1)
        if c.model.hidden % c.model.heads:
            raise ConfigError(f"model.heads={c.model.heads}: must divide model.hidden={c.model.hidden}")
    _check_bounds(c)
    _check_numbers(c)
    _check_optimizer(c)
    if (problem := c.schedule.problem(c)) is not None:
        raise ConfigError(problem)
    if c.zero not in (0, 1):
        raise ConfigError(f"zero={c.zero}: unknown (allowed: 0, 1)")
    if c.zero == 1 and c.dp == 1:
        raise ConfigError("zero=1: shards optimizer state across data-parallel replicas, and dp=1 has none "
                          "(allowed: zero=1 with dp > 1, or zero=0)")
    if c.partition.name == "profile" and not c.profile:
        raise ConfigError("partition=profile: needs profile=<per-layer profile JSON> "
                          "(write one with `python -m harness.profile`)")
    if c.global_batch is not None and (c.global_batch < 1 or c.global_batch % (c.dp * c.microbatches)):
        raise ConfigError(f"global_batch={c.global_batch}: must split evenly into dp={c.dp} x "
                          f"microbatches={c.microbatches} microbatches (allowed: multiples of "
                          f"{c.dp * c.microbatches})")
    if c.cluster is not None:
        check_cluster(c.cluster)


def _check_bounds(c: Config) -> None:
    """The integers that size what the harness allocates, each within what it can hold (the
    MAX_* constants say why), before anything is built; the key at fault named."""
    if c.warmup_steps + c.steps > MAX_STEPS:
        key, value = ("warmup_steps", c.warmup_steps) if c.warmup_steps > c.steps else ("steps", c.steps)
        raise ConfigError(f"{key}={value}: warmup_steps + steps = {c.warmup_steps + c.steps:,}, more than "
                          f"{MAX_STEPS:,} (allowed: at most {MAX_STEPS:,} steps in all; result.json keeps each step)")
    if c.pp * c.dp * c.tp > MAX_WORLD:
        sizes = {"pp": c.pp, "dp": c.dp, "tp": c.tp}
        key = max(sizes, key=lambda k: (sizes[k], k == "dp"))  # the largest, dp on a tie as before
        other = c.pp * c.dp * c.tp // sizes[key]
        product = "pp x dp x tp" if c.tp > 1 else "pp x dp"
        raise ConfigError(f"{key}={sizes[key]}: {product} = {c.pp * c.dp * c.tp:,} ranks, more than {MAX_WORLD:,} "
                          f"(allowed: {key} <= {max(1, MAX_WORLD // other):,} here; result.json keeps each rank)")
    if not isinstance(c.sequence_parallel, bool):
        raise ConfigError(f"sequence_parallel={c.sequence_parallel!r}: unknown (allowed: true, false)")
    if c.global_batch is not None and c.global_batch > c.dp * c.microbatches * MAX_DIM:
        raise ConfigError(f"global_batch={c.global_batch}: sets microbatch_size = global_batch / (dp={c.dp} x "
                          f"microbatches={c.microbatches}), more than {MAX_DIM:,} (allowed: global_batch <= "
                          f"{c.dp * c.microbatches * MAX_DIM:,}; a tensor dimension)")
    at_most("microbatch_size", c.microbatch_size, MAX_DIM, "a tensor dimension")
    at_most("cost.at_microbatch_size", c.cost.at_microbatch_size, MAX_DIM, "a tensor dimension")
    for key in ("hidden", "seq", "vocab", "ffn", "kv_heads"):
        value = getattr(c.model, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            at_most(f"model.{key}", value, MAX_DIM, "a tensor dimension")
    at_most("run.repeats", c.run.repeats, MAX_REPEATS, "a sweep runs points x repeats jobs")
    layers = c.model.layers
    if isinstance(layers, int) and layers > MAX_LAYERS:  # before any model is built (planning, profile, advise)
        raise ConfigError(f"model.layers={layers}: {layers:,} layers, more than {MAX_LAYERS:,} (allowed: model.layers "
                          f"<= {MAX_LAYERS:,}; a plan lists every layer)")


def _check_option(c: Config, group: str) -> None:
    """`model.name=gpt` set on an mlp's keys would leave the gpt's sizes out: the option's
    dataclass must be its name's (`model=gpt` switches both)."""
    option = getattr(c, group)
    want = option_class(group, option.name)
    if type(option) is not want and want is not BASES[group]:
        raise ConfigError(f"{group}.name={option.name}: set the option with {group}={option.name} (its keys come "
                          f"with it), not its name alone")


def _check_optimizer(c: Config) -> None:
    o = c.optimizer
    for key in ("momentum", "eps", "weight_decay"):
        value = getattr(o, key, 0.0)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"optimizer.{key}={value}: must be a finite number >= 0")
    if isinstance(o, AdamWConfig) and (len(o.betas) != 2 or not all(math.isfinite(b) and 0 <= b < 1 for b in o.betas)):
        raise ConfigError(f"optimizer.betas={list(o.betas)}: must be two numbers in [0, 1)")
    if c.memory_budget_gib is not None and not (math.isfinite(c.memory_budget_gib) and c.memory_budget_gib > 0):
        raise ConfigError(f"memory_budget_gib={c.memory_budget_gib}: must be a positive number of GiB")


def _check_numbers(c: Config) -> None:
    """Floats finite (nan and inf compare false with every bound), costs not negative, the
    seed within what torch.manual_seed takes once a layer's index is mixed in."""
    floats = {"lr": c.lr, "run.timeout_s": c.run.timeout_s,
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
    if c.lr <= 0:
        raise ConfigError(f"lr={c.lr}: must be > 0")
    timeout_s = c.run.timeout_s
    if timeout_s is not None and timeout_s < MIN_TIMEOUT_S:
        raise ConfigError(f"run.timeout_s={timeout_s}: must be at least {MIN_TIMEOUT_S:g} s (or null: 60 s + 10x the "
                          "modeled run)")
    if timeout_s is not None and timeout_s > MAX_TIMEOUT_S:
        raise ConfigError(f"run.timeout_s={timeout_s}: more than {MAX_TIMEOUT_S:,} s (allowed: {MIN_TIMEOUT_S:g}.."
                          f"{MAX_TIMEOUT_S:,} s, a week; or null: 60 s + 10x the modeled run)")
    if c.cost.time_scale <= 0:
        raise ConfigError(f"cost.time_scale={c.cost.time_scale}: must be > 0")
    at_most("cost.time_scale", c.cost.time_scale, MAX_TIME_SCALE, "a factor on every emulated cost")
    at_most("cost.fwd_ms_per_layer", c.cost.fwd_ms_per_layer, MAX_LAYER_MS, "a day a layer")
    at_most("cost.bwd_over_fwd", c.cost.bwd_over_fwd, MAX_BWD_OVER_FWD, "backward / forward time")
    at_least("cost.at_microbatch_size", c.cost.at_microbatch_size, 1)
    for key in ("fixed_fraction", "weight_grad_share"):
        if not 0 <= getattr(c.cost, key) <= 1:
            raise ConfigError(f"cost.{key}={getattr(c.cost, key)}: must be between 0 and 1")
    if c.comm.bandwidth_Bps <= 0:
        raise ConfigError(f"comm.bandwidth_Bps={c.comm.bandwidth_Bps}: must be > 0")
    _check_link("comm", c.comm)
    if c.memory_budget_gib is not None:
        at_most("memory_budget_gib", c.memory_budget_gib, MAX_GPU_MEMORY_GIB, "GiB per rank")
    _check_skews("run.clock_skew_s", c.run.clock_skew_s)


def _check_skews(key: str, skews: object) -> None:
    """The test-only clock skews: a list of finite seconds within MAX_CLOCK_SKEW_S either way
    (nan or 1e300 would reach every timestamp of the rank, in a worker, as a traceback)."""
    if skews is None:
        return
    if not isinstance(skews, (list, tuple)):
        raise ConfigError(f"{key}={skews!r}: must be a list of seconds, one per global rank, e.g. [0,0.5]")
    for rank, s in enumerate(skews):
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not abs(s) <= MAX_CLOCK_SKEW_S:
            raise ConfigError(f"{key}[{rank}]={s!r}: not a skew (allowed: a finite number of seconds, "
                              f"-{MAX_CLOCK_SKEW_S:,.0f}..{MAX_CLOCK_SKEW_S:,.0f}; a day either way)")


def _check_link(key: str, link: LinkConfig | CommConfig | None) -> None:
    if link is None:
        return
    key = key if key == "comm" else f"cluster.{key}"
    if not (math.isfinite(link.latency_s) and link.latency_s >= 0):
        raise ConfigError(f"{key}.latency_s={link.latency_s}: must be a finite number >= 0")
    if not (math.isfinite(link.bandwidth_Bps) and link.bandwidth_Bps > 0):
        raise ConfigError(f"{key}.bandwidth_Bps={link.bandwidth_Bps}: must be a finite number > 0")
    if link.latency_s > MAX_LATENCY_S:
        raise ConfigError(f"{key}.latency_s={link.latency_s}: more than {MAX_LATENCY_S:g} s (allowed: 0.."
                          f"{MAX_LATENCY_S:g} s; a message takes microseconds)")
    if not MIN_BANDWIDTH_BPS <= link.bandwidth_Bps <= MAX_BANDWIDTH_BPS:
        raise ConfigError(f"{key}.bandwidth_Bps={link.bandwidth_Bps}: outside {MIN_BANDWIDTH_BPS:g}.."
                          f"{MAX_BANDWIDTH_BPS:g} (allowed: bytes a second, 1 B/s to 1 PB/s)")


def check_cluster(c: ClusterConfig) -> None:
    """Everything a cluster must say, each problem one line naming the key."""
    one_of("cluster.device", c.device, CLUSTER_DEVICES)
    for key in ("gpus_per_node", "nodes"):
        at_least(f"cluster.{key}", getattr(c, key), 1)
    if c.gpus_per_node * c.nodes > MAX_GPUS:
        key, value, other = ("nodes", c.nodes, c.gpus_per_node) if c.nodes >= c.gpus_per_node else \
            ("gpus_per_node", c.gpus_per_node, c.nodes)
        raise ConfigError(f"cluster.{key}={value}: cluster.nodes x cluster.gpus_per_node = {c.gpus:,} GPUs, more "
                          f"than {MAX_GPUS:,} (allowed: cluster.{key} <= {max(1, MAX_GPUS // other):,} here; a "
                          "point runs pp x dp ranks on them, at most that many)")
    for key in ("memory_per_gpu_gib", "memory_bandwidth_Bps"):
        v = getattr(c, key)
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ConfigError(f"cluster.{key}={v}: must be a finite number > 0")
    at_most("cluster.memory_per_gpu_gib", c.memory_per_gpu_gib, MAX_GPU_MEMORY_GIB, "GiB a GPU")
    if c.memory_bandwidth_Bps is not None:
        at_most("cluster.memory_bandwidth_Bps", c.memory_bandwidth_Bps, MAX_BANDWIDTH_BPS, "bytes a second")
    if not (math.isfinite(c.memory_reserve_gib) and 0 <= c.memory_reserve_gib < c.memory_per_gpu_gib):
        raise ConfigError(f"cluster.memory_reserve_gib={c.memory_reserve_gib}: must be >= 0 and below "
                          f"memory_per_gpu_gib={c.memory_per_gpu_gib}")
    one_of("cluster.allreduce", c.allreduce, ALLREDUCE_ALGORITHMS)
    for key in ("intra", "inter", "allreduce_intra", "allreduce_inter"):
        _check_link(key, getattr(c, key))
    for key in OVERHEAD_TABLES:
        for k, v in getattr(c.overhead, key).items():
            if not str(k).isdigit() or not (math.isfinite(float(v)) and 0 <= float(v) <= MAX_LATENCY_S):
                raise ConfigError(f"cluster.overhead.{key}: {k}: {v} (allowed: ranks on the host -> a number in 0.."
                                  f"{MAX_LATENCY_S:g}: seconds, or real_*'s scale)")
