"""Executors by name, with what each supports: validation (harness/planning/checks.py) reads this
registry and job.execute is a lookup. A new executor is one module (a runner, or a whole `run`)
plus one entry here, or one `register(...)` call from anywhere (tests/test_executor_registry.py).

Entry points are named "module:attr" and imported when first used, as Hydra's `_target_`: an
executor that runs processes names a runner class (imported in the worker, so heavy imports
stay out of the main process; harness/runtime/loop.py builds it on every rank and runs the
shared step loop around it); one that runs no process (sim) names a `run(plan, pids) ->
Execution`; `check` names a function `(Config) -> str | None` for any further constraint. So
this registry, which validation and planning read, imports none of them.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Executor:
    name: str
    summary: str  # one line, for --help-like listings and errors
    runner: str | None = None  # "module:Class" of a harness.runtime.loop.Runner; None: `run` instead
    run: str | None = None  # "module:function" executing a plan without worker processes: (plan, pids) -> Execution
    dp: bool = False  # runs dp > 1 replicas
    split_backward: bool = True  # runs I/W schedules (zb_h1, zbv, dualpipev)
    memory: bool = False  # meters activation memory
    transport: bool = False  # sends its messages through harness/runtime/transport.py (p2p=, checked by the validator)
    faults: tuple[str, ...] = ("raise", "kill", "hang", "term")  # test-only fault kinds it honours
    devices: tuple[str, ...] = ("cpu", "cuda")
    simulated: bool = False  # its timings come from the simulator, not from clocks
    # whether a config makes it reach into torch internals (harness/runtime/compat.py guards the version)
    private_torch: Callable[[Any], bool] = lambda c: False
    check: str | None = None  # "module:function": any further constraint on a Config, as one line or None
    tp: bool = False  # runs tp > 1 (tensor parallelism inside each stage, harness/parallel)
    no_tp: str | None = None  # why not, for its one-line refusal


def entry_point(path: str) -> Any:
    """"module:attr" -> the attribute, imported now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


EXECUTORS: dict[str, Executor] = {}


def register(executor: Executor) -> Executor:
    EXECUTORS[executor.name] = executor
    return executor


register(Executor("native", "real worker processes, this harness's runner, P2P over torch.distributed",
                  runner="harness.runtime.native:NativeRunner", dp=True, memory=True, transport=True,
                  faults=("raise", "kill", "hang", "noaccum", "term", "enospc"), tp=True,
                  private_torch=lambda c: c.dp > 1 or c.tp > 1))
register(Executor("pytorch", "the same plan through torch.distributed.pipelining's schedule classes",
                  runner="harness.runtime.peer:PeerRunner", private_torch=lambda c: True,
                  check="harness.runtime.peer_check:check", tp=True))  # imports torch.distributed.pipelining: only when asked
register(Executor("sim", "the discrete-event simulator on the modeled costs (cost.*, comm.* or cluster=); no processes",
                  run="harness.runtime.sim:run_sim", dp=True, faults=("term", "enospc"), simulated=True, tp=True))


def get_executor(name: str) -> Executor:
    return EXECUTORS[name]
