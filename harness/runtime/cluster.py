"""Sweeps through submitit (hydra/launcher=submitit_local, slurm, submitit_slurm): harness's
launchers, registered as hydra_plugins.harness_launcher.

What they change from hydra-submitit-launcher's:

- **One job at a time per machine.** submitit_local runs at most `array_parallelism` jobs at once
  (1 by default: concurrent jobs share this machine's cores and distort every timing; more says
  so loudly). On SLURM each point is its own allocation on `exclusive` nodes.
- **Each point sized to its pp x dp** (`ranks_as_tasks=true`, SLURM's default): one task per
  rank, at most `gpus_per_node` per node, nodes = ceil(pp*dp / gpus_per_node), the ranks spread
  evenly; a GPU per task where there are GPUs. Hydra's launcher sets resources per sweep; this
  one sets them per job (`job_parameters`) before submitting it. With `ranks_as_tasks=false` a
  job is one task on one node and harness forks the ranks itself (the one-machine default).
- **Ranks join through submitit's job environment** (`rank_env`): every task of a job runs the
  same Hydra job; before it runs, MASTER_ADDR (rank 0's host), MASTER_PORT (from the job id),
  RANK, WORLD_SIZE, LOCAL_RANK and LOCAL_WORLD_SIZE are set from submitit.JobEnvironment, so the
  job takes the path torchrun's ranks take (harness.runtime.launch.external_rank: env://, every
  rank's report gathered on rank 0, which alone records). Other ranks run in a scratch
  directory, removed afterwards: nothing of theirs lands in the sweep.
- **Progress reaches the console**: jobs run in other processes whose output goes to submitit's
  log files (<sweep dir>/.submitit/<job id>/), so the launching side tells the Progress callback
  (harness/frontend/callbacks.py) of each job it starts and of each that comes back, with the headline of
  its result.json; every job also appends its headline to <sweep dir>/sweep.log.
- Each job's config is composed here, on the launching side, and sent whole: the worker gets no
  config loader to pickle (harness's composer holds every checked point).

Imported by Hydra's plugin scan at every start: nothing heavy (submitit, torch) at the top.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
import zlib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Optional, Sequence

from hydra.core.config_store import ConfigStore
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides, run_job, setup_globals
from hydra.types import HydraContext, TaskFunction
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf, LocalQueueConf, SlurmQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import BaseSubmititLauncher
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from harness.records.scratch import Scratch

LAUNCHER_ENV = "HARNESS_LAUNCHER"  # who made this rank, for messages (harness.runtime.launch.external_launcher)
# keys of harness's launcher configs that are no submitit parameter
_HARNESS_KEYS = {"array_parallelism", "ranks_as_tasks", "submitit_folder", "max_num_timeout"}


@dataclass
class LocalConf(LocalQueueConf):
    """hydra/launcher=submitit_local, harness's (replaces the plugin's: `register_configs`)."""
    _target_: str = "hydra_plugins.harness_launcher.HarnessLocalLauncher"
    # jobs running at once on this machine; more than 1 shares its cores between jobs (said loudly)
    array_parallelism: int = 1
    # true: each point is pp x dp submitit tasks, one per rank, joined through submitit's environment
    # as on SLURM; false: one task (tasks_per_node), in which harness forks the ranks itself
    ranks_as_tasks: bool = False


@dataclass
class SlurmConf(SlurmQueueConf):
    """hydra/launcher=submitit_slurm, harness's (replaces the plugin's); hydra/launcher=slurm
    (harness/conf/hydra/launcher/slurm.yaml) is it with a cluster's usual values."""
    _target_: str = "hydra_plugins.harness_launcher.HarnessSlurmLauncher"
    gpus_per_node: Optional[int] = 8  # GPUs one node has: the most ranks a point puts on one node
    ranks_as_tasks: bool = True  # one SLURM task per rank, the point's nodes sized to its pp x dp
    exclusive: bool = True  # whole nodes: no other job on their cores and GPUs
    array_parallelism: int = 256  # points submitted (queued or running) at once; each is its own job


