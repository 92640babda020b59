"""`python -m tools.between_actions BASE [OVERRIDES ...]`: the native runner's own CPU cost per
action (its bookkeeping between and around the model's ops), this checkout's against another's
(BASE: a checkout of the code before, e.g. `git worktree add /tmp/base main`), side by side in
one process, so a loaded machine slows both alike.

One rank in this process (pp=1: no process group, no P2P), three runners on the same plan, their
steps interleaved: BASE's NativeRunner (its runtime/native.py, memory.py and transport.py), this
checkout's, and a bare loop of the same stage's ops (forward, loss, backward; nothing metered,
traced or sent). Bookkeeping per action = a runner's CPU time per action minus the bare loop's;
medians (and minima) over the steps after a warm-up. OVERRIDES: Python dict literals of config
keys, one job each (default: the benchmarks' real-compute job at pp=1, M=16).
"""

from __future__ import annotations

import ast
import gc
import importlib.util
import statistics
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

import harness.runtime.native as this_native
from harness.config import Config, set_keys
from harness.planning.plan import Plan, make_plan
from harness.runtime.groups import Layout
from harness.runtime.loop import RankContext
from harness.runtime.tracer import Tracer, clock_for

CPU = torch.device("cpu")


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def base_native(base: Path) -> ModuleType:
    """BASE's native.py, with BASE's meter and transport in place of this checkout's (the rest
    of the harness, the model and the plan, is this checkout's: both runners get the same)."""
    runtime = base / "harness" / "runtime"
    memory, transport = _load("base_memory", runtime / "memory.py"), _load("base_transport", runtime / "transport.py")
    native = _load("base_native", runtime / "native.py")
    native.MemoryMeter = memory.MemoryMeter
    native.GroupTransport, native.Routes, native.Message = transport.GroupTransport, transport.Routes, transport.Message
    return native


class Bare:
    """The stage's own ops, F and B (pp=1), as the runner runs them (the same defer context,
    so SplitLinear records nn.Linear's graph), with no bookkeeping at all."""

    def __init__(self, plan: Plan):
        self.runner = this_native.NativeRunner(RankContext(0, plan, CPU, Tracer(clock_for(CPU)), Layout(1, 1)))

    def run_step(self, step: int) -> float:
        r = self.runner
        batch, held, total = r._batch(step), {}, 0.0
        for a in r.actions:
            with r.store.defer(None):
                if a.kind.value == "F":
                    x, y = batch[a.microbatch]
                    held[a.microbatch] = r.model.loss(r.modules[0](x).float(), y) / r.plan.config.microbatches
                    total = total + held[a.microbatch].detach()
                else:
                    torch.autograd.backward(held.pop(a.microbatch))
        return float(total)

    def parameters(self) -> list[torch.Tensor]:
        return self.runner.parameters()


def compare(base: ModuleType, overrides: dict[str, Any], steps: int = 30, warmup: int = 3) -> None:
    c = Config()
    c.wandb.mode, c.compute = "disabled", "real"
    c.model.layers, c.model.hidden = 8, 32  # the benchmarks' job (tests/conftest.py)
    plan = make_plan(set_keys(c, **{"pp": 1, "microbatches": 16, **overrides}))
    if plan.config.pp != 1 or any(a.kind.value not in "FB" for a in plan.schedule[0]):
        raise SystemExit(f"{overrides}: pp=1 with F and B actions only (the bare loop runs those)")
    runners = {name: module.NativeRunner(RankContext(0, plan, CPU, Tracer(clock_for(CPU)), Layout(1, 1)))
               for name, module in (("base", base), ("this", this_native))}
    runners["bare"] = Bare(plan)
    actions = len(plan.schedule[0])
    cpu: dict[str, list[float]] = {name: [] for name in runners}
    losses: dict[str, list[float]] = {name: [] for name in runners}
    gc.disable()  # as the rank loop: a collection inside a step is jitter
    try:
        for step in range(steps):
            order = list(runners) if step % 2 else list(reversed(runners))  # drift hits each alike
            for name in order:
                gc.collect(1)
                t0 = time.process_time()
                losses[name].append(runners[name].run_step(step))
                cpu[name].append((time.process_time() - t0) / actions * 1e6)
                if name != "bare":
                    runners[name].tracer.take()
                for p in runners[name].parameters():  # as the optimizer's zero_grad
                    p.grad = None
    finally:
        gc.enable()
    med = {name: statistics.median(v[warmup:]) for name, v in cpu.items()}
    low = {name: min(v[warmup:]) for name, v in cpu.items()}
    print(f"{overrides or 'default'}: CPU us per action, median (min) of {steps - warmup} steps; "
          f"losses equal: {losses['base'] == losses['this'] == losses['bare']}")
    for name in runners:
        print(f"  {name:5s} {med[name]:7.1f} ({low[name]:.1f})")
    book = {name: (med[name] - med["bare"], low[name] - low["bare"]) for name in ("base", "this")}
    for name, (m, n) in book.items():
        print(f"  bookkeeping {name}: {m:.1f} ({n:.1f})")
    print(f"  bookkeeping this / base: {book['this'][0] / book['base'][0]:.3f} "
          f"({book['this'][1] / book['base'][1]:.3f})")


def main(argv: list[str]) -> None:
    if not argv or not (Path(argv[0]) / "harness" / "runtime" / "native.py").is_file():
        raise SystemExit(__doc__)
    torch.set_num_threads(1)
    base = base_native(Path(argv[0]))
    for text in argv[1:] or ["{}"]:
        compare(base, ast.literal_eval(text))


if __name__ == "__main__":
    main(sys.argv[1:])
