"""Run a plan's ranks as processes (forked here, or made by torchrun or submitit), collect their
RankReports, always clean them up, and put their events on one timeline: an Execution."""

from __future__ import annotations

import os
import queue
import signal
import socket
import time
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

import torch.distributed as dist
import torch.multiprocessing as mp

from harness.config import ConfigError
from harness.planning.plan import Plan
from harness.runtime.faults import maybe_interrupt, parse_fault
from harness.runtime.groups import Layout
from harness.runtime.progress import Steps, stopped
from harness.measure.execution import RankReport
from harness.runtime.loop import one_line, pooled_worker_main, run_rank, worker_main


class WorkerError(RuntimeError):
    """A rank failed, died or timed out; str() names the rank and the first error."""


def _death(rank: int, exitcode: int) -> str:
    how = f"killed by {signal.Signals(-exitcode).name}" if exitcode < 0 else f"exit code {exitcode}"
    return f"rank {rank} died ({how})"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def context(method: str, preload: list[str]):
    """forkserver: one server process imports torch and the worker once; each rank is then
    a fork of it (~tens of ms) instead of a fresh interpreter re-importing torch (~1 s
    each, 4-5 s for 4 ranks on 2 cores). The server forks before any thread pool or
    process group exists, so the children start clean. It lives as long as this process,
    so every job of a sweep (and of a test session) launches fast."""
    if method == "spawn":  # a fresh interpreter per rank: the slow baseline the benchmark compares with
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(preload)
    return ctx


def preloads(runner: str, model: tuple[str, ...] = ()) -> list[str]:
    """What every rank imports, imported once in the forkserver (a model may bring
    transformers). The server takes the list of whoever starts it first: tests that fork
    their own ranks start it with this one, so that the harness's later jobs find it warm."""
    return ["harness.runtime.forkserver_guard", "harness.runtime.loop", runner.partition(":")[0], "harness.runtime.warm",
            *model]


class RankPool:
    """A sweep's rank processes, kept from one job to the next: while its jobs run on CPU with
    the same number of ranks, runner and preloads, a job forks no process, and none exits, and
    torch's first calls in each rank were paid by an earlier job (together ~0.1 s of a small
    job's ~0.3 s on 2 cores; tests/bench/test_bench_sweep.py). Each job still makes its own
    process group, builds its own model and leaves the group at its end.

    A job that fails in any way (a rank's error, death or timeout, Ctrl-C, SIGTERM) ends the
    pool's processes as an unpooled job ends its own; the next job starts fresh ones. `close`
    (the sweep's end) ends them all. CUDA jobs and run.start_method=spawn are not pooled: a rank
    keeps its CUDA context and caching allocator, which a next job's memory figures would see."""

    def __init__(self) -> None:
        self._key: tuple | None = None
        self.procs: list = []
        self.inboxes: list = []
        self.results: Any = None
        self.store: dist.TCPStore | None = None  # the ranks' rendezvous, one key prefix per job
        self.jobs = 0

    @staticmethod
    def serves(plan: Plan) -> bool:
        return plan.device == "cpu" and plan.config.run.start_method == "forkserver"

    def ranks(self, ctx: Any, world: int, key: tuple) -> None:
        """Ready for a job of `world` ranks: the running processes if they match `key` and
        all live, else new (unstarted) ones."""
        if key == self._key and all(p.exitcode is None for p in self.procs):
            return
        self.close()
        self.store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
        self.results = ctx.Queue()
        self.inboxes = [ctx.SimpleQueue() for _ in range(world)]
        self.procs = [ctx.Process(target=pooled_worker_main, args=(r, self.inboxes[r], self.results), daemon=True)
                      for r in range(world)]
        self._key = key

    def discard(self) -> None:
        """A job failed: its ranks' state is unknown; end them now."""
        _end(self.procs, graceful=False)
        self._forget()

    def close(self) -> None:
        """Every process asked to stop, then joined (terminated if it does not)."""
        for p, inbox in zip(self.procs, self.inboxes):
            if p.pid is not None and p.exitcode is None:
                inbox.put(None)
        _end(self.procs, graceful=True)
        self._forget()

    def _forget(self) -> None:
        if self.results is not None:
            self.results.close()
        self._key, self.procs, self.inboxes, self.results, self.store = None, [], [], None, None

    def send(self, rank: int, plan: Plan, runner: str, steps_path: str | None = None) -> None:
        if rank == 0:
            self.jobs += 1
        self.inboxes[rank].put((self.store.port, f"job{self.jobs}/", plan, runner, steps_path))


_SHARED: ContextVar[RankPool | None] = ContextVar("harness_rank_pool", default=None)


@contextmanager
def sharing(pool: RankPool | None) -> Iterator[None]:
    """Jobs run in this context share `pool`'s rank processes (a sweep's, harness/frontend/sweeper.py);
    its processes end when the context does."""
    token = _SHARED.set(pool)
    try:
        yield
    finally:
        _SHARED.reset(token)
        if pool is not None:
            pool.close()


def shared_pool() -> RankPool | None:
    """The pool a job here may run on (None outside a sweep's `sharing`)."""
    return _SHARED.get()


