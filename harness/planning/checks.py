"""Validation that needs more than the schema: the registries (each schedule, model and
executor says what it accepts) and the built model (its layers, its size). Planning runs it
(harness/planning/plan.py) before anything else is built; so does the planner, on every candidate.
What needs no model (and no torch) is in early.py, which the frontend runs before torch is imported.

ConfigError with one line naming the key, the value and what is allowed, before any worker.
"""

from __future__ import annotations

import math
import os

from harness.runtime import compat
from harness.config import (MAX_LAYERS, MAX_RUN_ACTIONS, MAX_TIMEOUT_S, Config, ConfigError, check_values,
                            planned_microbatch_size)
from harness.planning.devices import memory_bandwidth
from harness.planning.early import check_stages, check_unbuilt
from harness.planning.memory_theory import layer_memory
from harness.model.built import BuiltModel, built_model
from harness.model.profile_data import ProfileError, load_profile
from harness.parallel.tensor import refusal as tensor_refusal
from harness.runtime.precision import Precision
from harness.runtime.faults import parse_fault
from harness.runtime.registry import EXECUTORS, Executor, entry_point
from harness.schedules.registry import SCHEDULES, chunks_per_rank
from harness.simulate.pricing import optimizer_bytes_touched

GPU_BYTES_BOUND = 256 * 2**30  # no GPU has more memory than this (an upper bound, not a query)
LAYER_TENSORS = 2**16  # activation-sized tensors a layer may save (attention's T x T per head is ~3 T heads / hidden)
MAX_STEP_S = MAX_TIMEOUT_S  # a modeled step: no watchdog waits longer, and a sleep or timeout past it overflows


def validate(c: Config, cuda_devices: int = 0, model: BuiltModel | None = None,
             ranks_here: int | None = None) -> BuiltModel:
    """Everything a run needs that the schema cannot express, checked before any worker; the
    built model (`model`, when the caller built it already, else built here once). The checks
    of one machine's share (processes, memory) count `ranks_here` ranks on it (default: as
    torchrun says, LOCAL_WORLD_SIZE, else the whole world, forked here)."""
    world = c.pp * c.dp * c.tp
    here = min(world, ranks_here or ranks_on_host(world))
    check_values(c)
    check_unbuilt(c)  # the config's own rules past the schema: tp, the registries, the schedule (torch-free)
    schedule = SCHEDULES[c.schedule.name]
    executor = EXECUTORS[c.executor]
    _check_executor(c, executor, cuda_devices, here)
    _check_faults(c, executor)
    _check_run(c, executor)
    if model is None:
        model = built_model(c.model)
    if (line := tensor_refusal(model.model, c.model.name, c.tp)) is not None:  # a custom model without a plan
        raise ConfigError(line)
    if schedule.build is not None:  # a CSV schedule's stages are known once the plan reads it
        check_stages(c, c.pp * chunks_per_rank(c.schedule.name, c.virtual_stages), model.num_layers)
    if not executor.simulated:  # a simulated executor allocates nothing
        _check_sizes(c, cuda_devices, model, here)
    if model.num_layers > MAX_LAYERS:
        key = "model.layers" if hasattr(c.model, "layers") else "model"
        raise ConfigError(f"{key}={getattr(c.model, 'layers', c.model.name)}: {model.num_layers:,} layers, more than "
                          f"{MAX_LAYERS:,} (allowed: model.layers <= {MAX_LAYERS:,}; a plan lists every layer)")
    _check_modeled_time(c, executor, model)
    return model


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
    if c.tp > 1 and not executor.tp:
        able = ", ".join(n for n, e in EXECUTORS.items() if e.tp)
        raise ConfigError(f"tp={c.tp}: executor={c.executor} {executor.no_tp or 'runs no tensor parallelism'} "
                          f"(allowed: tp=1, or executor={able})")
    if here > c.run.max_processes and not executor.simulated:  # a simulated executor starts no process
        sizes = f"pp={c.pp} x dp={c.dp}" + (f" x tp={c.tp}" if c.tp > 1 else "")
        raise ConfigError(f"{sizes}: {here} processes on this machine, more than "
                          f"run.max_processes={c.run.max_processes}")
    if c.device == "cuda" and cuda_devices == 0 and not executor.simulated:  # sim models a GPU run, runs none
        raise ConfigError("device=cuda: no CUDA device here (use device=cpu or device=auto)")


