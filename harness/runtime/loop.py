"""The one rank loop every real executor shares: join the world, build the executor's
runner, measure the rank's clock against rank 0's (harness/runtime/clock.py), run every step
(gc between steps, fault injection, a barrier, the runner's actions, the optimizer), and
return a typed RankReport.

An executor supplies only a runner (harness/runtime/registry.py names it): an object that
builds this rank's stages and runs one step of their actions. What it cannot measure it
reports as None, never 0.
"""

from __future__ import annotations

import gc
import importlib
import os
import traceback
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.queues import Queue
from typing import Any, Protocol

import torch
import torch._dynamo  # noqa: F401 - the first optimizer imports it (~1.5 s); the forkserver pays once
import torch.distributed as dist

from harness.parallel.mesh import Grid, device_mesh
from harness.parallel.tensor import full_gradients, local, local_grads
from harness.runtime.optimizer import Optimizer
from harness.planning.plan import Plan
from harness.runtime.precision import Precision
from harness.runtime.faults import maybe_inject, parse_fault
from harness.runtime.groups import Layout
from harness.runtime.orphans import die_with_parent
from harness.runtime.progress import Mark
from harness.measure.execution import RankReport
from harness.runtime.clock import estimate_offset, same_clock, skew_ns
from harness.runtime.tracer import Tracer, clock_for
from harness.measure.trace import COMPUTE


@dataclass(frozen=True)
class RankContext:
    """What a runner is built from."""
    rank: int  # global rank
    plan: Plan
    device: torch.device
    tracer: Tracer
    layout: Layout
    dp_group: Any = None  # this rank's data-parallel group (dp > 1), made before the runner
    tp_mesh: Any = None  # this rank's tensor-parallel DeviceMesh (1-D, "tp"; tp > 1), made before the runner


@dataclass
class StepMemory:
    """One step's activation memory on a rank, from its meter."""
    samples: list[tuple[int, int]]  # (ns, live bytes)
    peak: int
    microbatch_bytes: list[int]  # bytes one (stage, microbatch) held at the end of its F
    peak_with_grads: int = 0  # the largest activations + gradients (+ a backward's recompute) live at once


class Runner(Protocol):
    def parameters(self) -> list[torch.Tensor]: ...

    def run_step(self, step: int, drop_grads: bool) -> float | None:
        """Every pipeline action of this rank for one step, sends drained; the step's loss
        on the rank holding the last stage, else None. drop_grads: the noaccum fault."""

    def gradients(self) -> dict[str, torch.Tensor]:
        """Accumulated gradients by global parameter name ("<layer>.<param>")."""

    def step_memory(self) -> StepMemory | None:
        """The step's activation memory, or None where this runner cannot meter it."""


def named_gradients(plan: Plan, layers_by_stage: dict[int, torch.nn.Module]) -> dict[str, torch.Tensor]:
    """Gradients of this rank's layers by global name "<layer>.<param>", as the
    single-process reference names them (layer i of the whole model is "i")."""
    out = {}
    for s, layers in layers_by_stage.items():
        first = plan.stage_layers[s][0]
        # tp > 1: whole, in the unsplit layout (collective over the TP group: every TP rank asks)
        grads = full_gradients(layers) if plan.config.tp > 1 else {n: p.grad for n, p in layers.named_parameters()}
        for name, g in grads.items():
            index, rest = name.split(".", 1)
            out[f"{first + int(index)}.{rest}"] = g.detach().cpu().clone()
    return out


