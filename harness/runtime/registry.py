"""Executors by name, with what each supports: config validation reads this registry and
job.execute is a lookup. A new executor is one module (a runner, or a whole `run`) plus one
entry here, or one `register(...)` call from anywhere (tests/test_executor_registry.py).

An executor that runs processes names a runner class as "module:Class" (imported in the
worker, so heavy imports stay out of the main process): harness/runtime/loop.py builds it
on every rank and runs the shared step loop around it. One that runs no process (sim)
gives `run` instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from harness.config import Config
    from harness.runtime.launch import Execution
    from harness.plan import Plan


@dataclass(frozen=True)
class Executor:
    name: str
    summary: str  # one line, for --help-like listings and errors
    runner: str | None = None  # "module:Class" of a harness.runtime.loop.Runner; None: `run` instead
    run: Callable[["Plan", list[int]], "Execution"] | None = None  # executes a plan without worker processes
    dp: bool = False  # runs dp > 1 replicas
    split_backward: bool = True  # runs I/W schedules (zb_h1, zbv, dualpipev)
    memory: bool = False  # meters activation memory
    transport: bool = False  # sends its messages through harness/runtime/transport.py (p2p=, checked by the validator)
    faults: tuple[str, ...] = ("raise", "kill", "hang", "term")  # test-only fault kinds it honours
    devices: tuple[str, ...] = ("cpu", "cuda")
    simulated: bool = False  # its timings come from the simulator, not from clocks
    # whether a config makes it reach into torch internals (harness/compat.py guards the version)
    private_torch: Callable[["Config"], bool] = lambda c: False
    check: Callable[["Config"], str | None] | None = None  # any further constraint, as one line


def _peer_check(c: "Config") -> str | None:
    from harness.runtime.peer_check import check  # imports torch.distributed.pipelining: only when asked

    return check(c)


def _run_sim(plan: "Plan", pids: list[int]) -> "Execution":
    from harness.runtime.sim import run_sim

    return run_sim(plan)


EXECUTORS: dict[str, Executor] = {}


def register(executor: Executor) -> Executor:
    EXECUTORS[executor.name] = executor
    return executor


register(Executor("native", "real worker processes, this harness's runner, P2P over torch.distributed",
                  runner="harness.runtime.native:NativeRunner", dp=True, memory=True, transport=True,
                  faults=("raise", "kill", "hang", "noaccum", "term"), private_torch=lambda c: c.dp > 1))
register(Executor("pytorch", "the same plan through torch.distributed.pipelining's schedule classes",
                  runner="harness.runtime.peer:PeerRunner", private_torch=lambda c: True, check=_peer_check))
register(Executor("sim", "the discrete-event simulator on the modeled costs (cost.*, comm.*); no processes",
                  run=_run_sim, dp=True, faults=("term",), simulated=True))


def get_executor(name: str) -> Executor:
    return EXECUTORS[name]