def _check_run(c: Config, executor: Executor) -> None:
    """What no run of this executor can do: check gradients it never computes, hold the events
    of more timed actions than MAX_RUN_ACTIONS in memory."""
    if executor.simulated and c.verify_grads:
        raise ConfigError(f"verify_grads=true: executor={c.executor} computes no gradients, so there are none to "
                          f"verify (allowed: verify_grads=false with executor={c.executor})")
    spec = SCHEDULES[c.schedule.name]
    if executor.simulated:  # sim keeps one step standing for all
        return
    if spec.actions is not None:  # its own count (a file's: read, checked and cached by its check)
        if (counted := spec.actions(c)) is None:  # said by the schedule's own check
            return
        per_step = counted
    else:
        per_step = c.pp * chunks_per_rank(c.schedule.name, c.virtual_stages) * c.microbatches * \
            (3 if spec.split_backward else 2)
    steps = c.warmup_steps + c.steps
    if per_step * steps > MAX_RUN_ACTIONS:
        key, value = ("warmup_steps", c.warmup_steps) if c.warmup_steps > c.steps else ("steps", c.steps)
        raise ConfigError(f"{key}={value}: {steps:,} steps x {per_step:,} actions a step = {per_step * steps:,} timed "
                          f"actions, more than {MAX_RUN_ACTIONS:,} (allowed: warmup_steps + steps <= "
                          f"{max(1, MAX_RUN_ACTIONS // per_step):,} here; each is kept as events until the records "
                          "are written)")


