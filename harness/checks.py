"""Validation that needs more than the schema: the registries (each schedule, model and
executor says what it accepts) and the built model (its layers, its size). Planning runs it
(harness/plan.py) before anything else is built; so does the planner, on every candidate.

ConfigError with one line naming the key, the value and what is allowed, before any worker.
"""

from __future__ import annotations

import math
import os

from harness import compat
from harness.config import MAX_ACTIONS, Config, ConfigError, check_values, one_of, planned_microbatch_size
from harness.model import MODELS
from harness.model.built import BuiltModel, built_model
from harness.precision import Precision
from harness.runtime.faults import parse_fault
from harness.runtime.registry import EXECUTORS, Executor, entry_point
from harness.schedules.registry import SCHEDULES, chunks_per_rank, requirements

GPU_BYTES_BOUND = 256 * 2**30  # no GPU has more memory than this (an upper bound, not a query)


def validate(c: Config, cuda_devices: int = 0, model: BuiltModel | None = None,
             ranks_here: int | None = None) -> BuiltModel:
    """Everything a run needs that the schema cannot express, checked before any worker; the
    built model (`model`, when the caller built it already, else built here once). The checks
    of one machine's share (processes, memory) count `ranks_here` ranks on it (default: as
    torchrun says, LOCAL_WORLD_SIZE, else the whole world, forked here)."""
    here = min(c.pp * c.dp, ranks_here or ranks_on_host(c.pp * c.dp))
    check_values(c)
    one_of("schedule", c.schedule.name, tuple(SCHEDULES))
    one_of("model", c.model.name, tuple(MODELS))
    one_of("executor", c.executor, tuple(EXECUTORS))
    schedule = SCHEDULES[c.schedule.name]
    if schedule.check is not None and (problem := schedule.check(c)):
        raise ConfigError(problem)
    if schedule.build is not None:
        if (why := requirements(c.schedule.name, c.pp, c.microbatches, c.virtual_stages)) is not None:
            raise ConfigError(why)
        _check_actions(c)
    executor = EXECUTORS[c.executor]
    _check_executor(c, executor, cuda_devices, here)
    if model is None:
        model = built_model(c.model)
    _check_faults(c, executor)
    if schedule.build is not None:  # a CSV schedule's stages are known once the plan reads it
        check_stages(c, c.pp * chunks_per_rank(c.schedule.name, c.virtual_stages), model.num_layers)
    if not executor.simulated:  # a simulated executor allocates nothing
        _check_sizes(c, cuda_devices, model, here)
    return model


def check_stages(c: Config, stages: int, layers: int) -> None:
    """What depends on the number of stages: each needs a layer; checkpoint segments and an
    explicit partition must fit them."""
    if stages > layers:
        raise ConfigError(f"pp={c.pp}: {stages} stages, more than the model's {layers} layers "
                          f"(allowed: pp x chunks per rank <= {layers}, or raise model.layers)")
    smallest = layers // stages
    if c.checkpointing and c.checkpoint_every > smallest:
        raise ConfigError(f"checkpoint_every={c.checkpoint_every}: more than the {smallest} layers of the "
                          f"smallest stage (allowed: 1..{smallest})")
    if c.partition.name == "explicit":
        lps = getattr(c.partition, "layers_per_stage", None)
        if not lps or len(lps) != stages:
            raise ConfigError(f"partition.layers_per_stage={lps}: partition=explicit needs {stages} entries "
                              f"(one per stage)")
        if any(n < 1 for n in lps) or sum(lps) != layers:
            raise ConfigError(f"partition.layers_per_stage={lps}: entries must be >= 1 and sum to the "
                              f"model's {layers} layers")