def register_configs() -> None:
    """harness's launcher configs under the plugin's names (hydra/launcher=submitit_local,
    submitit_slurm). Called after Hydra's plugin scan (hydra_plugins.harness_launcher's search
    path plugin): the scan executes the plugin's config module again, which registers its own."""
    cs = ConfigStore.instance()
    cs.store(group="hydra/launcher", name="submitit_local", node=LocalConf, provider="harness")
    cs.store(group="hydra/launcher", name="submitit_slurm", node=SlurmConf, provider="harness")


@dataclass(frozen=True)
class Resources:
    """What one point asks of the executor."""
    nodes: int
    tasks_per_node: int
    gpus_per_node: int  # 0: none asked

    def describe(self) -> str:
        """`2 nodes x 8 tasks, 8 GPUs each`."""
        def n(count: int, what: str) -> str:
            return f"{count} {what}{'s' if count != 1 else ''}"

        gpus = f", {n(self.gpus_per_node, 'GPU')} each" if self.gpus_per_node else ""
        return f"{n(self.nodes, 'node')} x {n(self.tasks_per_node, 'task')}{gpus}"


def spread(world: int, per_node: int) -> tuple[int, int]:
    """(nodes, tasks per node) for `world` ranks on nodes of at most `per_node`:
    nodes = ceil(world / per_node), the ranks evenly over them; ValueError if they cannot be."""
    if per_node < 1:
        raise ValueError(f"{per_node} ranks per node")
    nodes = math.ceil(world / per_node)
    tasks = math.ceil(world / nodes)
    if nodes * tasks != world:
        raise ValueError(f"pp x dp = {world} ranks do not spread evenly over {nodes} nodes of at most {per_node} "
                         f"(choose pp x dp <= {per_node} or a multiple of {nodes})")
    return nodes, tasks


def master_port(job_id: str) -> int:
    """A port from the job id, the same on every task of the job (10000..29999: below Linux's
    ephemeral range, so no outgoing connection holds it)."""
    return 10000 + zlib.crc32(job_id.encode()) % 20000