def load_runner(path: str) -> Any:
    """"module:Class" -> the class (imported in the worker: a runner may pull in heavy modules)."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def join_world(rank: int, plan: Plan, rendezvous: str | dist.Store) -> torch.device:
    """One thread, this rank's device, the process group joined (unless torchrun's caller
    already did) through `rendezvous`: an init_method URL, or a store."""
    torch.set_num_threads(1)  # several ranks share the cores; more threads slowed matmuls 10x
    if plan.device == "cuda":
        # this node's GPU for this rank: LOCAL_RANK under an external launcher, else its slot
        slot = Layout(plan.config.pp, plan.config.dp, plan.config.tp).slot(rank, plan.config.placement)
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", slot)) % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        how = {"init_method": rendezvous} if isinstance(rendezvous, str) else {"store": rendezvous}
        dist.init_process_group(plan.backend, rank=rank, world_size=plan.world,
                                timeout=timedelta(seconds=plan.config.run.timeout_s), **how)
    return device


def storage_bytes(tensors: Any) -> int:
    """Bytes of the tensors' storages, each storage once; a DTensor's (tp > 1) local shard."""
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in map(local, tensors)
            if isinstance(t, torch.Tensor) and t.numel()}
    return sum(seen.values())


def run_rank(rank: int, plan: Plan, rendezvous: str | dist.Store, runner_path: str, one_host: bool = False,
             steps_path: str | None = None) -> RankReport:
    """Joins the world as `rank`, builds the runner, runs every step. The caller owns the
    process group's teardown (torchrun gathers over it first). `one_host`: every rank was forked
    on this host (one clock: nothing to measure, unless clock_skew_s says otherwise).
    `steps_path`: the launcher's file of each rank's started steps (harness/runtime/progress.py)."""
    device = join_world(rank, plan, rendezvous)
    c = plan.config
    tracer = Tracer(clock_for(device, skew_ns(c.run.clock_skew_s, rank)))
    layout = Layout(c.pp, c.dp, c.tp)
    dp_group = layout.dp_group(rank)  # collective: before the runner's own groups, on every rank
    # tp > 1: the (pp, dp, tp) DeviceMesh, collective too, next in every rank's order of group creations
    tp_mesh = device_mesh(Grid(c.pp, c.dp, c.tp), device.type)["tp"] if c.tp > 1 else None
    runner: Runner = load_runner(runner_path)(RankContext(rank, plan, device, tracer, layout, dp_group, tp_mesh))
    params = runner.parameters()  # tp > 1: DTensors, the optimizer steps their local shards (same storage)
    shards = [local(p) for p in params]
    optimizer = Optimizer(shards, c.lr, c.optimizer, Precision(c.dtype), dp_group if c.zero else None)
    fault = parse_fault(c.run.fault)
    report = RankReport(rank, [], [])
    book = MemoryBook(storage_bytes(params))
    total = c.warmup_steps + c.steps
    # this clock against rank 0's: collective, unless every rank reads this host's one clock
    report.clock = (same_clock(tracer.clock) if one_host and not c.run.clock_skew_s else
                    estimate_offset(tracer.clock, plan.backend, device))
    mark = Mark(steps_path, rank)
    gc.disable()  # a collection pause inside a step is jitter; collect between steps instead...
    try:
        for step in range(total):
            # ...the young generations only: what the steps before left. A full pass would also walk
            # the heap this process started with (~0.7 s; frozen in the forkserver, harness/runtime/warm.py)
            gc.collect(1)
            maybe_inject(fault, rank, step)
            mark(step)  # started: a rank that never says so is the one the watchdog names
            drop = fault is not None and fault.kind == "noaccum" and (fault.rank, fault.step) == (rank, step)
            dist.barrier()  # every rank starts the step together; not inside the window
            tracer.start_step(step)
            report.losses.append(runner.run_step(step, drop))
            if c.verify_grads and step == total - 1:
                report.grads = {k: v.float().numpy() for k, v in runner.gradients().items()}
            grads = storage_bytes(p.grad for p in params)
            state = optimizer.state_bytes()  # what the step held from the step before
            _optimizer_step(optimizer, params, shards, tracer, sharded=c.tp > 1)
            tracer.finish_step()
            report.events += tracer.take()
            book.add(step, runner.step_memory(), tracer.clock, grads, state, optimizer.state_bytes(),
                     measured=step >= c.warmup_steps)
    finally:
        gc.enable()
        mark.close()
    if report.losses[0] is None:
        report.losses = None
    book.fill(report)
    if device.type == "cuda":
        report.cuda_max_memory_allocated = torch.cuda.max_memory_allocated(device)
        report.cuda_memory = {"allocated": torch.cuda.memory_allocated(device),
                              "reserved": torch.cuda.memory_reserved(device),
                              "max_allocated": torch.cuda.max_memory_allocated(device)}
    return report


def _optimizer_step(optimizer: Optimizer, params: list, shards: list, tracer: Tracer, sharded: bool) -> None:
    """The step's optimizer, traced as one `optim` event. `sharded` (tp > 1): the parameters are
    DTensors, and the optimizer steps their local shards, which share their storage."""
    t0 = tracer.mark()
    if sharded:
        local_grads(params, shards)
    optimizer.step()
    optimizer.zero_grad()
    if sharded:
        for p in params:
            p.grad = None
    tracer.record("optim", COMPUTE, "optim", -1, -1, t0)


class MemoryBook:
    """A rank's memory over its steps: the meter's samples (every step), and over the measured
    steps the largest gradients, optimizer state, activations and their sum with the weights.
    A step whose runner could not meter it (None) leaves the activation figures None."""

    def __init__(self, param_bytes: int):
        self.samples: list[tuple[int, int, int]] = []  # (step, rank-0 ns, live bytes)
        self.peaks: list[int] = []
        self.microbatch_bytes: list[int] = []
        self.metered = True
        self.held = {"params": param_bytes, "grads": 0, "optimizer": 0, "activations": None, "peak": None}

    def add(self, step: int, mem: StepMemory | None, clock: Any, grads: int, state_before: int, state_after: int,
            measured: bool) -> None:
        """`state_before`: the optimizer state the step held from the step before (its peak's);
        `state_after`: what the optimizer holds after its step."""
        self.metered = self.metered and mem is not None
        if mem is not None:  # the meter reads the host's clock
            self.samples += [(step, clock.local(t), b) for t, b in mem.samples]
        if not measured:
            return
        held = self.held
        held["grads"] = max(held["grads"], grads)
        held["optimizer"] = max(held["optimizer"], state_after)
        if mem is not None:
            self.peaks.append(mem.peak)
            self.microbatch_bytes += mem.microbatch_bytes
            held["activations"] = max(held["activations"] or 0, mem.peak)
            held["peak"] = max(held["peak"] or 0, held["params"] + state_before + mem.peak_with_grads)

    def fill(self, report: RankReport) -> None:
        if self.metered:
            report.memory, report.peak_activation_bytes = self.samples, max(self.peaks)
            mb = self.microbatch_bytes
            report.activation_bytes_per_microbatch = sum(mb) / len(mb) if mb else 0.0
        report.memory_breakdown = self.held


def one_line(e: BaseException) -> str:
    """`Type: message (file:line)` of where it was raised, on one line."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" ({os.path.basename(where.filename)}:{where.lineno})" if where else ""
    return f"{type(e).__name__}: {e}{at}".replace("\n", " ")


def worker_main(rank: int, port: int, plan: Plan, results: Queue, runner_path: str,
                steps_path: str | None = None) -> None:
    """Entry point of a forked rank: run it, put (rank, "ok", RankReport) or (rank, "error",
    line) on `results`, and leave the process group. Rank 0 serves the rendezvous on `port`."""
    die_with_parent()
    serve(rank, f"tcp://127.0.0.1:{port}", plan, results, runner_path, steps_path)


def pooled_worker_main(rank: int, inbox: Queue, results: Queue) -> None:
    """Entry point of a RankPool's rank (harness/runtime/launch.py): serves each job it is sent,
    (store port, job key prefix, plan, runner), as worker_main serves one, until it is sent
    None. The pool's process serves the store: every rank of a job starts at once, and a rank
    that reached rank 0's store before it listened would back off for ~0.7 s."""
    die_with_parent()
    store = None
    while (job := inbox.get()) is not None:
        port, prefix, plan, runner_path, steps_path = job
        if store is None:
            store = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=plan.config.run.timeout_s))
        serve(rank, dist.PrefixStore(prefix, store), plan, results, runner_path, steps_path)


def serve(rank: int, rendezvous: str | dist.Store, plan: Plan, results: Queue, runner_path: str,
          steps_path: str | None = None) -> None:
    """One job as `rank`; its report or its error on `results`; the process group left."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host
    try:
        results.put((rank, "ok", run_rank(rank, plan, rendezvous, runner_path, one_host=True, steps_path=steps_path)))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        results.put((rank, "error", one_line(e)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