def run_processes(plan: Plan, runner: str, pids: list[int] | None = None,
                  started: Callable[[list[int]], None] | None = None,
                  later: ExitStack | None = None, pool: RankPool | None = None) -> list[RankReport]:
    """Runs the plan on plan.world forked ranks, each the rank loop around `runner`
    ("module:Class"); raises WorkerError on the first failure. Every rank is gone when it
    returns or raises, Ctrl-C and SIGTERM included, or, when every rank reported and `later`
    is given, when `later` closes (the caller measures while they leave the process group and
    exit, ~50 ms). Their pids are appended to `pids`, and `started(pids)` is told once all
    have started. With a `pool` that serves the plan, its processes run the job and stay for
    the next (RankPool)."""

    preload = preloads(runner, getattr(plan.model.model, "preload", ()))
    ctx = context(plan.config.run.start_method, preload)
    fault = parse_fault(plan.config.run.fault)
    pooled = pool is not None and pool.serves(plan)
    steps = Steps(plan.world)  # each rank's started steps: the watchdog names the one that stopped
    if pooled:
        pool.ranks(ctx, plan.world, (plan.world, runner, tuple(preload)))
        procs, results = pool.procs, pool.results
    else:
        results, port = ctx.Queue(), free_port()
        procs = [ctx.Process(target=worker_main, args=(r, port, plan, results, runner, steps.path), daemon=True)
                 for r in range(plan.world)]
    reports: dict[int, RankReport] = {}
    deadline = time.monotonic() + plan.config.run.timeout_s
    try:
        for r, p in enumerate(procs):
            if p.pid is None:  # a pool's process may be running from an earlier job
                p.start()
            if pooled:
                pool.send(r, plan, runner, steps.path)
            if pids is not None:
                pids.append(p.pid)
            maybe_interrupt(fault, "launch")
        if started is not None:
            started([p.pid for p in procs])
        while len(reports) < plan.world:
            try:
                rank, status, payload = results.get(timeout=0.2)
            except queue.Empty:
                for r, p in enumerate(procs):
                    if r not in reports and p.exitcode is not None:
                        # a clean exit puts its report first; drain before calling it dead
                        time.sleep(0.2)
                        if results.empty():
                            raise WorkerError(_death(r, p.exitcode)) from None
                if time.monotonic() > deadline:
                    missing = sorted(set(range(plan.world)) - set(reports))
                    raise WorkerError(f"run.timeout_s={plan.config.run.timeout_s} passed; "
                                      f"{stopped(steps.read(), missing)}") from None
                continue
            if status != "ok":
                # a peer's death shows first as a broken connection here: name the dead rank
                time.sleep(0.3)
                dead = [(r, p.exitcode) for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                cause = "; ".join(_death(r, code) for r, code in dead if r != rank)
                raise WorkerError(f"{cause}; then rank {rank}: {payload}" if cause else f"rank {rank}: {payload}")
            reports[rank] = payload
    finally:
        steps.close()  # the ranks that still run hold it open: their marks go nowhere once it is gone
        if pooled:
            if len(reports) < plan.world:
                pool.discard()
        elif later is not None and len(reports) == plan.world:
            later.callback(results.close)
            later.callback(_end, procs, True)  # first: callbacks run last-in first-out
        else:
            _end(procs, graceful=len(reports) == plan.world)
            results.close()
    return [reports[r] for r in range(plan.world)]


def _end(procs: list, graceful: bool) -> None:
    """Join, terminate, then kill every started process. Ctrl-C and SIGTERM wait until this
    is done (held, then delivered): a second Ctrl-C must not leave workers behind."""
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        live = [p for p in procs if p.pid is not None]  # a start Ctrl-C interrupted never ran
        for p in live:
            p.join(timeout=5 if graceful else 0.1)
        for p in live:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
            if p.is_alive():
                p.kill()
                p.join()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


def external_rank() -> tuple[int, int] | None:
    """(rank, world size) when a launcher outside harness made this process one rank of the
    job, else None: torchrun (or anything setting env://'s RANK, WORLD_SIZE and MASTER_ADDR), or
    a task of a multi-task submitit job (SLURM, or submitit's local executor), for which
    harness.runtime.cluster sets the same variables from submitit's job environment before
    the job runs."""
    if "TORCHELASTIC_RUN_ID" in os.environ or {"RANK", "WORLD_SIZE", "MASTER_ADDR"} <= set(os.environ):
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return None


def external_launcher() -> str:
    """Who made this rank, for messages: torchrun, submitit, or "the launcher"."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return "torchrun"
    return os.environ.get("HARNESS_LAUNCHER", "the launcher")  # harness.runtime.cluster.LAUNCHER_ENV


def run_external(plan: Plan, runner: str) -> list[RankReport] | None:
    """This process is one of the ranks an external launcher made (`external_rank`): run it,
    gather every rank's report on rank 0 over the process group. Rank 0 gets the reports, the
    others None."""
    rank, world = external_rank()
    if world != plan.world:
        who = external_launcher()
        c = plan.config
        what = "pp x dp x tp" if c.tp > 1 else "pp x dp"
        how = {"torchrun": f"launch {what} processes, e.g. --nproc-per-node {plan.world}",
               "submitit": f"hydra.launcher.ranks_as_tasks=true gives each point its {what} tasks"}
        raise ConfigError(f"WORLD_SIZE={world} from {who}, but pp={c.pp} x dp={c.dp}"
                          + (f" x tp={c.tp}" if c.tp > 1 else "")
                          + f" = {plan.world} ({how.get(who, f'launch {what} processes')})")
    rank = Layout(plan.config.pp, plan.config.dp, plan.config.tp).rank_of_slot(rank, plan.config.placement)  # a slot
    try:
        try:
            payload: RankReport | str = run_rank(rank, plan, "env://", runner)
        except Exception as e:  # noqa: BLE001 - reported through rank 0
            payload = one_line(e)
        gathered = [None] * world if rank == 0 else None
        dist.gather_object(payload, gathered, dst=0)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank != 0:
        return None
    for r, p in enumerate(gathered):
        if isinstance(p, str):
            raise WorkerError(f"rank {r}: {p}")
    return gathered


torchrun_rank, run_torchrun = external_rank, run_external  # their names before SLURM/submitit ranks