def _check_actions(c: Config) -> None:
    """A schedule too long to build (microbatches=1000000000) is refused before it is built."""
    chunks = chunks_per_rank(c.schedule.name, c.virtual_stages)
    actions = c.pp * chunks * c.microbatches * 3
    if actions > MAX_ACTIONS:
        big, value = ("virtual_stages", c.virtual_stages) if c.virtual_stages > c.microbatches else \
            ("microbatches", c.microbatches)
        allowed = max(1, MAX_ACTIONS // (3 * c.pp * (chunks if big == "microbatches" else c.microbatches)))
        raise ConfigError(f"{big}={value}: pp={c.pp} x {chunks} chunks x {c.microbatches} microbatches x 3 = "
                          f"{actions:,} schedule actions, more than {MAX_ACTIONS:,} (allowed: {big} <= {allowed})")


def _check_executor(c: Config, executor: Executor, cuda_devices: int, here: int) -> None:
    if c.dp > 1 and not executor.dp:
        able = ", ".join(n for n, e in EXECUTORS.items() if e.dp)
        raise ConfigError(f"dp={c.dp}: executor={c.executor} runs one pipeline (allowed: dp=1, or executor={able})")
    if c.device == "cuda" and "cuda" not in executor.devices:
        raise ConfigError(f"device=cuda: executor={c.executor} runs on {', '.join(executor.devices)}")
    split = SCHEDULES[c.schedule.name].split_backward
    if split and not executor.split_backward:
        raise ConfigError(f"schedule={c.schedule.name}: executor={c.executor} runs no split backward (I/W)")
    if executor.private_torch(c) and (problem := compat.untested_torch()):
        raise ConfigError(f"executor={c.executor}: {problem}")
    if executor.check is not None and (problem := entry_point(executor.check)(c)):
        raise ConfigError(problem)
    if here > c.max_processes and not executor.simulated:  # a simulated executor starts no process
        raise ConfigError(f"pp={c.pp} x dp={c.dp}: {here} processes on this machine, more than "
                          f"max_processes={c.max_processes}")
    if c.device == "cuda" and cuda_devices == 0 and not executor.simulated:  # sim models a GPU run, runs none
        raise ConfigError("device=cuda: no CUDA device here (use device=cpu or device=auto)")


def _check_faults(c: Config, executor: Executor) -> None:
    try:
        fault = parse_fault(c.fault)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if fault and fault.rank is not None and not (fault.rank < c.pp * c.dp and fault.step < c.warmup_steps + c.steps):
        raise ConfigError(f"fault={c.fault}: rank or step outside this run ({c.pp * c.dp} ranks, "
                          f"{c.warmup_steps + c.steps} steps)")
    if fault and fault.kind not in executor.faults:
        raise ConfigError(f"fault={c.fault}: executor={c.executor} honours "
                          f"{', '.join(executor.faults) or 'no faults'}")


def machine_bytes(device: str, gpus: int) -> int:
    """An upper bound on the memory a machine's ranks can use: its RAM (os.sysconf), plus,
    where its ranks may run on GPUs, GPU_BYTES_BOUND per GPU."""
    try:
        ram = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not POSIX: no bound
        return 2**63
    return ram + (gpus * GPU_BYTES_BOUND if device != "cpu" else 0)


def ranks_on_host(world: int) -> int:
    """Worker processes on this host: torchrun's per-node count, else the whole world (forked here)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", world))


def _check_sizes(c: Config, cuda_devices: int, model: BuiltModel, here: int) -> None:
    """Inputs that pass every range check but cannot fit this machine (microbatch_size,
    model.hidden, model.seq of 1e9): the activations and the weights and gradients of the
    ranks this machine runs, in `dtype`, at the microbatch size global_batch sets. Checked
    before anything is built; a simulated executor allocates nothing and is not checked."""
    limit = machine_bytes(c.device, min(here, cuda_devices))
    b = planned_microbatch_size(c)
    itemsize = Precision(c.dtype).bytes
    dims = model.model.activation_shape(b)
    # every rank may hold all M microbatches' inter-stage tensors (GPipe does): a lower bound of what it holds
    activations = here * c.microbatches * itemsize * math.prod(dims)
    if activations > limit:
        shape = "x".join(str(d) for d in dims)
        key, value = max([("microbatches", c.microbatches)] +
                         [(k, v) for k, v in (("microbatch_size", b), ("model.hidden", c.model.hidden),
                                              ("model.seq", getattr(c.model, "seq", None))) if v in dims],
                         key=lambda kv: kv[1])
        raise ConfigError(f"{key}={value}: the activations of this machine's {here} ranks ({here} x microbatches="
                          f"{c.microbatches} x {shape} {c.dtype}) are {_gib(activations)}, more than its "
                          f"{_gib(limit)}")
    params = model.total_params
    if params is None:
        return
    # this machine's share of the replicas' weights and gradients, in dtype
    weights = 2 * itemsize * params * here / c.pp
    if weights > limit:
        sizes = ("layers", "hidden", "vocab", "ffn")
        key = max((k for k in sizes if hasattr(c.model, k)), key=lambda k: getattr(c.model, k) or 0)
        raise ConfigError(f"model.{key}={getattr(c.model, key)}: {params:,} parameters, weights and "
                          f"gradients in {c.dtype} for this machine's {here} ranks need {_gib(int(weights))}, more "
                          f"than its {_gib(limit)}")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
