"""Worker: one global rank (a pipeline rank of one replica). Builds its stages, runs every
step, reports back: to the launching process through a queue, or under torchrun by
returning its payload to be gathered on rank 0."""

from __future__ import annotations

import gc
import os
import traceback
from datetime import timedelta
from typing import Callable
from multiprocessing.queues import Queue

import torch
import torch._dynamo  # noqa: F401 - the first optimizer imports it (~1.5 s); the forkserver pays once
import torch.distributed as dist

from harness.plan import Plan
from harness.runtime.executor import StageRunner
from harness.runtime.faults import maybe_inject, parse_fault
from harness.runtime.groups import Layout


def join_world(rank: int, plan: Plan, init_method: str) -> torch.device:
    """One thread, this rank's device, the process group joined (unless torchrun's caller
    already did): what every executor's rank does first."""
    torch.set_num_threads(1)  # several ranks share the cores; more threads slowed matmuls 10x
    if plan.device == "cuda":
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if not dist.is_initialized():
        dist.init_process_group(plan.backend, init_method=init_method, rank=rank, world_size=plan.world,
                                timeout=timedelta(seconds=plan.config.timeout_s))
    return device


def run_rank(rank: int, plan: Plan, init_method: str) -> dict:
    """Joins the world as `rank`, builds its stages, runs every step; returns its payload.
    The caller owns the process group's teardown (torchrun gathers over it first)."""
    device = join_world(rank, plan, init_method)
    c = plan.config
    layout = Layout(c.pp, c.dp)
    _, dp_group = layout.new_groups(rank)
    runner = StageRunner(rank, plan, device, layout, dp_group)
    fault = parse_fault(c.fault)
    losses, events, memory, peaks, mb_bytes, grads = [], [], [], [], [], None
    total = c.warmup_steps + c.steps
    gc.disable()  # a collection pause inside a step is jitter; collect between steps instead
    gc.freeze()  # ...and only of what this rank made: not the heap forked from the forkserver (~0.7 s a pass)
    try:
        for step in range(total):
            gc.collect()
            maybe_inject(fault, rank, step)
            runner.drop_grads = fault is not None and fault.kind == "noaccum" and (fault.rank, fault.step) == (rank, step)
            dist.barrier()  # every rank starts the step together; not inside the window
            loss, grads = runner.run_step(step, keep_grads=c.verify_grads and step == total - 1)
            losses.append(loss)
            events += runner.take_events()
            memory += [(step, t, b) for t, b in runner.meter.samples]
            if step >= c.warmup_steps:
                peaks.append(runner.meter.peak)
                mb_bytes += runner.microbatch_bytes
    finally:
        gc.unfreeze()
        gc.enable()
    payload = {"events": events, "losses": losses if losses[0] is not None else None, "memory": memory,
               "peak_activation_bytes": max(peaks),
               # one (stage, microbatch)'s activations: with chunks, one chunk's
               "activation_bytes_per_microbatch": sum(mb_bytes) / len(mb_bytes),
               # numpy, not tensors: torch's queue pickling shares tensor memory by file
               # descriptor, which dies with this process
               "grads": None if grads is None else {k: v.numpy() for k, v in grads.items()}}
    if device.type == "cuda":
        payload["cuda_max_memory_allocated"] = torch.cuda.max_memory_allocated(device)
    return payload


def one_line(e: BaseException) -> str:
    """`Type: message (file:line)` of where it was raised, on one line."""
    where = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    at = f" ({os.path.basename(where.filename)}:{where.lineno})" if where else ""
    return f"{type(e).__name__}: {e}{at}".replace("\n", " ")


def worker_main(rank: int, port: int, plan: Plan, results: Queue,
                run: Callable[[int, Plan, str], dict] = run_rank) -> None:
    """Entry point of a forked rank: `run` it, put (rank, "ok", payload) or (rank, "error",
    line) on `results`, and leave the process group."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every rank is on this host
    try:
        results.put((rank, "ok", run(rank, plan, f"tcp://127.0.0.1:{port}")))
    except BaseException as e:  # noqa: BLE001 - every failure must reach the parent
        results.put((rank, "error", one_line(e)))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
