"""Spawn one process per rank, collect what they report, and always clean them up."""

from __future__ import annotations

import queue
import socket
import time
from dataclasses import dataclass
from typing import Callable

import torch.multiprocessing as mp

from harness.plan import Plan
from harness.runtime.worker import worker_main


class WorkerError(RuntimeError):
    """A rank failed, died or timed out; str() names the rank and the first error."""


@dataclass
class RankReport:
    rank: int
    events: list[tuple]
    losses: list[float] | None
    memory: list[tuple[int, int, int]]  # (step, ns, live activation bytes)
    peak_activation_bytes: int
    activation_bytes_per_microbatch: float
    grads: dict | None = None  # last step's accumulated gradients (verify_grads=true)
    cuda_max_memory_allocated: int | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context(preload: str = "harness.runtime.worker"):
    """forkserver: one server process imports torch and the worker once; each rank is then
    a fork of it (~tens of ms) instead of a fresh interpreter re-importing torch (~1 s
    each, 4-5 s for 4 ranks on 2 cores). The server forks before any thread pool or
    process group exists, so the children start clean. It lives as long as this process,
    so every job of a sweep (and of a test session) launches fast."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([preload])
    return ctx


def run_native(plan: Plan, target: Callable = worker_main) -> list[RankReport]:
    """Runs the plan on plan.world ranks, each `target(rank, port, plan, results)`; raises
    WorkerError on the first failure."""
    ctx = _context(target.__module__)
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=target, args=(r, port, plan, results), daemon=True)
             for r in range(plan.world)]
    reports: dict[int, RankReport] = {}
    deadline = time.monotonic() + plan.config.timeout_s
    try:
        for p in procs:
            p.start()
        while len(reports) < plan.world:
            try:
                rank, status, payload = results.get(timeout=0.2)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in reports and p.exitcode is not None:
                        # a clean exit puts its report first; drain before calling it dead
                        time.sleep(0.2)
                        if results.empty():
                            raise WorkerError(f"rank {r} died (exit code {p.exitcode})") from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(plan.world)) - set(reports))
                    raise WorkerError(f"timeout_s={plan.config.timeout_s} passed; ranks {missing} "
                                      "still running") from None
                continue
            if status != "ok":
                raise WorkerError(f"rank {rank}: {payload}")
            reports[rank] = RankReport(rank=rank, **payload)
    finally:
        for p in procs:
            p.join(timeout=5 if len(reports) == plan.world else 0.1)
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    return [reports[r] for r in range(plan.world)]