def _check_faults(c: Config, executor: Executor) -> None:
    try:
        fault = parse_fault(c.run.fault)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if fault and fault.where == "launch" and executor.runner is None:
        raise ConfigError(f"run.fault={c.run.fault}: executor={c.executor} starts no worker, so there is no launch to "
                          f"interrupt (allowed with executor={c.executor}: term@start, term@plan, term@records, "
                          "term@end)")
    world = c.pp * c.dp * c.tp
    if fault and fault.rank is not None and not (fault.rank < world and fault.step < c.warmup_steps + c.steps):
        raise ConfigError(f"run.fault={c.run.fault}: rank or step outside this run ({world} ranks, "
                          f"{c.warmup_steps + c.steps} steps)")
    if fault and fault.kind not in executor.faults:
        raise ConfigError(f"run.fault={c.run.fault}: executor={c.executor} honours "
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
    model.hidden, model.seq of 1e9, dp of 1e4): the activations and the weights and gradients
    of the ranks this machine runs, in `dtype`, at the microbatch size global_batch sets.
    Three bounds, cheapest first: the tensors between stages (every rank may hold all M:
    GPipe does), the weights and gradients, then the memory theory's activations (every layer's
    saved tensors, harness/planning/memory_theory.py) with the weights. Checked before anything is
    built; a simulated executor allocates nothing and is not checked."""
    limit = machine_bytes(c.device, min(here, cuda_devices))
    b = planned_microbatch_size(c)
    itemsize = Precision(c.dtype).bytes
    dims = model.model.activation_shape(b)
    bkey = ("global_batch", c.global_batch) if c.global_batch is not None else ("microbatch_size", b)
    # every rank may hold all M microbatches' inter-stage tensors (GPipe does): a lower bound of what it holds
    # sequence_parallel: a TP rank's inter-stage tensor is its sequence shard
    activations = here * c.microbatches * itemsize * math.prod(dims) // (c.tp if c.sequence_parallel else 1)
    if activations > limit:
        shape = "x".join(str(d) for d in dims)
        key, value = _culprit(c, here, [("microbatches", c.microbatches)] + [
            (k, v) for k, v in (("microbatch_size", b), ("model.hidden", c.model.hidden),
                                ("model.seq", getattr(c.model, "seq", None))) if v in dims])
        raise ConfigError(f"{key}={value}: the activations of this machine's {here} ranks ({here} x microbatches="
                          f"{c.microbatches} x {shape} {c.dtype}) are {_gib(activations)}, more than its "
                          f"{_gib(limit)}")
    params = model.total_params
    if params is None:
        return
    # this machine's share of the replicas' weights and gradients, in dtype (a TP rank: at least a tp-th)
    weights = 2 * itemsize * params * here / (c.pp * c.tp)
    if weights > limit:
        if 2 * itemsize * params <= limit and here > c.pp:  # one replica fits: the replicas here do not
            key, value = ("dp", c.dp)
        else:
            sizes = ("layers", "hidden", "vocab", "ffn")
            k = max((k for k in sizes if hasattr(c.model, k)), key=lambda k: getattr(c.model, k) or 0)
            key, value = f"model.{k}", getattr(c.model, k)
        raise ConfigError(f"{key}={value}: {params:,} parameters, weights and "
                          f"gradients in {c.dtype} for this machine's {here} ranks need {_gib(int(weights))}, more "
                          f"than its {_gib(limit)}")
    # the memory theory's bound, traced only where it could matter: where a layer holding
    # LAYER_TENSORS tensors of the inter-stage size on every rank for all M could pass the machine
    could = weights + here * c.microbatches * model.num_layers * LAYER_TENSORS * itemsize * math.prod(dims) > limit
    held = _held_activations(c, model, b, cuda_devices) if could else None  # one replica's
    if held is not None and held * here / (c.pp * c.tp) + weights > limit:
        acts = held * here / (c.pp * c.tp)  # a TP rank holds at least a tp-th of its stage's
        if acts >= weights:
            key, value = _culprit(c, here, [bkey, ("model.hidden", c.model.hidden),
                                            ("model.seq", getattr(c.model, "seq", None))])
        else:
            key, value = "model.layers", c.model.layers
        raise ConfigError(f"{key}={value}: this machine's {here} ranks need at least {_gib(int(acts + weights))}: "
                          f"activations held for backward {_gib(int(acts))} (the memory theory's, at "
                          f"microbatch_size={b}) and weights and gradients {_gib(int(weights))}, more than its "
                          f"{_gib(limit)}")


def _culprit(c: Config, here: int, candidates: list[tuple[str, object]]) -> tuple[str, object]:
    """The key to name for memory that does not fit: dp where this machine's ranks are the
    many replicas of a pipeline (their count outweighs every size), else the largest size."""
    sized = [(k, v) for k, v in candidates if isinstance(v, int)]
    key, value = max(sized, key=lambda kv: kv[1])
    if c.dp > 1 and here > c.pp and c.dp > value:
        return "dp", c.dp
    return key, value


def _held_activations(c: Config, model: BuiltModel, b: int, cuda_devices: int) -> int | None:
    """A lower bound of the activation bytes one pipeline replica's ranks hold at their peaks,
    from the memory theory (harness/planning/memory_theory.py: every layer's saved tensors), traced at
    microbatch sizes 1 and 2 and extended linearly to b (each saved tensor is a fixed size or
    one per sample: exact, and nothing of size b is allocated): every rank holds at least the
    fewest microbatches any rank of its schedule holds (GPipe's M, 1F1B's 1) of its stage, so
    the replica that many microbatches through the whole model (with V chunks per rank, a V-th
    of one). A bound, not the peak the plan's theory prices: only what no partition or order
    can avoid is refused. None where the theory has no per-layer memory (a model not buildable
    on the meta device, or past its layer count) or with checkpointing (the inter-stage bound
    counts what a checkpoint keeps)."""
    if c.checkpointing or model.numels is None:
        return None
    device = c.device if c.device != "auto" else ("cuda" if cuda_devices >= c.pp * c.dp else "cpu")
    L = model.num_layers
    try:
        mem = layer_memory(model, c.dtype, device)
        one, two = mem.stage(0, L, 1, False).kept, mem.stage(0, L, 2, False).kept
    except Exception:  # noqa: BLE001 - a model the theory cannot trace: the workers say what fails
        return None
    whole = one + (b - 1) * max(0, two - one)
    spec = SCHEDULES[c.schedule.name]
    chunks = chunks_per_rank(c.schedule.name, c.virtual_stages) if spec.build is not None else 1
    held = 1
    if spec.build is not None and spec.inflight is not None and not spec.split_backward and chunks == 1 \
            and c.pp <= 4096:
        held = max(1, min(spec.inflight(c.pp, c.microbatches, r, c.virtual_stages) for r in range(c.pp)))
    return held * whole // chunks


def _check_modeled_time(c: Config, executor: Executor, model: BuiltModel) -> None:
    """The modeled step (what executor=sim reports, compute=emulated sleeps, and the watchdog
    scales with) bounded before it is priced: a lower bound of it, the busiest rank's compute
    (M microbatches' forward and backward of at least the mean share of the layers), microbatch
    0's hops there and back, and with a cluster the optimizer step, must be within MAX_STEP_S
    (a week: a sleep or a timeout past it overflows), and with worker processes and no
    timeout_s the watchdog it sets, 60 s + 10x the modeled run, too. executor=sim needs some
    compute to time (a step of 0 s has no throughput)."""
    b, m, cc = planned_microbatch_size(c), c.microbatches, c.cost
    k = cc.time_scale
    if c.profile:
        try:
            layers = load_profile(c.profile, b, model.kinds)
        except ProfileError as e:
            raise ConfigError(str(e)) from None
        compute = k * m * sum(lc.fwd_s + lc.bwd_s for lc in layers) / c.pp
        ckey = ("cost.time_scale", k) if k > 1 else ("profile", c.profile)
    else:
        per_layer = cc.fwd_ms_per_layer / 1e3 * (cc.fixed_fraction + (1 - cc.fixed_fraction) * b
                                                 / cc.at_microbatch_size)
        compute = k * m * per_layer * (1 + cc.bwd_over_fwd) * -(-model.num_layers // c.pp)
        ckey = max((("cost.time_scale", k, k), ("cost.fwd_ms_per_layer", cc.fwd_ms_per_layer, cc.fwd_ms_per_layer / 5),
                    ("cost.bwd_over_fwd", cc.bwd_over_fwd, cc.bwd_over_fwd / 2), ("microbatches", m, m / 8),
                    ("microbatch_size", b, b / max(1, cc.at_microbatch_size))), key=lambda t: t[2])[:2]
    if executor.simulated and compute <= 0:
        key, value = ("profile", c.profile) if c.profile else ("cost.fwd_ms_per_layer", cc.fwd_ms_per_layer)
        raise ConfigError(f"{key}={value}: executor={c.executor}'s step is the modeled compute, and it is 0 s here "
                          f"(allowed: a forward > 0 ms with executor={c.executor}: cost.fwd_ms_per_layer, or a profile's "
                          "times)")
    nbytes = Precision(c.dtype).bytes * model.activation_numel(b)
    links = [("comm", c.comm.latency_s, c.comm.bandwidth_Bps)] if c.cluster is None else [
        (f"cluster.{n}", link.latency_s, link.bandwidth_Bps) for n, link in (("intra", c.cluster.intra),
                                                                             ("inter", c.cluster.inter))]
        # the faster of the links: a lower bound wherever the ranks are
    name, latency, bandwidth = min(links, key=lambda t: t[1] + nbytes / t[2])
    hops = 2 * (c.pp - 1) * (latency + nbytes / bandwidth)
    hkey = (f"{name}.bandwidth_Bps", bandwidth) if nbytes / bandwidth >= latency else (f"{name}.latency_s", latency)
    optimizer, okey = 0.0, ("cluster.memory_bandwidth_Bps", None)
    if c.cluster is not None and model.total_params is not None:
        bandwidth = memory_bandwidth(c.cluster)
        optimizer = model.total_params / c.pp * optimizer_bytes_touched(c) / bandwidth
        okey = ("cluster.memory_bandwidth_Bps" if c.cluster.memory_bandwidth_Bps is not None else "cluster.gpu",
                bandwidth if c.cluster.memory_bandwidth_Bps is not None else c.cluster.gpu)
    step, (key, value) = max((compute, ckey), (hops, hkey), (optimizer, okey), key=lambda t: t[0])
    if step > MAX_STEP_S:
        raise ConfigError(f"{key}={value}: the modeled step is at least {step:,.4g} s, more than {MAX_STEP_S:,} s, a "
                          "week (allowed: a modeled step within a week; it is slept, simulated and timed out)")
    steps = c.warmup_steps + c.steps
    if c.run.timeout_s is None and not executor.simulated and 60 + 10 * step * steps > MAX_STEP_S:
        key, value = ("steps", c.steps) if step <= 3600 else (key, value)  # a sane step: the count is at fault
        raise ConfigError(f"{key}={value}: {steps:,} steps of a modeled step of at least {step:,.4g} s set a watchdog "
                          f"(60 s + 10x the modeled run) past {MAX_STEP_S:,} s, a week (allowed: a shorter run, or "
                          f"run.timeout_s=<seconds up to {MAX_STEP_S:,}>)")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"
