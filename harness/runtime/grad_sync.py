"""Data parallelism of a rank's stages: gradients accumulate locally over the step's
microbatches and are averaged over the stage's data-parallel group once, when the stage's last
gradient is in:
- a stage without W (its backwards are whole B's): wrapped in DDP, which all-reduces inside the
  stage's last backward of the step (as torch.distributed.pipelining's stage does);
- a stage with W (zero-bubble schedules: the weight gradients come after the backward, where
  DDP's hooks never see them): `all_reduce` after its last B or W, the gradients in buckets of
  DDP's default size, all launched at once and then waited for.

The sync is traced as its own event (`dp_sync`: from the last gradient bucket's launch to the
end of the backward, or the explicit all-reduce). With compute=emulated the action's modeled
cost is held before the first bucket launches, so the sync never hides inside the emulated
compute.
"""

from __future__ import annotations

from contextlib import contextmanager, nullcontext
from typing import Any, Callable, ContextManager, Iterator

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from harness.parallel.tensor import local
from harness.runtime import compat
from harness.runtime.emulate import Emulator
from harness.runtime.tracer import Tracer


BUCKET_BYTES = 25 * 2**20  # DDP's bucket_cap_mb default


def buckets(grads: list[torch.Tensor], cap: int = BUCKET_BYTES) -> list[list[torch.Tensor]]:
    """Consecutive gradients of one dtype and device, each bucket up to `cap` bytes (a larger
    gradient alone)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        nbytes = g.numel() * g.element_size()
        if not out or size + nbytes > cap or (g.dtype, g.device) != (out[-1][0].dtype, out[-1][0].device):
            out.append([])
            size = 0
        out[-1].append(g)
        size += nbytes
    return out


class GradSync:
    def __init__(self, group: dist.ProcessGroup, device: torch.device, emulator: Emulator, tracer: Tracer):
        self.group, self.device, self.emulator, self.tracer = group, device, emulator, tracer
        # (start ns, modeled s, its TP collectives' host ns so far) of the syncing backward
        self._hold: tuple[int, float, Callable[[], int]] | None = None
        self.launched: Any = None  # clock token of the last bucket's launch in that backward

    def wrap(self, module: nn.Module) -> DistributedDataParallel:
        ddp = DistributedDataParallel(module, process_group=self.group, forward_sync_buffers=False,
                                      device_ids=[self.device.index] if self.device.type == "cuda" else None)

        def timed_allreduce(state, bucket):  # DDP's default all-reduce, its launch noted
            if self._hold is not None:  # its modeled compute besides its TP collectives, as the runner holds
                start_ns, modeled_s, also_ns = self._hold
                self.emulator.hold_s(start_ns + also_ns(), modeled_s)
            self.launched = self.tracer.mark()
            return default_hooks.allreduce_hook(state, bucket)

        ddp.register_comm_hook(self.group, timed_allreduce)
        return ddp

    def all_reduce(self, params: list[torch.Tensor]) -> None:
        """Average the gradients of `params` over the group (every replica holds the same set:
        they run the same schedule), traced as dp_sync."""
        t0 = self.tracer.mark()
        grads = [local(p.grad) for p in params if p.grad is not None]  # tp > 1: each rank's shards
        world = dist.get_world_size(self.group)
        groups = buckets(grads)
        flat = [_flatten_dense_tensors(b) for b in groups]
        works = [dist.all_reduce(f, group=self.group, async_op=True) for f in flat]
        for work, f, b in zip(works, flat, groups):
            work.wait()
            f.div_(world)
            for g, reduced in zip(b, _unflatten_dense_tensors(f, b)):
                g.copy_(reduced)
        self.launched = t0

    @staticmethod
    def forward_context(module: nn.Module) -> ContextManager:
        """Forwards never sync: only the backward chosen by `backward` arms the reducer."""
        return module.no_sync() if isinstance(module, DistributedDataParallel) else nullcontext()

    @contextmanager
    def backward(self, module: nn.Module, output: torch.Tensor, last: bool, start_ns: int,
                 modeled_s: float, also_ns: Callable[[], int] = lambda: 0) -> Iterator[None]:
        """Around one backward of `module`: all-reduce if it is the stage's `last` of the
        step, else accumulate locally (no_sync). `launched` says when the sync began. An
        emulated backward is held for `modeled_s` from `start_ns` plus `also_ns()`, its TP
        collectives' host time so far, before the first bucket's all-reduce."""
        self.launched = None
        if not last:
            with module.no_sync():
                yield
            return
        compat.arm_ddp_backward(module, output)
        self._hold = (start_ns, modeled_s, also_ns)
        try:
            yield
        finally:
            self._hold = None
