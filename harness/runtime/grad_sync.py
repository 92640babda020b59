"""Data parallelism of a rank's stages: each stage module wrapped in DDP over its pipeline
rank's data-parallel group; gradients accumulate locally and are all-reduced once, in the
stage's last backward of the step (as torch.distributed.pipelining's stage does).

The sync is traced as its own event (`dp_sync`: from the last gradient bucket's launch to
the end of the backward). With compute=emulated the backward's modeled cost is held before
the first bucket launches, so the sync never hides inside the emulated compute.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, ContextManager, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from harness import compat
from harness.runtime.emulate import Emulator
from harness.runtime.tracer import Tracer


class GradSync:
    def __init__(self, group: dist.ProcessGroup, device: torch.device, emulator: Emulator, tracer: Tracer):
        self.group, self.device, self.emulator, self.tracer = group, device, emulator, tracer
        self._hold: tuple[int, float] | None = None  # (start ns, modeled s) of the syncing backward
        self.launched: Any = None  # clock token of the last bucket's launch in that backward

    def wrap(self, module: nn.Module) -> DistributedDataParallel:
        ddp = DistributedDataParallel(module, process_group=self.group, forward_sync_buffers=False,
                                      device_ids=[self.device.index] if self.device.type == "cuda" else None)

        def timed_allreduce(state, bucket):  # DDP's default all-reduce, its launch noted
            if self._hold is not None:
                self.emulator.hold_s(*self._hold)
            self.launched = self.tracer.mark()
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(self.group, timed_allreduce)
        return ddp

    @staticmethod
    def forward_context(module: nn.Module) -> ContextManager:
        """Forwards never sync: only the backward chosen by `backward` arms the reducer."""
        return module.no_sync() if isinstance(module, DistributedDataParallel) else nullcontext()

    @contextmanager
    def backward(self, module: nn.Module, output: torch.Tensor, last: bool, start_ns: int,
                 modeled_s: float) -> Iterator[None]:
        """Around one backward of `module`: all-reduce if it is the stage's `last` of the
        step, else accumulate locally (no_sync). `launched` says when the sync began."""
        self.launched = None
        if not last:
            with module.no_sync():
                yield
            return
        compat.arm_ddp_backward(module, output)
        self._hold = (start_ns, modeled_s)
        try:
            yield
        finally:
            self._hold = None