def rank_env(global_rank: int, local_rank: int, num_tasks: int, num_nodes: int, hostnames: Sequence[str],
             job_id: str) -> dict[str, str]:
    """The env:// variables (torchrun's) for one task of a submitit job: rank 0's host as
    MASTER_ADDR (loopback when the job has one node), a port from the job id."""
    return {"MASTER_ADDR": hostnames[0] if num_nodes > 1 else "127.0.0.1",
            "MASTER_PORT": str(master_port(job_id)),
            "RANK": str(global_rank), "WORLD_SIZE": str(num_tasks),
            "LOCAL_RANK": str(local_rank), "LOCAL_WORLD_SIZE": str(num_tasks // max(num_nodes, 1)),
            "GROUP_RANK": str(global_rank // max(num_tasks // max(num_nodes, 1), 1)),
            LAUNCHER_ENV: "submitit"}


def world_cuda_devices(local: int, environ: Mapping[str, str] = os.environ) -> int:
    """The GPUs a job's ranks have, from this node's count: under an external launcher spanning
    nodes (WORLD_SIZE > LOCAL_WORLD_SIZE: torchrun --nnodes, a SLURM point on several nodes)
    every node has as many as this one, so local x nodes when each node has a GPU per rank of
    its own; else `local`. What a rank should plan with (make_plan's cuda_devices): one node's
    count alone is fewer GPUs than ranks, which plans gloo through host memory instead of NCCL."""
    try:
        world, per_node = int(environ["WORLD_SIZE"]), int(environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return local
    if per_node < 1 or world <= per_node or local < per_node:
        return local
    return local * math.ceil(world / per_node)


def _tp(cfg: DictConfig) -> int:
    """A point's tp (1 where its config has none)."""
    return int(OmegaConf.select(cfg, "tp", default=1) or 1)


def point_resources(cfg: DictConfig) -> Resources | None:
    """For planning a sweep point on the launching side (harness/frontend/sweeper.py): what its SLURM
    allocation gives it (nodes, tasks and GPUs per node) under hydra/launcher=slurm or
    submitit_slurm, or None where its jobs run on this machine. A login node without GPUs then
    plans device=cuda points as they will run."""
    if OmegaConf.select(cfg, "hydra.launcher._target_", default=None) != SlurmConf._target_:
        return None
    params = OmegaConf.to_container(cfg.hydra.launcher, resolve=False)
    params.pop("_target_", None)
    try:
        return SlurmLauncher(**params).resources(int(cfg.pp), int(cfg.dp), str(cfg.device), _tp(cfg))
    except ValueError:
        return None  # cannot be placed: the launcher says so before submitting anything


def job_dir(cfg: DictConfig) -> Path:
    """A sweep job's output directory, as Hydra's run_job makes it."""
    return Path(str(cfg.hydra.sweep.dir)) / str(OmegaConf.select(cfg, "hydra.sweep.subdir"))


class SubmititJob:
    """What each task of one submitit job runs: the Hydra job of one sweep point, its config
    composed on the launching side. With several tasks each is one rank (`rank_env`); rank 0
    writes into the job's directory, the others into a scratch directory removed after."""

    def __init__(self, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig,
                 singleton_state: dict) -> None:
        self.hydra_context, self.task_function = hydra_context, task_function
        self.config, self.singleton_state = config, singleton_state

    def __call__(self) -> JobReturn:
        import submitit

        Singleton.set_state(self.singleton_state)
        setup_globals()
        env = submitit.JobEnvironment()
        cfg = self.config
        with open_dict(cfg.hydra.job):
            cfg.hydra.job.id = env.job_id
        scratch = None
        if env.num_tasks > 1:
            os.environ.update(rank_env(env.global_rank, env.local_rank, env.num_tasks, env.num_nodes,
                                       env.hostnames, env.job_id))
            if env.global_rank != 0:  # as under torchrun (harness.frontend.cli.torchrun_overrides): no records, no logs
                scratch = Scratch(prefix=f"harness-{env.job_id}-rank{env.global_rank}-")
                with read_write(cfg.hydra), open_dict(cfg.hydra):
                    cfg.hydra.sweep.dir = str(scratch.path)
                    cfg.hydra.output_subdir = None
        try:
            return run_job(hydra_context=self.hydra_context, task_function=self.task_function, config=cfg,
                           job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")
        finally:
            if scratch is not None:
                scratch.remove()  # the directory made above, by its identity


@dataclass
class _Point:
    num: int
    overrides: list[str]
    config: DictConfig
    resources: Resources
    started: float = 0.0


class Launcher(BaseSubmititLauncher):
    """Hydra's submitit launcher with per-point resources, a cap on jobs at once, ranks as
    tasks and progress on the launching side (the module's doc)."""

    poll_s = 1.0  # how often running jobs are checked

    def executor_keys(self) -> dict[str, Any]:
        """The sweep-wide submitit parameters (AutoExecutor's names), harness's own keys left out."""
        base = set(OmegaConf.structured(BaseQueueConf).keys())
        return {k if k in base else f"{self._EXECUTOR}_{k}": v for k, v in self.params.items()
                if k not in _HARNESS_KEYS}

    def make_executor(self, folder: str | Path | None = None) -> Any:
        import submitit

        init = {"folder": str(folder or self.params["submitit_folder"])}
        if "max_num_timeout" in self.params:
            init[f"{self._EXECUTOR}_max_num_timeout"] = self.params["max_num_timeout"]
        executor = submitit.AutoExecutor(cluster=self._EXECUTOR, **init)
        executor.update_parameters(**self.executor_keys())
        return executor

    def node_gpus(self, device: str) -> int:
        """GPUs a node offers this point's ranks (0: none asked)."""
        raise NotImplementedError

    def resources(self, pp: int, dp: int, device: str, tp: int = 1) -> Resources:
        """What a point of pp x dp x tp ranks asks for. ValueError (one line) if it cannot be
        placed, or if a TP group (tp consecutive ranks) would span two nodes."""
        world = pp * dp * tp
        gpus = self.node_gpus(device)
        if not self.params.get("ranks_as_tasks"):  # one task (or the user's), harness forks the ranks
            return Resources(1, int(self.params.get("tasks_per_node") or 1), min(gpus, world) if gpus else 0)
        nodes, tasks = spread(world, self.ranks_per_node(gpus))
        if tasks % tp:
            raise ValueError(f"tp={tp}: {tasks} ranks per node would split a TP group across nodes (allowed: tp "
                             f"dividing the ranks per node; TP's collectives want one node's links)")
        return Resources(nodes, tasks, tasks if gpus else 0)

    def ranks_per_node(self, gpus: int) -> int:
        raise NotImplementedError

    def job_parameters(self, cfg: DictConfig) -> dict[str, Any]:
        """The submitit parameters of one point (AutoExecutor's names), from its pp x dp."""
        r = self.resources(int(cfg.pp), int(cfg.dp), str(cfg.device), _tp(cfg))
        out: dict[str, Any] = {"nodes": r.nodes, "tasks_per_node": r.tasks_per_node}
        if r.gpus_per_node:
            out["gpus_per_node"] = r.gpus_per_node
        return out

    def warn(self) -> None:
        """Say what makes concurrent jobs share cores."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        if "mode" in self.config.hydra.sweep:
            os.chmod(sweep_dir, mode=int(str(self.config.hydra.sweep.mode), 8))
        points, bad = [], []
        for i, overrides in enumerate(job_overrides):
            num = initial_job_idx + i
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.num = num
            try:
                res = self.resources(int(cfg.pp), int(cfg.dp), str(cfg.device), _tp(cfg))
            except ValueError as e:
                bad.append(f"[{' '.join(filter_overrides(overrides)) or 'defaults'}] {e}")
                continue
            points.append(_Point(num, list(overrides), cfg, res))
        if bad:  # before any job is submitted
            from harness.config import ConfigError

            raise ConfigError(f"{len(bad)} sweep point(s) cannot be placed on hydra.launcher.gpus_per_node="
                              f"{self.params.get('gpus_per_node')}: " + "; ".join(bad))
        self.warn()
        progress = _progress(self.hydra_context)
        # a lightweight context for the jobs: callbacks and the plain config loader (not a composer
        # holding every checked point; harness's is not picklable either)
        loader = getattr(self.hydra_context.config_loader, "_loader", self.hydra_context.config_loader)
        context = HydraContext(config_loader=loader, callbacks=self.hydra_context.callbacks)
        limit = max(1, int(self.params.get("array_parallelism") or 1))
        waiting, running, returns = deque(points), {}, {}
        with _sigterm_as_interrupt():
            try:
                while waiting or running:
                    while waiting and len(running) < limit:
                        p = waiting.popleft()
                        executor = self.make_executor()  # fresh: nothing of the previous point's size stays
                        executor.update_parameters(**self.job_parameters(p.config))
                        job = executor.submit(SubmititJob(context, self.task_function, p.config,
                                                          Singleton.get_state()))
                        p.started = time.monotonic()
                        running[p.num] = (p, job)
                        where = f"{self._EXECUTOR} job {job.job_id}: {p.resources.describe()}"
                        progress.job_submitted(p.num, _shown(p.overrides), where)
                    finished = [n for n, (_, job) in running.items() if job.done()]
                    if not finished:
                        time.sleep(self.poll_s)
                    for n in finished:
                        p, job = running.pop(n)
                        returns[n] = self.collect(p, job, progress)
            except BaseException:
                for _, job in running.values():  # Ctrl-C, SIGTERM: no job left behind
                    try:
                        job.cancel(check=False)  # local: SIGINT to its controller, which ends its tasks
                    except Exception:  # noqa: BLE001 - best effort; the scheduler's own time limit remains
                        pass
                raise
        return [returns[p.num] for p in points]

    def collect(self, p: _Point, job: Any, progress: Any) -> JobReturn:
        """Rank 0's JobReturn of a finished job; a job that died (its process killed, the
        allocation ended) is said with its log and returned as completed without a value: the
        sweep goes on, and its summary lists the job as having no record."""
        out = job_dir(p.config)
        try:
            ret = job.results()[0]
            out = Path(str(ret.hydra_cfg.hydra.runtime.output_dir))
            problem = None
        except Exception as e:  # noqa: BLE001 - submitit's UncompletedJobError / FailedJobError
            import submitit

            if isinstance(e, submitit.core.utils.FailedJobError):  # raised in the job: its last line
                lines = [line.strip() for line in str(e).splitlines() if line.strip()]
                why = lines[-1] if lines else type(e).__name__
            else:  # killed, out of memory, out of time: no result
                why = f"no result, state {job.state}"
            problem = f"{self._EXECUTOR} job {job.job_id} ended: {why}; its log: {job.paths.stderr}"
            ret = JobReturn(overrides=p.overrides, status=JobStatus.COMPLETED, _return_value=None)
            ret.cfg, ret.hydra_cfg, ret.working_dir = p.config, p.config, str(out)
        progress.job_returned(p.num, _shown(p.overrides), out, time.monotonic() - p.started, problem)
        return ret


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's kill, `kill PID`) ends the launching side like Ctrl-C: its
    running jobs are cancelled, not orphaned."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class LocalLauncher(Launcher):
    """hydra/launcher=submitit_local: jobs on this machine, one at a time by default."""

    _EXECUTOR = "local"
    poll_s = 0.2

    def executor_keys(self) -> dict[str, Any]:
        keys = super().executor_keys()
        keys.pop("local_array_parallelism", None)
        return keys

    def node_gpus(self, device: str) -> int:
        if device == "cpu" or self.params.get("gpus_per_node") == 0:
            return 0
        if self.params.get("gpus_per_node"):
            return int(self.params["gpus_per_node"])
        import torch  # every GPU here (submitit's local executor shows a job only those it is given)

        return torch.cuda.device_count() if torch.cuda.is_available() else 0

    def ranks_per_node(self, gpus: int) -> int:
        return 1 << 30  # one machine: every rank on it

    def resources(self, pp: int, dp: int, device: str) -> Resources:
        r = super().resources(pp, dp, device)
        gpus = self.node_gpus(device)
        return Resources(r.nodes, r.tasks_per_node, gpus)  # a local job sees every GPU it may use

    def warn(self) -> None:
        n = int(self.params.get("array_parallelism") or 1)
        if n > 1:
            print(f"harness: warning: hydra.launcher.array_parallelism={n}: up to {n} jobs run at once on this "
                  "machine and share its cores; their timings distort each other (1 runs one at a time)",
                  file=sys.stderr, flush=True)


class SlurmLauncher(Launcher):
    """hydra/launcher=slurm: each point its own SLURM job on exclusive nodes, sized to its pp x dp."""

    _EXECUTOR = "slurm"
    poll_s = 2.0

    def executor_keys(self) -> dict[str, Any]:
        keys = super().executor_keys()
        keys.pop("slurm_array_parallelism", None)  # each point is its own job, no array
        for k in ("nodes", "tasks_per_node", "gpus_per_node"):  # per point (job_parameters)
            keys.pop(k, None)
        return keys

    def node_gpus(self, device: str) -> int:
        return 0 if device == "cpu" else int(self.params.get("gpus_per_node") or 0)

    def ranks_per_node(self, gpus: int) -> int:
        return int(self.params.get("gpus_per_node") or 1)  # a rank per GPU (device=cpu too: the same packing)

    def warn(self) -> None:
        if not self.params.get("exclusive"):
            print("harness: warning: hydra.launcher.exclusive=false: other jobs may share these nodes' cores and "
                  "GPUs, and distort the timings", file=sys.stderr, flush=True)


def _shown(overrides: Sequence[str]) -> str:
    return " ".join(filter_overrides(overrides)) or "defaults"


class _Quiet:
    def job_submitted(self, *args: Any) -> None:
        pass

    def job_returned(self, *args: Any) -> None:
        pass


def _progress(context: HydraContext) -> Any:
    """The sweep's Progress callback (harness/frontend/callbacks.py), or one that says nothing."""
    for cb in getattr(context.callbacks, "callbacks", []):
        if hasattr(cb, "job_submitted") and hasattr(cb, "job_returned"):
            return cb
    return _Quiet()

